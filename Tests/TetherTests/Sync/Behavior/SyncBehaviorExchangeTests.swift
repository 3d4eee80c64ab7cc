import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Extracting batches (order, limits, no echo, in flight, acknowledgement)
/// and applying them (cursor, duplicates, atomicity, last writer wins, existence).
@Suite struct SyncBehaviorExchangeTests {
    @Test func batchesHoldChangesInSequenceOrderWithinTheirLimits() throws {
        let db = try Database.inMemory()
        try db.execute(
            """
            CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, count INTEGER);
            CREATE TABLE u (code TEXT PRIMARY KEY, label TEXT);
            """)
        try db.enableSync(table: "t")
        try db.enableSync(table: "u")
        for index in 1...4 {
            try db.execute("INSERT INTO t (id, name, count) VALUES (?, 'n', 0)", [index])
            try db.execute("INSERT INTO u (code, label) VALUES (?, 'l')", ["c\(index)"])
        }
        try db.execute("UPDATE t SET count = 1 WHERE id = 1")
        try db.execute("DELETE FROM u WHERE code = 'c2'")
        let peer = SyncTestKit.fakePeer()
        var cursor: Int64 = 0
        var keys: [String] = []
        var batches: [ChangeBatch] = []
        while true {
            let batch = try db.extractChanges(
                for: peer, after: cursor, limits: BatchLimits(maximumChanges: 3), markInFlight: false)
            batches.append(batch)
            #expect(batch.after == cursor)
            #expect(batch.changes.count <= 3)
            let sequences = batch.changes.map(\.sequence)
            #expect(
                sequences == sequences.sorted() && Set(sequences).count == sequences.count, "out of order: \(sequences)"
            )
            #expect(sequences.allSatisfy { $0 > cursor && $0 <= batch.through })
            keys += batch.changes.map { "\(batch.tables[$0.table].name):\($0.key[0].description)" }
            cursor = batch.through
            if batch.isLast { break }
            #expect(batches.count < 20)
        }
        #expect(batches.count == 3)
        #expect(batches.dropLast().allSatisfy { !$0.isLast })
        #expect(cursor == (try db.lastSequence()))
        #expect(Set(keys).count == 8 && keys.count == 8, "\(keys)")
        // The changes follow the order in which rows last changed.
        #expect(keys.last == "u:'c2'")
        #expect(keys.dropLast().last == "t:1")

