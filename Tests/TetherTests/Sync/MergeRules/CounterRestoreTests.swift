import Foundation
import Logging
import Testing

@testable import Tether
import TetherTestSupport

/// A database restored in place (a file-system snapshot rolled back) whose counters were written
/// both before the restore and since: the rekey gives the original's key back what it held at the
/// restore (its peers hold the original's later value of it) and the new key what was added since.
/// Before, the contribution stayed whole under the old key while the column's version moved, and
/// every peer refused the row.
@Suite struct CounterRestoreTests {
    static let schema = "CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)"

    static func open(_ path: String, logger: Logger? = nil) throws -> Database {
        var configuration = Database.Configuration()
        if let logger { configuration.logger = logger }
        let db = try Database(path: path, configuration: configuration)
        try db.execute(schema.replacingOccurrences(of: "CREATE TABLE", with: "CREATE TABLE IF NOT EXISTS"))
        try db.enableSync(table: "inventory", columnRules: ["stock": .counter])
        return db
    }

    static func node() throws -> Database {
        let db = try Database.inMemory()
        try db.execute(schema)
        try db.enableSync(table: "inventory", columnRules: ["stock": .counter])
        return db
    }

    static func stocks(_ db: Database) throws -> [String] {
        try db.fetchRows("SELECT sku, stock FROM inventory ORDER BY sku").map {
            "\(try $0.get(0, as: String.self))=\(try $0.get(1, as: Int64.self))"
        }
    }

    /// Each change in a transaction of its own: each leaves a value of the contribution a restore may go back to.
    static func sell(_ amounts: [Int64], of sku: String = "apple", on db: Database) throws {
        for amount in amounts {
            try db.execute("UPDATE inventory SET stock = stock - ? WHERE sku = ?", [amount, sku])
        }
    }

    /// Restores `path` to `snapshot`, writes with `since`, has C notice the restore and rekeys.
    static func restoreWriteAndRekey(
        _ path: String, to snapshot: Data, c: Database, logger: Logger? = nil, since: (Database) throws -> Void
    ) throws -> Database {
        try restoreInPlace(path, from: snapshot)
        let a = try open(path, logger: logger)
        try since(a)
        #expect(throws: SyncError.self) { try CopiesAndBackupsTests.sendKeepingMarks(from: a, to: c) }
        #expect(try a.detectedCopy()?.kind == .restored)
        try a.resetInstanceKey()
        return a
    }

