import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Conflict policies, conflict reports, and identity by a secondary key.
@Suite struct SyncBehaviorPolicyTests {
    /// a (last writer wins) and b (`policy`) share row 1 ('base', 0), synced and acknowledged.
    func conflictPeers(_ policy: ConflictPolicy) throws -> (a: Database, b: Database) {
        let a = try SyncTestKit.peers(1)[0]
        let b = try Database.inMemory()
        try b.execute(SyncTestKit.schema)
        try b.enableSync(table: "t", policy: policy)
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'base', 0)")
        try SyncTestKit.sync(a, b)
        #expect(try SyncTestKit.status(b, id: 1) == .synced)
        #expect(try SyncTestKit.status(a, id: 1) == .synced)
        return (a, b)
    }

    func observe(_ db: Database) -> LockedBox<[Conflict]> {
        let box = LockedBox<[Conflict]>([])
        db.onConflict { conflict in box.withLock { $0.append(conflict) } }
        return box
    }

    /// The row's metadata, to tell an untouched row.
    func meta(_ db: Database, id: Int64 = 1) throws -> [String] {
        try SyncTestKit.dump(
            db,
            """
            SELECT tether_seq, tether_status, tether_in_flight, hex(tether_versions) FROM \
            \(SyncTestKit.meta("t")) WHERE id = \(id)
            """)
    }

    // MARK: Last writer wins

    @Test func lastWriterWinsTakesTheLaterRemoteValue() throws {
        let (a, b) = try conflictPeers(.lastWriterWins)
        let observed = observe(b)
        try b.execute("UPDATE t SET name = 'local' WHERE id = 1")
        try SyncTestKit.moveClockAhead(a)
        try a.execute("UPDATE t SET name = 'remote', count = 7 WHERE id = 1")
        let conflicts = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'remote'|7"])
        #expect(conflicts.count == 1)
        let conflict = try #require(conflicts.first)
        #expect(conflict.table == "t")
        #expect(conflict.key == [.integer(1)])
        #expect(conflict.peer == a.instanceKey)
        #expect(conflict.resolution == .lastWriterWins)
        #expect(conflict.local?["name"] == .text("local"))
        #expect(conflict.remote?["name"] == .text("remote"))
        #expect(conflict.remote?["count"] == .integer(7))
        #expect(observed.value.count == 1)
        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a) == ["1|'remote'|7"])
        #expect(try SyncTestKit.dump(b) == ["1|'remote'|7"])
    }

    @Test func lastWriterWinsKeepsTheLaterLocalValuePerColumn() throws {
        let (a, b) = try conflictPeers(.lastWriterWins)
        try a.execute("UPDATE t SET name = 'remote', count = 7 WHERE id = 1")
        try SyncTestKit.moveClockAhead(b)
        try b.execute("UPDATE t SET name = 'local' WHERE id = 1")
        let conflicts = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'local'|7"])
        #expect(conflicts.map(\.resolution) == [.lastWriterWins])
        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a) == ["1|'local'|7"])
        #expect(try SyncTestKit.dump(b) == ["1|'local'|7"])
    }

    /// A remote change to a row with a pending local change is a conflict,
    /// even when every local value is later and nothing is written.
    @Test func lastWriterWinsReportsAConflictTheLocalRowWinsEntirely() throws {
        let (a, b) = try conflictPeers(.lastWriterWins)
        let observed = observe(b)
        try a.execute("UPDATE t SET name = 'remote' WHERE id = 1")
        try SyncTestKit.moveClockAhead(b)
        try b.execute("UPDATE t SET name = 'local' WHERE id = 1")
        let conflicts = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'local'|0"])
        #expect(
            conflicts.map(\.resolution) == [.lastWriterWins],
            "the remote 'remote' lost to the pending local 'local' without a report")
        #expect(observed.value.count == 1)
    }

    // MARK: Local wins

    @Test func localWinsLeavesAPendingLocalRowUntouched() throws {
        let (a, b) = try conflictPeers(.localWins)
        let observed = observe(b)
        try b.execute("UPDATE t SET name = 'local' WHERE id = 1")
        let before = try meta(b)
        // Even a later remote change does not overwrite it.
        try SyncTestKit.moveClockAhead(a)
        try a.execute("UPDATE t SET name = 'remote', count = 7 WHERE id = 1")
        let conflicts = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'local'|0"])
        #expect(try meta(b) == before)
        #expect(try SyncTestKit.status(b, id: 1) == .updated)
        #expect(conflicts.count == 1)
        #expect(conflicts.first?.resolution == .keptLocal)
        #expect(conflicts.first?.local?["name"] == .text("local"))
        #expect(conflicts.first?.remote?["name"] == .text("remote"))
        #expect(observed.value.map(\.resolution) == [.keptLocal])

        // In flight (sent, not acknowledged) is pending too.
        _ = try b.extractChanges(for: a.instanceKey, after: 0)
        #expect(try SyncTestKit.inFlight(b, id: 1) == true)
        try a.execute("UPDATE t SET count = 8 WHERE id = 1")
        let second = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'local'|0"])
        #expect(second.map(\.resolution) == [.keptLocal])
    }

    // MARK: Remote wins

    @Test func remoteWinsReplacesAPendingLocalRow() throws {
        let (a, b) = try conflictPeers(.remoteWins)
        let observed = observe(b)
        // Even an older remote change replaces the local one.
        try a.execute("UPDATE t SET name = 'remote' WHERE id = 1")
        try SyncTestKit.moveClockAhead(b)
        try b.execute("UPDATE t SET name = 'local', count = 5 WHERE id = 1")
        let conflicts = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'remote'|0"])
        #expect(try SyncTestKit.status(b, id: 1) == .synced)
        #expect(try SyncTestKit.inFlight(b, id: 1) == false)
        #expect(try SyncTestKit.pendingCount(b) == 0)
        #expect(conflicts.map(\.resolution) == [.tookRemote])
        #expect(conflicts.first?.local?["count"] == .integer(5))
        #expect(conflicts.first?.remote?["name"] == .text("remote"))
        #expect(observed.value.map(\.resolution) == [.tookRemote])

        // An in-flight row is replaced too.
        try b.execute("UPDATE t SET count = 6 WHERE id = 1")
        _ = try b.extractChanges(for: SyncTestKit.fakePeer(), after: 0)
        #expect(try SyncTestKit.inFlight(b, id: 1) == true)
        try a.execute("UPDATE t SET name = 'remote again' WHERE id = 1")
        let second = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'remote again'|0"])
        #expect(try SyncTestKit.status(b, id: 1) == .synced)
        #expect(second.map(\.resolution) == [.tookRemote])
    }

    // MARK: Custom

    @Test func customMergeIsWrittenAsANewLocalChangeThatPropagates() throws {
        let calls = LockedBox<[([String: DatabaseValue], [String: DatabaseValue])]>([])
        let merge: MergeFunction = { local, remote in
            calls.withLock { $0.append((local, remote)) }
            var merged = remote
            if case let .text(l)? = local["name"], case let .text(r)? = remote["name"] {
                merged["name"] = .text("\(l)+\(r)")
            }
            if case let .integer(l)? = local["count"], case let .integer(r)? = remote["count"] {
                merged["count"] = .integer(max(l, r))
            }
            return merged
        }
        let (a, b) = try conflictPeers(.custom(merge))
        let observed = observe(b)
        try b.execute("UPDATE t SET name = 'local', count = 3 WHERE id = 1")
        try a.execute("UPDATE t SET name = 'remote', count = 7 WHERE id = 1")
        let sequenceBefore = try b.lastSequence()
        let conflicts = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'local+remote'|7"])
        #expect(try SyncTestKit.status(b, id: 1) == .updated)
        #expect(try #require(try SyncTestKit.sequence(b, id: 1)) > sequenceBefore)
        #expect(calls.value.count == 1)
        #expect(calls.value.first?.0["name"] == .text("local"))
        #expect(calls.value.first?.1["name"] == .text("remote"))
        #expect(conflicts.map(\.resolution) == [.merged])
        #expect(observed.value.map(\.resolution) == [.merged])

        // The merged row reaches the other peer and both settle on it.
        try SyncTestKit.sync(b, a)
        #expect(try SyncTestKit.dump(a) == ["1|'local+remote'|7"])
        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a) == ["1|'local+remote'|7"])
        #expect(try SyncTestKit.dump(b) == ["1|'local+remote'|7"])
        #expect(try SyncTestKit.status(b, id: 1) == .synced)
        #expect(calls.value.count == 1, "the merge ran again: \(calls.value)")
    }

    // MARK: Every policy

    static let policyNames = ["lastWriterWins", "localWins", "remoteWins", "custom"]

    @Test(arguments: policyNames)
    func aSyncedRowTakesRemoteChangesUnderEveryPolicy(policyName: String) throws {
        let merges = LockedBox(0)
        let policy: ConflictPolicy =
            switch policyName {
            case "localWins": .localWins
            case "remoteWins": .remoteWins
            case "custom":
                .custom { _, remote in
                    merges.withLock { $0 += 1 }; return remote
                }
            default: .lastWriterWins
            }
        let (a, b) = try conflictPeers(policy)
        let observed = observe(b)
        try a.execute("UPDATE t SET name = 'remote', count = 7 WHERE id = 1")
        var reports = try SyncTestKit.sync(a, b)
        #expect(try SyncTestKit.dump(b) == ["1|'remote'|7"])
        #expect(try SyncTestKit.status(b, id: 1) == .synced)
        try a.execute("INSERT INTO t (id, name, count) VALUES (2, 'two', 2)")
        try a.execute("DELETE FROM t WHERE id = 1")
        reports += try SyncTestKit.sync(a, b)
        #expect(try SyncTestKit.dump(b) == ["2|'two'|2"])
        #expect(reports.allSatisfy { $0.conflicts.isEmpty })
        #expect(observed.value.isEmpty)
        #expect(merges.value == 0)
        #expect(try SyncTestKit.pendingCount(b) == 0)
    }

    @Test func conflictObserversRunAfterTheCommit() throws {
        let (a, b) = try conflictPeers(.localWins)
        let seen = LockedBox<[(table: String, cursor: Int64, name: String)]>([])
        let peer = a.instanceKey
        b.onConflict { [unowned b] conflict in
            // The apply is committed: its cursor and rows are visible.
            let cursor = (try? b.cursor(for: peer).after) ?? -1
            let name = (try? SyncTestKit.dump(b, "SELECT name FROM t WHERE id = 1").first) ?? "?"
            seen.withLock { $0.append((conflict.table, cursor, name)) }
        }
        try b.execute("UPDATE t SET name = 'local' WHERE id = 1")
        try a.execute("UPDATE t SET name = 'remote' WHERE id = 1")
        try a.execute("INSERT INTO t (id, name, count) VALUES (2, 'two', 2)")
        let batch = try a.extractChanges(for: b.instanceKey, after: try b.cursor(for: a.instanceKey).after)
        let report = try b.apply(batch)
        #expect(report.conflicts.count == 1)
        #expect(seen.value.count == 1)
        #expect(seen.value.first?.table == "t")
        #expect(seen.value.first?.cursor == batch.through)
        #expect(seen.value.first?.name == "'local'")
    }

    @Test func setConflictPolicyChangesHowLaterConflictsAreSettled() throws {
        let (a, b) = try conflictPeers(.lastWriterWins)
        try b.setConflictPolicy(.localWins, for: "t")
        try b.execute("UPDATE t SET name = 'local' WHERE id = 1")
        try SyncTestKit.moveClockAhead(a)
        try a.execute("UPDATE t SET name = 'remote' WHERE id = 1")
        let first = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'local'|0"])
        #expect(first.map(\.resolution) == [.keptLocal])

        try b.setConflictPolicy(.remoteWins, for: "t")
        try a.execute("UPDATE t SET count = 9 WHERE id = 1")
        let second = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(try SyncTestKit.dump(b) == ["1|'remote'|9"])
        #expect(second.map(\.resolution) == [.tookRemote])
    }

    // MARK: Identity by a secondary key

    static let noteSchema =
        "CREATE TABLE note (id INTEGER PRIMARY KEY AUTOINCREMENT, uuid TEXT NOT NULL UNIQUE, title TEXT)"

    func notePeers(_ count: Int, policy: ConflictPolicy = .lastWriterWins) throws -> [Database] {
        try (0..<count).map { _ in
            let db = try Database.inMemory()
            try db.execute(Self.noteSchema)
            try db.enableSync(table: "note", identity: ["uuid"], policy: policy)
            return db
        }
    }

    func localID(_ db: Database, _ uuid: String) throws -> Int64? {
        try SyncTestKit.int(db, "SELECT id FROM note WHERE uuid = ?", [uuid])
    }

    @Test func rowsAreMatchedBySecondaryKeyAndTheLocalIdIsNeverSent() throws {
        let peers = try notePeers(2)
        let (a, b) = (peers[0], peers[1])
        try b.execute("INSERT INTO note (uuid, title) VALUES ('u3', 'B3')")
        try a.execute("INSERT INTO note (uuid, title) VALUES ('u1', 'A1')")
        try a.execute("INSERT INTO note (uuid, title) VALUES ('u2', 'A2')")
        let batch = try a.extractChanges(for: b.instanceKey, after: 0, markInFlight: false)
        let descriptor = try #require(batch.tables.first { $0.name == "note" })
        #expect(descriptor.keyColumns == ["uuid"])
        #expect(descriptor.valueColumns == ["title"])
        #expect(batch.changes.allSatisfy { $0.key.count == 1 && $0.values.count == 1 })
        #expect(batch.changes.map(\.key) == [[.text("u1")], [.text("u2")]])

        try SyncTestKit.settle([a, b])
        let notes = "SELECT uuid, title FROM note ORDER BY uuid"
        #expect(try SyncTestKit.dump(a, notes) == ["'u1'|'A1'", "'u2'|'A2'", "'u3'|'B3'"])
        #expect(try SyncTestKit.dump(b, notes) == SyncTestKit.dump(a, notes))
        #expect(try localID(a, "u1") == 1)
        #expect(try localID(b, "u3") == 1)
        #expect(try localID(b, "u1") != localID(a, "u1"))

        let aIDs = try SyncTestKit.dump(a, "SELECT id, uuid FROM note ORDER BY id")
        let bIDs = try SyncTestKit.dump(b, "SELECT id, uuid FROM note ORDER BY id")
        try a.execute("UPDATE note SET title = 'A1 edited' WHERE uuid = 'u1'")
        try b.execute("DELETE FROM note WHERE uuid = 'u2'")
        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a, notes) == ["'u1'|'A1 edited'", "'u3'|'B3'"])
        #expect(try SyncTestKit.dump(b, notes) == SyncTestKit.dump(a, notes))
        // Local ids never change.
        #expect(try SyncTestKit.dump(a, "SELECT id, uuid FROM note ORDER BY id") == aIDs.filter { !$0.contains("u2") })
        #expect(try SyncTestKit.dump(b, "SELECT id, uuid FROM note ORDER BY id") == bIDs.filter { !$0.contains("u2") })
    }

    @Test func modelsWithALocalKeySyncByTheirSecondaryKey() throws {
        let peers = try (0..<2).map { _ in try makeDatabase(syncing: SyncTestNote.self) }
        let (a, b) = (peers[0], peers[1])
        try b.insert(SyncTestNote(id: nil, uuid: "from-b", title: "b"))
        try a.insert(SyncTestNote(id: nil, uuid: "from-a", title: "a"))
        try SyncTestKit.settle([a, b])
        let aNotes = try a.fetchAll(SyncTestNote.query.orderBy("uuid"))
        let bNotes = try b.fetchAll(SyncTestNote.query.orderBy("uuid"))
        #expect(aNotes.map(\.uuid) == ["from-a", "from-b"])
        #expect(aNotes.map(\.title) == bNotes.map(\.title))
        #expect(aNotes.map(\.id) == [1, 2])
        #expect(bNotes.map(\.id) == [2, 1])
    }

    @Test func localWinsNeverOverwritesAPendingRowThroughItsSecondaryKey() throws {
        let peers = try notePeers(2, policy: .localWins)
        let (a, b) = (peers[0], peers[1])
        // Both peers create a row with the same identity; b's is pending.
        try a.execute("INSERT INTO note (uuid, title) VALUES ('same', 'from a')")
        try b.execute("INSERT INTO note (uuid, title) VALUES ('other', 'b other')")
        try b.execute("INSERT INTO note (uuid, title) VALUES ('same', 'from b')")
        let id = try localID(b, "same")
        let conflicts = try SyncTestKit.sync(a, b).flatMap(\.conflicts)
        #expect(
            try SyncTestKit.dump(b, "SELECT id, uuid, title FROM note ORDER BY id") == [
                "1|'other'|'b other'", "2|'same'|'from b'",
            ])
        #expect(try localID(b, "same") == id)
        #expect(conflicts.map(\.resolution) == [.keptLocal])

        // A synced row with a pending local update keeps it too.
        try a.execute("INSERT INTO note (uuid, title) VALUES ('u9', 'a9')")
        try SyncTestKit.sync(a, b)
        try b.execute("UPDATE note SET title = 'b edit' WHERE uuid = 'u9'")
        try SyncTestKit.moveClockAhead(a)
        try a.execute("UPDATE note SET title = 'a edit' WHERE uuid = 'u9'")
        try SyncTestKit.sync(a, b)
        #expect(try SyncTestKit.dump(b, "SELECT title FROM note WHERE uuid = 'u9'") == ["'b edit'"])
        #expect(try SyncTestKit.int(b, "SELECT count(*) FROM note") == 3)
    }
}
