import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Change capture: sequence numbers, rollbacks, compaction, row status.
@Suite struct SyncBehaviorCaptureTests {
    func itemDatabase() throws -> Database {
        try makeDatabase(syncing: SyncTestItem.self)
    }

    /// Runs `write` and checks it gave each row in `ids` a new sequence
    /// number, above every number given before, and moved lastSequence to the highest.
    func expectNewSequences(
        _ db: Database, _ ids: [Int64], _ what: String, _ write: () throws -> Void,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let before = try db.lastSequence()
        try write()
        let after = try db.lastSequence()
        #expect(after > before, "\(what): lastSequence did not move (\(before))", sourceLocation: sourceLocation)
        var seen: Set<Int64> = []
        for id in ids {
            let sequence = try SyncTestKit.sequence(db, "sync_item", id: id)
            #expect(
                sequence != nil && sequence! > before && sequence! <= after,
                "\(what): row \(id) has sequence \(String(describing: sequence)), expected in \(before + 1)...\(after)",
                sourceLocation: sourceLocation)
            if let sequence {
                #expect(
                    seen.insert(sequence).inserted, "\(what): sequence \(sequence) given twice",
                    sourceLocation: sourceLocation)
            }
        }
    }

    @Test func everyCommittedWriteGetsANewIncreasingSequenceNumber() throws {
        let db = try itemDatabase()
        try expectNewSequences(db, [1], "ORM insert") { try db.insert(SyncTestItem(id: 1, name: "one", count: 1)) }
        try expectNewSequences(db, [2, 3], "ORM insert(contentsOf:)") {
            try db.insert(contentsOf: [
                SyncTestItem(id: 2, name: "two", count: 2), SyncTestItem(id: 3, name: "three", count: 3),
            ])
        }
        try expectNewSequences(db, [1], "ORM update") { try db.update(SyncTestItem(id: 1, name: "uno", count: 1)) }
        try expectNewSequences(db, [2], "ORM save of an existing row") {
            try db.save(SyncTestItem(id: 2, name: "dos", count: 2))
        }
        try expectNewSequences(db, [4], "ORM save of a new row") {
            try db.save(SyncTestItem(id: 4, name: "four", count: 4))
        }
        try expectNewSequences(db, [3], "ORM delete") { _ = try db.delete(SyncTestItem.self, key: PrimaryKey(3)) }
        #expect(try SyncTestKit.deadStatus(db, "sync_item", id: 3) == .deleted)
        try expectNewSequences(db, [5], "raw INSERT") {
            try db.execute("INSERT INTO sync_item (id, name, count) VALUES (5, 'five', 5)")
        }
        try expectNewSequences(db, [5], "raw UPDATE") { try db.execute("UPDATE sync_item SET count = 50 WHERE id = 5") }
        try expectNewSequences(db, [6], "raw INSERT in autocommit mode") {
            try db.writeWithoutTransaction {
                try $0.execute("INSERT INTO sync_item (id, name, count) VALUES (6, 'six', 6)")
            }
        }
        try expectNewSequences(db, [6], "raw UPDATE in autocommit mode") {
            try db.writeWithoutTransaction { try $0.execute("UPDATE sync_item SET name = 'SIX' WHERE id = 6") }
        }
        try expectNewSequences(db, [6], "raw DELETE in autocommit mode") {
            try db.writeWithoutTransaction { try $0.execute("DELETE FROM sync_item WHERE id = 6") }
        }
        try expectNewSequences(db, [1, 2, 7], "several statements in one transaction") {
            try db.transaction { conn in
                try conn.execute("UPDATE sync_item SET count = 10 WHERE id = 1")
                try conn.execute("DELETE FROM sync_item WHERE id = 2")
                try conn.execute("INSERT INTO sync_item (id, name, count) VALUES (7, 'seven', 7)")
            }
        }
        // A deleted row inserted again gets a number above its tombstone's, and the tombstone goes.
        try expectNewSequences(db, [3], "re-insert of a deleted row") {
            try db.insert(SyncTestItem(id: 3, name: "three again", count: 3))
        }
        #expect(try SyncTestKit.int(db, "SELECT count(*) FROM tether_dead_sync_item WHERE id = 3") == 0)

        try expectNewSequences(db, [1], "ORM replace") {
            try db.replace(SyncTestItem(id: 1, name: "replaced", count: 11))
        }
        try expectNewSequences(db, [4, 5, 7], "ORM update of a query") {
            _ = try db.update(SyncTestItem.where(\.id >= 4), set: [.set("count", to: 99)])
        }
        try expectNewSequences(db, [4], "ORM delete of a query") { _ = try db.delete(SyncTestItem.where(\.id == 4)) }
        var failures = 0
        try expectNewSequences(db, [8, 9], "ORM insertEach with a failing element") {
            failures = try db.insertEach([
                SyncTestItem(id: 8, name: "eight", count: 8), SyncTestItem(id: 1, name: "duplicate", count: 0),
                SyncTestItem(id: 9, name: "nine", count: 9),
            ]).count
        }
        #expect(failures == 1)
        try expectNewSequences(db, [9, 20], "a primary key changed (a delete and an insert)") {
            try db.execute("UPDATE sync_item SET id = 20 WHERE id = 9")
        }
        #expect(try SyncTestKit.deadStatus(db, "sync_item", id: 9) == .deleted)

        // Each row's number is unique across live rows and tombstones.
        let all = try db.fetchRows(
            """
            SELECT tether_effective_seq FROM \(SyncTestKit.meta("sync_item")) UNION ALL SELECT tether_seq FROM \
            tether_dead_sync_item
            """
        )
        .map { try $0.get(0, as: Int64.self) }
        #expect(Set(all).count == all.count)
        #expect(all.max() == (try db.lastSequence()))
    }

    @Test func sequenceNumbersAreNeverReusedAfterDeletesGarbageCollectionAndReopen() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.url.appendingPathComponent("seq.sqlite").path
        var db: Database? = try Database(path: path)
        try db!.createTable(SyncTestItem.self)
        try db!.enableSync(for: SyncTestItem.self)
        try db!.insert(contentsOf: (1...5).map { SyncTestItem(id: $0, name: "n\($0)", count: 0) })
        try db!.execute("DELETE FROM sync_item WHERE id >= 4")
        let afterDeletes = try db!.lastSequence()
        #expect(afterDeletes >= 7)
        // No peer knows this database: every tombstone may go.
        #expect(try db!.collectGarbage() == 2)
        #expect(try SyncTestKit.int(db!, "SELECT count(*) FROM tether_dead_sync_item") == 0)
        #expect(try db!.lastSequence() == afterDeletes)
        try db!.insert(SyncTestItem(id: 4, name: "again", count: 0))
        let reinserted = try #require(try SyncTestKit.sequence(db!, "sync_item", id: 4))
        #expect(reinserted > afterDeletes)
        let beforeClose = try db!.lastSequence()
        try db!.close()
        db = nil

        let reopened = try Database(path: path)
        defer { try? reopened.close() }
        #expect(try reopened.lastSequence() == beforeClose)
        try reopened.execute("INSERT INTO sync_item (id, name, count) VALUES (9, 'nine', 9)")
        let afterReopen = try #require(try SyncTestKit.sequence(reopened, "sync_item", id: 9))
        #expect(afterReopen > beforeClose)
        try reopened.insert(SyncTestItem(id: 10, name: "ten", count: 10))
        #expect(try #require(try SyncTestKit.sequence(reopened, "sync_item", id: 10)) > afterReopen)
        let all = try reopened.fetchRows("SELECT tether_effective_seq FROM \(SyncTestKit.meta("sync_item"))").map {
            try $0.get(0, as: Int64.self)
        }
        #expect(Set(all).count == all.count)
    }

    @Test func replacedAndReKeyedRowsReachPeers() throws {
        let peers = try SyncTestKit.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        try SyncTestKit.sync(a, b)
        try a.execute("UPDATE t SET id = 10 WHERE id = 1")
        try a.execute("INSERT OR REPLACE INTO t (id, name, count) VALUES (2, 'replaced', 22)")
        try a.execute("UPDATE t SET id = 30, count = 33 WHERE id = 3")
        try SyncTestKit.sync(a, b)
        #expect(try SyncTestKit.dump(a) == ["2|'replaced'|22", "10|'one'|1", "30|'three'|33"])
        #expect(try SyncTestKit.dump(b) == SyncTestKit.dump(a), "b: \(String(describing: try? SyncTestKit.dump(b)))")
    }

    @Test func aRolledBackTransactionLeavesNoTrace() throws {
        let db = try itemDatabase()
        try db.insert(contentsOf: (1...3).map { SyncTestItem(id: $0, name: "n\($0)", count: 0) })
        let peer = SyncTestKit.fakePeer()
        let sent = try db.extractChanges(for: peer, after: 0)
        try db.acknowledge(peer: peer, through: sent.through)
        let sequence = try db.lastSequence()
        let rows = try db.fetchRows(
            """
            SELECT id, name, count, tether_seq, tether_status, tether_in_flight, tether_versions FROM \
            \(SyncTestKit.meta("sync_item")) ORDER BY id
            """)

        #expect(throws: SyncTestAbort.self) {
            try db.transaction { conn in
                try conn.execute("INSERT INTO sync_item (id, name, count) VALUES (4, 'four', 4)")
                try conn.execute("UPDATE sync_item SET name = 'changed' WHERE id = 1")
                try conn.execute("DELETE FROM sync_item WHERE id = 2")
                throw SyncTestAbort()
            }
        }
        // Reading right after the rollback sees the database as it was.
        func expectUnchanged(_ what: String) {
            do {
                #expect(
                    try db.fetchRows(
                        """
                        SELECT id, name, count, tether_seq, tether_status, tether_in_flight, tether_versions FROM \
                        \(SyncTestKit.meta("sync_item")) ORDER BY id
                        """
                    )
                    .map(\.values) == rows.map(\.values), "\(what)")
                #expect(try SyncTestKit.int(db, "SELECT count(*) FROM tether_dead_sync_item") == 0, "\(what)")
                #expect(try db.lastSequence() == sequence, "\(what)")
                #expect(try db.count(SyncTestItem.where(.pendingSync)) == 0, "\(what)")
                let next = try db.extractChanges(for: peer, after: sent.through, markInFlight: false)
                #expect(next.changes.isEmpty, "\(what)")
            } catch {
                Issue.record("\(what): reading the database failed: \(error)")
            }
        }
        expectUnchanged("after a rolled-back transaction")
        // An ORM batch that fails midway is rolled back too.
        #expect(throws: (any Error).self) {
            try db.insert(contentsOf: [
                SyncTestItem(id: 5, name: "five", count: 5), SyncTestItem(id: 1, name: "duplicate", count: 0),
            ])
        }
        expectUnchanged("after a failed insert(contentsOf:)")

        // The next committed change still gets a number above every earlier one.
        try db.insert(SyncTestItem(id: 4, name: "four", count: 4))
        #expect(try #require(try SyncTestKit.sequence(db, "sync_item", id: 4)) > sequence)
        let after = try db.extractChanges(for: peer, after: sent.through, markInFlight: false)
        #expect(after.changes.map(\.key) == [[.integer(4)]])
    }

    @Test func severalChangesToARowBeforeASyncAreOneChangeWithTheLatestValues() throws {
        let db = try itemDatabase()
        let peer = SyncTestKit.fakePeer()
        try db.insert(SyncTestItem(id: 1, name: "first", count: 0))
        try db.insert(SyncTestItem(id: 2, name: "other", count: 0))
        try db.execute("UPDATE sync_item SET name = 'second' WHERE id = 1")
        try db.update(SyncTestItem(id: 1, name: "third", count: 3))
        try db.execute("UPDATE sync_item SET count = count + 1 WHERE id = 1")
        let first = try db.extractChanges(for: peer, after: 0)
        #expect(first.changes.count == 2)
        let one = try #require(first.changes.first { $0.key == [.integer(1)] })
        #expect(one.isAlive)
        #expect(one.values == [.text("third"), .integer(4)])
        try db.acknowledge(peer: peer, through: first.through)

        // After a sync: updates of one column keep per-column versions.
        try db.execute("UPDATE sync_item SET name = 'fourth' WHERE id = 1")
        try db.execute("UPDATE sync_item SET name = 'fifth' WHERE id = 1")
        let second = try db.extractChanges(for: peer, after: first.through)
        #expect(second.changes.count == 1)
        let change = try #require(second.changes.first)
        #expect(change.key == [.integer(1)])
        #expect(change.values == [.text("fifth"), .integer(4)])
        let nameIndex = try #require(second.tables[change.table].valueColumns.firstIndex(of: "name"))
        let countIndex = try #require(second.tables[change.table].valueColumns.firstIndex(of: "count"))
        #expect(change.version(nameIndex) > change.version(countIndex))
        #expect(change.version(countIndex) == one.version(countIndex))

        // Inserted and deleted before any sync: one change, a tombstone.
        try db.insert(SyncTestItem(id: 3, name: "brief", count: 0))
        try db.execute("UPDATE sync_item SET count = 9 WHERE id = 3")
        _ = try db.delete(SyncTestItem.self, key: PrimaryKey(3))
        let third = try db.extractChanges(for: peer, after: second.through)
        #expect(third.changes.count == 1)
        #expect(third.changes.first?.key == [.integer(3)])
        #expect(third.changes.first?.isAlive == false)
        #expect(third.changes.first?.values == [.text("brief"), .integer(9)])
    }

    @Test func peersThatChangedDifferentColumnsOfOneRowBothKeepTheirChange() throws {
        let peers = try SyncTestKit.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'base', 0)")
        try SyncTestKit.sync(a, b)
        for value in 1...3 {
            try a.execute("UPDATE t SET name = ? WHERE id = 1", ["a\(value)"])
            try b.execute("UPDATE t SET count = ? WHERE id = 1", [value * 10])
        }
        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a) == ["1|'a3'|30"])
        #expect(try SyncTestKit.dump(b) == ["1|'a3'|30"])
    }

    @Test func statusFollowsLocalChangesAndAcknowledgements() throws {
        let db = try itemDatabase()
        let peer = SyncTestKit.fakePeer()
        try db.insert(SyncTestItem(id: 1, name: "one", count: 1))
        #expect(try SyncTestKit.status(db, "sync_item", id: 1) == .created)
        try db.execute("UPDATE sync_item SET count = 2 WHERE id = 1")
        #expect(try SyncTestKit.status(db, "sync_item", id: 1) == .created, "a created row stays created when updated")
        #expect(try db.count(SyncTestItem.where(.pendingSync)) == 1)

        let batch = try db.extractChanges(for: peer, after: 0)
        #expect(try SyncTestKit.inFlight(db, "sync_item", id: 1) == true)
        #expect(try db.count(SyncTestItem.where(.pendingSync)) == 1, "an in-flight row is still pending")
        #expect(try db.count(SyncTestItem.where(.inFlight)) == 1)
        try db.acknowledge(peer: peer, through: batch.through)
        #expect(try SyncTestKit.status(db, "sync_item", id: 1) == .synced)
        #expect(try SyncTestKit.inFlight(db, "sync_item", id: 1) == false)
        #expect(try db.count(SyncTestItem.where(.pendingSync)) == 0)

        try db.update(SyncTestItem(id: 1, name: "uno", count: 2))
        #expect(try SyncTestKit.status(db, "sync_item", id: 1) == .updated)
        try db.execute("UPDATE sync_item SET count = 3 WHERE id = 1")
        #expect(try SyncTestKit.status(db, "sync_item", id: 1) == .updated)
        #expect(try db.count(SyncTestItem.where(.pendingSync)) == 1)

        // An update that changes no value is not a change.
        let sequence = try SyncTestKit.sequence(db, "sync_item", id: 1)
        try db.execute("UPDATE sync_item SET name = name WHERE id = 1")
        #expect(try SyncTestKit.sequence(db, "sync_item", id: 1) == sequence)

        _ = try db.delete(SyncTestItem.self, key: PrimaryKey(1))
        #expect(try SyncTestKit.status(db, "sync_item", id: 1) == nil)
        #expect(try SyncTestKit.deadStatus(db, "sync_item", id: 1) == .deleted)
        #expect(try db.count(SyncTestItem.where(.pendingSync)) == 0, "the deleted row left the table")
        let deleted = try db.extractChanges(for: peer, after: batch.through)
        #expect(deleted.changes.map(\.isAlive) == [false])
        try db.acknowledge(peer: peer, through: deleted.through)
        #expect(try SyncTestKit.deadStatus(db, "sync_item", id: 1) == .synced)
    }
}