    @Test(
        """
        a database restored in place and written since counts every sale once on every node: the original's \
        before the restore, its own since
        """)
    func everySaleCountsOnce() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("a.db")
        var a = try Self.open(path)
        let c = try Self.node(), d = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10), ('pear', 5)")
        try Self.sell([2, 1], on: a)
        try Self.sell([1], of: "pear", on: a)
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        try a.close()
        let snapshot = try Data(contentsOf: URL(fileURLWithPath: path))

        // The original goes on: its sales reach C and D, then it is rolled back.
        a = try Self.open(path)
        try Self.sell([3, 5], on: a)
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        try c.execute("UPDATE inventory SET stock = stock + 100 WHERE sku = 'apple'")
        try c.execute("UPDATE inventory SET stock = stock + 1 WHERE sku = 'pear'")
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        try CopiesAndBackupsTests.convergeKeepingMarks([c, d])
        try a.close()

        a = try Self.restoreWriteAndRekey(path, to: snapshot, c: c) { a in
            #expect(try Self.stocks(a) == ["apple=7", "pear=4"])
            try Self.sell([1, 1, 4], on: a)
            try a.execute("INSERT INTO inventory VALUES ('plum', 3)")
            try Self.sell([1], of: "plum", on: a)
        }
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        try CopiesAndBackupsTests.convergeKeepingMarks([c, d])
        // apple: 10, A's 2 and 1 before the backup, 3 and 5 after it, C's 100, A's 1, 1 and 4 since the restore.
        let expected = ["apple=93", "pear=5", "plum=2"]
        for node in [a, c, d] { #expect(try Self.stocks(node) == expected) }
        // Later sales go on adding up.
        try Self.sell([1], on: a)
        try Self.sell([2], on: d)
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        try CopiesAndBackupsTests.convergeKeepingMarks([c, d])
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        for node in [a, c, d] { #expect(try Self.stocks(node).first == "apple=90") }
        try a.close()
    }

    @Test("a backup from before the database ever synced, restored in place and written since, counts every sale once")
    func aBackupFromBeforeAnySync() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("a.db")
        var a = try Self.open(path)
        let c = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10)")
        try Self.sell([2], on: a)
        try a.close()
        let snapshot = try Data(contentsOf: URL(fileURLWithPath: path))
        a = try Self.open(path)
        try Self.sell([3], on: a)
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        try c.execute("UPDATE inventory SET stock = stock + 100")
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        try a.close()

        a = try Self.restoreWriteAndRekey(path, to: snapshot, c: c) { try Self.sell([1, 1, 1], on: $0) }
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        for node in [a, c] { #expect(try Self.stocks(node) == ["apple=102"]) }  // 10 - 2 - 3 + 100 - 3
        try a.close()
    }

    @Test(
        """
        a row changed in more transactions since the restore than its history keeps moves whole to the new key, \
        and the rekey says so
        """)
    func pastTheLimitTheRekeySaysSo() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("a.db")
        var a = try Self.open(path)
        let c = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 1000)")
        try Self.sell([2], on: a)
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        try a.close()
        let snapshot = try Data(contentsOf: URL(fileURLWithPath: path))
        a = try Self.open(path)
        try Self.sell([3], on: a)
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        try a.close()

        let recorder = LogRecorder()
        let sales = Array(repeating: Int64(1), count: ContributionHistory.limit + 2)
        a = try Self.restoreWriteAndRekey(path, to: snapshot, c: c, logger: recorder.logger()) {
            try Self.sell(sales, on: $0)
        }
        #expect(recorder.entries.contains { $0.level == .warning && $0.message.contains("move whole to the new key") })
        try CopiesAndBackupsTests.convergeKeepingMarks([a, c])
        // The original's 2 and 3, and the 2 it held at the restore counted again with the sales since.
        let expected = "apple=\(1000 - 2 - 3 - 2 - sales.count)"
        for node in [a, c] { #expect(try Self.stocks(node) == [expected]) }
        try a.close()
    }

    // MARK: The history itself

    typealias Value = ContributionHistory.Value

    static func value(_ timestamp: UInt64, _ amount: Int64) -> Value {
        Value(timestamp: timestamp, amount: .integer(amount))
    }

    @Test("a contribution's value at a clock: the latest at or before it, none before the first, unknown where dropped")
    func lookup() {
        let site = InstanceKey.random()
        let base = Version(timestamp: HybridTimestamp(rawValue: 5), origin: InstanceKey.random())
        var history = ContributionHistory(current: Self.value(10, -1), keptSince: 0)
        history.record(Self.value(10, -1), floor: 0)
        history.record(Self.value(20, -3), floor: 0)
        let current = Self.value(30, -4)
        #expect(history.value(at: 9, current: current, site: site, after: base) == .none)
        #expect(history.value(at: 10, current: current, site: site, after: base) == .amount(Self.value(10, -1)))
        #expect(history.value(at: 29, current: current, site: site, after: base) == .amount(Self.value(20, -3)))
        #expect(history.value(at: 30, current: current, site: site, after: base) == .amount(current))
        // A value from before the base counts for none.
        let laterBase = Version(timestamp: HybridTimestamp(rawValue: 15), origin: InstanceKey.random())
        #expect(history.value(at: 12, current: current, site: site, after: laterBase) == .none)
        // Written before the history was kept: only the current value is known.
        let old = ContributionHistory(current: current, keptSince: 100)
        #expect(old.value(at: 29, current: current, site: site, after: base) == .unknown)
    }

    @Test("values older than the floor go, all but the latest of them; past the limit the oldest go, and are unknown")
    func pruning() {
        let site = InstanceKey.random()
        let base = Version(timestamp: .zero, origin: site)
        var history = ContributionHistory(current: Self.value(10, -1), keptSince: 0)
        for step in 1...4 { history.record(Self.value(UInt64(step * 10), Int64(-step)), floor: 0) }
        history.record(Self.value(50, -5), floor: 35)
        #expect(history.values == [Self.value(30, -3), Self.value(40, -4), Self.value(50, -5)])
        #expect(
            history.value(at: 35, current: Self.value(60, -6), site: site, after: base) == .amount(Self.value(30, -3)))
        for step in 6...100 { history.record(Self.value(UInt64(step * 10), Int64(-step)), floor: 35) }
        #expect(history.values.count == ContributionHistory.limit)
        let oldest = 100 - ContributionHistory.limit + 1
        #expect(history.values.first == Self.value(UInt64(oldest * 10), Int64(-oldest)))
        let current = Self.value(1_010, -101)
        #expect(history.value(at: UInt64(oldest * 10 - 5), current: current, site: site, after: base) == .unknown)
        #expect(
            history.value(at: UInt64(oldest * 10), current: current, site: site, after: base)
                == .amount(Self.value(UInt64(oldest * 10), Int64(-oldest))))
    }

    @Test("the histories are stored after a row's counter states, read back the same, and damage is noticed")
    func storedForm() throws {
        let key = InstanceKey.random()
        let state = CounterState(
            base: .integer(10), baseVersion: Version(timestamp: HybridTimestamp(rawValue: 1), origin: key),
            contributions: [.init(site: key, timestamp: HybridTimestamp(rawValue: 30), amount: .integer(-4))])
        var counters = RowCounters(states: ["stock": state])
        let plain = counters.encoded()
        counters.own["stock"] = ContributionHistory(
            knownSince: 7, values: [Self.value(10, -1), Value(timestamp: 20, amount: .real(-2.5))])
        let encoded = counters.encoded()
        #expect(encoded.count == plain.count + 3 + 2 + 5 + 8 + 2 + 2 * 17)
        #expect(RowCounters(encoded: Data(encoded)) == counters)
        #expect(RowCounters(encoded: Data(plain)) == RowCounters(states: ["stock": state]))
        #expect(RowCounters(encoded: Data(encoded.dropLast())) == nil)
        var wrongTag = encoded
        wrongTag[plain.count] = 0xB2
        #expect(RowCounters(encoded: Data(wrongTag)) == nil)
        // A history whose column holds no state is not kept.
        counters.own["gone"] = ContributionHistory(knownSince: 0, values: [Self.value(1, 1)])
        #expect(counters.encoded() == encoded)
    }
}
