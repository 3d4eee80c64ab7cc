import Foundation
import Testing
import TetherTestSupport

// A rolling upgrade of three `tether serve` nodes (issue 12): each is stopped, migrated (a column
// added to the synced table, a new synced table) and restarted in turn, while all of them take writes.

/// Rows of `sql` on `db` as "v1|v2|…" (columns in name order, NULL as "null"); nil when the query
/// failed (busy for a moment).
private func rows(_ db: String, _ sql: String) throws -> [String]? {
    let result = try tether("sql", "--db", db, sql, "--json")
    guard result.status == 0 else { return nil }
    return try jsonRows(result.stdout).map { row in
        row.keys.sorted().map { key in row[key].map { $0 is NSNull ? "null" : "\($0)" } ?? "null" }.joined(separator: "|")
    }
}

private func write(_ db: String, _ sql: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
    let result = try tether("sql", "--db", db, sql)
    #expect(result.status == 0, "\(result)", sourceLocation: sourceLocation)
}

@Suite("tether serve: rolling upgrade", .serialized)
struct ServeRollingUpgradeTests {
    @Test("three nodes in a line A–B–C upgraded one at a time while all take writes: they keep syncing what they share, and end with every row and every value")
    func rollingUpgradeOfThreeNodes() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let names = ["a", "b", "c"]
        var databases: [String] = []
        var flags: [[String]] = []
        for name in names {
            let (db, nodeFlags) = try fixture.node(name)
            databases.append(db)
            flags.append(nodeFlags)
        }
        let upgrade = fixture.directory.file("upgrade")
        try FileManager.default.createDirectory(atPath: upgrade, withIntermediateDirectories: true)
        _ = try fixture.directory.write("upgrade/002-color-and-tag.sql", """
            ALTER TABLE t ADD COLUMN color TEXT;
            CREATE TABLE tag (id INTEGER PRIMARY KEY, label TEXT NOT NULL);
            """)

        // A–B–C: B dials A, C dials B; a restarted node listens on its port again.
        var running: [ServeProcess?] = [nil, nil, nil]
        var ports: [Int] = [0, 0, 0]
        func start(_ index: Int) throws {
            let peers = index == 0 ? [] : ["--peer", "127.0.0.1:\(ports[index - 1])"]
            let node = try nodes.start(["serve", "--db", databases[index], "--listen", "127.0.0.1:\(ports[index])"] + flags[index] + peers)
            let listening = try #require(node.waitForListening(timeout: 30), "\(node.summary)")
            ports[index] = listening.port
            running[index] = node
        }
        for index in 0..<3 { try start(index) }

        var next = 0
        /// A row inserted on each node (running or stopped): the writes go on throughout.
        func writeEverywhere(upgraded: Set<Int>) throws {
            for index in 0..<3 {
                next += 1
                if upgraded.contains(index) {
                    try write(databases[index], "INSERT INTO t (id, body, n, color) VALUES (\(next), '\(names[index])\(next)', \(next), 'c\(next)')")
                } else {
                    try write(databases[index], "INSERT INTO t (id, body, n) VALUES (\(next), '\(names[index])\(next)', \(next))")
                }
            }
        }
        /// Waits until `query` gives the same rows on `indices`, and they are `count` rows when given.
        func expectConverged(_ query: String, on indices: [Int], count: Int? = nil, step: String,
                             sourceLocation: SourceLocation = #_sourceLocation) throws {
            var last: [[String]?] = []
            let converged = try eventually(within: .seconds(60), checkingEvery: .milliseconds(200)) {
                last = try indices.map { try rows(databases[$0], query) }
                guard let first = last.first ?? nil, last.allSatisfy({ $0 == first }) else { return false }
                return count.map { first.count == $0 } ?? true
            }
            #expect(converged, """
                \(step): not converged in 60 s on \(query)
                \(zip(indices, last).map { "\(names[$0]): \($1 ?? ["(query failed)"])" }.joined(separator: "\n"))
                \(running.compactMap { $0?.summary }.joined(separator: "\n"))
                """, sourceLocation: sourceLocation)
        }
        let shared = "SELECT id, body, n FROM t ORDER BY id"

        try writeEverywhere(upgraded: [])
        try expectConverged(shared, on: [0, 1, 2], count: 3, step: "before the upgrade")

        var upgraded = Set<Int>()
        for index in 0..<3 {
            let step = "upgrading \(names[index])"
            let stopped = running[index]?.stop()
            #expect(stopped == 0, "\(running[index]?.summary ?? "")")
            try writeEverywhere(upgraded: upgraded)
            let migrated = try tether("init", "--db", databases[index], "--schema", upgrade, "--sync", "t,tag")
            #expect(migrated.status == 0, "\(migrated)")
            upgraded.insert(index)
            try start(index)
            // New-column values on old rows and new rows, and rows of the new table, on the upgraded node.
            try write(databases[index], "UPDATE t SET color = 'set on \(names[index])' WHERE id = \(index + 1)")
            try write(databases[index], "INSERT INTO tag (id, label) VALUES (\(index + 1), 'tag of \(names[index])')")
            try writeEverywhere(upgraded: upgraded)
            // Everyone keeps syncing what they share, whoever is upgraded.
            try expectConverged(shared, on: [0, 1, 2], count: next, step: step)
            if index > 0 {
                // Upgraded neighbours (A, then A and B, then all) share the new column and table too.
                try expectConverged("SELECT id, color FROM t ORDER BY id", on: Array(0...index), step: step)
                try expectConverged("SELECT id, label FROM tag ORDER BY id", on: Array(0...index), count: index + 1, step: step)
            }
            if index == 0 {
                // B, not upgraded, tells how A's schema differs from its own.
                let status = try tether("status", "--db", databases[1], "--json")
                #expect(status.stdout.contains("column color is synced by the peer, not here")
                        && status.stdout.contains("table tag is synced by the peer, not here"), "\(status)")
            }
        }

        // The end: every row and every value of the new column and table on every node.
        try expectConverged("SELECT id, body, n, color FROM t ORDER BY id", on: [0, 1, 2], count: next, step: "after the upgrade")
        try expectConverged("SELECT id, label FROM tag ORDER BY id", on: [0, 1, 2], count: 3, step: "after the upgrade")
        let colors = try rows(databases[2], "SELECT id || ':' || color AS v FROM t WHERE id <= 3 ORDER BY id")
        #expect(colors == ["1:set on a", "2:set on b", "3:set on c"], "\(String(describing: colors))")
        // Every row inserted with a color kept it: by the upgraded nodes, 0 + 1 (A) + 1 + 2 (B) + 2 + 3 (C).
        let withColor = try rows(databases[0], "SELECT count(*) AS n FROM t WHERE color LIKE 'c%'")
        #expect(withColor == ["9"], "\(String(describing: withColor))")
        for node in running.compactMap({ $0 }) {
            #expect(node.stop() == 0, "\(node.summary)")
            #expect(!node.stderr.contains("error"), "\(node.summary)")
        }
    }
}
