import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Updates of consecutive bulk-inserted rows, the same columns each, in one transaction, are
/// logged as a range of their own (`UpdateRun`): the same changes, statuses and versions as rows
/// with metadata of their own would have, without a metadata row each.
@Suite struct UpdateRunTests {
    func rows(_ db: Database) throws -> [SyncItem] { try db.fetchAll(SyncItem.query.orderBy("id")) }

    func bulkInserted(_ ids: ClosedRange<Int64>) throws -> Database {
        let db = try makeDatabase(syncing: SyncItem.self)
        try db.insert(contentsOf: ids.map { SyncItem(id: $0, name: "n\($0)", count: 0) })
        return db
    }

    func ranges(_ db: Database) throws -> [String] {
        try db.fetchRows(
            """
            SELECT first_rowid || '-' || last_rowid || ' s' || status || (CASE WHEN versions IS NULL THEN '' ELSE ' \
            updated' END)
            FROM tether_insert_ranges WHERE table_name = 'item' ORDER BY first_rowid
            """
        ).map { try $0.get(0, as: String.self) }
    }

    func ownMetadataRows(_ db: Database) throws -> Int {
        try db.fetchValue("SELECT count(*) FROM tether_rows_item", as: Int.self) ?? -1
    }

    /// Updates `ids`' counts to `count`, one statement per row, in one transaction.
    func updateEach(_ db: Database, _ ids: ClosedRange<Int64>, count: Int) throws {
        try db.write { conn in
            for id in ids { try conn.update(SyncItem(id: id, name: "n\(id)", count: count), columns: ["count"]) }
        }
    }

