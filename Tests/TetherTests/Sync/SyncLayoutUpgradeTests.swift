import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Databases made by Tether before the sync metadata moved out of the user's tables
/// (format 1, Fixtures/layout1, made on 2026-11-23 by the code of that day): `a` bulk-inserted
/// and changed rows of `item` (synced by the library) and `note` (captured by triggers) and
/// sent them to `b`; `b` then changed rows, some sent and not acknowledged (in flight), some
/// not sent; `a` changed rows after that.
@Suite struct SyncLayoutUpgradeTests {
    struct Item: Model, Equatable {
        static let tableName = "item"
        var id: String
        var name: String
        var qty: Int
        var price: Double?
    }

    struct Note: Model, Equatable {
        static let tableName = "note"
        var id: Int64
        var body: String?
    }

    /// Opens copies of the fixtures made in `directory`.
    func openFixtures(in directory: TemporaryDirectory) throws -> (a: Database, b: Database) {
        // Tests/TetherTests/Fixtures, one folder up from this file's Sync/.
        let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/layout1")
        for name in ["a.db", "b.db"] {
            try FileManager.default.copyItem(
                at: fixtures.appendingPathComponent(name), to: directory.url.appendingPathComponent(name))
        }
        return (try Database(path: directory.file("a.db")), try Database(path: directory.file("b.db")))
    }

    /// Sends what `to` lacks from `from`; returns the number of changes sent.
    func sync(_ from: Database, _ to: Database) throws -> Int {
        try sendChanges(from: from, to: to, allowingPartialRows: true).reduce(0) { $0 + $1.batch.changes.count }
    }

    @Test func anOldLayoutIsUpgradedOnOpenWithNothingLost() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (a, b) = try openFixtures(in: directory)
        for db in [a, b] {
            #expect(
                try db.fetchValue("SELECT value FROM tether_meta WHERE key = 'format'", as: Int.self)
                    == RowMetadataLayout.formatVersion)
            #expect(
                try db.fetchValue("SELECT sql FROM sqlite_master WHERE name = 'item'", as: String.self)
                    == """
                    CREATE TABLE item (id TEXT PRIMARY KEY, name TEXT NOT NULL, qty INTEGER NOT NULL DEFAULT 0, \
                    price REAL)
                    """)
            #expect(
                try db.fetchRows("SELECT name FROM pragma_table_info('note')").map { try $0.get(0, as: String.self) }
                    == ["id", "body"])
            #expect(
                try db.fetchValue(
                    """
                    SELECT count(*) FROM sqlite_master WHERE sql LIKE '%tether_seq_item%' OR name = \
                    'tether_pending_updates'
                    """, as: Int.self) == 0)
        }
        #expect(try a.count(Item.self) == 61)
        #expect(try b.count(Item.self) == 50)
        #expect(
            try a.fetch(Item.self, key: PrimaryKey("r10")) == Item(id: "r10", name: "ranged 10", qty: 100, price: 5))

        // Each row keeps its state: received and unchanged, changed and sent, changed and not sent.
        #expect(try SyncTestKit.status(b, "item", key: "r1") == .synced)
        #expect(try SyncTestKit.status(b, "item", key: "r5") == .updated)
        #expect(try SyncTestKit.inFlight(b, "item", key: "r5") == true)
        #expect(try SyncTestKit.status(b, "item", key: "s1") == .updated)
        #expect(try SyncTestKit.inFlight(b, "item", key: "s1") == false)
        #expect(
            try SyncTestKit.int(b, "SELECT tether_status FROM tether_dead_item WHERE id = 'r6'")
                == Int64(SyncStatus.deleted.rawValue))
        #expect(try SyncTestKit.status(a, "item", key: "r7") == .updated)
        #expect(try SyncTestKit.status(a, "item", key: "r55") == .created)
        #expect(try SyncTestKit.status(a, "item", key: "r1") == .synced)
        #expect(try b.count(Item.where(.pendingSync)) == 2)

        // The cursors are kept: a sends b only what b lacks (r7, and r51…r60), not everything again.
        let sequenceBefore = try a.lastSequence()
        #expect(try b.cursor(for: a.instanceKey).after > 0)
        #expect(try sync(a, b) == 11)
        _ = try sync(b, a)
        _ = try sync(a, b)
        #expect(try a.lastSequence() >= sequenceBefore)

        let items = { (db: Database) in try db.fetchAll(Item.query.orderBy("id")) }
        let notes = { (db: Database) in try db.fetchAll(Note.query.orderBy("id")) }
        #expect(try items(a) == items(b))
        #expect(try notes(a) == notes(b))
        #expect(try notes(a).map(\.id) == [1, 2, 3])
        #expect(try a.fetch(Item.self, key: PrimaryKey("r5"))?.name == "changed on b")
        #expect(try a.fetch(Item.self, key: PrimaryKey("r6")) == nil)
        #expect(try b.fetch(Item.self, key: PrimaryKey("r7"))?.name == "renamed on a")
        #expect(try a.fetch(Item.self, key: PrimaryKey("s1"))?.price == 9.75)
        for db in [a, b] {
            #expect(try db.pendingChangeCount() == 0)
        }
        // And writes go on as usual, through SQL without a column list too.
        try b.execute("INSERT INTO item VALUES ('new', 'after the upgrade', 1, NULL)")
        #expect(try sync(b, a) == 1)
        #expect(try a.fetch(Item.self, key: PrimaryKey("new"))?.name == "after the upgrade")
    }

    @Test func aDatabaseOfANewerFormatIsRefused() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (a, _) = try openFixtures(in: directory)
        try a.execute("UPDATE tether_meta SET value = 99 WHERE key = 'format'")
        let path = a.path
        try a.close()
        #expect(throws: SyncError.self) { _ = try Database(path: path) }
    }
    @Test func aDatabaseOfFormatTwoGainsInsertedSequencesAndItsNewInsertsReadBackAsInserts() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.url.appendingPathComponent("format2.sqlite").path
        let db = try Database(path: path)
        try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
        try db.enableSync(table: "t")
        try db.execute("INSERT INTO t (id, name) VALUES (1, 'before')")
        // Format 2 as it was: the rows table without inserted_seq.
        try db.execute("ALTER TABLE tether_rows_t DROP COLUMN inserted_seq")
        try db.execute("UPDATE tether_meta SET value = 2 WHERE key = 'format'")
        try db.close()

        let upgraded = try Database(path: path)
        #expect(
            try upgraded.fetchValue("SELECT value FROM tether_meta WHERE key = 'format'", as: Int.self)
                == RowMetadataLayout.formatVersion)
        #expect(
            try upgraded.fetchValue(
                "SELECT count(*) FROM pragma_table_info('tether_rows_t') WHERE name = 'inserted_seq'", as: Int.self)
                == 1)
        let before = try upgraded.lastSequence()
        try upgraded.execute("INSERT INTO t (id, name) VALUES (2, 'after')")
        #expect(
            try upgraded.fetchValue("SELECT inserted_seq FROM tether_rows_t WHERE row_id = 2", as: Int64.self) == before
                + 1)
    }
}
