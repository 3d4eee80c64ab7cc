import Foundation
import Testing
@testable import Tether

/// Garbage collection of tombstones, and the full resync of a peer that
/// comes back after its history was collected.
@Suite struct SyncBehaviorGarbageTests {
    func tombstones(_ db: Database) throws -> Int64 {
        try SyncTestKit.int(db, "SELECT count(*) FROM tether_dead_t") ?? -1
    }

    @Test func collectionKeepsTombstonesAKnownPeerHasNotAcknowledged() throws {
        let peers = try SyncTestKit.peers(3)
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.execute(
            "INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3), (4, 'four', 4)")
        try SyncTestKit.sync(a, b)
        try SyncTestKit.sync(a, c)
        try a.execute("DELETE FROM t WHERE id IN (1, 2)")
        #expect(try tombstones(a) == 2)
        try SyncTestKit.sync(a, b)

        // c has not acknowledged the deletions yet.
        #expect(try a.collectGarbage() == 0)
        #expect(try tombstones(a) == 2)
        // Sent but not acknowledged is not enough.
        let sent = try a.extractChanges(for: c.instanceKey, after: try c.cursor(for: a.instanceKey).after)
        try c.apply(sent)
        #expect(try a.collectGarbage() == 0)
        #expect(try tombstones(a) == 2)

        try a.acknowledge(peer: c.instanceKey, through: sent.through)
        let known = try a.peers()
        #expect(Set(known.map(\.instanceKey)) == [b.instanceKey, c.instanceKey])
        #expect(known.allSatisfy { $0.acknowledgedThrough >= sent.through })
        #expect(try a.collectGarbage() == 2)
        #expect(try tombstones(a) == 0)
        #expect(try SyncTestKit.dump(c) == ["3|'three'|3", "4|'four'|4"])

        // A tombstone made after the collection waits for acknowledgements again.
        try a.execute("DELETE FROM t WHERE id = 3")
        #expect(try a.collectGarbage() == 0)
        #expect(try tombstones(a) == 1)
    }

