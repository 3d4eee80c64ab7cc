import Foundation
import Testing
import Tether
import TetherSync
import TetherTestSupport

// `tether sync --help` promises exit 77 for TLS failures: a certificate refused by either side
// ends a sync with 77 and the reason (the peer's alert, or this side's verification), not 69
// "connection reset" (issue 34).

/// Writes a certificate for `name` signed by the CA in `caDirectory` (`tether cert ca`'s files),
/// valid for one day from `notBefore`, as DIR/cert.pem and DIR/key.pem; returns the directory.
private func issue(_ name: String, caDirectory: String, notBefore: Date, in fixture: ServeFixture) throws -> String {
    let ca = CertificateAndKey(
        certificatePEM: try String(contentsOfFile: caDirectory + "/ca.pem", encoding: .utf8),
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
    @Test(
        """
        a client whose certificate the server refuses (from a CA it does not trust) exits 77 with the server's \
        alert, one whose certificate expired 77 before connecting, a client refusing the server's expired \
        certificate 77 naming it
        """)
    func refusedCertificatesExit77() async throws {
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

        // The client's certificate has expired: refused before it connects (the server would
        // refuse it with the alert "certificate expired").
        let expired = try issue("node-b", caDirectory: fixture.ca, notBefore: threeDaysAgo, in: fixture)
        let expiredClient = try sync(replacingCertificateWith: expired, port: listening.port)
        #expect(expiredClient.status == 77, "\(expiredClient)")
        #expect(expiredClient.stderr.contains("expired on"), "\(expiredClient)")

        // The client's certificate comes from a CA the server does not trust.
        let otherCA = fixture.directory.file("other-ca")
        try #require(try tether("cert", "ca", "--out", otherCA).status == 0)
        let foreign = try issue("node-foreign", caDirectory: otherCA, notBefore: Date(), in: fixture)
        let foreignClient = try sync(
            replacingCertificateWith: foreign, ca: fixture.ca + "/ca.pem", port: listening.port)
        #expect(foreignClient.status == 77, "\(foreignClient)")
        #expect(foreignClient.stderr.contains("unknown ca"), "\(foreignClient)")

        // The server's certificate has expired: the client refuses it, naming why. (tether serve
        // refuses to start with one, below: the server is this process's.)
        let expiredServer = try issue("node-c", caDirectory: fixture.ca, notBefore: threeDaysAgo, in: fixture)
        let staleDatabase = try Database.inMemory()
        try staleDatabase.execute(serveSchema)
        try staleDatabase.enableSync(table: "t")
        let staleTLS = try TLSContext(
            configuration: .server(
                certificateChainFile: expiredServer + "/cert.pem", privateKeyFile: expiredServer + "/key.pem",
                trustedCAFile: fixture.ca + "/ca.pem"))
        let stale = try await SyncServer.start(database: staleDatabase, host: "127.0.0.1", port: 0, tls: staleTLS)
        let refusingClient = try sync(port: stale.port)
        try await stale.stop()
        #expect(refusingClient.status == 77, "\(refusingClient)")
        #expect(refusingClient.stderr.contains("certificate has expired"), "\(refusingClient)")

        // And a good certificate still syncs.
        let fine = try sync(port: listening.port)
        #expect(fine.status == 0, "\(fine)")
    }
}

@Suite("tether serve and sync: this node's own TLS material checked before any peer is met", .serialized)
struct OwnCertificateTests {
    @Test(
        """
        an expired certificate of its own, or a private key others may read, is refused at once (77, naming the \
        file and the fix), by serve and by sync
        """)
    func ownExpiredCertificateAndUnprotectedKey() throws {
        let fixture = try ServeFixture()
        let (a, flagsA) = try fixture.node("a")
        let expired = try issue("node-a", caDirectory: fixture.ca, notBefore: threeDaysAgo, in: fixture)
        var expiredFlags = flagsA
        if let index = expiredFlags.firstIndex(of: "--cert") {
            expiredFlags[index + 1] = expired + "/cert.pem"
            expiredFlags[index + 3] = expired + "/key.pem"
        }
        // Run as a process that may not end by itself: before, serve started and ran on.
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let serve = try nodes.start(fixture.serveArguments(db: a, flags: expiredFlags))
        #expect(
            serve.waitForExit(timeout: 30) == 77 && serve.stderr.contains("expired on")
                && serve.stderr.contains(expired + "/cert.pem"), "\(serve.summary)")
        let sync = try tether(["sync", "--db", a, "--peer", "127.0.0.1:9"] + expiredFlags)
        #expect(sync.status == 77 && sync.stderr.contains("expired on"), "\(sync)")

        let key = try #require(flagsA.firstIndex(of: "--key").map { flagsA[$0 + 1] })
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: key)
        let readable = try nodes.start(fixture.serveArguments(db: a, flags: flagsA))
        #expect(
            readable.waitForExit(timeout: 30) == 77 && readable.stderr.contains("chmod 600 \(key)")
                && readable.stderr.contains("644"), "\(readable.summary)")
    }
}
