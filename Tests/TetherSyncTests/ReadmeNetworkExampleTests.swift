import Foundation
import Prometheus
import Testing
import Tether
import TetherSync
import TetherTestSupport

/// The README's "Over the network" and "Metrics" examples, kept true.
@Suite("README: sync over the network")
struct ReadmeNetworkExampleTests {
    /// What the README's examples assume: TLS contexts, and two databases syncing `t`, `a` with one row.
    private static func readmeSetup(_ pki: TestPKI) throws -> (
        serverTLS: TLSContext, clientTLS: TLSContext, a: Database, b: Database
    ) {
        let a = try Database.inMemory()
        let b = try Database.inMemory()
        for db in [a, b] {
            try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
            try db.enableSync(table: "t")
        }
        try a.execute("INSERT INTO t (id, name) VALUES (1, 'one')")
        return (try pki.serverContext(), try pki.clientContext(), a, b)
    }

    @Test("the README's network example runs as written")
    func networkExample() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let (serverTLS, clientTLS, a, b) = try Self.readmeSetup(pki)

        let server = try await SyncServer.start(database: a, host: "127.0.0.1", port: 0, tls: serverTLS)

        // Once: catch up both ways, then BYE.
        let summary = try await SyncClient.syncOnce(database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)

        // With progress (an AsyncSequence of snapshots: done, and expected each way).
        let run = try await SyncClient.startSync(database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)
        for await step in run.progress { print(step.done.changesReceived, step.changesExpectedToReceive ?? 0) }
        _ = try await run.summary()

        // Kept in sync: live push, heartbeats, and reconnection with backoff when the session ends.
        let link = SyncClient.keepSyncing(database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)
        var events = link.events.makeAsyncIterator()
        guard case .connected? = await events.next() else {
            Issue.record("the link did not connect")
            await link.stop()
            try await server.stop()
            return
        }
        // … later
        await link.stop()
        try await server.stop()

        #expect(summary.changesReceived == 1)
        #expect(try b.fetchValue("SELECT name FROM t WHERE id = 1", as: String.self) == "one")
        #expect(server.totals.sessions == 3)
    }

    @Test("the README's rolling-upgrade example runs as written: the row without its color, then the color backfilled")
    func rollingUpgradeExample() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let (serverTLS, clientTLS, a, b) = try Self.readmeSetup(pki)
        let server = try await SyncServer.start(database: a, host: "127.0.0.1", port: 0, tls: serverTLS)
        do {
            // Both sync `t (id, name)`; a is upgraded first, and writes colors b cannot hold yet.
            var migrator = Migrator()
            migrator.register("2-color") { try $0.addColumn("color", to: "t", "TEXT") }
            try migrator.migrate(a)
            try a.execute("UPDATE t SET color = 'red' WHERE id = 1")
            let before = try await SyncClient.syncOnce(
                database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)
            // before.changesReceived == 1: the row, without its color; b's status shows the difference.
            #expect(before.changesReceived == 1)
            #expect(try b.peerSchemas().first?.differences == ["table t: column color is synced by the peer, not here"])

            try migrator.migrate(b)  // b is upgraded
            let after = try await SyncClient.syncOnce(database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)
            // after.changesReceived == 1: the one row holding a color, backfilled; b has color 'red'.
            #expect(after.changesReceived == 1)
            #expect(try b.fetchValue("SELECT color FROM t WHERE id = 1", as: String.self) == "red")
        } catch {
            try await server.stop()
            throw error
        }
        try await server.stop()
    }

    @Test("the README's metrics example runs as written: the Prometheus text holds the peer's series")
    func metricsExample() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let (serverTLS, clientTLS, a, b) = try Self.readmeSetup(pki)

        let registry = PrometheusCollectorRegistry()
        var options = SyncOptions()
        options.metricsFactory = PrometheusMetricsFactory(registry: registry)
        let server = try await SyncServer.start(
            database: a, host: "127.0.0.1", port: 0, tls: serverTLS, options: options)
        _ = try await SyncClient.syncOnce(database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)
        try SyncMetrics(factory: options.metricsFactory).recordPendingChanges(in: a)  // the lag, before each export
        let text = registry.emitToString()  // tether_sync_changes_sent_total{peer="…"} 1 …
        try await server.stop()

        let peer = "{peer=\"\(b.instanceKey)\"}"
        #expect(text.contains("tether_sync_changes_sent_total\(peer) 1\n"), "\(text)")
        #expect(text.contains("tether_sync_pending_changes\(peer) 0.0\n"), "\(text)")
        #expect(text.contains("tether_sync_sessions_total 1\n"), "\(text)")
    }
}

