import Foundation
import Testing
@testable import Tether
import TetherTestSupport

struct SyncItem: Model, Equatable {
    var id: Int64
    var name: String
    var count: Int
    static let tableName = "item"
}

@Suite struct SyncSmokeTests {
    func rows(_ db: Database) throws -> [SyncItem] { try db.fetchAll(SyncItem.query.orderBy("id")) }

    func sync(_ from: Database, _ to: Database) throws {
        for sent in try sendChanges(from: from, to: to, limits: BatchLimits(maximumChanges: 3), acknowledging: false) {
            #expect(sent.delivered == sent.batch)
        }
    }

    @Test func twoPeersConverge() throws {
        let a = try makeDatabase(syncing: SyncItem.self)
        let b = try makeDatabase(syncing: SyncItem.self)
        try a.insert(contentsOf: (1...10).map { SyncItem(id: $0, name: "a\($0)", count: 0) })
        try b.insert(SyncItem(id: 100, name: "b", count: 1))
        try a.execute("UPDATE item SET count = 5 WHERE id <= 3")
        try a.delete(SyncItem.self, key: PrimaryKey(4))
        try sync(a, b)
        try sync(b, a)
        #expect(try rows(a) == rows(b))
        #expect(try rows(a).count == 10)
        // concurrent updates of different columns of the same row merge per column
        try a.execute("UPDATE item SET name = 'fromA' WHERE id = 1")
        try b.execute("UPDATE item SET count = 42 WHERE id = 1")
        try b.execute("DELETE FROM item WHERE id = 2")
        try sync(a, b)
        try sync(b, a)
        #expect(try rows(a) == rows(b))
        #expect(try a.fetch(SyncItem.self, key: PrimaryKey(1)) == SyncItem(id: 1, name: "fromA", count: 42))
        #expect(try a.fetch(SyncItem.self, key: PrimaryKey(2)) == nil)
        let pending = try a.count(SyncItem.where(.pendingSync))
        #expect(pending > 0)
    }
}

/// A syncable model the tests can make: `SyncNote` through Codable,
/// `SyncColumnNote` through @Model.
protocol SyncNoteModel: SyncableModel, Equatable {
    init(id: Int64, text: String, syncStatus: SyncStatus)
    var id: Int64 { get }
}

struct SyncNote: SyncNoteModel {
    var id: Int64
    var text: String
    var syncStatus: SyncStatus = .created
    var inFlight = false
    enum CodingKeys: String, CodingKey {
        case id, text
        case syncStatus = "tether_status", inFlight = "tether_in_flight"
    }
    static let tableName = "note"
    init(id: Int64, text: String, syncStatus: SyncStatus = .created) {
        self.id = id
        self.text = text
        self.syncStatus = syncStatus
    }
}

@Model
struct SyncColumnNote: SyncNoteModel {
    var id: Int64
    var text: String
    var syncStatus: SyncStatus = .created
    var inFlight = false
    enum CodingKeys: String, CodingKey {
        case id, text
        case syncStatus = "tether_status", inFlight = "tether_in_flight"
    }
    static let tableName = "note"
    init(id: Int64, text: String, syncStatus: SyncStatus = .created) {
        self.id = id
        self.text = text
        self.syncStatus = syncStatus
    }
}

@Suite struct SyncableModelTests {
    @Test func statusIsReadableFromModels() throws {
        try checkStatusIsReadable(SyncNote.self)
    }

    @Test func statusIsReadableFromColumnCodedModels() throws {
        #expect(try ModelSchema<SyncColumnNote>.shared().columnCoding != nil)
        try checkStatusIsReadable(SyncColumnNote.self)
    }

