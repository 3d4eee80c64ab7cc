import CSQLite
import Foundation
import Testing

@testable import Tether
import TetherTestSupport

/// Columns whose merge rule is `max` or `min`: the better value ever written wins on every peer.
@Suite struct OrderedColumnTests {
    static let schema = """
        CREATE TABLE devices (id TEXT PRIMARY KEY, last_seen INTEGER, first_seen INTEGER, best TEXT, name TEXT)
        """
    static let rules: [String: ColumnMergeRule] = ["last_seen": .maximum, "first_seen": .minimum, "best": .maximum]

    static func node(_ rules: [String: ColumnMergeRule] = Self.rules) throws -> Database {
        let db = try Database.inMemory()
        try db.execute(schema)
        try db.enableSync(table: "devices", columnRules: rules)
        return db
    }

    static func row(_ db: Database, _ id: String = "d1") throws -> [DatabaseValue] {
        try db.fetchRows("SELECT last_seen, first_seen, best, name FROM devices WHERE id = ?", [id])
            .first.map { row in (0..<4).map { row[$0] } } ?? []
    }

    /// b writes after a (perhaps in the same millisecond), worse on each column: the better values win, and the
    /// other column keeps last-writer-wins.
    @Test func theBetterValueWinsWhicheverIsLater() throws {
        let a = try Self.node(), b = try Self.node()
        try a.execute("INSERT INTO devices VALUES ('d1', 100, 100, 'b', 'first')")
        try sendChanges(from: a, to: b)
        try a.execute("UPDATE devices SET last_seen = 500, first_seen = 50, best = 'z', name = 'from a'")
        try b.execute("UPDATE devices SET last_seen = 300, first_seen = 80, best = 'c', name = 'from b'")
        try CounterColumnTests.exchange(a, b)
        // The name: whichever write is later by the clocks (both may fall in one millisecond).
        let name = try Self.row(a)[3]
        #expect(name == .text("from a") || name == .text("from b"))
        let expected: [DatabaseValue] = [.integer(500), .integer(50), .text("z"), name]
        #expect(try Self.row(a) == expected)
        #expect(try Self.row(b) == expected)
    }

    /// Without the rules, the later write wins: the high-water mark goes down (what the rules are for).
    @Test func withoutTheRulesTheLaterWriteWins() throws {
        let a = try Self.node([:]), b = try Self.node([:])
        try a.execute("INSERT INTO devices VALUES ('d1', 100, 100, 'b', 'first')")
        try sendChanges(from: a, to: b)
        try a.execute("UPDATE devices SET last_seen = 500")
        try sendChanges(from: a, to: b)  // b's write is then the later
        try b.execute("UPDATE devices SET last_seen = 300")
        try CounterColumnTests.exchange(a, b)
        #expect(try Self.row(a)[0] == .integer(300))
        #expect(try Self.row(b)[0] == .integer(300))
    }

    /// A value merged from an older, better write gets a version of the merging peer's: a third
    /// peer that held the losing write at its version still receives the better value (a change
    /// that leaves out columns the receiver holds at the same version would otherwise skip it).
    @Test func aMergedValueReachesAPeerThatHeldTheOlderPair() throws {
        let a = try Self.node(), b = try Self.node(), c = try Self.node()
        try a.execute("INSERT INTO devices VALUES ('d1', 100, 100, 'b', 'first')")
        try sendChanges(from: a, to: b)
        try sendChanges(from: a, to: c)
        try a.execute("UPDATE devices SET last_seen = 900")
        try b.execute("UPDATE devices SET last_seen = 200, name = 'b'")
        try sendChanges(from: b, to: c)  // c holds 200 at b's version
        try sendChanges(from: a, to: b)  // b: 900 is better, b's version later: merged
        try sendChanges(from: b, to: c)
        #expect(try Self.row(c)[0] == .integer(900))
        for _ in 0..<2 {
            try CounterColumnTests.exchange(a, b)
            try CounterColumnTests.exchange(b, c)
        }
        for db in [a, b, c] { #expect(try Self.row(db) == Self.row(a)) }
        #expect(try Self.row(a)[0] == .integer(900))
        #expect(try Self.row(a)[3] == .text("b"))
    }

    /// Concurrent writes on three peers delivered in every order of pairs reach one state.
    @Test func everyOrderOfDeliveryConverges() throws {
        let orders: [[(Int, Int)]] = [
            [(0, 1), (1, 2), (2, 0), (0, 1), (1, 2)], [(2, 1), (1, 0), (0, 2), (2, 1), (1, 0)],
            [(1, 0), (2, 0), (0, 1), (0, 2), (1, 2), (2, 1)],
        ]
        for order in orders {
            let nodes = try (0..<3).map { _ in try Self.node() }
            try nodes[0].execute("INSERT INTO devices VALUES ('d1', 10, 10, 'm', 'n')")
            try sendChanges(from: nodes[0], to: nodes[1])
            try sendChanges(from: nodes[0], to: nodes[2])
            try nodes[0].execute("UPDATE devices SET last_seen = 40, first_seen = 9, best = 'q'")
            try nodes[1].execute("UPDATE devices SET last_seen = 70, first_seen = 5, best = 'n'")
            try nodes[2].execute("UPDATE devices SET last_seen = 55, first_seen = 7, best = 'zz'")
            try CounterColumnTests.deliver(among: nodes, first: order)
            let expected: [DatabaseValue] = [.integer(70), .integer(5), .text("zz"), .text("n")]
            for node in nodes { #expect(try Self.row(node) == expected) }
        }
    }

    /// A local write that makes the value worse is refused, its statement undone, as the rule
    /// would undo it at the next sync; the same written as `max(…)` changes nothing.
    @Test func aWorseLocalWriteIsRefused() throws {
        let a = try Self.node()
        try a.execute("INSERT INTO devices VALUES ('d1', 100, 100, 'b', 'first')")
        #expect {
            try a.execute("UPDATE devices SET last_seen = 99")
        } throws: { error in
            "\(error)".contains("last_seen of devices is merged as max: a write may only raise it")
        }
        #expect(throws: SyncError.self) { try a.execute("UPDATE devices SET first_seen = 101") }
        #expect(throws: SyncError.self) { try a.execute("UPDATE devices SET last_seen = NULL") }
        #expect(try Self.row(a) == [.integer(100), .integer(100), .text("b"), .text("first")])
        try a.execute("UPDATE devices SET last_seen = max(last_seen, 99), first_seen = min(first_seen, 80)")
        #expect(try Self.row(a) == [.integer(100), .integer(80), .text("b"), .text("first")])
        // The transaction that held the refused statement is undone whole.
        #expect(throws: SyncError.self) {
            try a.write { conn in
                try conn.execute("UPDATE devices SET name = 'renamed'")
                try conn.execute("UPDATE devices SET best = 'a'")
            }
        }
        #expect(try Self.row(a)[3] == .text("first"))
    }