    @Test func aRunOfUpdatesIsCutOutOfItsRangeAndSyncsLikeRowsOfTheirOwn() throws {
        let a = try bulkInserted(1...100)
        let b = try makeDatabase(syncing: SyncItem.self)
        let before =
            try a.fetchValue(
                "SELECT max(first_seq + last_rowid - first_rowid) FROM tether_insert_ranges", as: Int64.self) ?? 0
        try updateEach(a, 20...60, count: 7)
        #expect(try ranges(a) == ["1-19 s1", "20-60 s1 updated", "61-100 s1"])
        #expect(try ownMetadataRows(a) == 0)
        // The updated rows got consecutive sequence numbers after the insert's, and stay created.
        #expect(
            try a.fetchValue("SELECT first_seq FROM tether_insert_ranges WHERE first_rowid = 20", as: Int64.self)
                == before + 1)
        #expect(try a.syncState(of: SyncItem.self, key: PrimaryKey(30))?.status == .created)
        let batch = try a.extractChanges(for: b.instanceKey, after: 0)
        #expect(batch.changes.count == 100)
        #expect(batch.changes.map(\.sequence) == batch.changes.map(\.sequence).sorted())
        try b.apply(batch)
        try a.acknowledge(peer: b.instanceKey, through: batch.through)
        #expect(try rows(b) == rows(a))
        #expect(try a.count(SyncItem.where(.pendingSync)) == 0)
        // The run's rows hold per-column versions: a concurrent edit of another column merges.
        try b.execute("UPDATE item SET name = 'from b' WHERE id = 40")
        try updateEach(a, 30...50, count: 8)
        for (from, to) in [(a, b), (b, a)] { try sendChanges(from: from, to: to, acknowledging: false) }
        #expect(try a.fetch(SyncItem.self, key: PrimaryKey(40)) == SyncItem(id: 40, name: "from b", count: 8))
        #expect(try rows(b) == rows(a))
    }

    @Test func rowsReceivedFromAPeerAndUpdatedTogetherArePendingUntilAcknowledged() throws {
        let a = try bulkInserted(1...64)
        let b = try makeDatabase(syncing: SyncItem.self)
        try sendChanges(from: a, to: b)
        try updateEach(b, 1...64, count: 3)
        #expect(try ranges(b) == ["1-64 s2 updated"])
        #expect(try b.syncState(of: SyncItem.self, key: PrimaryKey(64))?.status == .updated)
        let batch = try b.extractChanges(for: a.instanceKey, after: 0)
        // Not echoes: changed here, they go back to the peer the rows came from.
        #expect(batch.changes.count == 64)
        // Sent with each column's version: the updated one is b's, the other still a's.
        #expect(
            batch.changes.allSatisfy {
                $0.versions.count == 2 && $0.versions[0].origin == a.instanceKey
                    && $0.versions[1].origin == b.instanceKey
            })
        try a.apply(batch)
        try b.acknowledge(peer: a.instanceKey, through: batch.through)
        #expect(try b.syncState(of: SyncItem.self, key: PrimaryKey(1))?.status == .synced)
        #expect(try rows(a) == rows(b))
        #expect(try rows(a).allSatisfy { $0.count == 3 })
    }

    @Test func aTableCapturingOtherProgramsWritesLogsRunsOfItsOwnUpdatesAlike() throws {
        let a = try Database.inMemory()
        try a.createTable(SyncItem.self)
        try a.enableSync(for: SyncItem.self, capturingExternalWrites: true)
        try a.insert(contentsOf: (Int64(1)...60).map { SyncItem(id: $0, name: "n\($0)", count: 0) })
        try updateEach(a, 1...60, count: 4)
        #expect(try ranges(a) == ["1-60 s1 updated"])
        #expect(try ownMetadataRows(a) == 0)
        // The triggers, paused for the library's writes, recorded nothing.
        #expect(try a.fetchValue("SELECT count(*) FROM tether_external_changes", as: Int.self) == 0)
        let b = try makeDatabase(syncing: SyncItem.self)
        try sendChanges(from: a, to: b)
        #expect(try rows(b) == rows(a))
    }

    @Test func onlyTheColumnsAnUpdateSetsAreCompared() throws {
        let a = try bulkInserted(1...20)
        let b = try makeDatabase(syncing: SyncItem.self)
        try sendChanges(from: a, to: b)
        // The key moves by the rowid: a delete and an insert, whatever the statement names.
        try a.execute("UPDATE item SET rowid = 100 WHERE id = 1")
        try a.execute("UPDATE item SET name = 'renamed', count = count WHERE id = 2")
        try a.execute("UPDATE item SET id = 200 WHERE id = 3")
        try sendChanges(from: a, to: b)
        #expect(try rows(b) == rows(a))
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(100))?.name == "n1")
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(2))?.name == "renamed")
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(3)) == nil)
    }

    @Test func oneStatementUpdatingManyRowsIsARunToo() throws {
        let a = try bulkInserted(1...50)
        try a.execute("UPDATE item SET count = count + 1")
        #expect(try ranges(a) == ["1-50 s1 updated"])
        #expect(try ownMetadataRows(a) == 0)
        // The changelog reads them back as updates (they were inserted before).
        let inserted = try a.fetchValue("SELECT inserted_first_seq FROM tether_insert_ranges", as: Int64.self)
        #expect(inserted == 1)
    }

    @Test func shortRunsGiveRowsMetadataOfTheirOwn() throws {
        let a = try bulkInserted(1...40)
        try updateEach(a, 5...(4 + UpdateRun.shortestRange - 1), count: 2)
        #expect(try ranges(a) == ["1-40 s1"])
        #expect(try ownMetadataRows(a) == Int(UpdateRun.shortestRange) - 1)
        #expect(try a.syncState(of: SyncItem.self, key: PrimaryKey(5))?.status == .created)
    }

    @Test func readsOfTheMetadataInTheTransactionSeeTheRun() throws {
        let a = try bulkInserted(1...100)
        let b = try makeDatabase(syncing: SyncItem.self)
        try sendChanges(from: a, to: b)
        try b.write { conn in
            for id in Int64(1)...40 { try conn.update(SyncItem(id: id, name: "x", count: 1), columns: ["count"]) }
            // The status is read from the metadata: the run is written before the query runs.
            #expect(
                try conn.fetchValue(
                    "SELECT count(*) FROM tether_insert_ranges WHERE versions IS NOT NULL", as: Int.self) == 1)
            #expect(try conn.count(SyncItem.where(.pendingSync)) == 40)
            for id in Int64(41)...60 { try conn.update(SyncItem(id: id, name: "x", count: 1), columns: ["count"]) }
        }
        #expect(try b.count(SyncItem.where(.pendingSync)) == 60)
        #expect(try ranges(b) == ["1-40 s2 updated", "41-60 s2 updated", "61-100 s0"])
        try sendChanges(from: b, to: a)
        #expect(try rows(a) == rows(b))
    }

    @Test func aRolledBackSavepointOrTransactionLeavesNoTraceOfItsRun() throws {
        let a = try bulkInserted(1...100)
        let metadataBefore = try ranges(a)
        struct Abandon: Error {}
        #expect(throws: Abandon.self) {
            try a.write { conn in
                for id in Int64(1)...50 {
                    try conn.update(SyncItem(id: id, name: "n\(id)", count: 9), columns: ["count"])
                }
                throw Abandon()
            }
        }
        #expect(try ranges(a) == metadataBefore)
        try a.write { conn in
            for id in Int64(1)...20 { try conn.update(SyncItem(id: id, name: "n\(id)", count: 1), columns: ["count"]) }
            _ = try? conn.transaction { () throws -> Void in
                for id in Int64(21)...60 {
                    try conn.update(SyncItem(id: id, name: "n\(id)", count: 2), columns: ["count"])
                }
                throw Abandon()
            }
            for id in Int64(61)...80 { try conn.update(SyncItem(id: id, name: "n\(id)", count: 3), columns: ["count"]) }
        }
        #expect(try ranges(a) == ["1-20 s1 updated", "21-60 s1", "61-80 s1 updated", "81-100 s1"])
        #expect(
            try rows(a).map(\.count) == Array(repeating: 1, count: 20) + Array(repeating: 0, count: 40)
                + Array(repeating: 3, count: 20) + Array(repeating: 0, count: 20))
        let b = try makeDatabase(syncing: SyncItem.self)
        try sendChanges(from: a, to: b)
        #expect(try rows(b) == rows(a))
    }

    @Test func otherChangesInTheTransactionEndTheRunAndKeepTheirOrder() throws {
        let a = try bulkInserted(1...100)
        try a.write { conn in
            for id in Int64(1)...30 { try conn.update(SyncItem(id: id, name: "n\(id)", count: 5), columns: ["count"]) }
            try conn.execute("DELETE FROM item WHERE id = 10")
            try conn.execute("INSERT INTO item (id, name, count) VALUES (500, 'new', 0)")
            for id in Int64(31)...50 { try conn.update(SyncItem(id: id, name: "m\(id)", count: 5), columns: ["name"]) }
            try conn.execute("UPDATE item SET count = 6 WHERE id = 31")
        }
        #expect(try ranges(a) == ["1-30 s1 updated", "31-50 s1 updated", "51-100 s1"])
        let b = try makeDatabase(syncing: SyncItem.self)
        try sendChanges(from: a, to: b)
        #expect(try rows(b) == rows(a))
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(10)) == nil)
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(31)) == SyncItem(id: 31, name: "m31", count: 6))
        // A full resync of a third peer holds the same rows.
        let c = try makeDatabase(syncing: SyncItem.self)
        try sendChanges(from: b, to: c)
        #expect(try rows(c) == rows(a))
    }

    @Test func aDatabaseOfFormatThreeGainsTheColumnsWhenOpened() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("format3-\(UUID().uuidString).db").path
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
        do {
            let db = try Database(path: path)
            try db.createTable(SyncItem.self)
            try db.enableSync(for: SyncItem.self)
            try db.insert(contentsOf: (Int64(1)...40).map { SyncItem(id: $0, name: "n\($0)", count: 0) })
            try db.execute("ALTER TABLE tether_insert_ranges DROP COLUMN versions")
            try db.execute("ALTER TABLE tether_insert_ranges DROP COLUMN inserted_first_seq")
            try db.execute("UPDATE tether_meta SET value = 3 WHERE key = 'format'")
            try db.close()
        }
        let db = try Database(path: path)
        defer { try? db.close() }
        #expect(
            try db.fetchValue("SELECT value FROM tether_meta WHERE key = 'format'", as: Int.self)
                == RowMetadataLayout.formatVersion)
        try updateEach(db, 1...40, count: 4)
        #expect(try ranges(db) == ["1-40 s1 updated"])
        let b = try makeDatabase(syncing: SyncItem.self)
        try sendChanges(from: db, to: b)
        #expect(try rows(b) == rows(db))
    }

    /// An apply keeps the insert range it last read for the rows after it (one read a batch of
    /// scattered updates to rows loaded together), and forgets it as soon as the ranges are
    /// written (a run of updates cut out of it, a new range recorded); outside an apply nothing is kept.
    @Test func theRangeAnApplyReadIsForgottenWhenTheRangesAreWritten() throws {
        let db = try bulkInserted(1...100)
        let engine = try db.engine()
        let table = try #require(engine.table(named: "item"))
        try db.write { conn in
            var report = ApplyReport()
            try engine.whileApplying(&report, conn) { _ in
                let read = try #require(try engine.insertRange(of: table, containing: 10, conn))
                #expect(read.firstRowid == 1 && read.lastRowid == 100)
                #expect(engine.reachedRange(of: table, containing: 90)?.firstRowid == 1)
                #expect(engine.reachedRange(of: table, containing: 101) == nil)
                // The range written again, as a cut writes its pieces: what was read may be stale.
                try engine.replace(read, with: [read], of: table, conn)
                #expect(engine.reachedRange(of: table, containing: 90) == nil)
                #expect(try engine.insertRange(of: table, containing: 90, conn)?.lastRowid == 100)
                #expect(engine.reachedRange(of: table, containing: 90)?.lastRowid == 100)
            }
        }
        let outside = try db.write { conn in try engine.insertRange(of: table, containing: 10, conn) }
        #expect(outside?.lastRowid == 100)
        #expect(engine.reachedRange(of: table, containing: 10) == nil)
    }
}