    func checkStatusIsReadable<Note: SyncNoteModel>(_ type: Note.Type) throws {
        let a = try makeDatabase(syncing: Note.self)
        let b = try makeDatabase(syncing: Note.self)
        try a.insert(Note(id: 1, text: "hello", syncStatus: .synced))
        try a.execute("INSERT INTO note (id, text) VALUES (2, 'raw')")
        #expect(try a.fetchAll(Note.query.orderBy("id")).map(\.syncStatus) == [.created, .created])
        let batch = try a.extractChanges(for: b.instanceKey, after: 0)
        #expect(try a.fetchAll(Note.query).allSatisfy(\.inFlight))
        try b.apply(batch)
        #expect(try b.fetchAll(Note.query).map(\.syncStatus) == [.synced, .synced])
        try a.update(Note(id: 1, text: "changed while in flight", syncStatus: .created))
        try a.acknowledge(peer: b.instanceKey, through: batch.through)
        let notes = try a.fetchAll(Note.query.orderBy("id"))
        // Row 1 changed after it was sent: still pending; row 2 is now synced.
        #expect(notes.map(\.syncStatus) == [.created, .synced])
        #expect(notes.map(\.inFlight) == [false, false])
        #expect(try a.syncState(of: Note.self, key: PrimaryKey(2))?.status == .synced)
        #expect(try a.fetchAll(Note.where(.pendingSync)).map(\.id) == [1])
    }
}

@Suite struct InsertRangeTests {
    @Test func bulkInsertsAreLoggedAsRangesAndSyncLikeAnyRow() throws {
        let a = try makeDatabase(syncing: SyncItem.self)
        let b = try makeDatabase(syncing: SyncItem.self)
        try a.insert(contentsOf: (1...20).map { SyncItem(id: $0, name: "n\($0)", count: 0) })
        try a.insert(contentsOf: (31...35).map { SyncItem(id: $0, name: "n\($0)", count: 0) })
        // Two runs of consecutive rowids: two ranges, and no per-row metadata.
        #expect(try a.fetchValue("SELECT count(*) FROM tether_insert_ranges", as: Int.self) == 2)
        #expect(
            try a.fetchValue("SELECT count(*) FROM \(SyncTestKit.meta("item")) WHERE tether_seq IS NULL", as: Int.self)
                == 25)
        // Below the ranges: explicit metadata.
        try a.insert(contentsOf: [SyncItem(id: 25, name: "gap", count: 0)])
        #expect(
            try a.fetchValue(
                "SELECT tether_seq IS NOT NULL FROM \(SyncTestKit.meta("item")) WHERE id = 25", as: Bool.self) == true)
        // A change gives a range row its own metadata, keeping untouched columns' versions.
        try a.execute("UPDATE item SET count = 7 WHERE id = 3")
        try a.execute("DELETE FROM item WHERE id = 4")
        #expect(
            try a.fetchValue(
                "SELECT tether_seq IS NOT NULL FROM \(SyncTestKit.meta("item")) WHERE id = 3", as: Bool.self) == true)
        let batch = try a.extractChanges(for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 7))
        #expect(batch.changes.count == 7)
        #expect(batch.changes.map(\.sequence) == batch.changes.map(\.sequence).sorted())
        #expect(try a.count(SyncItem.where(.inFlight)) == 7)
        try b.apply(batch)
        try a.acknowledge(peer: b.instanceKey, through: batch.through)
        #expect(try a.count(SyncItem.where(.inFlight)) == 0)
        try sendChanges(from: a, to: b, acknowledging: false)
        #expect(try b.fetchAll(SyncItem.query.orderBy("id")) == a.fetchAll(SyncItem.query.orderBy("id")))
        #expect(try b.count(SyncItem.self) == 25)
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(3))?.count == 7)
        // Concurrent edits of a range row on both sides merge per column.
        try a.execute("UPDATE item SET name = 'from a' WHERE id = 10")
        try b.execute("UPDATE item SET count = 99 WHERE id = 10")
        for (from, to) in [(a, b), (b, a)] { try sendChanges(from: from, to: to, acknowledging: false) }
        #expect(try a.fetch(SyncItem.self, key: PrimaryKey(10)) == SyncItem(id: 10, name: "from a", count: 99))
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(10)) == SyncItem(id: 10, name: "from a", count: 99))
        // Garbage collection forgets ranges no row belongs to any more.
        try a.execute("UPDATE item SET count = 1 WHERE id BETWEEN 31 AND 35")
        try a.collectGarbage()
        #expect(try a.fetchValue("SELECT count(*) FROM tether_insert_ranges", as: Int.self) == 1)
    }

    /// A live session applies one commit at a time: rows inserted by small transactions get
    /// metadata of their own, not a range each (ranges piled up one per commit, and every apply
    /// and acknowledgement read them all). A large insert is still one range; the rows sync on
    /// and are not echoed.
    @Test func smallAppliedInsertsLeaveNoRangeBehind() throws {
        let a = try makeDatabase(syncing: SyncItem.self)
        let b = try makeDatabase(syncing: SyncItem.self)
        let c = try makeDatabase(syncing: SyncItem.self)
        for id: Int64 in 1...30 {
            try a.insert(SyncItem(id: id, name: "live \(id)", count: Int(id)))
            try sendChanges(from: a, to: b)
        }
        #expect(try b.fetchValue("SELECT count(*) FROM tether_insert_ranges", as: Int.self) == 0)
        #expect(
            try b.fetchValue(
                "SELECT count(*) FROM \(SyncTestKit.meta("item")) WHERE tether_seq IS NOT NULL", as: Int.self) == 30)
        #expect(try b.count(SyncItem.where(.pendingSync)) == 0)
        try a.insert(contentsOf: (31...35).map { SyncItem(id: $0, name: "five \($0)", count: 0) })
        try sendChanges(from: a, to: b)
        #expect(try b.fetchValue("SELECT count(*) FROM tether_insert_ranges", as: Int.self) == 0)
        try a.insert(contentsOf: (36...100).map { SyncItem(id: $0, name: "bulk \($0)", count: 0) })
        try sendChanges(from: a, to: b)
        #expect(try b.fetchValue("SELECT count(*) FROM tether_insert_ranges", as: Int.self) == 1)
        // Relayed on to C, nothing travels back to B or A.
        try sendChanges(from: b, to: c)
        #expect(try c.fetchAll(SyncItem.query.orderBy("id")) == a.fetchAll(SyncItem.query.orderBy("id")))
        #expect(try c.extractChanges(for: b.instanceKey, after: 0).changes.isEmpty)
        #expect(try b.extractChanges(for: a.instanceKey, after: 0).changes.isEmpty)
    }

    /// A receiver's trigger that deletes or changes a row the same batch has just inserted: every
    /// row keeps metadata of its own (the capture's writes after the trigger's statement once took
    /// the insert's rowid), and the trigger's changes, the receiver's own, travel back.
    @Test func aReceiversTriggerChangesRowsOfTheBatchItApplies() throws {
        let a = try makeDatabase(syncing: SyncItem.self)
        let b = try makeDatabase(syncing: SyncItem.self)
        try b.execute(
            """
            CREATE TRIGGER drop_two AFTER INSERT ON item WHEN new.name = 'drop 2'
            BEGIN DELETE FROM item WHERE id = 2; UPDATE item SET count = 99 WHERE id = 3; END
            """)
        try a.insert(contentsOf: (1...5).map { SyncItem(id: $0, name: $0 == 4 ? "drop 2" : "row \($0)", count: 0) })
        try sendChanges(from: a, to: b)
        #expect(try b.fetchAll(SyncItem.query.orderBy("id")).map(\.id) == [1, 3, 4, 5])
        #expect(try b.fetchValue("SELECT count FROM item WHERE id = 3", as: Int.self) == 99)
        #expect(try b.fetchValue("SELECT count(*) FROM \(SyncTestKit.meta("item")) WHERE tether_seq IS NULL") == 0)
        #expect(
            try b.fetchValue(
                "SELECT count(*) FROM tether_rows_item WHERE row_id NOT IN (SELECT rowid FROM item)", as: Int.self) == 0
        )
        try sendChanges(from: b, to: a)
        #expect(try a.fetchAll(SyncItem.query.orderBy("id")) == b.fetchAll(SyncItem.query.orderBy("id")))
    }
}

