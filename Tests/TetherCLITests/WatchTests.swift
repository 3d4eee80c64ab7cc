import Foundation
import Testing
import TetherTestSupport

#if canImport(Glibc)
    import Glibc
#endif

/// `tether watch`: the change feed of a database that `tether serve` keeps in sync in another process.
@Suite("tether watch", .serialized)
struct WatchTests {
    @Test("prints a change made on a peer within a second of its commit there, as JSON")
    func printsAPeersChange() throws {
        let fixture = try ServeFixture()
        let processes = ServeProcesses()
        defer { processes.killAll() }
        let (a, flagsA) = try fixture.node("a")
        let (b, flagsB) = try fixture.node("b")
        let nodeA = try processes.start(fixture.serveArguments(db: a, flags: flagsA))
        let listeningA = try #require(nodeA.waitForListening(), "\(nodeA.summary)")
        let nodeB = try processes.start(
            fixture.serveArguments(
                db: b, flags: flagsB,
                peers: [listeningA.port]))
        let listeningB = try #require(nodeB.waitForListening(), "\(nodeB.summary)")
        let watch = try processes.start(["watch", "--db", a, "--json", "--table", "t", "--poll-interval", "20"])
        _ = try #require(watch.waitForLine(containing: "watching", onStderr: true), "\(watch.summary)")
        // A change made on A itself, by another process.
        let local = try tether("sql", "--db", a, "INSERT INTO t (id, body, n) VALUES (1, 'made on A', 1)")
        try #require(local.status == 0, "\(local)")
        let first = try #require(watch.waitForLine(containing: "\"key\":[1]"), "\(watch.summary)")
        // An insert, even once the peer acknowledged it (which marks the row synced before the watch may look).
        #expect(
            first.contains("\"table\":\"t\"") && first.contains("\"origin\":\"local\"")
                && first.contains("\"kind\":\"insert\""), "\(first)")

        let written = Date()
        let remote = try tether("sql", "--db", b, "INSERT INTO t (id, body, n) VALUES (2, 'made on B', 2)")
        try #require(remote.status == 0, "\(remote)")
        let line = try #require(
            watch.waitForLine(containing: "\"key\":[2]", timeout: 10),
            "\(watch.summary)\n\(nodeA.summary)\n\(nodeB.summary)")
        let elapsed = Date().timeIntervalSince(written)
        #expect(elapsed < 1, "the peer's change took \(elapsed) s to be printed")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["table"] as? String == "t")
        #expect(object["kind"] as? String == "insert", "a peer's insert of a new row")
        #expect(object["origin"] as? String == "peer")
        #expect(object["peer"] as? String == listeningB.key)
        #expect((object["sequence"] as? NSNumber) != nil)
        // The source transaction: B's, the same for the changes of one transaction there, apart from the others.
        func transaction(_ line: String) throws -> [String: String] {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            return try #require(object["transaction"] as? [String: String], "\(line)")
        }
        let madeOnA = try transaction(first), single = try transaction(line)
        #expect(madeOnA["origin"] == listeningA.key && madeOnA["timestamp"].flatMap(UInt64.init) != nil, "\(first)")
        #expect(single["origin"] == listeningB.key, "\(line)")
        let pair = try tether(
            "sql", "--db", b,
            "BEGIN; INSERT INTO t (id, body, n) VALUES (3, 'x', 3); "
                + "INSERT INTO t (id, body, n) VALUES (4, 'y', 4); COMMIT;")
        try #require(pair.status == 0, "\(pair)")
        let three = try #require(watch.waitForLine(containing: "\"key\":[3]", timeout: 10), "\(watch.summary)")
        let four = try #require(watch.waitForLine(containing: "\"key\":[4]", timeout: 10), "\(watch.summary)")
        #expect(try transaction(three) == transaction(four), "\(three)\n\(four)")
        #expect(try transaction(three)["origin"] == listeningB.key && transaction(three) != single)
        #expect(watch.stop() == 0, "\(watch.summary)")
    }
}
