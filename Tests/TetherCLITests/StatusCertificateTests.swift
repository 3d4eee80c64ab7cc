import Foundation
import Testing
import TetherTestSupport

// `tether status` names each peer by the certificate it presented, not only by its instance key (issue 34).

@Suite("tether status shows the peers' certificates", .serialized)
struct StatusCertificateTests {
    @Test(
        """
        after a sync over TLS, tether status on the server shows the client's common name and the SHA-256 \
        fingerprint tether cert node printed (text and --json); the client shows the server's
        """)
    func peersCertificateAfterSync() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (hub, hubFlags) = try fixture.node("hub", certificateName: "hub")
        let (client, _) = try fixture.node("client")
        // The client's own certificate, its fingerprint as `tether cert node --json` prints it.
        let certificate = fixture.directory.file("certs/north")
        let issued = try tether("cert", "node", "--ca", fixture.ca, "--name", "north", "--out", certificate, "--json")
        let report = try #require(
            try JSONSerialization.jsonObject(with: Data(issued.stdout.utf8)) as? [String: Any], "\(issued)")
        let fingerprint = try #require(report["sha256"] as? String, "\(issued)")
        let clientFlags = [
            "--cert", certificate + "/cert.pem", "--key", certificate + "/key.pem", "--ca", fixture.ca + "/ca.pem",
        ]

        let server = try nodes.start(fixture.serveArguments(db: hub, flags: hubFlags))
        let (port, hubKey) = try #require(server.waitForListening(), "\(server.summary)")
        let synced = try tether(["sync", "--db", client, "--peer", "127.0.0.1:\(port)"] + clientFlags)
        #expect(synced.status == 0, "\(synced)")
        let clientStatus = try tether("status", "--db", client, "--json")
        let clientKey = try #require(
            (try JSONSerialization.jsonObject(with: Data(clientStatus.stdout.utf8)) as? [String: Any])?["instanceKey"]
                as? String,
            "\(clientStatus)")

        // Text: under the client's line, its certificate.
        let text = try tether("status", "--db", hub)
        #expect(text.status == 0, "\(text)")
        let lines = text.stdout.split(separator: "\n").map(String.init)
        let peerLine = try #require(lines.firstIndex { $0.hasPrefix("  \(clientKey)  ") }, "\(text)")
        #expect(lines.dropFirst(peerLine + 1).first == "    certificate: north, sha256:\(fingerprint)", "\(text)")

        // JSON: the same, and what its instance key is pinned to.
        let json = try tether("status", "--db", hub, "--json")
        let peers = try #require(
            (try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])?["peers"]
                as? [[String: Any]], "\(json)")
        let peer = try #require(peers.first { $0["instanceKey"] as? String == clientKey }, "\(json)")
        #expect(peer["certificateName"] as? String == "north", "\(json)")
        #expect(peer["certificateFingerprint"] as? String == fingerprint, "\(json)")
        #expect(peer["pinnedTo"] as? String == "north", "\(json)")

        // The client knows the server the same way.
        let fromClient = try tether("status", "--db", client)
        let clientLines = fromClient.stdout.split(separator: "\n").map(String.init)
        let serverLine = try #require(clientLines.firstIndex { $0.hasPrefix("  \(hubKey)  ") }, "\(fromClient)")
        #expect(
            clientLines.dropFirst(serverLine + 1).first?.hasPrefix("    certificate: hub, sha256:") == true,
            "\(fromClient)")
        #expect(server.stop() == 0, "\(server.summary)")
    }
}
