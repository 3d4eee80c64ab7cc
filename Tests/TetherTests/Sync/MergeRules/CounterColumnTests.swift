import CSQLite
import Foundation
import Testing

@testable import Tether
import TetherTestSupport

/// Columns whose merge rule is `counter`: concurrent changes add up on every peer.
@Suite struct CounterColumnTests {
    static let schema = "CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL, name TEXT)"

    static func node(_ rules: [String: ColumnMergeRule] = ["stock": .counter]) throws -> Database {
        let db = try Database.inMemory()
        try db.execute(schema)
        try db.enableSync(table: "inventory", columnRules: rules)
        return db
    }

    static func stock(_ db: Database, _ sku: String = "apple") throws -> Int64? {
        try db.fetchValue("SELECT stock FROM inventory WHERE sku = ?", [sku], as: Int64.self)
    }

    /// Both ways until neither has anything new for the other.
    static func exchange(_ a: Database, _ b: Database) throws {
        try sendChanges(from: a, to: b)
        try sendChanges(from: b, to: a)
        try sendChanges(from: a, to: b)
    }

    /// Delivers between `nodes` in the pairs of `order` (sender, receiver), then twice every way.
    static func deliver(among nodes: [Database], first order: [(Int, Int)]) throws {
        for (from, to) in order { try sendChanges(from: nodes[from], to: nodes[to]) }
        for _ in 0..<2 {
            for from in nodes.indices {
                for to in nodes.indices where to != from { try sendChanges(from: nodes[from], to: nodes[to]) }
            }
        }
    }

