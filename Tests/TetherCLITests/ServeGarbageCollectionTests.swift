import Foundation
import Testing
import TetherTestSupport

/// `tether status --json` of `db` as an object; nil when the command failed (the database busy for a moment).
private func status(_ db: String) throws -> [String: Any]? {
    let result = try tether("status", "--db", db, "--json")
    guard result.status == 0 else { return nil }
    return try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
}

@Suite("tether serve collects garbage by itself", .serialized)
struct ServeGarbageCollectionTests {
    @Test(
        """
        a pair with --gc-interval 1s: rows deleted on one side, applied by the other and acknowledged both ways \
        leave no tombstone on either, with no command run by hand; the runs are logged
        """)
    func tombstonesCollectedByARunningPair() async throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (a, flagsA) = try fixture.node("a")
        let (b, flagsB) = try fixture.node("b")
        let gc = ["--gc-interval", "1s", "--log-level", "info"]
        let nodeA = try nodes.start(fixture.serveArguments(db: a, flags: flagsA + gc + ["--metrics", "127.0.0.1:0"]))
        let listeningA = try #require(nodeA.waitForListening(), "\(nodeA.summary)")
        let metricsLine = try #require(nodeA.waitForLine(startingWith: "metrics on "), "\(nodeA.summary)")
        let metricsPort = try #require(metricsLine.split(separator: ":").last.flatMap { Int($0) }, "\(metricsLine)")
        let nodeB = try nodes.start(fixture.serveArguments(db: b, flags: flagsB + gc, peers: [listeningA.port]))
        _ = try #require(nodeB.waitForListening(), "\(nodeB.summary)")

        let insert = try tether(
            "sql", "--db", a,
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50) INSERT INTO t (id, body, \
            n) SELECT i, 'row', i FROM n
            """)
        #expect(insert.status == 0, "\(insert)")
        #expect(
            try await eventually(checkingEvery: .milliseconds(100)) { try count(b) == 50 },
            "\(nodeB.summary)")
        let delete = try tether("sql", "--db", a, "DELETE FROM t WHERE id <= 20")
        #expect(delete.stdout == "20 rows changed\n", "\(delete)")
        #expect(
            try await eventually(checkingEvery: .milliseconds(100)) { try count(b) == 30 },
            "\(nodeB.summary)")
        // Both nodes collect on their own schedule, once each has its peer's acknowledgement.
        var last: [[String: Any]?] = []
        let collected = try await eventually(checkingEvery: .milliseconds(200)) {
            last = try [a, b].map(status)
            return last.allSatisfy { ($0?["tombstones"] as? NSNumber)?.intValue == 0 }
        }
        #expect(
            collected, "tombstones left: \(last.map { $0?["tombstones"] ?? "?" })\n\(nodeA.summary)\n\(nodeB.summary)")
        for object in last {
            let peers = object?["peers"] as? [[String: Any]] ?? []
            #expect(
                peers.count == 1 && (peers.first?["tombstonesHeldBack"] as? NSNumber)?.intValue == 0,
                "\(String(describing: object))")
            #expect(
                peers.first?["forgotten"] is NSNull
                    && (object?["forgetPeersAfter"] as? NSNumber)?.intValue == 30 * 86_400)
        }
        // B only received: the tombstones of A's deletes waited for no acknowledgement of A's.
        #expect(try count(a) == 30 && count(b) == 30)
        // A's run that removed its 20 tombstones is logged at info, with the figures.
        let logged = nodeA.waitForLine(
            containing: "garbage collection removed 20 tombstone(s)", onStderr: true, timeout: 5)
        #expect(logged != nil, "\(nodeA.summary)")
        // And counted: the runs (each timed), the tombstones removed, none kept.
        let text = try httpGet(port: metricsPort, "/metrics").body
        let values = samples(text)
        #expect(values["tether_sync_gc_tombstones_removed_total"] == 20, "\(text)")
        #expect(
            values["tether_sync_gc_tombstones_kept"] == 0 && values["tether_sync_gc_peers_forgotten_total"] == 0,
            "\(text)")
        let runs = values["tether_sync_gc_runs_total{result=\"complete\"}"] ?? 0
        #expect(runs >= 1 && values["tether_sync_gc_run_seconds_count"] == runs, "\(text)")
        #expect(
            text.contains("# TYPE tether_sync_gc_run_seconds histogram\n")
                && text.contains("tether_sync_gc_run_seconds_bucket{le=\"0.0005\"}"), "\(text)")

        for node in [nodeB, nodeA] {
            #expect(node.stop() == 0, "\(node.summary)")
            #expect(!node.stderr.contains("error"), "\(node.summary)")
        }
    }
}
