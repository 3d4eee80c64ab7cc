import CSQLite
import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// The events the core's seam gives the sync capture and observation — bulk inserts as rowid
/// ranges, schema changes from the authorizer, the one scope that suspends capture — and what
/// is built on them: insert ranges, followed columns, expiry forgotten with its row.
@Suite struct CaptureSeamTests {
    /// Records the seam's bulk, schema and suspension events.
    final class SeamRecorder: TransactionObserver {
        var events: [String] = []
        let observation: BulkInsertObservation
        let capturesWrites: Bool
        var observesStatements: Bool { true }
        var writesInTransaction: Bool { false }
        init(_ observation: BulkInsertObservation, capturesWrites: Bool = false) {
            self.observation = observation
            self.capturesWrites = capturesWrites
        }

        func rowWillChange(_ change: PreUpdateChange) { events.append("row \(change.newRowid)") }
        func schemaWillChange(_ change: SchemaChange, _ connection: Connection) throws {
            events.append("schema will change \(change.kind) \(change.table ?? "-")")
        }
        func schemaDidChange(_ change: SchemaChange, _ connection: Connection) throws {
            events.append("schema did change \(change.kind) \(change.table ?? "-")")
        }
        func bulkInsertWillBegin(into table: String, rowCount: Int, _ connection: Connection) throws
            -> BulkInsertObservation
        {
            events.append("bulk begins \(table) \(rowCount)")
            return observation
        }
        func rowsInserted(into table: String, rowids: ClosedRange<Int64>, _ connection: Connection) throws {
            events.append("rows \(table) \(rowids.lowerBound)...\(rowids.upperBound)")
        }
        func bulkInsertDidEnd(_ connection: Connection) { events.append("bulk ends") }
        func captureWillSuspend(_ connection: Connection) throws { events.append("suspend") }
        func captureDidResume(_ connection: Connection) throws { events.append("resume") }
    }

    func connection() throws -> Connection {
        let connection = try Connection(path: ":memory:", flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
        try connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
        return connection
    }

    func bulkInsert(_ ids: [Int64], _ connection: Connection) throws {
        try connection.transaction {
            try connection.insertingInBulk(into: "t", rowCount: ids.count) { recordsRows in
                for id in ids {
                    try connection.execute("INSERT INTO t (id, name) VALUES (?, 'x')", [id])
                    if recordsRows { try connection.noteBulkInsertedRow() }
                }
            }
        }
    }

    @Test func aBulkInsertReachesObserversAsRunsOfConsecutiveRowidsNotRows() throws {
        let connection = try connection()
        let ranges = SeamRecorder(.rowidRanges)
        let rows = SeamRecorder(.eachRow)
        connection.add(ranges)
        connection.add(rows)
        try bulkInsert([1, 2, 3, 7, 8, 20], connection)
        #expect(ranges.events == ["bulk begins t 6", "rows t 1...3", "rows t 7...8", "rows t 20...20", "bulk ends"])
        #expect(rows.events == ["bulk begins t 6", "row 1", "row 2", "row 3", "row 7", "row 8", "row 20", "bulk ends"])

        // A failed bulk insert reports nothing of its last run: its transaction undoes it.
        ranges.events.removeAll()
        #expect(throws: DatabaseError.self) { try bulkInsert([30, 31, 1], connection) }
        #expect(ranges.events == ["bulk begins t 3", "bulk ends"])
        #expect(try connection.fetchValue("SELECT count(*) FROM t", as: Int.self) == 6)
    }

    @Test func schemaChangesAreToldFromTheAuthorizerWhateverTheText() throws {
        let connection = try connection()
        let recorder = SeamRecorder(.eachRow)
        connection.add(recorder)
        for ddl in [
            "/* new */ alter TABLE t ADD COLUMN extra", "CREATE TABLE u (id INTEGER PRIMARY KEY)",
            "CREATE INDEX t_on_name ON t (name)", "DROP TABLE u",
        ] {
            try connection.execute(ddl)
        }
        #expect(
            recorder.events == [
                "schema will change alterTable t", "schema did change alterTable t",
                "schema will change createTable u", "schema did change createTable u",
                "schema will change other -", "schema did change other -",
                "schema will change dropTable u", "schema did change dropTable u",
            ])
    }

    @Test func withoutCaptureHidesWritesFromCapturingObserversOnlyAndNests() throws {
        let connection = try connection()
        let capture = SeamRecorder(.eachRow, capturesWrites: true)
        let observation = SeamRecorder(.eachRow)
        connection.add(capture)
        connection.add(observation)
        try connection.withoutCapture {
            try connection.execute("INSERT INTO t (id, name) VALUES (1, 'a')")
            try connection.withoutCapture { try connection.execute("INSERT INTO t (id, name) VALUES (2, 'b')") }
        }
        try connection.execute("INSERT INTO t (id, name) VALUES (3, 'c')")
        #expect(capture.events == ["suspend", "resume", "row 3"])
        #expect(observation.events == ["row 1", "row 2", "row 3"])

        // Except cascades: the rows the caller writes are hidden, those its writes change in turn are not.
        try connection.execute("PRAGMA foreign_keys = ON")
        try connection.execute(
            "CREATE TABLE child (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES t (id) ON DELETE CASCADE)")
        try connection.execute("INSERT INTO child (id, parent) VALUES (10, 1)")
        capture.events.removeAll()
        try connection.withoutCapture(.exceptCascades) { try connection.execute("DELETE FROM t WHERE id = 1") }
        #expect(capture.events == ["suspend", "row 10", "resume"])
    }