@Suite struct BatchValidationTests {
    @Test func batchesBuiltInCodeAreCheckedBeforeUse() throws {
        let db = try makeDatabase(syncing: SyncItem.self)
        let source = InstanceKey.random()
        let version = Version(timestamp: HybridTimestamp(milliseconds: 1, counter: 0), origin: source)
        let item = TableDescriptor(name: "item", keyColumns: ["id"], valueColumns: ["name", "count"])
        let badIndex = ChangeBatch(
            source: source, after: 0, through: 1, isLast: true, tables: [item],
            changes: [
                RowChange(
                    table: 3, key: [1], isAlive: true, existence: version, values: ["a", 1], versions: [], sequence: 1)
            ])
        #expect(throws: SyncError.self) { try db.apply(badIndex) }
        let twice = TableDescriptor(name: "item", keyColumns: ["id"], valueColumns: ["name", "name"])
        let duplicated = ChangeBatch(
            source: source, after: 0, through: 1, isLast: true, tables: [twice],
            changes: [
                RowChange(
                    table: 0, key: [1], isAlive: true, existence: version, values: ["a", "b"], versions: [], sequence: 1
                )
            ])
        #expect(throws: SyncError.self) { try db.apply(duplicated) }
        #expect(throws: BatchDecodingError.self) { try BatchCoding.decode(BatchCoding.encode(duplicated)) }
        #expect(try db.count(SyncItem.self) == 0)
    }
}

