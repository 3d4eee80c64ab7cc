import Foundation
import Logging
import MetricsTestKit
import Testing
import Tether
import TetherSync
import TetherTestSupport

/// Rows with the ids in `range` into `t` (of `makeSyncedDatabase`), in one transaction.
private func insert(_ db: Database, _ range: ClosedRange<Int>) throws {
    try db.write { conn in
        for id in range { try conn.execute("INSERT INTO t (id) VALUES (?)", [id]) }
    }
}

/// The total of the counter `name` (with `dimensions`), nil while it was never made.
private func total(_ metrics: TestMetrics, _ name: String, _ dimensions: [(String, String)] = []) -> Int64? {
    try? metrics.expectCounter(name, dimensions).totalValue
}

@Suite("A sync server collects garbage by itself (SyncOptions.garbageCollection)", .serialized)
struct ScheduledGarbageCollectionTests {
    @Test(
        """
        11,000 rows deleted on a server with no schedule: the deletes call a run, which collects once the live \
        client acknowledged them, in runs cut by the time limit; the metrics count the runs, the tombstones and \
        the time
        """)
    func largeDeletesCallARun() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...12_000)
        let metrics = TestMetrics()
        var options = SyncOptions.patientServer
        options.metricsFactory = metrics
        // No run on a schedule; one step (5,000 tombstones) per run.
        options.garbageCollection = GarbageCollectionSchedule(
            interval: nil, timeLimit: .nanoseconds(1), catchUpDelay: .milliseconds(100))

        try await withSyncServer(server, pki: pki, options: options) { syncServer in
            let connection = try await SyncClient.connect(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
            #expect(try client.fetchValue("SELECT count(*) FROM t", as: Int.self) == 12_000)
            #expect(
                try metrics.expectGauge(SyncMetrics.Name.gcTombstonesKept).lastValue == 0,
                "recorded as the server started")

            try server.execute("DELETE FROM t WHERE id <= 11000")
            let collected = try await eventually(checkingEvery: .milliseconds(50)) {
                try server.tombstoneCount() == 0
            }
            #expect(collected, "tombstones left: \(String(describing: try? server.tombstoneCount()))")
            #expect(try client.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1_000)
            _ = try await connection.stop()
        }

        #expect(total(metrics, SyncMetrics.Name.gcTombstonesRemoved) == 11_000)
        let partial = total(metrics, SyncMetrics.Name.gcRuns, [("result", "partial")]) ?? 0
        let complete = total(metrics, SyncMetrics.Name.gcRuns, [("result", "complete")]) ?? 0
        // 5,000 a run at the most: two runs stopped at the limit at least, and the last one complete.
        #expect(partial >= 2 && complete >= 1, "partial \(partial), complete \(complete)")
        #expect(total(metrics, SyncMetrics.Name.gcRuns, [("result", "failed")]) == nil)
        #expect(try metrics.expectTimer(SyncMetrics.Name.gcRunSeconds).values.count == Int(partial + complete))
        #expect(try metrics.expectGauge(SyncMetrics.Name.gcTombstonesKept).lastValue == 0)
        #expect(total(metrics, SyncMetrics.Name.gcPeersForgotten) == 0)
    }

    @Test(
        """
        a peer not seen for longer than the horizon is forgotten by a scheduled run: logged at notice with its \
        certificate, counted, shown by peers(); the tombstones it held back go
        """)
    func peerBeyondTheHorizonForgotten() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...10)
        // A first session makes the client a known peer; the server deletes after it, unacknowledged.
        _ = try await runServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        try server.execute("DELETE FROM t WHERE id <= 4")
        #expect(try server.tombstoneCount(after: try #require(try server.peers().first).acknowledgedThrough) == 4)
        // Last seen 40 days ago, as if the client had gone away then.
        try server.execute("UPDATE tether_peers SET last_seen = last_seen - 40 * 86400")

        let log = LogRecorder()
        let metrics = TestMetrics()
        var options = SyncOptions.patientServer
        options.logger = log.logger(level: .info)
        options.metricsFactory = metrics
        options.garbageCollection.interval = .milliseconds(100)
        try await withSyncServer(server, pki: pki, options: options) { _ in
            let forgotten = try await eventually {
                total(metrics, SyncMetrics.Name.gcPeersForgotten) == 1
            }
            #expect(forgotten, "\(log.entries)")
        }

        #expect(try server.peers().first?.forgotten != nil)
        #expect(try server.tombstoneCount() == 0)
        let notice = log.entries.first { $0.message.hasPrefix("forgot peer \(client.instanceKey)") }
        #expect(notice?.level == .notice, "\(log.entries)")
        #expect(
            notice?.metadata["tether.peer_name"] == "node-client"
                && notice?.metadata["tether.peer_fingerprint"]?.count == 64, "\(String(describing: notice))")
        let run = log.entries.first { $0.message.hasPrefix("garbage collection removed 4 tombstone(s)") }
        #expect(run?.level == .info && run?.metadata["tether.gc.trigger"] == "scheduled", "\(log.entries)")
        #expect(total(metrics, SyncMetrics.Name.gcTombstonesRemoved) == 4)
        // The runs after it found nothing: logged at debug, so not here.
        #expect(log.entries.filter { $0.message.hasPrefix("garbage collection removed") }.count == 1, "\(log.entries)")
    }

    @Test("a peer unseen for more than three quarters of the horizon is logged once as close to it, and not forgotten")
    func peerCloseToTheHorizonLogged() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...3)
        _ = try await runServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        try server.execute("UPDATE tether_peers SET last_seen = last_seen - 25 * 86400")

        let log = LogRecorder()
        var options = SyncOptions.patientServer
        options.logger = log.logger(level: .info)
        options.garbageCollection.interval = .milliseconds(50)
        let closeToIt = {
            log.entries.filter { $0.message.hasPrefix("peer \(client.instanceKey) (node-client) was last seen") }
        }
        try await withSyncServer(server, pki: pki, options: options) { _ in
            // Several runs go by; the peer is told of once.
            let logged = try await eventually {
                log.entries.filter { $0.message.hasPrefix("garbage collection") }.isEmpty && closeToIt().count == 1
            }
            #expect(logged, "\(log.entries)")
        }
        #expect(closeToIt().count == 1, "\(log.entries)")
        #expect(closeToIt().first?.level == .notice)
        // Five days of thirty left, less the moments the test took.
        #expect(
            closeToIt().first?.message.hasSuffix("it is forgotten in 119 h unless it syncs") == true, "\(closeToIt())")
        #expect(try server.peers().first?.forgotten == nil)
    }

    @Test("GarbageCollectionSchedule.never: no run at all, whatever is deleted")
    func neverRuns() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        try insert(server, 1...10_500)
        let metrics = TestMetrics()
        var options = SyncOptions.patientServer
        options.metricsFactory = metrics
        options.garbageCollection = .never
        try await withSyncServer(server, pki: pki, options: options) { syncServer in
            try server.execute("DELETE FROM t")
            // A session after the deletes: their commit has reached the server's monitor by then.
            _ = try await SyncClient.syncOnce(
                database: try makeSyncedDatabase(), host: "127.0.0.1", port: syncServer.port,
                tls: try pki.clientContext())
        }
        #expect(try server.tombstoneCount() == 10_500)
        #expect(metrics.counters(label: SyncMetrics.Name.gcRuns).isEmpty)
    }
}