    /// Other programs' writes (the capture triggers) are held to the same rule.
    @Test func anotherProgramsWorseWriteIsRefused() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("devices.sqlite")
        let a = try Database(path: path)
        defer { try? a.close() }
        try a.execute(Self.schema)
        try a.enableSync(table: "devices", capturingExternalWrites: true, columnRules: Self.rules)
        let b = try Self.node()
        try a.execute("INSERT INTO devices VALUES ('d1', 100, 100, 'b', 'first')")
        var shell: OpaquePointer?
        try #require(sqlite3_open_v2(path, &shell, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK)
        defer { sqlite3_close(shell) }
        #expect(sqlite3_exec(shell, "UPDATE devices SET last_seen = 50", nil, nil, nil) == SQLITE_CONSTRAINT)
        #expect(sqlite3_exec(shell, "UPDATE devices SET best = NULL", nil, nil, nil) == SQLITE_CONSTRAINT)
        #expect(sqlite3_exec(shell, "UPDATE devices SET last_seen = 700, first_seen = 20", nil, nil, nil) == SQLITE_OK)
        try b.execute("INSERT INTO devices VALUES ('d1', 650, 30, 'c', 'b')")
        try CounterColumnTests.exchange(a, b)
        #expect(try Self.row(a) == Self.row(b))
        #expect(try Self.row(a)[0] == .integer(700))
        #expect(try Self.row(a)[1] == .integer(20))
        #expect(try Self.row(a)[2] == .text("c"))
    }

    /// A table WITHOUT ROWID, whose writes (the library's too) only its triggers see: the same rule.
    @Test func aTableWithoutRowidKeepsTheRule() throws {
        func node() throws -> Database {
            let db = try Database.inMemory()
            try db.execute("CREATE TABLE marks (id TEXT PRIMARY KEY, high INTEGER) WITHOUT ROWID")
            try db.enableSync(table: "marks", columnRules: ["high": .maximum])
            return db
        }
        let a = try node(), b = try node()
        try a.execute("INSERT INTO marks VALUES ('m', 5)")
        try sendChanges(from: a, to: b)
        #expect(throws: DatabaseError.self) { try a.execute("UPDATE marks SET high = 4") }
        try a.execute("UPDATE marks SET high = 30")
        try sendChanges(from: a, to: b)  // b then writes later, and less
        try b.execute("UPDATE marks SET high = max(high, 20)")
        try b.execute("INSERT OR REPLACE INTO marks VALUES ('m', 12)")  // a new row: its value is free
        try CounterColumnTests.exchange(a, b)
        for db in [a, b] { #expect(try db.fetchValue("SELECT high FROM marks", as: Int64.self) == 30) }
    }

    /// The rules need the last-writer-wins policy (another decides whole rows), and value columns.
    @Test func rulesAreCheckedWhenTheTableIsSynced() throws {
        let db = try Database.inMemory()
        try db.execute(Self.schema)
        #expect {
            try db.enableSync(table: "devices", policy: .localWins, columnRules: ["last_seen": .maximum])
        } throws: { error in
            "\(error)".contains("only under the lastWriterWins policy")
        }
        #expect(throws: SyncError.self) { try db.enableSync(table: "devices", columnRules: ["id": .minimum]) }
    }

    /// SQLite's order, made total: NULL, numbers (an integer before an equal real), texts by
    /// bytes, blobs.
    @Test func valuesAreOrderedAsSQLiteOrdersThem() {
        let ascending: [DatabaseValue] = [
            .null, .real(-1e300), .integer(Int64.min), .integer(-3), .real(-2.5), .integer(-2), .real(-2),
            .integer(0), .real(0.5), .integer(1), .real(1), .real(1.5), .integer(Int64.max), .real(1e19),
            .text(""), .text("B"), .text("a"), .text("ab"), .text("é"), .blob(Data()), .blob(Data([0])),
        ]
        for (i, a) in ascending.enumerated() {
            for (j, b) in ascending.enumerated() {
                let order = ValueOrder.compare(a, b)
                #expect(i < j ? order < 0 : (i == j ? order == 0 : order > 0), "\(a) against \(b)")
            }
        }
        #expect(ColumnMergeRule.maximum.prefers(.integer(1), over: .null))
        #expect(ColumnMergeRule.minimum.prefers(.integer(1), over: .null))
        #expect(!ColumnMergeRule.minimum.prefers(.null, over: .integer(1)))
        #expect(ColumnMergeRule.minimum.prefers(.integer(1), over: .integer(2)))
        #expect(!ColumnMergeRule.counter.prefers(.integer(2), over: .integer(1)))
    }
}