/// The README's "Partial replication" example, kept true.
@Suite("README: partial replication")
struct ReadmePartialReplicationExampleTests {
    private static func ordersDatabase() throws -> Database {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT NOT NULL, status TEXT NOT NULL)")
        try db.execute("CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL, item TEXT)")
        try db.enableSync(table: "orders")
        try db.enableSync(table: "order_line")
        return db
    }

    @Test("the README's partial replication example runs as written, and does what its comments say")
    func partialReplicationExample() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let hub = try Self.ordersDatabase()
        let north = try Self.ordersDatabase()
        try hub.execute(
            """
            INSERT INTO orders (id, site, status) VALUES (1, 'north', 'open'), (2, 'north', 'closed'), (3, \
            'south', 'open')
            """)
        try hub.execute(
            "INSERT INTO order_line (id, order_id, item) VALUES (10, 1, 'bolts'), (20, 2, 'nuts'), (30, 3, 'washers')")
        let hubTLS = try pki.serverContext()
        let northTLS = try pki.clientContext(try pki.issue(commonName: "north", as: "north"))
        let evicted = LockedBox<Int>(0)
        let counting = north.observe(.evict, in: "orders") { _ in evicted.withLock { $0 += 1 } }
        defer { counting.cancel() }
        func ids(_ table: String) throws -> [Int] {
            try north.fetchRows("SELECT id FROM \(table) ORDER BY id").map { try $0.get(0, as: Int.self) }
        }

        // The README's code, as written:
        // On the hub: each site holds, and may write, its own orders and their lines.
        var hubOptions = SyncOptions()
        hubOptions.peers.others = PeerPolicy(scopes: [
            "orders": .filter("site = :peer_name"),  // the certificate's common name
            "order_line": .reference(column: "order_id", parent: "orders"),  // lines of those orders
        ])
        try hubOptions.peers.validate(against: hub)  // an unknown column or table fails here, by name
        let server = try await SyncServer.start(
            database: hub, host: "127.0.0.1", port: 0, tls: hubTLS, options: hubOptions)

        // On north (certificate "north"): only its open orders.
        var northOptions = SyncOptions()
        northOptions.interest = ["orders": .filter("status = 'open'")]
        let leaving = north.observe(.evict, in: "orders") { event in print("left north:", event.key) }
        _ = try await SyncClient.syncOnce(
            database: north, host: "127.0.0.1", port: server.port, tls: northTLS, options: northOptions)
        #expect(try ids("orders") == [1] && ids("order_line") == [10], "north's open orders and their lines")

        // Moved to south on the hub: evicted from north at its next sync (observed as evict, not delete).
        try hub.execute("UPDATE orders SET site = 'south' WHERE id = 1")
        _ = try await SyncClient.syncOnce(
            database: north, host: "127.0.0.1", port: server.port, tls: northTLS, options: northOptions)
        #expect(try ids("orders") == [] && ids("order_line") == [])
        #expect(try await eventually(within: .seconds(60)) { evicted.value == 1 }, "observed as evict")

        // A write outside north's scope is refused by the hub, and recorded on north.
        try north.execute("INSERT INTO orders (id, site, status) VALUES (9, 'south', 'open')")
        let summary = try await SyncClient.syncOnce(
            database: north, host: "127.0.0.1", port: server.port, tls: northTLS, options: northOptions)
        print(summary.refusedByPeer, try north.refusedChanges())  // 1 [change … to orders [9] refused: …]
        // (end of the README's code)
        leaving.cancel()

        #expect(summary.refusedByPeer == 1)
        #expect(try north.refusedChanges().map(\.key) == [[.integer(9)]])
        #expect(
            try hub.fetchValue("SELECT count(*) FROM orders WHERE id = 9", as: Int.self) == 0,
            "nothing of it written on the hub")
        _ = try await SyncClient.syncOnce(
            database: north, host: "127.0.0.1", port: server.port, tls: northTLS, options: northOptions)
        #expect(try ids("orders") == [], "north holds exactly its scope of the hub again")
        try await server.stop()
    }
}

/// The "Who a peer is" example of HowItWorks.md, kept true: rules name certificates.
@Suite("Docs: who a peer is")
struct HowItWorksPeerRulesExampleTests {
    @Test("the article's peer rules find peers by common name and by fingerprint, and refuse the others")
    func peerRules() {
        var options = SyncOptions()
        options.peers[.name("node-b")] = PeerPolicy(readOnly: true)  // by common name
        options.peers[.fingerprint("3f2a…")] = PeerPolicy(allowedTables: ["player"])  // by certificate
        options.peers.acceptsOthers = false  // only the peers named

        let unknownFingerprint = String(repeating: "0", count: 64)
        #expect(
            options.peers.policy(for: PeerIdentity(name: "node-b", fingerprint: unknownFingerprint))?.readOnly == true)
        #expect(options.peers.policy(for: PeerIdentity(name: nil, fingerprint: "3f2a…"))?.allowedTables == ["player"])
        // A peer no rule names is refused, whatever instance key it declares.
        #expect(options.peers.policy(for: PeerIdentity(name: "node-c", fingerprint: unknownFingerprint)) == nil)
    }
}
