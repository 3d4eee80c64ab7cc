import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// An expiry is a change to the row it names: a peer's (or a sync file's) entry of the synced
/// store that names a table this database does not sync, one of Tether's or SQLite's own, or a
/// row by something other than its key is refused with the whole batch, and never stored, kept
/// for a later schema, or relayed.
@Suite struct SyncExpiryEntryTests {
    static let storeDescriptor = TableDescriptor(
        name: ExpiryStore.syncedTable, keyColumns: ["table_name", "row_key"], valueColumns: ["expires_at"])

    /// `t` synced, `secret` not, with a row each.
    func receiver() throws -> Database {
        let db = try makeDatabase(
            schema: "\(SyncTestKit.schema); CREATE TABLE secret (id INTEGER PRIMARY KEY, body TEXT)", syncing: ["t"])
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1)")
        try db.execute("INSERT INTO secret (id, body) VALUES (1, 'classified')")
        return db
    }

    /// A batch from a peer: a new row 5 of `t`, then an entry naming `table` and `rowKey`, already due.
    func batch(naming table: DatabaseValue, rowKey: DatabaseValue) -> ChangeBatch {
        let version = SyncTestKit.version(SyncTestKit.nowMilliseconds, SyncTestKit.fakePeer())
        let entry = RowChange(
            table: 1, key: [table, rowKey], isAlive: true, existence: version, values: [.real(0)], versions: [],
            sequence: 2)
        return ChangeBatch(
            source: version.origin, after: 0, through: 2, isLast: true,
            tables: [SyncTestKit.tDescriptor, Self.storeDescriptor],
            changes: [SyncTestKit.row(5, name: "five", count: 5, at: version, sequence: 1), entry])
    }

    /// Applies the batch naming `table` and `rowKey`: refused, with a reason holding `words`, and nothing
    /// of it written.
    func expectRefused(
        _ db: Database, naming table: DatabaseValue, rowKey: DatabaseValue, because words: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let error = SyncTestKit.error { try db.apply(batch(naming: table, rowKey: rowKey)) }
        guard case let .refusedExpiry(change, reason)? = error as? SyncError else {
            Issue.record("not refused as an expiry: \(String(describing: error))", sourceLocation: sourceLocation)
            return
        }
        #expect(change == 1, sourceLocation: sourceLocation)
        #expect(reason.contains(words), "\(reason)", sourceLocation: sourceLocation)
        #expect(
            try db.fetchValue("SELECT count(*) FROM t WHERE id = 5", as: Int.self) == 0,
            "the batch's row of t was applied", sourceLocation: sourceLocation)
        #expect(
            try db.fetchValue("SELECT count(*) FROM \(ExpiryStore.syncedTable)", as: Int.self) == 0,
            sourceLocation: sourceLocation)
        #expect(
            try db.fetchValue("SELECT count(*) FROM tether_kept_for_schema", as: Int.self) == 0,
            sourceLocation: sourceLocation)
        #expect(
            try db.fetchValue("SELECT count(*) FROM tether_kept_aside", as: Int.self) == 0,
            sourceLocation: sourceLocation)
    }

    @Test func anEntryForATableNotSyncedHereIsRefusedWholeAndSyncingTheTableLaterDeletesNothing() throws {
        let db = try receiver()
        try expectRefused(
            db, naming: .text("secret"), rowKey: .text("[1]"),
            because: "table secret, which this database does not sync")
        try db.enableSync(table: "secret")
        #expect(try db.deleteExpiredRows() == 0)
        #expect(try db.fetchValue("SELECT body FROM secret WHERE id = 1", as: String.self) == "classified")
    }

    @Test func aDatabaseSyncingNothingKeepsNoEntryForLater() throws {
        let db = try makeDatabase(
            schema: "\(SyncTestKit.schema); CREATE TABLE secret (id INTEGER PRIMARY KEY, body TEXT)")
        try db.execute("INSERT INTO secret (id, body) VALUES (1, 'classified')")
        let error = SyncTestKit.error { try db.apply(batch(naming: .text("secret"), rowKey: .text("[1]"))) }
        guard case .refusedExpiry? = error as? SyncError else {
            Issue.record("not refused as an expiry: \(String(describing: error))")
            return
        }
        try db.enableSync(table: "secret")
        #expect(try db.fetchValue("SELECT count(*) FROM \(ExpiryStore.syncedTable)", as: Int.self) == 0)
        #expect(try db.deleteExpiredRows() == 0)
        #expect(try db.fetchValue("SELECT body FROM secret WHERE id = 1", as: String.self) == "classified")
    }

    @Test func entriesNamingTetherOrSQLiteTablesAreRefused() throws {
        let db = try receiver()
        for table in ["tether_peers", "tether_meta", ExpiryStore.syncedTable, "TETHER_peers", "sqlite_master"] {
            try expectRefused(db, naming: .text(table), rowKey: .text("[1]"), because: "table \(table)")
        }
        #expect(
            try db.fetchValue("SELECT count(*) FROM tether_peers", as: Int.self) == 0,
            "a refused batch registers no peer")
    }

    @Test func malformedTableNamesAndRowKeysAreRefused() throws {
        let db = try receiver()
        try expectRefused(db, naming: .text("bulk; DROP TABLE item"), rowKey: .text("[1]"), because: "does not sync")
        try expectRefused(db, naming: .integer(7), rowKey: .text("[1]"), because: "names no table")
        for rowKey: DatabaseValue in [
            .text("1"), .text("not json"), .text("[1, 2]"), .text("[]"), .text("{\"id\": 1}"), .text("[[1]]"),
            .text("[null]"), .integer(1),
        ] {
            try expectRefused(
                db, naming: .text("t"), rowKey: rowKey, because: "not by a JSON array of its 1 key value(s) (id)")
        }
        #expect(try db.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1)
    }

    @Test func anEntryForASyncedRowIsAccepted() throws {
        let db = try receiver()
        let report = try db.apply(batch(naming: .text("t"), rowKey: .text("[1]")))
        #expect(report.applied == 2)
        // Already due: the purge deletes the row, and the entry with it.
        #expect(try db.fetchValue("SELECT count(*) FROM t WHERE id = 1", as: Int.self) == 0)
        #expect(try db.fetchValue("SELECT count(*) FROM \(ExpiryStore.syncedTable)", as: Int.self) == 0)
    }

    @Test func anEntryStoredBeforeEntriesWereCheckedIsNeitherRelayedNorPurged() throws {
        let db = try receiver()
        // What a database that accepted such entries holds (its own write here, as if a peer's).
        try db.execute(
            """
            INSERT INTO \(ExpiryStore.syncedTable) (table_name, row_key, expires_at)
            VALUES ('secret', '[1]', 0), ('tether_peers', '[1]', 0), ('t', '[1]', 4102444800)
            """)
        let batch = try db.extractChanges(for: SyncTestKit.fakePeer(), after: 0)
        let named = batch.changes.filter { batch.tables[$0.table].name == ExpiryStore.syncedTable }.compactMap {
            batch.tableConcerned(by: $0)
        }
        #expect(named == ["t"])
        #expect(try db.deleteExpiredRows() == 0)
        #expect(try db.fetchValue("SELECT count(*) FROM secret", as: Int.self) == 1)
    }
}