    @Test func forgottenPeersNoLongerHoldCollectionBack() throws {
        let peers = try SyncTestKit.peers(3)
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2)")
        try SyncTestKit.sync(a, b)
        try SyncTestKit.sync(a, c)
        try a.execute("DELETE FROM t WHERE id = 1")
        try SyncTestKit.sync(a, c)
        // b was last seen long ago (white box: its last_seen is set back).
        try a.execute("UPDATE tether_peers SET last_seen = 0 WHERE instance_key = ?", [Data(b.instanceKey.bytes)])
        // A peer seen recently is not forgotten.
        #expect(try a.collectGarbage(forgettingPeersUnseenFor: .seconds(3_600)) == 1)
        #expect(try a.peers().filter { $0.forgotten == nil }.map(\.instanceKey) == [c.instanceKey])
        #expect(try a.peers().first { $0.instanceKey == b.instanceKey }?.forgotten != nil)
        #expect(try tombstones(a) == 0)
    }

    /// Sets up a and b sharing rows 1...5 (made on a) plus `bRows` (made on
    /// b), then has a forget b and collect its tombstones while b is away.
    func returningPeer(bRows: [Int64]) throws -> (a: Database, b: Database, c: Database) {
        let peers = try SyncTestKit.peers(3)
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.write { conn in
            for id in 1...5 { try conn.execute("INSERT INTO t (id, name, count) VALUES (?, ?, 0)", [id, "a\(id)"]) }
        }
        for id in bRows { try b.execute("INSERT INTO t (id, name, count) VALUES (?, ?, 0)", [id, "b\(id)"]) }
        try SyncTestKit.settle([a, b, c])
        #expect(try SyncTestKit.dump(b) == SyncTestKit.dump(a), "b: \(String(describing: try? SyncTestKit.dump(b)))")

        // b goes away and keeps working offline.
        try b.execute("INSERT INTO t (id, name, count) VALUES (10, 'b offline', 0)")
        try b.execute("UPDATE t SET name = 'b edit' WHERE id = 4")
        // Meanwhile a deletes rows, changes others, and syncs with c only.
        try a.execute("DELETE FROM t WHERE id IN (2, 3)")
        try a.execute("UPDATE t SET name = 'a edit' WHERE id = 5")
        try a.execute("INSERT INTO t (id, name, count) VALUES (7, 'a7', 0)")
        try SyncTestKit.sync(a, c)
        // a forgets b and collects the tombstones c acknowledged.
        try a.execute("UPDATE tether_peers SET last_seen = 0 WHERE instance_key = ?", [Data(b.instanceKey.bytes)])
        #expect(try a.collectGarbage(forgettingPeersUnseenFor: .seconds(3_600)) >= 2)
        #expect(try a.peers().first { $0.instanceKey == b.instanceKey }?.forgotten != nil)
        #expect(try tombstones(a) == 0)
        return (a, b, c)
    }

    /// b comes back: its cursor is older than a's collected history.
    func resync(_ a: Database, into b: Database) throws {
        let cursor = try b.cursor(for: a.instanceKey)
        #expect(!cursor.resyncing)
        let first = try a.extractChanges(
            for: b.instanceKey, after: cursor.after, resuming: cursor.resyncing, limits: BatchLimits(maximumChanges: 2))
        #expect(first.isResync)
        #expect(first.after == 0)
        try b.apply(try BatchCoding.decode(BatchCoding.encode(first)))
        try a.acknowledge(peer: b.instanceKey, through: first.through)
        if !first.isLast {
            #expect(try b.cursor(for: a.instanceKey).resyncing)
            try SyncTestKit.sync(a, b, maximumChanges: 2)
        }
        #expect(try !b.cursor(for: a.instanceKey).resyncing)
    }

    @Test func aReturningPeerGetsAFullResyncThatRemovesRowsDeletedLongAgo() throws {
        let (a, b, c) = try returningPeer(bRows: [])
        try resync(a, into: b)
        // Rows deleted on a long ago are gone from b; b's own pending changes stay.
        #expect(
            try SyncTestKit.dump(b) == ["1|'a1'|0", "4|'b edit'|0", "5|'a edit'|0", "7|'a7'|0", "10|'b offline'|0"])
        #expect(try SyncTestKit.status(b, id: 10) == .created)
        #expect(try SyncTestKit.status(b, id: 4) == .updated)
        try SyncTestKit.settle([a, b, c])
        #expect(
            try SyncTestKit.dump(a) == ["1|'a1'|0", "4|'b edit'|0", "5|'a edit'|0", "7|'a7'|0", "10|'b offline'|0"])
        #expect(try SyncTestKit.dump(b) == SyncTestKit.dump(a), "b: \(String(describing: try? SyncTestKit.dump(b)))")
        #expect(try SyncTestKit.dump(c) == SyncTestKit.dump(a), "c: \(String(describing: try? SyncTestKit.dump(c)))")
    }

    /// Rows b made itself, which a still holds, are not in a's batches to b
    /// (no echo); the resync must not take them for rows a deleted long ago.
    @Test func aReturningPeerKeepsTheRowsItMadeThatTheSenderStillHas() throws {
        let (a, b, c) = try returningPeer(bRows: [6, 8])
        try resync(a, into: b)
        try SyncTestKit.settle([a, b, c])
        let expected = [
            "1|'a1'|0", "4|'b edit'|0", "5|'a edit'|0", "6|'b6'|0", "7|'a7'|0", "8|'b8'|0", "10|'b offline'|0",
        ]
        #expect(try SyncTestKit.dump(a) == expected, "a: \(String(describing: try? SyncTestKit.dump(a)))")
        #expect(try SyncTestKit.dump(b) == expected, "b: \(String(describing: try? SyncTestKit.dump(b)))")
        #expect(try SyncTestKit.dump(c) == expected, "c: \(String(describing: try? SyncTestKit.dump(c)))")
    }

    /// A row b made and synced only with c, which a never received: the
    /// resync from a cannot tell it from a row a deleted long ago; whatever b
    /// does with it, the peers must end with the same rows.
    @Test func aReturningPeerEndsWithTheSameRowsAsPeersThatHoldItsOtherRows() throws {
        let peers = try SyncTestKit.peers(3)
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'a1', 0), (2, 'a2', 0)")
        try SyncTestKit.settle([a, b, c])
        // b makes a row and gives it to c only; then b goes away.
        try b.execute("INSERT INTO t (id, name, count) VALUES (6, 'b6', 0)")
        try SyncTestKit.sync(b, c)
        // a deletes a row, sends it to c (c acknowledges), forgets b and collects.
        try a.execute("DELETE FROM t WHERE id = 2")
        try SyncTestKit.sync(a, c)
        try a.execute("UPDATE tether_peers SET last_seen = 0 WHERE instance_key = ?", [Data(b.instanceKey.bytes)])
        #expect(try a.collectGarbage(forgettingPeersUnseenFor: .seconds(3_600)) == 1)
        try resync(a, into: b)
        try SyncTestKit.settle([a, b, c])
        let expected = ["1|'a1'|0", "6|'b6'|0"]
        #expect(try SyncTestKit.dump(a) == expected, "a: \(String(describing: try? SyncTestKit.dump(a)))")
        #expect(try SyncTestKit.dump(b) == expected, "b: \(String(describing: try? SyncTestKit.dump(b)))")
        #expect(try SyncTestKit.dump(c) == expected, "c: \(String(describing: try? SyncTestKit.dump(c)))")
    }

    /// b edited, while away, a row a deleted and collected: b's changes wait until b took a's
    /// resync (they would bring the row back), and the resync deletes it on b (the delete wins,
    /// as it would against the tombstone). Rows b made while away stay and reach everyone.
    @Test func aReturningPeerLosesItsEditOfARowDeletedWhileItWasAway() throws {
        let (a, b, c) = try returningPeer(bRows: [])
        try b.execute("UPDATE t SET name = 'b edit of a deleted row' WHERE id = 2")
        // b pushes first: a takes nothing of it before b has its resync.
        #expect(SyncTestKit.syncErrorCase { try SyncTestKit.sync(b, a) } == "awaitingResync")
        #expect(try SyncTestKit.dump(a) == ["1|'a1'|0", "4|'a4'|0", "5|'a edit'|0", "7|'a7'|0"])
        try resync(a, into: b)
        #expect(
            try a.peers().first { $0.instanceKey == b.instanceKey }?.forgotten == nil,
            "remembered once it acknowledged the resync")
        #expect(
            try SyncTestKit.dump(b) == ["1|'a1'|0", "4|'b edit'|0", "5|'a edit'|0", "7|'a7'|0", "10|'b offline'|0"])
        // Deleted on b as b's own deletes: its other peers are told.
        #expect(try tombstones(b) == 2)
        try SyncTestKit.settle([b, a, c])
        let expected = ["1|'a1'|0", "4|'b edit'|0", "5|'a edit'|0", "7|'a7'|0", "10|'b offline'|0"]
        for (name, db) in [("a", a), ("b", b), ("c", c)] {
            #expect(try SyncTestKit.dump(db) == expected, "\(name): \(String(describing: try? SyncTestKit.dump(db)))")
        }
    }

    /// The forgotten peer is a relay: r sits between a and s and goes away from a (not from s).
    /// a deletes rows (made by c) and collects; s edits one of them and makes a row, both reaching r. When r
    /// returns, the rows a deleted are deleted on r as r's own deletes, so that s, which r asks
    /// again for everything, does not bring them back; s's new row reaches a.
    @Test func aForgottenRelayReturnsWithoutBringingDeletedRowsBack() throws {
        let peers = try SyncTestKit.peers(4)
        let (a, r, s, c) = (peers[0], peers[1], peers[2], peers[3])
        // Rows 2 and 3 are c's (a row a made itself, a knows it deleted: its own echo).
        try a.write { conn in
            for id in [1, 4, 5] {
                try conn.execute("INSERT INTO t (id, name, count) VALUES (?, ?, 0)", [id, "a\(id)"])
            }
        }
        try c.execute("INSERT INTO t (id, name, count) VALUES (2, 'a2', 0), (3, 'a3', 0)")
        try SyncTestKit.settle([a, c])
        try SyncTestKit.settle([a, r])
        try SyncTestKit.settle([r, s])
        try SyncTestKit.settle([a, r])
        #expect(try SyncTestKit.dump(s) == SyncTestKit.dump(a))

        // r is away from a; s and r go on syncing.
        try s.execute("UPDATE t SET name = 's edit' WHERE id = 3")
        try s.execute("INSERT INTO t (id, name, count) VALUES (20, 's20', 0)")
        try SyncTestKit.settle([r, s])
        try a.execute("DELETE FROM t WHERE id IN (2, 3)")
        try SyncTestKit.settle([a, c])
        try a.execute("UPDATE tether_peers SET last_seen = 0 WHERE instance_key = ?", [Data(r.instanceKey.bytes)])
        #expect(try a.collectGarbage(forgettingPeersUnseenFor: .seconds(3_600)) == 2)
        // c, whose only peer is a, collects its tombstones too: no peer but r holds the rows.
        #expect(try c.collectGarbage() == 2)

        try resync(a, into: r)
        try SyncTestKit.settle([r, s])
        try SyncTestKit.settle([a, r, c])
        try SyncTestKit.settle([r, s])
        let expected = ["1|'a1'|0", "4|'a4'|0", "5|'a5'|0", "20|'s20'|0"]
        for (name, db) in [("a", a), ("r", r), ("s", s), ("c", c)] {
            #expect(try SyncTestKit.dump(db) == expected, "\(name): \(String(describing: try? SyncTestKit.dump(db)))")
        }
    }

    /// b only receives from a: a never pulls from b, so never acknowledges b's sequences. The
    /// tombstones of a's deletes do not wait for a (it has them), only for b's other peers; and a,
    /// pulling from b later, is not sent a full resync for them.
    @Test func aNodeThatOnlyReceivesCollectsTheDeletesItReceived() throws {
        let peers = try SyncTestKit.peers(3)
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        try SyncTestKit.sync(a, b)
        try SyncTestKit.sync(b, c)
        try a.execute("DELETE FROM t WHERE id IN (1, 2)")
        try SyncTestKit.sync(a, b)
        #expect(try tombstones(b) == 2)
        // c has not acknowledged them: they stay.
        #expect(try b.collectGarbage() == 0)
        try SyncTestKit.sync(b, c)
        #expect(try b.collectGarbage() == 2)
        #expect(try tombstones(b) == 0)
        #expect(try b.peers().first { $0.instanceKey == a.instanceKey }?.acknowledgedThrough == 0)

        let fromB = try a.extractChanges(for: b.instanceKey, after: 0)
        #expect(!fromB.isResync)
        let toA = try b.extractChanges(for: a.instanceKey, after: a.cursor(for: b.instanceKey).after)
        #expect(!toA.isResync, "a is not sent back the deletes it made: no resync for them")
        // c, behind b's collected history, would be.
        #expect(try b.extractChanges(for: c.instanceKey, after: 0).isResync)
        try SyncTestKit.settle([a, b, c])
        for db in [a, b, c] { #expect(try SyncTestKit.dump(db) == ["3|'three'|3"]) }
    }
}
