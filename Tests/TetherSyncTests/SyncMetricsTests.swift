import Foundation
import MetricsTestKit
import Testing
import Tether
import TetherSync
import TetherWire

/// Inserts rows with the ids in `range` into `table` (`t` or `u` of `makeSyncedDatabase`) in one transaction.
private func insert(_ db: Database, _ range: ClosedRange<Int>, into table: String = "t") throws {
    try db.write { conn in
        for id in range { try conn.execute("INSERT INTO \(table) (id) VALUES (?)", [id]) }
    }
}

/// Options recording into `metrics`, with batches small enough that a few hundred rows take several.
private func recording(into metrics: TestMetrics) -> SyncOptions {
    var options = SyncOptions(batchLimits: BatchLimits(maximumChanges: 40, maximumBytes: 1 << 20))
    options.metricsFactory = metrics
    return options
}

/// The total of the counter `name` for `peer` (nil if it was never made).
private func count(_ metrics: TestMetrics, _ name: String, peer: InstanceKey) -> Int64? {
    try? metrics.expectCounter(name, [("peer", "\(peer)")]).totalValue
}

@Suite("Sync metrics, recorded through swift-metrics")
struct SyncMetricsTests {
    @Test(
        "a syncOnce of N changes one way and M the other shows them sent, received and applied per peer on both sides")
    func changesPerPeer() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...130)
        try insert(client, 1_000...1_099)
        let serverMetrics = TestMetrics()
        let clientMetrics = TestMetrics()

        let (summary, serverResult) = try await runServer(server, pki: pki, options: recording(into: serverMetrics)) {
            syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                options: recording(into: clientMetrics))
        }
        let serverSummary = try #require(try serverResult?.get())
        #expect(summary.changesReceived == 130 && summary.changesSent == 100)

        for (metrics, peer, sent, received) in [
            (serverMetrics, client.instanceKey, 130, 100), (clientMetrics, server.instanceKey, 100, 130),
        ] {
            #expect(count(metrics, SyncMetrics.Name.changesSent, peer: peer) == Int64(sent))
            #expect(count(metrics, SyncMetrics.Name.changesReceived, peer: peer) == Int64(received))
            #expect(count(metrics, SyncMetrics.Name.changesApplied, peer: peer) == Int64(received))
            #expect(count(metrics, SyncMetrics.Name.conflicts, peer: peer) == 0)
            #expect(count(metrics, SyncMetrics.Name.keptAside, peer: peer) == 0)
            #expect(try metrics.expectCounter(SyncMetrics.Name.sessions).totalValue == 1)
            #expect(try metrics.expectMeter(SyncMetrics.Name.sessionsOpen).lastValue == 0, "the session is over")
            // One apply timed per batch received: 40 changes at most each.
            #expect(try metrics.expectTimer(SyncMetrics.Name.batchApplySeconds).values.count >= (received + 39) / 40)
        }
        // Bytes: what each side counted as sent, the other counted as received, and the summaries agree.
        let serverSent = try #require(count(serverMetrics, SyncMetrics.Name.bytesSent, peer: client.instanceKey))
        let serverReceived = try #require(
            count(serverMetrics, SyncMetrics.Name.bytesReceived, peer: client.instanceKey))
        #expect(serverSent == Int64(serverSummary.bytesSent) && serverReceived == Int64(serverSummary.bytesReceived))
        #expect(count(clientMetrics, SyncMetrics.Name.bytesSent, peer: server.instanceKey) == Int64(summary.bytesSent))
        #expect(
            count(clientMetrics, SyncMetrics.Name.bytesReceived, peer: server.instanceKey)
                == Int64(summary.bytesReceived))
        #expect(serverSent > 0 && serverReceived > 0)
        #expect(serverMetrics.counters(label: SyncMetrics.Name.batchesRefused).isEmpty)
        #expect(serverMetrics.counters(label: SyncMetrics.Name.tlsHandshakeFailures).isEmpty)
    }

    @Test(
        """
        a batch refused whole counts under the ERROR code sent: tableNotAllowed from the session, malformedFrame \
        from the decoder
        """)
    func refusedBatches() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase(withU: true)
        let client = try makeSyncedDatabase(withU: true)
        try insert(client, 1...3, into: "u")
        let metrics = TestMetrics()
        var options = recording(into: metrics)
        options.peers[.name("node-client")] = PeerPolicy(allowedTables: ["t"])

        let (_, result) = try await runServer(server, pki: pki, options: options) { syncServer in
            await #expect(throws: SyncSessionError.self) {
                try await SyncClient.syncOnce(
                    database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
            }
        }
        guard case .failure(.tableNotAllowed)? = result else {
            Issue.record("the server's session did not fail with tableNotAllowed: \(String(describing: result))")
            return
        }
        #expect(
            try metrics.expectCounter(SyncMetrics.Name.batchesRefused, [("reason", "tableNotAllowed")]).totalValue == 1)
        #expect(
            count(metrics, SyncMetrics.Name.changesReceived, peer: client.instanceKey) == 0,
            "a refused batch is not received")
        #expect(try metrics.expectMeter(SyncMetrics.Name.sessionsOpen).lastValue == 0)

        // A BATCH the decoder refuses (its sequence numbers do not increase).
        let (_, decoded) = try await runServer(server, pki: pki, options: options) { syncServer in
            try await silentExchange(
                port: syncServer.port, pki: pki, mirrorAs: try makeSyncedDatabase().instanceKey,
                afterHello: try invalidVector("batch-sequence-not-increasing"))
        }
        guard case .failure(.malformedFrame(.batch))? = decoded else {
            Issue.record("the server's session did not fail with a malformed batch: \(String(describing: decoded))")
            return
        }
        #expect(
            try metrics.expectCounter(SyncMetrics.Name.batchesRefused, [("reason", "malformedFrame")]).totalValue == 1)
        #expect(metrics.counterTotal(label: SyncMetrics.Name.batchesRefused) == 2)
    }

    @Test("a failed TLS handshake counts on both sides, by reason; no session is counted")
    func handshakeFailure() async throws {
        let pki = try TestPKI()
        let stranger = try TestPKI()
        defer {
            pki.directory.remove()
            stranger.directory.remove()
        }
        let serverMetrics = TestMetrics()
        let clientMetrics = TestMetrics()
        let (_, result) = try await runServer(
            try makeSyncedDatabase(), pki: pki, options: recording(into: serverMetrics)
        ) { syncServer in
            // A client of another CA: it refuses the server's certificate.
            await #expect(throws: (any Error).self) {
                try await SyncClient.syncOnce(
                    database: try makeSyncedDatabase(), host: "127.0.0.1", port: syncServer.port,
                    tls: try stranger.clientContext(), options: recording(into: clientMetrics))
            }
        }
        guard case .failure(.tls)? = result else {
            Issue.record("the server's session did not fail in TLS: \(String(describing: result))")
            return
        }
        #expect(
            try clientMetrics.expectCounter(
                SyncMetrics.Name.tlsHandshakeFailures, [("reason", "peerCertificateRejected")]
            )
            .totalValue == 1)
        #expect(
            serverMetrics.counterTotal(label: SyncMetrics.Name.tlsHandshakeFailures) == 1,
            "\(serverMetrics.counters(label: SyncMetrics.Name.tlsHandshakeFailures).map(\.dimensions))")
        #expect(serverMetrics.counters(label: SyncMetrics.Name.sessions).allSatisfy { $0.totalValue == 0 })
    }

    @Test("a peer refused at HELLO gets no series of its own: its bytes count under peer=\"unauthenticated\"")
    func refusedPeerHasNoLabel() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let client = try makeSyncedDatabase()
        let metrics = TestMetrics()
        var options = recording(into: metrics)
        options.peers = .only([.name("node-other"): PeerPolicy()])

        let (_, result) = try await runServer(try makeSyncedDatabase(), pki: pki, options: options) { syncServer in
            await #expect(throws: SyncSessionError.self) {
                try await SyncClient.syncOnce(
                    database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
            }
        }
        guard case .failure(.unauthorized)? = result else {
            Issue.record("the server's session was not refused: \(String(describing: result))")
            return
        }
        let peers = Set(metrics.counters.flatMap { $0.dimensions.filter { $0.0 == "peer" }.map(\.1) })
        #expect(peers == [SyncMetrics.unauthenticatedPeer])
        #expect(
            try metrics.expectCounter(SyncMetrics.Name.bytesReceived, [("peer", SyncMetrics.unauthenticatedPeer)])
                .totalValue > 0)
        #expect(metrics.counters(label: SyncMetrics.Name.changesReceived).isEmpty)
        #expect(metrics.counterTotal(label: SyncMetrics.Name.sessions) == 0)
    }

    @Test(
        """
        pending changes per peer are counted when asked (a scrape): 0 once the peer caught up (its own changes \
        left out), then what was written since
        """)
    func pendingChanges() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...50)
        // The server applies these after the client's last acknowledgement: the client holds them, so they are not
        // pending for it.
        try insert(client, 100...119)
        let metrics = TestMetrics()
        let recorder = SyncMetrics(factory: metrics)
        let gauge = {
            try metrics.expectGauge(SyncMetrics.Name.pendingChanges, [("peer", "\(client.instanceKey)")]).lastValue
        }

        _ = try await runServer(server, pki: pki, options: recording(into: metrics)) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        #expect(try server.fetchValue("SELECT count(*) FROM t", as: Int.self) == 70)
        try recorder.recordPendingChanges(in: server)
        #expect(try gauge() == 0)
        try insert(server, 51...57)
        try recorder.recordPendingChanges(in: server)
        #expect(try gauge() == 7)
    }
}
