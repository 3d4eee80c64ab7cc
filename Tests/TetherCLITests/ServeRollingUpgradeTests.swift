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
        row.keys.sorted().map { key in row[key].map { $0 is NSNull ? "null" : "\($0)" } ?? "null" }.joined(
            separator: "|")
    }
}

private func write(_ db: String, _ sql: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
    let result = try tether("sql", "--db", db, sql)
    #expect(result.status == 0, "\(result)", sourceLocation: sourceLocation)
}

/// Three `tether serve` nodes in a line A–B–C (B dials A, C dials B), each stopped, migrated by
/// `tether init --schema <upgrade>` and restarted in turn by the tests.
private final class ServeLine {
    let names = ["a", "b", "c"]
    let fixture: ServeFixture
    let nodes = ServeProcesses()
    var databases: [String] = []
    var flags: [[String]] = []
    var running: [ServeProcess?] = [nil, nil, nil]
    /// A restarted node listens on its port again.
    var ports = [0, 0, 0]
    /// The migration's directory.
    let upgrade: String

    init(upgrade migration: String) throws {
        fixture = try ServeFixture()
        for name in names {
            let (db, nodeFlags) = try fixture.node(name)
            databases.append(db)
            flags.append(nodeFlags)
        }
        upgrade = fixture.directory.file("upgrade")
        try FileManager.default.createDirectory(atPath: upgrade, withIntermediateDirectories: true)
        _ = try fixture.directory.write("upgrade/002-upgrade.sql", migration)
        for index in 0..<3 { try start(index) }
    }

    deinit { nodes.killAll() }

    func start(_ index: Int) throws {
        let peers = index == 0 ? [] : ["--peer", "127.0.0.1:\(ports[index - 1])"]
        let node = try nodes.start(
            ["serve", "--db", databases[index], "--listen", "127.0.0.1:\(ports[index])"] + flags[index] + peers)
        let listening = try #require(node.waitForListening(timeout: 30), "\(node.summary)")
        ports[index] = listening.port
        running[index] = node
    }

    /// Stops node `index`, runs the migration on its database (syncing `tables`) and starts it again.
    func upgrade(
        _ index: Int, syncing tables: String, whileStopped: () throws -> Void = {},
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let stopped = running[index]?.stop()
        #expect(stopped == 0, "\(running[index]?.summary ?? "")", sourceLocation: sourceLocation)
        try whileStopped()
        let migrated = try tether("init", "--db", databases[index], "--schema", upgrade, "--sync", tables)
        #expect(migrated.status == 0, "\(migrated)", sourceLocation: sourceLocation)
        try start(index)
    }

    /// Waits until `query` gives the same rows on `indices`, and they are `count` rows when given.
    func expectConverged(
        _ query: String, on indices: [Int] = [0, 1, 2], count: Int? = nil, step: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws {
        var last: [[String]?] = []
        let converged = try await eventually(within: .seconds(60), checkingEvery: .milliseconds(200)) {
            last = try indices.map { try rows(databases[$0], query) }
            guard let first = last.first ?? nil, last.allSatisfy({ $0 == first }) else { return false }
            return count.map { first.count == $0 } ?? true
        }
        #expect(
            converged,
            """
            \(step): not converged in 60 s on \(query)
            \(zip(indices, last).map { "\(names[$0]): \($1 ?? ["(query failed)"])" }.joined(separator: "\n"))
            \(running.compactMap { $0?.summary }.joined(separator: "\n"))
            """, sourceLocation: sourceLocation)
    }

    /// Stops every node: each ends by itself, having logged nothing at level error or above (a
    /// neighbour stopped for its upgrade is only a warning: "link down").
    func stopAll(sourceLocation: SourceLocation = #_sourceLocation) {
        for node in running.compactMap({ $0 }) {
            #expect(node.stop() == 0, "\(node.summary)", sourceLocation: sourceLocation)
            let errors = node.stderr.split(separator: "\n").filter { line in
                line.split(separator: " ", maxSplits: 2).dropFirst().first.map { ["error", "critical"].contains($0) }
                    == true
            }
            #expect(errors.isEmpty, "\(node.summary)", sourceLocation: sourceLocation)
        }
    }
}