    @Test func concurrentSalesAddUp() throws {
        let a = try Self.node(), b = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, 'Apple')")
        try sendChanges(from: a, to: b)
        try a.execute("UPDATE inventory SET stock = stock - 3 WHERE sku = 'apple'")
        try b.execute("UPDATE inventory SET stock = stock - 4 WHERE sku = 'apple'")
        try Self.exchange(a, b)
        #expect(try Self.stock(a) == 3)
        #expect(try Self.stock(b) == 3)
    }

    /// The later of the two sales is the receiver's own: the row coming back looks like an echo
    /// by its versions (every one the receiver's), yet carries the other sale.
    @Test func aMergedStateWhoseNewestWriteIsTheReceiversGoesBackToIt() throws {
        let a = try Self.node(), b = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, 'Apple')")
        try sendChanges(from: a, to: b)
        try b.execute("UPDATE inventory SET stock = stock - 4 WHERE sku = 'apple'")
        try b.execute("INSERT INTO inventory VALUES ('pear', 5, 'Pear')")
        // A learns of B's later write (its clock moves past B's sale), not of the sale itself.
        var batch = try b.extractChanges(for: a.instanceKey, after: try a.cursor(for: b.instanceKey).after)
        batch.changes.removeAll { $0.key == [.text("apple")] }
        #expect(batch.changes.count == 1)
        try a.apply(batch)
        try a.execute("UPDATE inventory SET stock = stock - 3 WHERE sku = 'apple'")
        try Self.exchange(a, b)
        #expect(try Self.stock(a) == 3)
        #expect(try Self.stock(b) == 3)
    }

    /// The same without the rule: the later write wins, and a sale vanishes (what the rule is for).
    @Test func withoutTheRuleTheLaterWriteWins() throws {
        let a = try Self.node([:]), b = try Self.node([:])
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, 'Apple')")
        try sendChanges(from: a, to: b)
        try a.execute("UPDATE inventory SET stock = stock - 3 WHERE sku = 'apple'")
        try b.execute("UPDATE inventory SET stock = stock - 4 WHERE sku = 'apple'")
        try Self.exchange(a, b)
        #expect(try Self.stock(a) == Self.stock(b))
        #expect(try Self.stock(a) != 3)
    }

    /// Three peers in a line, writes on each, delivered through the middle one in both orders;
    /// another column of the row changed concurrently keeps its own rule.
    @Test func contributionsTravelThroughARelay() throws {
        let a = try Self.node(), b = try Self.node(), c = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 100, 'Apple')")
        try sendChanges(from: a, to: b)
        try sendChanges(from: b, to: c)
        try a.execute("UPDATE inventory SET stock = stock - 1")
        try a.execute("UPDATE inventory SET stock = stock - 2")
        try b.execute("UPDATE inventory SET stock = stock + 10, name = 'Green apple'")
        try c.execute("UPDATE inventory SET stock = 50")  // an assignment is the difference it makes: −50
        try sendChanges(from: c, to: b)
        try sendChanges(from: a, to: b)
        try sendChanges(from: b, to: a)
        try sendChanges(from: b, to: c)
        try sendChanges(from: a, to: b)
        for db in [a, b, c] {
            #expect(try Self.stock(db) == 100 - 1 - 2 + 10 - 50)
            #expect(try db.fetchValue("SELECT name FROM inventory", as: String.self) == "Green apple")
        }
        // Nothing left to send: every peer holds every contribution.
        try Self.exchange(a, b)
        try Self.exchange(b, c)
        #expect(try Self.stock(c) == 57)
    }

    /// A batch delivered twice, and old states arriving after new ones, count once.
    @Test func aContributionIsNeverCountedTwice() throws {
        let a = try Self.node(), b = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, NULL)")
        try sendChanges(from: a, to: b)
        try a.execute("UPDATE inventory SET stock = stock + 5")
        let first = try a.extractChanges(for: b.instanceKey, after: 0)
        try a.execute("UPDATE inventory SET stock = stock + 1")
        let second = try a.extractChanges(for: b.instanceKey, after: 0)
        try b.apply(second)
        try b.apply(first)
        try b.apply(second)
        #expect(try Self.stock(b) == 16)
        try b.execute("UPDATE inventory SET stock = stock - 6")
        try Self.exchange(a, b)
        #expect(try Self.stock(a) == 10)
        #expect(try Self.stock(b) == 10)
    }

    /// A row deleted and inserted again starts from its new value: contributions to the old row
    /// do not come back, wherever they were.
    @Test func aReinsertedRowStartsAgain() throws {
        let a = try Self.node(), b = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, NULL)")
        try sendChanges(from: a, to: b)
        try b.execute("UPDATE inventory SET stock = stock - 4")
        try a.execute("DELETE FROM inventory")
        try a.execute("INSERT INTO inventory VALUES ('apple', 20, NULL)")
        try Self.exchange(a, b)
        #expect(try Self.stock(a) == 20)
        #expect(try Self.stock(b) == 20)
        try b.execute("UPDATE inventory SET stock = stock - 1")
        try Self.exchange(a, b)
        #expect(try Self.stock(a) == 19)
        #expect(try Self.stock(b) == 19)
    }

    /// Another program's writes (the sqlite3 shell: a plain connection, the triggers alone
    /// capture) add up as the library's do; one that is not a number is refused by the trigger.
    @Test func anotherProgramsSalesAddUp() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("shop.sqlite")
        let a = try Database(path: path)
        defer { try? a.close() }
        try a.execute(Self.schema)
        try a.enableSync(table: "inventory", capturingExternalWrites: true, columnRules: ["stock": .counter])
        let b = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, 'Apple')")
        try sendChanges(from: a, to: b)
        var shell: OpaquePointer?
        try #require(sqlite3_open_v2(path, &shell, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK)
        defer { sqlite3_close(shell) }
        let sales = "BEGIN; UPDATE inventory SET stock = stock - 1; UPDATE inventory SET stock = stock - 2; COMMIT;"
        #expect(sqlite3_exec(shell, sales, nil, nil, nil) == SQLITE_OK)
        #expect(sqlite3_exec(shell, "UPDATE inventory SET stock = 'lots'", nil, nil, nil) == SQLITE_CONSTRAINT)
        try a.execute("UPDATE inventory SET stock = stock - 4")  // the library's own, captured by its hook
        try b.execute("UPDATE inventory SET stock = stock + 20")
        try Self.exchange(a, b)
        #expect(try Self.stock(a) == 23)
        #expect(try Self.stock(b) == 23)
    }

    /// A row a trigger deletes in the statement that updated it, then inserted again with the same
    /// rowid: it starts from its new value, and its peer agrees.
    @Test func aRowDeletedByATriggerStartsAgain() throws {
        let a = try Self.node(), b = try Self.node()
        try a.execute(
            """
            CREATE TRIGGER sold_out AFTER UPDATE OF stock ON inventory WHEN NEW.stock <= 0 BEGIN
              DELETE FROM inventory WHERE sku = NEW.sku;
            END
            """)
        try a.execute("INSERT INTO inventory VALUES ('apple', 2, NULL)")
        try a.execute("UPDATE inventory SET stock = stock - 2")
        #expect(try Self.stock(a) == nil)
        try a.execute("INSERT INTO inventory VALUES ('apple', 5, NULL)")
        try a.execute("UPDATE inventory SET stock = stock - 1")
        try sendChanges(from: a, to: b)
        #expect(try Self.stock(a) == 4)
        #expect(try Self.stock(b) == 4)
    }

    /// A table WITHOUT ROWID, whose writes (the library's too) only its triggers see, each row named
    /// by its surrogate: sales add up through a relay, several in one transaction count each once,
    /// a row whose key changes starts again from its value, and a value not a number is refused.
    @Test func aTableWithoutRowidCounts() throws {
        func node() throws -> Database {
            let db = try Database.inMemory()
            try db.execute("CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER, name TEXT) WITHOUT ROWID")
            try db.enableSync(table: "inventory", columnRules: ["stock": .counter])
            return db
        }
        let a = try node(), b = try node(), c = try node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, 'Apple'), ('pear', 7, 'Pear')")
        try sendChanges(from: a, to: b)
        try sendChanges(from: b, to: c)
        try a.write { conn in
            try conn.execute("UPDATE inventory SET stock = stock - 3 WHERE sku = 'apple'")
            try conn.execute("UPDATE inventory SET stock = stock - 1, name = 'Apples' WHERE sku = 'apple'")
        }
        try b.execute("UPDATE inventory SET stock = stock - 4 WHERE sku = 'apple'")
        try c.execute("UPDATE inventory SET stock = NULL WHERE sku = 'apple'")  // NULL counts as 0: −10
        try c.execute("UPDATE inventory SET stock = coalesce(stock, 0) + 20 WHERE sku = 'apple'")
        try c.execute("UPDATE inventory SET sku = 'pears', stock = stock + 1 WHERE sku = 'pear'")
        #expect(throws: (any Error).self) { try b.execute("UPDATE inventory SET stock = 'many'") }
        try sendChanges(from: c, to: b)
        try Self.exchange(a, b)
        try sendChanges(from: b, to: c)
        for db in [a, b, c] {
            let rows = try db.fetchRows("SELECT sku, stock, name FROM inventory ORDER BY sku").map {
                $0.values.map(\.description).joined(separator: "|")
            }
            #expect(rows == ["'apple'|12|'Apples'", "'pears'|8|'Pear'"])
        }
    }

    @Test func aCounterHoldsNumbers() throws {
        let a = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, NULL)")
        #expect(throws: SyncError.self) { try a.execute("UPDATE inventory SET stock = 'many'") }
        #expect(throws: SyncError.self) { try a.execute("INSERT INTO inventory VALUES ('pear', x'00', NULL)") }
        #expect(try Self.stock(a) == 10)
        #expect(try a.fetchValue("SELECT count(*) FROM inventory", as: Int64.self) == 1)
    }

    @Test func aPeersBrokenStateIsRefused() throws {
        let a = try Self.node(), b = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, NULL)")
        try sendChanges(from: a, to: b)
        try a.execute("UPDATE inventory SET stock = stock - 3")
        var batch = try a.extractChanges(for: b.instanceKey, after: 0)
        guard case var .blob(state) = batch.changes[0].values[0] else {
            Issue.record("a counter with a contribution goes as its state: \(batch.changes[0].values)")
            return
        }
        state.removeLast()
        batch.changes[0].values[0] = .blob(state)
        #expect(throws: SyncError.self) { try b.apply(batch) }
        #expect(try Self.stock(b) == 10)
    }

    /// A peer cannot speak for this database's own contribution: a state giving it another one is refused.
    @Test func aForgedOwnContributionIsRefused() throws {
        let a = try Self.node(), b = try Self.node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, NULL)")
        try sendChanges(from: a, to: b)
        try a.execute("UPDATE inventory SET stock = stock - 3")
        try sendChanges(from: a, to: b)
        try b.execute("UPDATE inventory SET stock = stock + 1")
        var batch = try b.extractChanges(for: a.instanceKey, after: 0)
        guard let index = batch.changes.firstIndex(where: { $0.key == [.text("apple")] }),
            case let .blob(data) = batch.changes[index].values[0]
        else {
            Issue.record("b's state of apple goes as a blob: \(batch.changes)")
            return
        }
        let state = try CounterState(decoding: data)
        // A's contribution made bigger, at a later time than A's own.
        let mine = try #require(state.contributions.first { $0.site == a.instanceKey })
        let forged = CounterState(
            base: state.base, baseVersion: state.baseVersion,
            contributions: state.contributions.filter { $0.site != a.instanceKey } + [
                .init(
                    site: a.instanceKey, timestamp: HybridTimestamp(rawValue: mine.timestamp.rawValue + 1),
                    amount: .integer(-300))
            ])
        batch.changes[index].values[0] = .blob(forged.encoded())
        if forged.newestVersion > batch.changes[index].version(0) {
            var versions = batch.changes[index].versions
            if versions.isEmpty { versions = [batch.changes[index].existence] }
            versions[0] = forged.newestVersion
            batch.changes[index].versions = versions
        }
        #expect(throws: SyncError.self) { try a.apply(batch) }
        #expect(try Self.stock(a) == 7)
    }

    @Test func rulesAreRecordedAndChecked() throws {
        let a = try Self.node()
        #expect(try a.syncedTableRecords().first?.columnRules == ["stock": .counter])
        let b = try Database.inMemory()
        try b.execute(Self.schema)
        #expect(throws: SyncError.self) { try b.enableSync(table: "inventory", columnRules: ["sku": .counter]) }
        #expect(throws: SyncError.self) { try b.enableSync(table: "inventory", columnRules: ["price": .counter]) }
    }

    /// A copy of a database (a cloned file) cannot change a counter until it is rekeyed: its
    /// contribution would sit under the original's key. Once rekeyed, the copy's sales and the
    /// original's both count, once.
    @Test func aCopyChangesCountersOnlyOnceRekeyed() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let originalPath = directory.file("shop.sqlite"), copyPath = directory.file("shop-copy.sqlite")
        var original = try Database(path: originalPath)
        try original.execute(Self.schema)
        try original.enableSync(table: "inventory", columnRules: ["stock": .counter])
        try original.execute("INSERT INTO inventory VALUES ('apple', 10, 'Apple')")
        try original.execute("UPDATE inventory SET stock = stock - 1")
        try original.close()
        try FileManager.default.copyItem(atPath: originalPath, toPath: copyPath)
        original = try Database(path: originalPath)
        defer { try? original.close() }
        let copy = try Database(path: copyPath)
        defer { try? copy.close() }
        #expect {
            try copy.execute("UPDATE inventory SET stock = stock - 2")
        } throws: { error in
            "\(error)".contains("column stock of inventory is a counter, which it cannot change before its rekey")
        }
        try copy.execute("UPDATE inventory SET name = 'Green apple'")  // other columns: as before
        _ = try copy.resetInstanceKey()
        try copy.execute("UPDATE inventory SET stock = stock - 2")
        try original.execute("UPDATE inventory SET stock = stock - 3")
        let third = try Self.node()
        try Self.exchange(original, copy)
        try Self.exchange(copy, third)
        try Self.exchange(original, third)
        for db in [original, copy, third] { #expect(try Self.stock(db) == 4) }
    }
}
