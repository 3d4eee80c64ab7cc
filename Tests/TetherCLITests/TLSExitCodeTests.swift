import Foundation
import Testing
import TetherSync
import TetherTestSupport

// `tether sync --help` promises exit 77 for TLS failures: a certificate refused by either side
// ends a sync with 77 and the reason (the peer's alert, or this side's verification), not 69
// "connection reset" (issue 34).

/// Writes a certificate for `name` signed by the CA in `caDirectory` (`tether cert ca`'s files),
/// valid for one day from `notBefore`, as DIR/cert.pem and DIR/key.pem; returns the directory.
private func issue(_ name: String, caDirectory: String, notBefore: Date, in fixture: ServeFixture) throws -> String {
    let ca = CertificateAndKey(certificatePEM: try String(contentsOfFile: caDirectory + "/ca.pem", encoding: .utf8),
                               privateKeyPEM: try String(contentsOfFile: caDirectory + "/ca-key.pem", encoding: .utf8))
    let made = try CertificateAuthority.issue(commonName: name, signedBy: ca, validity: 86_400, notBefore: notBefore)
    let directory = fixture.directory.file("certs/\(name)")
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    try made.certificatePEM.write(toFile: directory + "/cert.pem", atomically: true, encoding: .utf8)
    try made.privateKeyPEM.write(toFile: directory + "/key.pem", atomically: true, encoding: .utf8)
    try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: directory + "/key.pem")
    return directory
}

private let threeDaysAgo = Date().addingTimeInterval(-3 * 86_400)

@Suite("tether sync: a refused certificate exits 77 naming why", .serialized)
struct TLSExitCodeTests {
    @Test("a client whose certificate the server refuses (expired, or from a CA it does not trust) exits 77 with the server's alert; a client refusing the server's expired certificate exits 77 naming it")
    func refusedCertificatesExit77() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (a, flagsA) = try fixture.node("a")
        let (b, flagsB) = try fixture.node("b")
        let server = try nodes.start(fixture.serveArguments(db: a, flags: flagsA))
        let listening = try #require(server.waitForListening(), "\(server.summary)")
        func sync(replacingCertificateWith directory: String? = nil, ca: String? = nil, port: Int) throws -> CLIResult {
            var flags = flagsB
            if let directory, let index = flags.firstIndex(of: "--cert") {
                flags[index + 1] = directory + "/cert.pem"
                flags[index + 3] = directory + "/key.pem"
            }
            if let ca, let index = flags.firstIndex(of: "--ca") { flags[index + 1] = ca }
            return try tether(["sync", "--db", b, "--peer", "127.0.0.1:\(port)"] + flags)
        }

        // The client's certificate has expired: the server says so in its alert.
        let expired = try issue("node-b", caDirectory: fixture.ca, notBefore: threeDaysAgo, in: fixture)
        let expiredClient = try sync(replacingCertificateWith: expired, port: listening.port)
        #expect(expiredClient.status == 77, "\(expiredClient)")
        #expect(expiredClient.stderr.contains("certificate expired"), "\(expiredClient)")

        // The client's certificate comes from a CA the server does not trust.
        let otherCA = fixture.directory.file("other-ca")
        try #require(try tether("cert", "ca", "--out", otherCA).status == 0)
        let foreign = try issue("node-foreign", caDirectory: otherCA, notBefore: Date(), in: fixture)
        let foreignClient = try sync(replacingCertificateWith: foreign, ca: fixture.ca + "/ca.pem", port: listening.port)
        #expect(foreignClient.status == 77, "\(foreignClient)")
        #expect(foreignClient.stderr.contains("unknown ca"), "\(foreignClient)")

        // The server's certificate has expired: the client refuses it, naming why.
        let expiredServer = try issue("node-c", caDirectory: fixture.ca, notBefore: threeDaysAgo, in: fixture)
        let (c, flagsC) = try fixture.node("c")
        var serverFlags = flagsC
        if let index = serverFlags.firstIndex(of: "--cert") {
            serverFlags[index + 1] = expiredServer + "/cert.pem"
            serverFlags[index + 3] = expiredServer + "/key.pem"
        }
        let stale = try nodes.start(fixture.serveArguments(db: c, flags: serverFlags))
        let staleListening = try #require(stale.waitForListening(), "\(stale.summary)")
        let refusingClient = try sync(port: staleListening.port)
        #expect(refusingClient.status == 77, "\(refusingClient)")
        #expect(refusingClient.stderr.contains("certificate has expired"), "\(refusingClient)")

        // And a good certificate still syncs.
        let fine = try sync(port: listening.port)
        #expect(fine.status == 0, "\(fine)")
    }
}