@Suite("tether serve: rolling upgrade", .serialized)
struct ServeRollingUpgradeTests {
    @Test(
        """
        three nodes in a line A–B–C upgraded one at a time while all take writes: they keep syncing what they \
        share, and end with every row and every value
        """)
    func rollingUpgradeOfThreeNodes() async throws {
        let line = try ServeLine(
            upgrade: """
                ALTER TABLE t ADD COLUMN color TEXT;
                CREATE TABLE tag (id INTEGER PRIMARY KEY, label TEXT NOT NULL);
                """)
        let databases = line.databases, names = line.names
        var next = 0
        /// A row inserted on each node (running or stopped): the writes go on throughout.
        func writeEverywhere(upgraded: Set<Int>) throws {
            for index in 0..<3 {
                next += 1
                if upgraded.contains(index) {
                    try write(
                        databases[index],
                        """
                        INSERT INTO t (id, body, n, color) VALUES (\(next), '\(names[index])\(next)', \(next), \
                        'c\(next)')
                        """)
                } else {
                    try write(
                        databases[index],
                        "INSERT INTO t (id, body, n) VALUES (\(next), '\(names[index])\(next)', \(next))")
                }
            }
        }
        let shared = "SELECT id, body, n FROM t ORDER BY id"

        try writeEverywhere(upgraded: [])
        try await line.expectConverged(shared, count: 3, step: "before the upgrade")

        var upgraded = Set<Int>()
        for index in 0..<3 {
            let step = "upgrading \(names[index])"
            try line.upgrade(index, syncing: "t,tag", whileStopped: { try writeEverywhere(upgraded: upgraded) })
            upgraded.insert(index)
            // New-column values on old rows and new rows, and rows of the new table, on the upgraded node.
            try write(databases[index], "UPDATE t SET color = 'set on \(names[index])' WHERE id = \(index + 1)")
            try write(databases[index], "INSERT INTO tag (id, label) VALUES (\(index + 1), 'tag of \(names[index])')")
            try writeEverywhere(upgraded: upgraded)
            // Everyone keeps syncing what they share, whoever is upgraded.
            try await line.expectConverged(shared, count: next, step: step)
            if index > 0 {
                // Upgraded neighbours (A, then A and B, then all) share the new column and table too.
                try await line.expectConverged("SELECT id, color FROM t ORDER BY id", on: Array(0...index), step: step)
                try await line.expectConverged(
                    "SELECT id, label FROM tag ORDER BY id", on: Array(0...index), count: index + 1, step: step)
            }
            if index == 0 {
                // B, not upgraded, tells how A's schema differs from its own.
                let status = try tether("status", "--db", databases[1], "--json")
                #expect(
                    status.stdout.contains("column color is synced by the peer, not here")
                        && status.stdout.contains("table tag is synced by the peer, not here"), "\(status)")
            }
        }

        // The end: every row and every value of the new column and table on every node.
        try await line.expectConverged(
            "SELECT id, body, n, color FROM t ORDER BY id", count: next, step: "after the upgrade")
        try await line.expectConverged("SELECT id, label FROM tag ORDER BY id", count: 3, step: "after the upgrade")
        let colors = try rows(databases[2], "SELECT id || ':' || color AS v FROM t WHERE id <= 3 ORDER BY id")
        #expect(colors == ["1:set on a", "2:set on b", "3:set on c"], "\(String(describing: colors))")
        // Every row inserted with a color kept it: by the upgraded nodes, 0 + 1 (A) + 1 + 2 (B) + 2 + 3 (C).
        let withColor = try rows(databases[0], "SELECT count(*) AS n FROM t WHERE color LIKE 'c%'")
        #expect(withColor == ["9"], "\(String(describing: withColor))")
        line.stopAll()
    }

    @Test("the far end upgraded first (issue 34): A ends with the value C wrote before A and B had the column")
    func upgradedFromTheFarEnd() async throws {
        let line = try ServeLine(upgrade: "ALTER TABLE t ADD COLUMN color TEXT;")
        let (a, c) = (line.databases[0], line.databases[2])
        try write(a, "INSERT INTO t (id, body, n) VALUES (1, 'v1-a', 1)")
        try await line.expectConverged("SELECT id, body, n FROM t ORDER BY id", count: 1, step: "before the upgrade")

        try line.upgrade(2, syncing: "t")
        try write(c, "INSERT INTO t (id, body, n, color) VALUES (2, 'v2-c', 2, 'red')")
        try write(c, "UPDATE t SET color = 'blue' WHERE id = 1")
        try write(a, "INSERT INTO t (id, body, n) VALUES (3, 'mid-a', 3)")
        try await line.expectConverged("SELECT id, body, n FROM t ORDER BY id", count: 3, step: "C upgraded")

        try line.upgrade(1, syncing: "t")
        try line.upgrade(0, syncing: "t")
        try write(a, "UPDATE t SET color = 'green' WHERE id = 3")
        let all = "SELECT id, body, n, color FROM t ORDER BY id"
        try await line.expectConverged(all, count: 3, step: "all upgraded")
        let colors = "SELECT id || ':' || coalesce(color, 'none') AS v FROM t ORDER BY id"
        #expect(try rows(a, colors) == ["1:blue", "2:red", "3:green"])
        line.stopAll()
    }
}
