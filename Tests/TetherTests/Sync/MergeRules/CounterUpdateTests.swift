import Foundation
import Testing

@testable import Tether
import TetherTestSupport

/// A row with counters updated many times in one transaction is stamped once, with one
/// contribution: the sum of what the transaction added (`CounterUpdates.swift`).
@Suite struct CounterUpdateTests {
    static func node() throws -> Database { try CounterColumnTests.node() }
    static func stock(_ db: Database, _ sku: String = "apple") throws -> Int64? {
        try CounterColumnTests.stock(db, sku)
    }

    /// A and B holding apple (10) and pear (5), synced.
    static func pair() throws -> (Database, Database) {
        let a = try node(), b = try node()
        try a.execute("INSERT INTO inventory VALUES ('apple', 10, 'Apple'), ('pear', 5, 'Pear')")
        try sendChanges(from: a, to: b)
        return (a, b)
    }

    @Test func tenIncrementsInATransactionAreOneChangeOfTheRow() throws {
        let (a, b) = try Self.pair()
        let before = try a.lastSequence()
        try a.write { conn in
            for _ in 1...10 { try conn.execute("UPDATE inventory SET stock = stock + 1 WHERE sku = 'apple'") }
            try conn.execute("UPDATE inventory SET name = 'Green apple' WHERE sku = 'apple'")
            try conn.execute("UPDATE inventory SET stock = stock - 2 WHERE sku = 'pear'")
        }
        #expect(try a.lastSequence() == before + 2)
        try b.execute("UPDATE inventory SET stock = stock - 4 WHERE sku = 'apple'")
        try CounterColumnTests.exchange(a, b)
        for db in [a, b] {
            #expect(try Self.stock(db) == 16)
            #expect(try Self.stock(db, "pear") == 3)
            #expect(
                try db.fetchValue("SELECT name FROM inventory WHERE sku = 'apple'", as: String.self) == "Green apple")
        }
    }

    @Test func aSavepointRolledBackTakesBackItsIncrementsOnly() throws {
        let (a, b) = try Self.pair()
        try a.write { conn in
            try conn.execute("UPDATE inventory SET stock = stock + 3 WHERE sku = 'apple'")
            try conn.execute("SAVEPOINT more")
            try conn.execute("UPDATE inventory SET stock = stock + 5 WHERE sku = 'apple'")
            try conn.execute("UPDATE inventory SET stock = stock + 7 WHERE sku = 'pear'")
            try conn.execute("ROLLBACK TO more")
            try conn.execute("RELEASE more")
            try conn.execute("UPDATE inventory SET stock = stock + 1 WHERE sku = 'apple'")
        }
        try b.execute("UPDATE inventory SET stock = stock + 100 WHERE sku = 'apple'")
        try CounterColumnTests.exchange(a, b)
        for db in [a, b] {
            #expect(try Self.stock(db) == 114)
            #expect(try Self.stock(db, "pear") == 5)
        }
    }

    /// A read of the sync metadata in the middle writes what waits; later increments of the same
    /// row in the transaction add to the same contribution.
    @Test func aLookAtTheMetadataInTheMiddleCountsEveryIncrementOnce() throws {
        let (a, b) = try Self.pair()
        try a.write { conn in
            try conn.execute("UPDATE inventory SET stock = stock + 2 WHERE sku = 'apple'")
            let stamped = try conn.fetchValue(
                "SELECT count(*) FROM \(RowMetadataLayout.rowsTableName(of: "inventory"))", as: Int64.self)
            #expect(stamped == 2)
            try conn.execute("UPDATE inventory SET stock = stock + 3 WHERE sku = 'apple'")
        }
        try b.execute("UPDATE inventory SET stock = stock - 1 WHERE sku = 'apple'")
        try CounterColumnTests.exchange(a, b)
        #expect(try Self.stock(a) == 14)
        #expect(try Self.stock(b) == 14)
    }

    /// A statement that moves the row's rowid (the sync key is the text) takes its counter states
    /// along: the contributions made before stay counted once.
    @Test func aRowWhoseRowidMovesKeepsItsContributions() throws {
        let (a, b) = try Self.pair()
        try a.execute("UPDATE inventory SET stock = stock + 1 WHERE sku = 'apple'")
        try b.execute("UPDATE inventory SET stock = stock + 10 WHERE sku = 'apple'")
        try CounterColumnTests.exchange(a, b)
        try a.write { conn in
            try conn.execute("UPDATE inventory SET rowid = rowid + 100, stock = stock + 2 WHERE sku = 'apple'")
            try conn.execute("UPDATE inventory SET stock = stock + 3 WHERE sku = 'apple'")
        }
        try b.execute("UPDATE inventory SET stock = stock + 20 WHERE sku = 'apple'")
        try CounterColumnTests.exchange(a, b)
        #expect(try Self.stock(a) == 46)
        #expect(try Self.stock(b) == 46)
    }

    /// The refusal of a value that is not a number comes with its statement, not at the commit.
    @Test func aWriteThatIsNotANumberIsRefusedWithItsStatement() throws {
        let (a, _) = try Self.pair()
        var reached = false
        #expect(throws: SyncError.self) {
            try a.write { conn in
                try conn.execute("UPDATE inventory SET stock = stock + 1 WHERE sku = 'apple'")
                try conn.execute("UPDATE inventory SET stock = 'many' WHERE sku = 'pear'")
                reached = true
            }
        }
        #expect(!reached)
        #expect(try Self.stock(a) == 10)
        #expect(try Self.stock(a, "pear") == 5)
    }

    /// Updated, then deleted in the same transaction: the row's tombstone goes to the peer, and
    /// no contribution is left behind for a later row with its key.
    @Test func aRowUpdatedThenDeletedInOneTransactionIsDeletedOnThePeer() throws {
        let (a, b) = try Self.pair()
        try a.write { conn in
            try conn.execute("UPDATE inventory SET stock = stock + 5 WHERE sku = 'apple'")
            try conn.execute("DELETE FROM inventory WHERE sku = 'apple'")
            try conn.execute("INSERT INTO inventory VALUES ('apple', 1, 'Apple')")
            try conn.execute("UPDATE inventory SET stock = stock + 1 WHERE sku = 'apple'")
        }
        try CounterColumnTests.exchange(a, b)
        #expect(try Self.stock(a) == 2)
        #expect(try Self.stock(b) == 2)
    }

    /// Bulk-inserted rows (an insert range), a few of them updated since (metadata of their own),
    /// all incremented in one transaction: each row's stamp starts from its own state, the names
    /// updated before stay the peer's too.
    @Test func incrementsOverARangeWithRowsOfTheirOwn() throws {
        func node() throws -> Database {
            let db = try Database.inMemory()
            try db.createTable(SyncItem.self)
            try db.enableSync(for: SyncItem.self, columnRules: ["count": .counter])
            return db
        }
        let a = try node(), b = try node()
        try a.insert(contentsOf: (1...40).map { SyncItem(id: $0, name: "n\($0)", count: 0) })
        try sendChanges(from: a, to: b)
        try a.execute("UPDATE item SET name = 'renamed ' || id WHERE id IN (7, 8, 30)")
        try a.write { conn in
            for round in 1...3 {
                for id in Int64(1)...40 {
                    try conn.execute("UPDATE item SET count = count + ? WHERE id = ?", [round, id])
                }
            }
        }
        try b.execute("UPDATE item SET count = count + 100 WHERE id IN (8, 9)")
        try CounterColumnTests.exchange(a, b)
        let expected = (1...40).map { id in
            SyncItem(
                id: Int64(id), name: [7, 8, 30].contains(id) ? "renamed \(id)" : "n\(id)",
                count: [8, 9].contains(id) ? 106 : 6)
        }
        #expect(try a.fetchAll(SyncItem.query.orderBy("id")) == expected)
        #expect(try b.fetchAll(SyncItem.query.orderBy("id")) == expected)
    }
}