    // MARK: What the capture builds on them

    @Test func anObservedBulkInsertIntoASyncedTableIsCapturedAndObserved() throws {
        let db = try Database.inMemory()
        try db.createTable(SyncItem.self)
        try db.enableSync(for: SyncItem.self)
        let seen = LockedBox<[Int64]>([])
        let token = db.observe(.insert, in: "item") { event in seen.withLock { $0.append(event.rowID ?? -1) } }
        let before = try db.lastSequence()
        try db.insert(contentsOf: (1...50).map { SyncItem(id: $0, name: "n\($0)", count: 0) })
        try db.insert(contentsOf: [SyncItem(id: 60, name: "gap", count: 0), SyncItem(id: 61, name: "gap", count: 0)])
        // Captured as two ranges, one sequence number per row.
        #expect(try db.lastSequence() == before + 52)
        #expect(
            try db.fetchValue("SELECT count(*) FROM tether_insert_ranges WHERE table_name = 'item'", as: Int.self) == 2)
        let batch = try db.extractChanges(for: nil, after: before, markInFlight: false)
        #expect(batch.changes.count == 52)
        // And observed, every row once, after the commit.
        #expect(eventually { seen.value.count == 52 })
        #expect(seen.value == Array(1...50) + [60, 61])
        token.cancel()
    }

    @Test func aRawAlterOfASyncedTableIsFollowedByTheCapture() throws {
        let db = try Database.inMemory()
        try db.createTable(SyncItem.self)
        try db.enableSync(for: SyncItem.self)
        try db.execute("ALTER TABLE item ADD COLUMN note TEXT")
        try db.execute("INSERT INTO item (id, name, count, note) VALUES (1, 'a', 0, 'hello')")
        let batch = try db.extractChanges(for: nil, after: 0, markInFlight: false)
        let table = try #require(batch.tables.first { $0.name == "item" })
        #expect(table.valueColumns.contains("note"))
    }

    @Test(arguments: [false, true]) func aRawDeleteForgetsTheExpiryOfTheRowsItDeletes(synced: Bool) throws {
        let db = try Database.inMemory()
        try db.createTable(ExpSession.self)
        if synced { try db.enableSync(for: ExpSession.self) }
        let store = synced ? "tether_synced_expiry" : "tether_expiry"
        let later = Date(timeIntervalSinceNow: 3600)
        try db.insert(ExpSession(id: "s1", user: "arthur"), expiresAt: later)
        try db.insert(ExpSession(id: "s2", user: "barbara"), expiresAt: later)
        #expect(try db.fetchValue("SELECT count(*) FROM \(store)", as: Int.self) == 2)

        try db.execute("DELETE FROM exp_session WHERE id = 's1'")
        #expect(try db.fetchValue("SELECT count(*) FROM \(store)", as: Int.self) == 1)
        // Inserted again under the key, the row does not inherit the date.
        try db.execute("INSERT INTO exp_session (id, user) VALUES ('s1', 'again')")
        #expect(try db.expiry(of: ExpSession.self, key: PrimaryKey("s1")) == nil)
        #expect(try db.expiry(of: ExpSession.self, key: PrimaryKey("s2")) != nil)

        // Outside a transaction too, and for every row a statement deletes.
        try db.writeWithoutTransaction { conn in try conn.execute("DELETE FROM exp_session") }
        #expect(try db.fetchValue("SELECT count(*) FROM \(store)", as: Int.self) == 0)
    }

    /// The capture's own writes after a statement (metadata, tombstones) are not the statement's:
    /// the rowid and the count of changed rows the application reads are its statement's, also
    /// when a trigger of its own made the capture bury one row and stamp another.
    @Test func aStatementsRowidAndChangeCountAreItsOwn() throws {
        let db = try makeDatabase(syncing: SyncItem.self)
        try db.insert(contentsOf: (1...3).map { SyncItem(id: $0, name: "row \($0)", count: 0) })
        try db.execute(
            """
            CREATE TRIGGER touch AFTER INSERT ON item
            BEGIN UPDATE item SET count = count + 1 WHERE id = 1; DELETE FROM item WHERE id = 2; END
            """)
        #expect(try db.insert(SyncItem(id: 0, name: "new", count: 0), assigningNewKey: true) == 4)
        try db.write { connection in
            try connection.execute("INSERT INTO item (id, name, count) VALUES (10, 'ten', 0)")
            #expect(connection.lastInsertedRowID == 10)
            #expect(try connection.fetchValue("SELECT last_insert_rowid()", as: Int64.self) == 10)
            try connection.execute("UPDATE item SET count = 5 WHERE id >= 3")
            #expect(connection.changes == 3)
            #expect(try connection.fetchValue("SELECT changes()", as: Int.self) == 3)
            #expect(throws: DatabaseError.self) { try connection.execute("UPDATE item SET id = 1 WHERE id = 3") }
            #expect(connection.changes == 0)
        }
    }
}