@Suite struct HybridClockTests {
    /// A clock that was ahead of the wall clock (as when the wall clock later
    /// jumps back) is kept across a restart: new changes get later timestamps.
    @Test func theClockNeverGoesBackAcrossRestarts() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("clock.sqlite")
        let ahead = HybridTimestamp(milliseconds: HybridTimestamp.wallClock().milliseconds + 3_600_000, counter: 7)
        do {
            let db = try Database(path: path)
            try db.createTable(SyncItem.self)
            try db.enableSync(for: SyncItem.self)
            try db.execute("UPDATE tether_clock SET timestamp = ? WHERE id = 1", [Int64(bitPattern: ahead.rawValue)])
            try db.close()
        }
        let reopened = try Database(path: path)
        try reopened.insert(SyncItem(id: 1, name: "after restart", count: 0))
        let peer = InstanceKey.random()
        let batch = try reopened.extractChanges(for: peer, after: 0)
        let written = try #require(batch.changes.first?.existence.timestamp)
        #expect(written > ahead)
        // And it keeps moving forward.
        try reopened.execute("UPDATE item SET count = 1 WHERE id = 1")
        let next = try reopened.extractChanges(for: peer, after: batch.through)
        #expect(try #require(next.changes.first?.version(1).timestamp) > written)
    }
}

@Suite struct RelayTests {
    /// A → B → C: C received A's rows from B and does not send them back to B;
    /// B does not send them back to A. A change made on C does travel back.
    @Test func relayedRowsAreNotEchoedToThePeerTheyCameFrom() throws {
        let dbs = try (0..<3).map { _ in try makeDatabase(syncing: SyncItem.self) }
        let (a, b, c) = (dbs[0], dbs[1], dbs[2])
        try a.insert(contentsOf: (1...5).map { SyncItem(id: $0, name: "a\($0)", count: 0) })
        try a.execute("UPDATE item SET count = 1 WHERE id = 2")  // one row with its own metadata
        func pull(_ from: Database, into to: Database) throws -> Int {
            let batch = try from.extractChanges(for: to.instanceKey, after: try to.cursor(for: from.instanceKey).after)
            try to.apply(batch)
            return batch.changes.count
        }
        #expect(try pull(a, into: b) == 5)
        #expect(try pull(b, into: c) == 5)
        #expect(try pull(c, into: b) == 0)
        #expect(try pull(b, into: a) == 0)
        try c.execute("UPDATE item SET name = 'from c' WHERE id = 3")
        #expect(try pull(c, into: b) == 1)
        #expect(try pull(b, into: a) == 1)
        #expect(try a.fetch(SyncItem.self, key: PrimaryKey(3))?.name == "from c")
    }

    /// Re-enabling sync gives range rows their own metadata, including where
    /// they were received from: still nothing to send back.
    @Test func reEnablingSyncKeepsWhereRowsCameFrom() throws {
        let a = try makeDatabase(syncing: SyncItem.self)
        let b = try makeDatabase(syncing: SyncItem.self)
        try a.insert(contentsOf: (1...40).map { SyncItem(id: $0, name: "a\($0)", count: 0) })
        try b.apply(try a.extractChanges(for: b.instanceKey, after: 0))
        #expect(try b.fetchValue("SELECT count(*) FROM tether_insert_ranges", as: Int.self) == 1)
        try b.enableSync(for: SyncItem.self)
        #expect(try b.fetchValue("SELECT count(*) FROM tether_insert_ranges", as: Int.self) == 0)
        #expect(
            try b.fetchValue("SELECT count(*) FROM \(SyncTestKit.meta("item")) WHERE tether_via IS NULL", as: Int.self)
                == 0)
        #expect(try b.extractChanges(for: a.instanceKey, after: 0).changes.isEmpty)
    }
}
