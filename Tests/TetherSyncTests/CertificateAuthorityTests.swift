import COpenSSL
import Foundation
import Testing
import TetherSync
import TetherTestSupport

/// SHA-256 of the DER inside a PEM certificate, computed without X509: base64 decode + EVP_Digest.
private func independentFingerprint(_ pem: String) -> String? {
    let body = pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
    guard let der = Data(base64Encoded: body) else { return nil }
    var digest = [UInt8](repeating: 0, count: 32)
    var length: UInt32 = 0
    let ok = der.withUnsafeBytes { raw in
        EVP_Digest(raw.baseAddress, raw.count, &digest, &length, EVP_sha256(), nil)
    }
    guard ok == 1, length == 32 else { return nil }
    return digest.map { byte in
        let digits = String(byte, radix: 16)
        return digits.count == 1 ? "0" + digits : digits
    }.joined()
}

private func certificateError(
    sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> CertificateAndKey
) -> CertificateError? {
    do {
        _ = try body()
        Issue.record("no error thrown", sourceLocation: sourceLocation)
        return nil
    } catch let error as CertificateError {
        return error
    } catch {
        Issue.record("unexpected error \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

@Suite("Certificate tools")
struct CertificateAuthorityTests {
    @Test("a CA and a node certificate carry the names, validity and fingerprints asked for")
    func createAndIssue() throws {
        let start = Date(timeIntervalSince1970: (Date().timeIntervalSince1970).rounded(.down))
        let ca = try CertificateAuthority.create(commonName: "Fleet CA", validity: 10 * day, notBefore: start)
        #expect(ca.certificatePEM.hasPrefix("-----BEGIN CERTIFICATE-----"))
        #expect(ca.privateKeyPEM.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let caInfo = try CertificateAuthority.inspect(certificatePEM: ca.certificatePEM)
        #expect(caInfo.subject == "CN=Fleet CA")
        #expect(caInfo.issuer == "CN=Fleet CA")
        #expect(caInfo.isCertificateAuthority)
        #expect(caInfo.notBefore == start)
        #expect(caInfo.notAfter == start.addingTimeInterval(10 * day))
        #expect(caInfo.fingerprint == independentFingerprint(ca.certificatePEM))

        let node = try CertificateAuthority.issue(commonName: "node-7", signedBy: ca, validity: day, notBefore: start)
        let nodeInfo = try CertificateAuthority.inspect(certificatePEM: node.certificatePEM)
        #expect(nodeInfo.subject == "CN=node-7")
        #expect(nodeInfo.issuer == "CN=Fleet CA")
        #expect(!nodeInfo.isCertificateAuthority)
        #expect(nodeInfo.notAfter == start.addingTimeInterval(day))
        #expect(nodeInfo.fingerprint.count == 64)
        #expect(nodeInfo.fingerprint == independentFingerprint(node.certificatePEM))
        #expect(try CertificateAuthority.fingerprint(certificatePEM: node.certificatePEM) == nodeInfo.fingerprint)
        #expect(nodeInfo.fingerprint != caInfo.fingerprint)

        // Validity in the past: an expired certificate.
        let old = try CertificateAuthority.issue(
            commonName: "old", signedBy: ca, validity: day, notBefore: Date().addingTimeInterval(-5 * day))
        #expect(try CertificateAuthority.inspect(certificatePEM: old.certificatePEM).notAfter < Date())
    }

    @Test("the key file is written with mode 0600, also over an existing file")
    func keyFilePermissions() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let ca = try CertificateAuthority.create(commonName: "Fleet CA", validity: day)
        let keyPath = directory.file("ca.key")
        try "old".write(toFile: keyPath, atomically: false, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: keyPath)
        try CertificateAuthority.write(ca, certificatePath: directory.file("ca.crt"), privateKeyPath: keyPath)
        let keyMode = try FileManager.default.attributesOfItem(atPath: keyPath)[.posixPermissions] as? Int
        let certificateMode =
            try FileManager.default.attributesOfItem(atPath: directory.file("ca.crt"))[.posixPermissions] as? Int
        #expect(keyMode == 0o600)
        #expect(certificateMode == 0o644)
        #expect(try String(contentsOfFile: keyPath, encoding: .utf8) == ca.privateKeyPEM)

        let unwritable = directory.file("missing-dir/ca.key")
        #expect(throws: CertificateError.self) {
            try CertificateAuthority.write(ca, certificatePath: directory.file("x.crt"), privateKeyPath: unwritable)
        }
    }

    @Test("bad arguments and unusable CAs are refused")
    func refusals() throws {
        let ca = try CertificateAuthority.create(commonName: "Fleet CA", validity: day)
        guard
            case .invalidArgument? = certificateError({ try CertificateAuthority.create(commonName: "", validity: day) }
            )
        else { Issue.record("empty common name accepted"); return }
        guard
            case .invalidArgument? = certificateError({
                try CertificateAuthority.create(commonName: "CA", validity: -1)
            })
        else { Issue.record("negative validity accepted"); return }
        guard
            case .invalidArgument? = certificateError({
                try CertificateAuthority.create(commonName: "CA", validity: .infinity)
            })
        else { Issue.record("infinite validity accepted"); return }
        // A name that would smuggle another subjectAltName entry into OpenSSL's config syntax.
        guard
            case .invalidArgument? = certificateError({
                try CertificateAuthority.issue(
                    commonName: "node", signedBy: ca, validity: day, dnsNames: ["node,IP:10.0.0.1"])
            })
        else { Issue.record("bad DNS name accepted"); return }
        guard
            case .invalidArgument? = certificateError({
                try CertificateAuthority.issue(
                    commonName: "node", signedBy: ca, validity: day, ipAddresses: ["not-an-ip"])
            })
        else { Issue.record("bad IP address accepted"); return }

        let node = try CertificateAuthority.issue(commonName: "node", signedBy: ca, validity: day)
        guard
            case .notACertificateAuthority(subject: "CN=node")? = certificateError({
                try CertificateAuthority.issue(commonName: "other", signedBy: node, validity: day)
            })
        else { Issue.record("a node certificate signed another"); return }

        let otherCA = try CertificateAuthority.create(commonName: "Other CA", validity: day)
        let mixed = CertificateAndKey(certificatePEM: ca.certificatePEM, privateKeyPEM: otherCA.privateKeyPEM)
        guard
            case .keyDoesNotMatchCertificate? = certificateError({
                try CertificateAuthority.issue(commonName: "node", signedBy: mixed, validity: day)
            })
        else { Issue.record("a CA with the wrong key signed"); return }

        let garbled = CertificateAndKey(certificatePEM: "garbage", privateKeyPEM: ca.privateKeyPEM)
        guard
            case .invalidCertificate? = certificateError({
                try CertificateAuthority.issue(commonName: "node", signedBy: garbled, validity: day)
            })
        else { Issue.record("a garbled CA certificate was used"); return }
        #expect(throws: CertificateError.self) { try CertificateAuthority.inspect(certificatePEM: "") }
    }
}
