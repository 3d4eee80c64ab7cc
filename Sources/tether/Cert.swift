import ArgumentParser
import Foundation
import TetherSync

/// `tether cert`: a certificate authority and the node certificates it signs.
struct Cert: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cert",
        abstract: "Make a certificate authority and node certificates for sync over TLS.",
        subcommands: [CA.self, Node.self])

    static let day: TimeInterval = 86_400

    /// `tether cert ca --out DIR`: DIR/ca.pem and DIR/ca-key.pem.
    struct CA: ParsableCommand, ConfigurableCommand {
        static let configuration = CommandConfiguration(
            commandName: "ca",
            abstract: "Create a certificate authority: writes DIR/ca.pem and DIR/ca-key.pem (mode 0600).",
            discussion: Cert.jsonDiscussion)
        static let configKeys = ["out", "name", "days"] + OutputFormatOption.configKeys

        @OptionGroup var common: CommonOptions

        @Option(
            help: ArgumentHelp("The directory to write to (created if missing).", valueName: "dir"),
            completion: .directory)
        var out: String

        @Option(help: ArgumentHelp("The CA's common name.", valueName: "name"))
        var name = "Tether CA"

        @Option(help: ArgumentHelp("Validity, in days.", valueName: "days"))
        var days = 3650

        @OptionGroup var output: OutputFormatOption

        func validate() throws {
            guard days > 0 else { throw ValidationError("--days must be at least 1") }
            guard !name.isEmpty else { throw ValidationError("--name must not be empty") }
        }

        func run() throws {
            common.bootstrapLogging()
            let credentials = try CertificateAuthority.create(commonName: name, validity: Double(days) * Cert.day)
            try Cert.writePair(credentials, directory: out, certificate: "ca.pem", key: "ca-key.pem")
            let info = try CertificateAuthority.inspect(certificatePEM: credentials.certificatePEM)
            output.print(
                "wrote \(out)/ca.pem and \(out)/ca-key.pem (SHA-256 \(info.fingerprint))",
                json: Cert.report(certificate: out + "/ca.pem", key: out + "/ca-key.pem", name: name, info: info))
        }
    }

    /// `tether cert node --ca DIR --name NAME --out DIR2`: DIR2/cert.pem and DIR2/key.pem.
    struct Node: ParsableCommand, ConfigurableCommand {
        static let configuration = CommandConfiguration(
            commandName: "node",
            abstract: "Issue a node certificate signed by a CA: writes DIR/cert.pem and DIR/key.pem (mode 0600).",
            discussion: "The certificate serves both as a TLS server and a TLS client certificate. Its subjectAltName "
                + "holds the name when it is a DNS name, --dns names and --ip addresses (127.0.0.1 by default). "
                + Cert.jsonDiscussion)
        static let configKeys = ["ca", "name", "out", "days", "dns", "ip"] + OutputFormatOption.configKeys

        @OptionGroup var common: CommonOptions

        @Option(
            help: ArgumentHelp("The directory holding ca.pem and ca-key.pem.", valueName: "dir"), completion: .directory
        )
        var ca: String

        @Option(help: ArgumentHelp("The node's common name.", valueName: "name"))
        var name: String

        @Option(
            help: ArgumentHelp("The directory to write to (created if missing).", valueName: "dir"),
            completion: .directory)
        var out: String

        @Option(help: ArgumentHelp("Validity, in days.", valueName: "days"))
        var days = 825

        @Option(help: ArgumentHelp("A DNS name for subjectAltName (repeatable).", valueName: "name"))
        var dns: [String] = []

        @Option(
            help: ArgumentHelp(
                "An IP address for subjectAltName (repeatable; default 127.0.0.1).", valueName: "address"))
        var ip: [String] = []

        @OptionGroup var output: OutputFormatOption

        func validate() throws {
            guard days > 0 else { throw ValidationError("--days must be at least 1") }
            guard !name.isEmpty else { throw ValidationError("--name must not be empty") }
        }

        func run() throws {
            common.bootstrapLogging()
            let certificatePEM = try Self.text(
                AtomicFile.read(ca + "/ca.pem", what: "CA certificate"), path: ca + "/ca.pem")
            let keyPEM = try Self.text(AtomicFile.read(ca + "/ca-key.pem", what: "CA key"), path: ca + "/ca-key.pem")
            let authority = CertificateAndKey(certificatePEM: certificatePEM, privateKeyPEM: keyPEM)
            let credentials = try CertificateAuthority.issue(
                commonName: name, signedBy: authority, validity: Double(days) * Cert.day,
                dnsNames: dns.isEmpty ? nil : dns, ipAddresses: ip.isEmpty ? ["127.0.0.1"] : ip)
            try Cert.writePair(credentials, directory: out, certificate: "cert.pem", key: "key.pem")
            let info = try CertificateAuthority.inspect(certificatePEM: credentials.certificatePEM)
            output.print(
                "wrote \(out)/cert.pem and \(out)/key.pem for \(name) (SHA-256 \(info.fingerprint))",
                json: Cert.report(certificate: out + "/cert.pem", key: out + "/key.pem", name: name, info: info))
        }

        private static func text(_ data: Data, path: String) throws -> String {
            guard let text = String(data: data, encoding: .utf8) else {
                throw CLIError(.notPermitted, "\(path) is not a PEM file")
            }
            return text
        }
    }

    static let jsonDiscussion = """
        With --json, one object: "certificate" and "key" (the files written), "commonName", "notAfter" (the end \
        of its validity, ISO 8601) and "sha256" (the certificate's fingerprint, as --allow sha256:… takes it).
        """

    /// The `--json` report of `cert ca` and `cert node`.
    static func report(certificate: String, key: String, name: String, info: CertificateInfo) -> JSONValue {
        .object([
            "certificate": .string(certificate), "key": .string(key), "commonName": .string(name),
            "notAfter": .string(ISO8601DateFormatter().string(from: info.notAfter)),
            "sha256": .string(info.fingerprint),
        ])
    }

    /// Writes the key (0600) and the certificate (0644), each through a temporary
    /// file renamed into place.
    static func writePair(_ credentials: CertificateAndKey, directory: String, certificate: String, key: String) throws
    {
        try AtomicFile.createDirectory(directory)
        try AtomicFile.write(Data(credentials.privateKeyPEM.utf8), to: directory + "/" + key, mode: 0o600)
        try AtomicFile.write(Data(credentials.certificatePEM.utf8), to: directory + "/" + certificate, mode: 0o644)
    }
}