        // A byte limit: each large row goes alone.
        try db.execute("UPDATE t SET name = ?", [String(repeating: "x", count: 1_000)])
        let large = try db.extractChanges(
            for: peer, after: cursor, limits: BatchLimits(maximumBytes: 100), markInFlight: false)
        #expect(large.changes.count == 1)
        #expect(!large.isLast)
    }

    /// Rows that came from the peer are left out of its batches; a table
    /// with many of them must not make the batch skip rows it did not read.
    @Test func smallBatchesDeliverEveryChangeWhenEchoesFillAFetch() throws {
        let peers = try SyncTestKit.peers(2)
        let (a, b) = (peers[0], peers[1])
        try b.write { conn in
            for id in 1...10 { try conn.execute("INSERT INTO t (id, name, count) VALUES (?, ?, 0)", [id, "b\(id)"]) }
        }
        try SyncTestKit.sync(b, a)
        // a's own changes come after those echoes; the last one is a deletion (a tombstone).
        try a.write { conn in
            for id in 11...15 { try conn.execute("INSERT INTO t (id, name, count) VALUES (?, ?, 0)", [id, "a\(id)"]) }
        }
        try a.execute("DELETE FROM t WHERE id = 10")
        try SyncTestKit.sync(a, b, maximumChanges: 2)
        #expect(try SyncTestKit.dump(b) == SyncTestKit.dump(a), "b: \(String(describing: try? SyncTestKit.dump(b)))")
        #expect(try SyncTestKit.dump(b).count == 14)
    }

    @Test func changesAreNotSentBackToThePeerTheyCameFrom() throws {
        let peers = try SyncTestKit.peers(3)
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        try SyncTestKit.sync(a, b)
        let back = try b.extractChanges(for: a.instanceKey, after: 0, markInFlight: false)
        #expect(back.changes.isEmpty)
        #expect(back.isLast)
        #expect(back.through == (try b.lastSequence()))
        let onward = try b.extractChanges(for: c.instanceKey, after: 0, markInFlight: false)
        #expect(onward.changes.count == 3)
        // A row b changed is no longer a's alone: it goes back (with a's columns too).
        try b.execute("UPDATE t SET count = 20 WHERE id = 2")
        let mixed = try b.extractChanges(for: a.instanceKey, after: back.through, markInFlight: false)
        #expect(mixed.changes.map(\.key) == [[.integer(2)]])
        #expect(mixed.changes.first?.values == [.text("two"), .integer(20)])
        try SyncTestKit.settle([a, b, c])
        #expect(try SyncTestKit.dump(a) == ["1|'one'|1", "2|'two'|20", "3|'three'|3"])
        #expect(try SyncTestKit.dump(c) == SyncTestKit.dump(a), "c: \(String(describing: try? SyncTestKit.dump(c)))")
    }

    @Test func inFlightRowsBecomeSyncedWhenAcknowledgedUnlessChangedSince() throws {
        let db = try SyncTestKit.peers(1)[0]
        let peer = SyncTestKit.fakePeer()
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        // Without markInFlight, nothing is marked.
        _ = try db.extractChanges(for: SyncTestKit.fakePeer(), after: 0, markInFlight: false)
        #expect(
            try SyncTestKit.int(db, "SELECT count(*) FROM \(SyncTestKit.meta("t")) WHERE tether_in_flight != 0") == 0)

        let batch = try db.extractChanges(for: peer, after: 0)
        #expect(batch.changes.count == 3)
        #expect(
            try SyncTestKit.int(db, "SELECT count(*) FROM \(SyncTestKit.meta("t")) WHERE tether_in_flight = 1") == 3)
        #expect(try SyncTestKit.status(db, id: 1) == .created)

        // Changed after it was sent: a new, higher number, no longer in flight.
        try db.execute("UPDATE t SET count = 22 WHERE id = 2")
        #expect(try SyncTestKit.inFlight(db, id: 2) == false)
        #expect(try #require(try SyncTestKit.sequence(db, id: 2)) > batch.through)
        try db.execute("DELETE FROM t WHERE id = 3")
        #expect(try #require(try SyncTestKit.sequence(db, id: 3)) > batch.through)

        try db.acknowledge(peer: peer, through: batch.through)
        #expect(try SyncTestKit.status(db, id: 1) == .synced)
        #expect(try SyncTestKit.inFlight(db, id: 1) == false)
        #expect(try SyncTestKit.status(db, id: 2) == .created, "changed after it was sent: still pending")
        #expect(try SyncTestKit.deadStatus(db, id: 3) == .deleted)
        #expect(try SyncTestKit.pendingCount(db) == 1)
        #expect(try db.peers().first { $0.instanceKey == peer }?.acknowledgedThrough == batch.through)

        let next = try db.extractChanges(for: peer, after: batch.through)
        #expect(next.changes.map(\.key) == [[.integer(2)], [.integer(3)]])
        #expect(next.changes.map(\.isAlive) == [true, false])
        try db.acknowledge(peer: peer, through: next.through)
        #expect(try SyncTestKit.pendingCount(db) == 0)
        #expect(try SyncTestKit.deadStatus(db, id: 3) == .synced)
    }

    @Test func applyMovesThePeersCursorAndIsIdempotent() throws {
        let peers = try SyncTestKit.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        let batch = try a.extractChanges(for: b.instanceKey, after: 0)
        let report = try b.apply(batch)
        #expect(report.applied == 3)
        #expect(!report.wasDuplicate)
        #expect(report.cursor == batch.through)
        #expect(try b.cursor(for: a.instanceKey).after == batch.through)
        #expect(try !b.cursor(for: a.instanceKey).resyncing)
        #expect(try b.peers().first { $0.instanceKey == a.instanceKey }?.receivedThrough == batch.through)
        // Rows from a peer arrive synced: nothing for b to send.
        #expect(try SyncTestKit.pendingCount(b) == 0)

        let sequence = try b.lastSequence()
        let rows = try SyncTestKit.dump(b)
        let again = try b.apply(batch)
        #expect(again.wasDuplicate)
        #expect(again.applied == 0)
        #expect(try b.lastSequence() == sequence)
        #expect(try SyncTestKit.dump(b) == rows)

        // An older batch arriving after a newer one is a duplicate too.
        try a.execute("UPDATE t SET name = 'uno' WHERE id = 1")
        let newer = try a.extractChanges(for: b.instanceKey, after: batch.through)
        try b.apply(newer)
        #expect(try b.apply(batch).wasDuplicate)
        #expect(try SyncTestKit.dump(b) == ["1|'uno'|1", "2|'two'|2", "3|'three'|3"])
    }

    @Test func aFailingApplyLeavesTheDatabaseUnchanged() throws {
        let a = try SyncTestKit.peers(1)[0]
        let b = try Database.inMemory()
        try b.execute(SyncTestKit.schema)
        try b.enableSync(table: "t", policy: .custom { _, _ in throw SyncTestAbort() })
        let observed = LockedBox(0)
        b.onConflict { _ in observed.withLock { $0 += 1 } }
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'base', 0)")
        try SyncTestKit.sync(a, b)
        try b.execute("UPDATE t SET name = 'local' WHERE id = 1")
        try a.execute("INSERT INTO t (id, name, count) VALUES (2, 'two', 2)")
        try a.execute("UPDATE t SET name = 'remote' WHERE id = 1")
        try a.execute("INSERT INTO t (id, name, count) VALUES (3, 'three', 3)")
        let batch = try a.extractChanges(for: b.instanceKey, after: try b.cursor(for: a.instanceKey).after)
        #expect(batch.changes.map(\.key) == [[.integer(2)], [.integer(1)], [.integer(3)]])

        let everything = """
            SELECT id, name, count, tether_seq, tether_status, tether_in_flight, hex(tether_versions) FROM \
            \(SyncTestKit.meta("t")) ORDER BY id
            """
        let rows = try SyncTestKit.dump(b, everything)
        let sequence = try b.lastSequence()
        let cursor = try b.cursor(for: a.instanceKey)
        #expect(throws: SyncTestAbort.self) { try b.apply(batch) }
        // Reads work right after the failed apply (an in-memory database reads on its writer).
        #expect(throws: Never.self) { _ = try b.fetchRows("SELECT count(*) FROM t") }
        #expect(try SyncTestKit.dump(b, everything) == rows)
        #expect(try b.lastSequence() == sequence)
        #expect(try b.cursor(for: a.instanceKey).after == cursor.after)
        #expect(try b.keptAsideChanges().isEmpty)
        #expect(try SyncTestKit.int(b, "SELECT count(*) FROM tether_dead_t") == 0)
        #expect(observed.value == 0)

        // Nothing was recorded: with another policy the same batch applies.
        try b.setConflictPolicy(.lastWriterWins, for: "t")
        let report = try b.apply(batch)
        #expect(!report.wasDuplicate)
        #expect(try SyncTestKit.dump(b).count == 3)
    }

    @Test func equalTimestampsAreSettledByTheLargerInstanceKey() throws {
        let x = InstanceKey.random()
        let y = InstanceKey.random()
        let (low, high) = x < y ? (x, y) : (y, x)
        let time = SyncTestKit.nowMilliseconds - 60_000
        let fromLow = SyncTestKit.batch(
            from: low, changes: [SyncTestKit.row(1, name: "low", count: 1, at: SyncTestKit.version(time, low))])
        let fromHigh = SyncTestKit.batch(
            from: high, changes: [SyncTestKit.row(1, name: "high", count: 2, at: SyncTestKit.version(time, high))])
        for order in [[fromLow, fromHigh], [fromHigh, fromLow]] {
            let db = try SyncTestKit.peers(1)[0]
            for batch in order { try db.apply(batch) }
            #expect(try SyncTestKit.dump(db) == ["1|'high'|2"])
        }
        // A later timestamp wins whatever the keys.
        let later = SyncTestKit.batch(
            from: low, after: 1, through: 2,
            changes: [
                SyncTestKit.row(1, name: "later", count: 3, at: SyncTestKit.version(time, low, counter: 1), sequence: 2)
            ])
        for order in [[fromHigh, later], [later, fromHigh]] {
            let db = try SyncTestKit.peers(1)[0]
            for batch in order { try db.apply(batch) }
            #expect(try SyncTestKit.dump(db) == ["1|'later'|3"])
        }
    }

    @Test func eachColumnTakesItsLatestVersion() throws {
        let db = try SyncTestKit.peers(1)[0]
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'local', 0)")
        let remote = InstanceKey.random()
        let now = SyncTestKit.nowMilliseconds
        let existence = SyncTestKit.version(now - 3_600_000, remote)
        // The name is older than the local one, the count newer.
        let change = SyncTestKit.row(
            1, name: "old name", count: 99, at: existence,
            versions: [SyncTestKit.version(now - 3_600_000, remote), SyncTestKit.version(now + 60_000, remote)])
        try db.apply(SyncTestKit.batch(from: remote, changes: [change]))
        #expect(try SyncTestKit.dump(db) == ["1|'local'|99"])
    }

    @Test func aRowExistsIfItsLatestInsertIsLaterThanItsLatestDelete() throws {
        let peers = try SyncTestKit.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'base', 0), (2, 'keep', 0)")
        try SyncTestKit.settle([a, b])
        // a deletes; b updates the row later, without having seen the delete.
        try a.execute("DELETE FROM t WHERE id = 1")
        try SyncTestKit.moveClockAhead(b)
        try b.execute("UPDATE t SET count = 42 WHERE id = 1")
        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a) == ["2|'keep'|0"], "an update must not revive a deleted row")
        #expect(try SyncTestKit.dump(b) == ["2|'keep'|0"])
        // The tombstones keep the values (the later update included) and their versions.
        let tombstone = "SELECT id, name, count, tether_versions IS NOT NULL FROM tether_dead_t ORDER BY id"
        #expect(try SyncTestKit.dump(a, tombstone) == ["1|'base'|42|1"])
        #expect(try SyncTestKit.dump(b, tombstone) == ["1|'base'|42|1"])

        // Inserting again after the delete brings the row back everywhere.
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'back', 7)")
        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a) == ["1|'back'|7", "2|'keep'|0"])
        #expect(try SyncTestKit.dump(b) == ["1|'back'|7", "2|'keep'|0"])
        #expect(try SyncTestKit.int(b, "SELECT count(*) FROM tether_dead_t") == 0)
    }
}
