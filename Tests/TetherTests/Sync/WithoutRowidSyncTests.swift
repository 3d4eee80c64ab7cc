import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A note kept in a table WITHOUT ROWID (made by SQL: Tether makes no such tables), for the ORM's paths.
struct WithoutRowidNote: Model, Equatable {
    var id: String
    var body: String
    var stars: Int
    static let tableName = "note"
}

/// Tables declared WITHOUT ROWID sync as tables with a rowid do: their row metadata is keyed by a
/// surrogate mapped from the primary key (`tether_keys_T`), and triggers capture their writes.
@Suite struct WithoutRowidSyncTests {
    static let noteSchema = """
        CREATE TABLE note (id TEXT PRIMARY KEY NOT NULL, body TEXT NOT NULL, stars INTEGER NOT NULL DEFAULT 0) \
        WITHOUT ROWID
        """
    /// A composite key, one part text and one integer.
    static let cellSchema = """
        CREATE TABLE cell (sheet TEXT NOT NULL, pos INTEGER NOT NULL, value TEXT, PRIMARY KEY (sheet, pos)) STRICT, \
        WITHOUT ROWID
        """

    static func peers(
        _ count: Int, schema: String = noteSchema, table: String = "note", policy: ConflictPolicy = .lastWriterWins
    ) throws -> [Database] {
        try (0..<count).map { _ in try makeDatabase(schema: schema, syncing: [table], policy: policy) }
    }

    static func notes(_ db: Database) throws -> [String] {
        try SyncTestKit.dump(db, "SELECT id, body, stars FROM note ORDER BY id")
    }

    static func cells(_ db: Database) throws -> [String] {
        try SyncTestKit.dump(db, "SELECT sheet, pos, value FROM cell ORDER BY sheet, pos")
    }

    static let noteMeta = RowMetadataLayout.inspectionSQL(table: "note", withoutRowidKey: ["id"])

    static func status(_ db: Database, _ id: String) throws -> SyncStatus? {
        try SyncTestKit.int(db, "SELECT tether_status FROM \(noteMeta) WHERE id = ?", [id]).flatMap {
            SyncStatus(rawValue: Int($0))
        }
    }

    static func inFlight(_ db: Database, _ id: String) throws -> Bool? {
        try SyncTestKit.int(db, "SELECT tether_in_flight FROM \(noteMeta) WHERE id = ?", [id]).map { $0 != 0 }
    }

    /// Every live row has its own metadata and a surrogate, and no surrogate names a row that is gone.
    static func expectConsistentKeys(
        _ db: Database, _ table: String = "note", key: [String] = ["id"],
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let match = key.enumerated().map { "k.k\($0.offset) = t.\($0.element)" }.joined(separator: " AND ")
        let live = try SyncTestKit.int(db, "SELECT count(*) FROM \(table)") ?? -1
        let keyed =
            try SyncTestKit.int(db, "SELECT count(*) FROM tether_keys_\(table) AS k JOIN \(table) AS t ON \(match)")
            ?? -2
        let keys = try SyncTestKit.int(db, "SELECT count(*) FROM tether_keys_\(table)") ?? -3
        let withMetadata =
            try SyncTestKit.int(
                db,
                """
                SELECT count(*) FROM tether_rows_\(table) AS m JOIN tether_keys_\(table) AS k ON k.row_id = \
                m.row_id JOIN \(table) AS t ON \(match)
                """) ?? -4
        #expect(
            keyed == live && keys == live && withMetadata == live,
            "rows \(live), surrogates \(keys) (\(keyed) of live rows), with metadata \(withMetadata)",
            sourceLocation: sourceLocation)
    }

    // MARK: Basics

    @Test func aTableWithoutRowidSyncsToAPeer() throws {
        let a = try makeDatabase(schema: Self.noteSchema)
        // Rows written before the table is synced reach peers too.
        try a.execute("INSERT INTO note (id, body, stars) VALUES ('b', 'before', 1)")
        try a.enableSync(table: "note")
        #expect(a.syncedTables == ["note"])
        #expect(
            try a.syncedTableRecords().first { $0.name == "note" }?.capturesExternalWrites == true,
            "a table WITHOUT ROWID is captured by triggers")
        let b = try Self.peers(1)[0]
        try a.execute("INSERT INTO note (id, body, stars) VALUES ('a', 'first', 2), ('c', 'third', 3)")
        try SyncTestKit.sync(a, b)
        #expect(try Self.notes(b) == ["'a'|'first'|2", "'b'|'before'|1", "'c'|'third'|3"])
        try Self.expectConsistentKeys(a)
        try Self.expectConsistentKeys(b)
    }

    @Test func insertsUpdatesAndDeletesConvergeBothWays() throws {
        let peers = try Self.peers(3)
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.execute("INSERT INTO note (id, body) VALUES ('x', 'from a'), ('y', 'from a')")
        try b.execute("INSERT INTO note (id, body) VALUES ('z', 'from b')")
        try SyncTestKit.settle(peers)
        #expect(try Self.notes(c) == ["'x'|'from a'|0", "'y'|'from a'|0", "'z'|'from b'|0"])

        try b.execute("UPDATE note SET stars = 5 WHERE id = 'x'")
        try c.execute("DELETE FROM note WHERE id = 'y'")
        try a.execute("UPDATE note SET body = 'edited' WHERE id = 'z'")
        try SyncTestKit.settle(peers)
        let expected = ["'x'|'from a'|5", "'z'|'edited'|0"]
        for peer in peers {
            #expect(try Self.notes(peer) == expected)
            try Self.expectConsistentKeys(peer)
            #expect(try SyncTestKit.int(peer, "SELECT count(*) FROM tether_dead_note WHERE id = 'y'") == 1)
        }
        // A row deleted and inserted again under its key is a new row everywhere.
        try a.execute("INSERT INTO note (id, body) VALUES ('y', 'again')")
        try SyncTestKit.settle(peers)
        for peer in peers {
            #expect(try Self.notes(peer) == ["'x'|'from a'|5", "'y'|'again'|0", "'z'|'edited'|0"])
            #expect(try SyncTestKit.int(peer, "SELECT count(*) FROM tether_dead_note") == 0)
        }
    }

    @Test func theORMsWritesAreCaptured() throws {
        let a = try Self.peers(1)[0]
        let b = try Self.peers(1)[0]
        _ = try a.insert(WithoutRowidNote(id: "one", body: "1", stars: 1))
        try a.insert(contentsOf: (2...40).map { WithoutRowidNote(id: "n\($0)", body: "\($0)", stars: $0) })
        try a.update(WithoutRowidNote(id: "one", body: "uno", stars: 11))
        #expect(try a.delete(WithoutRowidNote.self, key: ["n2"]))
        try SyncTestKit.sync(a, b)
        #expect(try b.fetchAll(WithoutRowidNote.self).count == 39)
        #expect(try b.fetch(WithoutRowidNote.self, key: ["one"]) == WithoutRowidNote(id: "one", body: "uno", stars: 11))
        #expect(try b.fetch(WithoutRowidNote.self, key: ["n2"]) == nil)
        #expect(try Self.notes(a) == Self.notes(b))
        try Self.expectConsistentKeys(a)
        try Self.expectConsistentKeys(b)
        // The row status, as SyncableModel reads it.
        #expect(try a.syncState(of: WithoutRowidNote.self, key: ["one"])?.status == .synced)
        try a.update(WithoutRowidNote(id: "one", body: "again", stars: 1))
        #expect(try a.syncState(of: WithoutRowidNote.self, key: ["one"])?.status == .updated)
    }

    @Test func writesInOneTransactionAndRolledBackOnesAreCapturedExactly() throws {
        let a = try Self.peers(1)[0]
        let b = try Self.peers(1)[0]
        try a.transaction { db in
            try db.execute("INSERT INTO note (id, body) VALUES ('kept', 'k')")
            try db.execute("UPDATE note SET stars = 2 WHERE id = 'kept'")
        }
        #expect(throws: SyncTestAbort.self) {
            try a.transaction { db in
                try db.execute("INSERT INTO note (id, body) VALUES ('lost', 'l')")
                throw SyncTestAbort()
            }
        }
        try SyncTestKit.sync(a, b)
        #expect(try Self.notes(b) == ["'kept'|'k'|2"])
        try Self.expectConsistentKeys(a)
    }

    // MARK: Status and conflicts

    @Test func syncStatusAndInFlightFollowTheRowsLifecycle() throws {
        let a = try Self.peers(1)[0]
        let b = try Self.peers(1)[0]
        try a.execute("INSERT INTO note (id, body) VALUES ('r', 'new')")
        #expect(try Self.status(a, "r") == .created)
        #expect(try Self.inFlight(a, "r") == false)
        #expect(try a.pendingChangeCount() == 1)

        let batch = try a.extractChanges(for: b.instanceKey, after: 0)
        #expect(batch.changes.map(\.key) == [[.text("r")]])
        #expect(try Self.inFlight(a, "r") == true)
        // Changed again while in flight: the acknowledgement of the first send does not cover it.
        try a.execute("UPDATE note SET body = 'newer' WHERE id = 'r'")
        #expect(try Self.inFlight(a, "r") == false)
        let report = try b.apply(batch)
        try a.acknowledge(peer: b.instanceKey, through: report.cursor)
        #expect(try Self.status(a, "r") == .created)
        try SyncTestKit.sync(a, b)
        #expect(try Self.status(a, "r") == .synced)
        #expect(try Self.inFlight(a, "r") == false)
        #expect(try Self.status(b, "r") == .synced)
        #expect(try a.pendingChangeCount() == 0)

        try b.execute("UPDATE note SET stars = 3 WHERE id = 'r'")
        #expect(try Self.status(b, "r") == .updated)
        try b.execute("DELETE FROM note WHERE id = 'r'")
        #expect(
            try SyncTestKit.int(b, "SELECT tether_status FROM tether_dead_note WHERE id = 'r'")
                == Int64(SyncStatus.deleted.rawValue))
        try SyncTestKit.sync(b, a)
        #expect(try Self.notes(a).isEmpty)
        #expect(
            try SyncTestKit.int(b, "SELECT tether_status FROM tether_dead_note WHERE id = 'r'")
                == Int64(SyncStatus.synced.rawValue))
    }

    @Test func concurrentUpdatesOfOneRowResolveTheSameEverywhere() throws {
        let peers = try Self.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO note (id, body, stars) VALUES ('r', 'start', 0)")
        try SyncTestKit.settle(peers)
        // b writes later (its clock ahead): its body wins; a's stars, changed only there, stay.
        try a.execute("UPDATE note SET body = 'from a', stars = 7 WHERE id = 'r'")
        try SyncTestKit.moveClockAhead(b)
        try b.execute("UPDATE note SET body = 'from b' WHERE id = 'r'")
        let reports = try SyncTestKit.sync(b, a)
        #expect(reports.flatMap(\.conflicts).map(\.key) == [[.text("r")]], "a's pending row met b's change")
        try SyncTestKit.settle(peers)
        #expect(try Self.notes(a) == ["'r'|'from b'|7"])
        #expect(try Self.notes(b) == Self.notes(a))
        #expect(try Self.status(a, "r") == .synced)
        #expect(try Self.status(b, "r") == .synced)
    }

    @Test func localWinsKeepsThePendingRow() throws {
        let peers = try Self.peers(2, policy: .localWins)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO note (id, body) VALUES ('r', 'start')")
        try SyncTestKit.settle(peers)
        try a.execute("UPDATE note SET body = 'mine' WHERE id = 'r'")
        try SyncTestKit.moveClockAhead(b)
        try b.execute("UPDATE note SET body = 'theirs' WHERE id = 'r'")
        let reports = try SyncTestKit.sync(b, a)
        #expect(reports.flatMap(\.conflicts).map(\.resolution) == [.keptLocal])
        #expect(try Self.notes(a) == ["'r'|'mine'|0"])
        #expect(try Self.status(a, "r") == .updated)
    }

    @Test func aDeleteAndAConcurrentUpdateResolveByVersion() throws {
        let peers = try Self.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO note (id, body) VALUES ('r', 'start'), ('s', 'start')")
        try SyncTestKit.settle(peers)
        try a.execute("UPDATE note SET body = 'updated' WHERE id = 'r'")
        try SyncTestKit.moveClockAhead(b)
        try b.execute("DELETE FROM note WHERE id = 'r'")
        try SyncTestKit.settle(peers)
        #expect(try Self.notes(a) == ["'s'|'start'|0"])
        #expect(try Self.notes(b) == Self.notes(a))
        try Self.expectConsistentKeys(a)
    }

    // MARK: Keys

    @Test func compositeKeysSync() throws {
        let peers = try Self.peers(2, schema: Self.cellSchema, table: "cell")
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO cell (sheet, pos, value) VALUES ('s1', 1, 'a'), ('s1', 2, 'b'), ('s2', 1, 'c')")
        try b.execute("INSERT INTO cell (sheet, pos, value) VALUES ('s2', 2, 'd')")
        try SyncTestKit.settle(peers)
        #expect(try Self.cells(a) == ["'s1'|1|'a'", "'s1'|2|'b'", "'s2'|1|'c'", "'s2'|2|'d'"])
        try b.execute("UPDATE cell SET value = 'B' WHERE sheet = 's1' AND pos = 2")
        try a.execute("DELETE FROM cell WHERE sheet = 's2' AND pos = 1")
        try SyncTestKit.settle(peers)
        #expect(try Self.cells(a) == ["'s1'|1|'a'", "'s1'|2|'B'", "'s2'|2|'d'"])
        #expect(try Self.cells(b) == Self.cells(a))
        try Self.expectConsistentKeys(a, "cell", key: ["sheet", "pos"])
        try Self.expectConsistentKeys(b, "cell", key: ["sheet", "pos"])
    }

    /// A change of a row's primary key is the old row's delete and the new row's insert, as for a
    /// table with a rowid and a declared key.
    @Test func changingTheKeyMovesTheRowOnPeers() throws {
        let peers = try Self.peers(2, schema: Self.cellSchema, table: "cell")
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO cell (sheet, pos, value) VALUES ('s1', 1, 'a'), ('s1', 2, 'b')")
        try SyncTestKit.settle(peers)
        try a.execute("UPDATE cell SET pos = 3 WHERE sheet = 's1' AND pos = 1")
        try a.execute("UPDATE cell SET sheet = 's9', value = 'moved' WHERE pos = 2")
        let batch = try a.extractChanges(
            for: b.instanceKey, after: try b.cursor(for: a.instanceKey).after, markInFlight: false)
        #expect(batch.changes.count == 4)
        #expect(
            batch.changes.filter(\.isAlive).map(\.key) == [[.text("s1"), .integer(3)], [.text("s9"), .integer(2)]])
        #expect(
            batch.changes.filter { !$0.isAlive }.map(\.key) == [
                [.text("s1"), .integer(1)], [.text("s1"), .integer(2)],
            ])
        try SyncTestKit.settle(peers)
        #expect(try Self.cells(b) == ["'s1'|3|'a'", "'s9'|2|'moved'"])
        #expect(try Self.cells(a) == Self.cells(b))
        try Self.expectConsistentKeys(a, "cell", key: ["sheet", "pos"])
        try Self.expectConsistentKeys(b, "cell", key: ["sheet", "pos"])
    }

    @Test func aTextKeyWithACollationIsOneRow() throws {
        let schema = "CREATE TABLE tag (name TEXT COLLATE NOCASE PRIMARY KEY, uses INTEGER) WITHOUT ROWID"
        let peers = try Self.peers(2, schema: schema, table: "tag")
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO tag (name, uses) VALUES ('Swift', 1)")
        try SyncTestKit.settle(peers)
        try b.execute("UPDATE tag SET uses = 2 WHERE name = 'SWIFT'")
        try SyncTestKit.settle(peers)
        #expect(try SyncTestKit.dump(a, "SELECT name, uses FROM tag") == ["'Swift'|2"])
        try Self.expectConsistentKeys(a, "tag", key: ["name"])
    }

    /// A secondary key as identity: the primary key is then a value that syncs, and a row whose
    /// primary key changes keeps its surrogate (and its metadata).
    @Test func aSecondaryIdentityKeepsTheRowWhenItsPrimaryKeyChanges() throws {
        let schema =
            "CREATE TABLE item (code TEXT PRIMARY KEY NOT NULL, uuid TEXT NOT NULL UNIQUE, label TEXT) WITHOUT ROWID"
        let peers = try (0..<2).map { _ -> Database in
            let db = try makeDatabase(schema: schema)
            try db.enableSync(table: "item", identity: ["uuid"])
            return db
        }
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO item (code, uuid, label) VALUES ('A1', 'u-1', 'one')")
        try SyncTestKit.settle(peers)
        let surrogate = try SyncTestKit.int(a, "SELECT row_id FROM tether_keys_item WHERE k0 = 'A1'")
        try a.execute("UPDATE item SET code = 'B2' WHERE uuid = 'u-1'")
        #expect(try SyncTestKit.int(a, "SELECT row_id FROM tether_keys_item WHERE k0 = 'B2'") == surrogate)
        let batch = try a.extractChanges(
            for: b.instanceKey, after: try b.cursor(for: a.instanceKey).after, markInFlight: false)
        #expect(batch.changes.map(\.key) == [[.text("u-1")]])
        #expect(batch.changes.map(\.isAlive) == [true])
        try SyncTestKit.settle(peers)
        #expect(try SyncTestKit.dump(b, "SELECT code, uuid, label FROM item") == ["'B2'|'u-1'|'one'"])
        try Self.expectConsistentKeys(b, "item", key: ["code"])
    }

    // MARK: Other programs, stopping, observation

    @Test func writesByAnotherConnectionAndTheShellAreCaptured() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("shared.sqlite")
        let db = try Database(path: path)
        defer { try? db.close() }
        try db.execute(Self.noteSchema)
        try db.enableSync(table: "note")
        let peer = try Self.peers(1)[0]
        try db.execute("INSERT INTO note (id, body) VALUES ('1', 'one'), ('2', 'two'), ('3', 'three')")
        try SyncTestKit.sync(db, peer)
        let before = try db.lastSequence()

        let other = try Database(path: path)
        try other.execute("INSERT INTO note (id, body) VALUES ('4', 'from other')")
        try other.execute("UPDATE note SET stars = 9 WHERE id = '1'")
        try other.close()
        let shell = URL(fileURLWithPath: "/usr/bin/sqlite3")
        if FileManager.default.isExecutableFile(atPath: shell.path) {
            let process = Process()
            process.executableURL = shell
            process.arguments = [
                path, "INSERT INTO note (id, body) VALUES ('5', 'shell'); DELETE FROM note WHERE id = '2';",
            ]
            try process.run()
            process.waitUntilExit()
            try #require(process.terminationStatus == 0)
        } else {
            try db.execute("INSERT INTO note (id, body) VALUES ('5', 'shell')")
            try db.execute("DELETE FROM note WHERE id = '2'")
        }

        let batch = try db.extractChanges(
            for: peer.instanceKey, after: try peer.cursor(for: db.instanceKey).after, markInFlight: false)
        #expect(Set(batch.changes.map(\.key)) == [[.text("1")], [.text("2")], [.text("4")], [.text("5")]])
        #expect(batch.changes.allSatisfy { $0.sequence > before })
        #expect(try Self.status(db, "4") == .created)
        #expect(try Self.status(db, "1") == .updated)
        try SyncTestKit.sync(db, peer)
        #expect(try Self.notes(peer) == ["'1'|'one'|9", "'3'|'three'|0", "'4'|'from other'|0", "'5'|'shell'|0"])
        try Self.expectConsistentKeys(db)
    }

    @Test func observersHearInsertsUpdatesAndDeletes() throws {
        let a = try Self.peers(1)[0]
        let start = try a.lastSequence()
        try a.execute("INSERT INTO note (id, body) VALUES ('i', 'x'), ('u', 'x'), ('d', 'x')")
        let afterInsert = try a.lastSequence()
        try a.execute("UPDATE note SET body = 'y' WHERE id = 'u'")
        try a.execute("DELETE FROM note WHERE id = 'd'")
        let events = try a.write { conn in try a.syncEngine.map { try $0.changes(after: afterInsert, conn) } ?? [] }
        #expect(events.map(\.kind) == [.update, .delete])
        #expect(events.map(\.keyValues) == [[.text("u")], [.text("d")]])
        #expect(events.allSatisfy { $0.rowID == nil })
        let all = try a.write { conn in try a.syncEngine.map { try $0.changes(after: start, conn) } ?? [] }
        #expect(all.filter { $0.kind == .insert }.map(\.keyValues) == [[.text("i")], [.text("u")]])
    }

    @Test func disablingSyncDropsTheSurrogates() throws {
        let a = try Self.peers(1)[0]
        try a.execute("INSERT INTO note (id, body) VALUES ('1', 'one')")
        try a.disableSync(table: "note")
        #expect(try !a.tableExists("tether_keys_note"))
        try a.execute("INSERT INTO note (id, body) VALUES ('2', 'two')")
        try a.enableSync(table: "note")
        try Self.expectConsistentKeys(a)
        let b = try Self.peers(1)[0]
        try SyncTestKit.sync(a, b)
        #expect(try Self.notes(b) == ["'1'|'one'|0", "'2'|'two'|0"])
    }

    @Test func aColumnAddedToTheTableSyncsAndItsTriggersFollow() throws {
        let peers = try Self.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO note (id, body) VALUES ('old', 'x')")
        try SyncTestKit.settle(peers)
        for peer in peers { try peer.execute("ALTER TABLE note ADD COLUMN color TEXT") }
        try a.execute("INSERT INTO note (id, body, color) VALUES ('new', 'y', 'red')")
        try a.execute("UPDATE note SET color = 'blue' WHERE id = 'old'")
        try SyncTestKit.settle(peers)
        #expect(try SyncTestKit.dump(b, "SELECT id, color FROM note ORDER BY id") == ["'new'|'red'", "'old'|'blue'"])
        try Self.expectConsistentKeys(a)
        try Self.expectConsistentKeys(b)
    }

    /// A peer back after its peer collected tombstones it never received gets a full resync,
    /// which removes the rows deleted meanwhile and keeps its own pending ones.
    @Test func aReturningPeerGetsAFullResync() throws {
        let peers = try Self.peers(3)
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.write { conn in
            for id in 1...5 { try conn.execute("INSERT INTO note (id, body) VALUES (?, ?)", ["n\(id)", "a\(id)"]) }
        }
        try SyncTestKit.settle(peers)
        try b.execute("INSERT INTO note (id, body) VALUES ('n9', 'b offline')")
        try b.execute("UPDATE note SET body = 'b edit' WHERE id = 'n4'")
        try a.execute("DELETE FROM note WHERE id IN ('n2', 'n3')")
        try a.execute("UPDATE note SET body = 'a edit' WHERE id = 'n5'")
        try SyncTestKit.sync(a, c)
        try a.execute("UPDATE tether_peers SET last_seen = 0 WHERE instance_key = ?", [Data(b.instanceKey.bytes)])
        #expect(try a.collectGarbage(forgettingPeersUnseenFor: .seconds(3_600)) >= 2)

        let cursor = try b.cursor(for: a.instanceKey)
        let first = try a.extractChanges(
            for: b.instanceKey, after: cursor.after, resuming: cursor.resyncing, limits: BatchLimits(maximumChanges: 2))
        #expect(first.isResync)
        try b.apply(try BatchCoding.decode(BatchCoding.encode(first)))
        try a.acknowledge(peer: b.instanceKey, through: first.through)
        if !first.isLast { try SyncTestKit.sync(a, b, maximumChanges: 2) }
        #expect(try !b.cursor(for: a.instanceKey).resyncing)
        let expected = ["'n1'|'a1'|0", "'n4'|'b edit'|0", "'n5'|'a edit'|0", "'n9'|'b offline'|0"]
        #expect(try Self.notes(b) == expected)
        #expect(try Self.status(b, "n9") == .created)
        #expect(try Self.status(b, "n4") == .updated)
        try SyncTestKit.settle(peers)
        for peer in peers {
            #expect(try Self.notes(peer) == expected)
            try Self.expectConsistentKeys(peer)
        }
    }

    /// A peer's delete applied here deletes, by a foreign key's cascade, rows of a table WITHOUT
    /// ROWID: those are local deletes (as the hook records them for other tables), which reach
    /// the peers that still hold the rows.
    @Test func cascadesOfAnAppliedChangeAreLocalDeletes() throws {
        let peers = try (0..<3).map { _ in
            try makeDatabase(schema: WithoutRowidConvergence.schema, syncing: ["parent", "child"])
        }
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.execute("INSERT INTO parent (id, name) VALUES ('p', 'parent')")
        try a.execute("INSERT INTO child (parent_id, slot, value) VALUES ('p', 1, 10)")
        try SyncTestKit.settle(peers)
        // b adds a child nobody else has yet, and gives it to c only; a deletes the parent.
        try b.execute("INSERT INTO child (parent_id, slot, value) VALUES ('p', 2, 20)")
        try SyncTestKit.sync(b, c)
        try a.execute("DELETE FROM parent WHERE id = 'p'")
        try SyncTestKit.sync(a, b)
        #expect(try SyncTestKit.int(b, "SELECT count(*) FROM child") == 0)
        #expect(
            try SyncTestKit.int(
                b,
                "SELECT count(*) FROM tether_dead_child WHERE slot = 2 AND tether_seq IS NOT NULL AND tether_status = 3"
            ) == 1,
            "b deleted its child by the cascade: a local delete")
        try SyncTestKit.settle(peers)
        for peer in peers {
            #expect(try WithoutRowidConvergence.dump(peer).isEmpty)
            try Self.expectConsistentKeys(peer, "child", key: ["parent_id", "slot"])
        }
    }

    // MARK: Convergence and crashes

    @Test(arguments: Array(0..<4))
    func replicasConverge(shard: Int) throws {
        let perShard = (ProcessInfo.processInfo.environment["TETHER_LONG_TESTS"] == nil ? 48 : 2_000) / 4
        var parents = 0
        var children = 0
        for index in 0..<perShard {
            let rows = try WithoutRowidConvergence.run(seed: UInt64(shard * perShard + index))
            parents += rows.parents
            children += rows.children
        }
        // The edits are not all refused: the replicas end with rows of both tables.
        #expect(parents > perShard && children > 0, "\(parents) parents, \(children) children")
    }

    @Test func applySurvivesSIGKILL() throws {
        var random = SeededGenerator(seed: 7)
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let source = try makeDatabase(schema: Self.cellSchema, syncing: ["cell"])
        try source.transaction { db in
            for index in 1...1_500 {
                try db.execute(
                    "INSERT INTO cell (sheet, pos, value) VALUES (?, ?, ?)", ["s\(index % 7)", index, "v\(index)"])
            }
        }
        for _ in 0..<300 {
            let index = Int.random(in: 1...1_500, using: &random)
            if Bool.random(using: &random) {
                try source.execute("UPDATE cell SET value = value || 'u' WHERE pos = ?", [index])
            } else {
                try source.execute("DELETE FROM cell WHERE pos = ?", [index])
            }
        }
        let (paths, cursor) = try SyncCrashTests.writeBatches(from: source, into: directory)
        func makeTarget(_ path: String) throws {
            let db = try Database(path: path)
            try db.execute(Self.cellSchema)
            try db.enableSync(table: "cell")
            try db.close()
        }
        let referencePath = directory.file("reference.sqlite")
        try makeTarget(referencePath)
        #expect(
            try SyncCrashTests.runWorker(database: referencePath, batches: paths, killAfter: nil).output.last
                == "finished")
        let targetPath = directory.file("target.sqlite")
        try makeTarget(targetPath)
        #expect(
            try SyncCrashTests.killRepeatedly(database: targetPath, batches: paths, attempts: 4, random: &random) > 0)
        #expect(
            try SyncCrashTests.runWorker(database: targetPath, batches: paths, killAfter: nil).output.last == "finished"
        )

        let target = try Database(path: targetPath)
        let reference = try Database(path: referencePath)
        #expect(try Self.cells(target) == Self.cells(source))
        #expect(try Self.cells(reference) == Self.cells(source))
        #expect(try target.cursor(for: source.instanceKey).after == cursor)
        #expect(try target.lastSequence() == reference.lastSequence())
        #expect(try target.fetchValue("PRAGMA integrity_check", as: String.self) == "ok")
        try Self.expectConsistentKeys(target, "cell", key: ["sheet", "pos"])
    }
}

/// `ConvergenceScenario` over tables WITHOUT ROWID: a parent with a text key and a unique column,
/// a child with a composite key referring to it, edited at random (keys changed included) on
/// replicas that exchange batches out of order, twice, or late.
struct WithoutRowidConvergence {
    static let schema = """
        CREATE TABLE parent (id TEXT PRIMARY KEY NOT NULL, name TEXT, code TEXT UNIQUE, stock INTEGER NOT NULL \
        DEFAULT 0) WITHOUT ROWID;
        CREATE TABLE child (parent_id TEXT NOT NULL REFERENCES parent(id) ON DELETE CASCADE, slot INTEGER NOT NULL, \
        value INTEGER,
          PRIMARY KEY (parent_id, slot)) WITHOUT ROWID;
        """

    struct Parent: Model {
        var id: String
        var name: String?
        var code: String?
        static let tableName = "parent"
    }

    /// The rows the replicas hold at the end.
    @discardableResult
    static func run(seed: UInt64) throws -> (parents: Int, children: Int) {
        var sizes = SeededGenerator(seed: seed ^ 0x5EED)
        let replicas = try (0..<Int.random(in: 2...5, using: &sizes)).map { _ in
            let db = try Database.inMemory()
            try db.execute(schema)
            // A counter (issue 39), which only the triggers capture in a table WITHOUT ROWID.
            try db.enableSync(table: "parent", columnRules: ["stock": .counter])
            try db.enableSync(table: "child")
            return db
        }
        var scenario = try ConvergenceScenario(seed: seed, replicas: replicas)
        for _ in 0..<Int.random(in: 5...40, using: &sizes) {
            if Int.random(in: 0..<3, using: &scenario.random) == 0 {
                try scenario.randomExchange()
            } else {
                randomEdit(&scenario)
            }
            // Drawn apart: the other edits stay the ones they were.
            if Int.random(in: 0..<3, using: &scenario.counterRandom) == 0 {
                let db = replicas[Int.random(in: 0..<replicas.count, using: &scenario.counterRandom)]
                let parent = "p\(Int.random(in: 0..<6, using: &scenario.counterRandom))"
                let amount = Int.random(in: -5...9, using: &scenario.counterRandom)
                _ = try? db.execute("UPDATE parent SET stock = stock + ? WHERE id = ?", [amount, parent])
            }
        }
        try scenario.settle()
        let reference = try dump(replicas[0])
        for (index, replica) in replicas.enumerated().dropFirst() {
            let dump = try dump(replica)
            #expect(
                dump == reference,
                "seed \(seed): replica \(index) differs from replica 0\n--- 0:\n\(reference)\n--- \(index):\n\(dump)")
            if dump != reference { return (0, 0) }
        }
        for replica in replicas {
            try WithoutRowidSyncTests.expectConsistentKeys(replica, "parent", key: ["id"])
            try WithoutRowidSyncTests.expectConsistentKeys(replica, "child", key: ["parent_id", "slot"])
        }
        return (
            Int(try SyncTestKit.int(replicas[0], "SELECT count(*) FROM parent") ?? 0),
            Int(try SyncTestKit.int(replicas[0], "SELECT count(*) FROM child") ?? 0)
        )
    }

    static func randomEdit(_ scenario: inout ConvergenceScenario) {
        let db = scenario.replicas[Int.random(in: 0..<scenario.replicas.count, using: &scenario.random)]
        let parent = "p\(Int.random(in: 0..<6, using: &scenario.random))"
        let other = "p\(Int.random(in: 0..<6, using: &scenario.random))"
        let code = "c\(Int.random(in: 0..<4, using: &scenario.random))"
        let slot = Int.random(in: 0..<4, using: &scenario.random)
        let value = Int.random(in: 0..<100, using: &scenario.random)
        // Local constraint failures are part of the game: the edit just does not happen.
        switch Int.random(in: 0..<12, using: &scenario.random) {
        case 0, 1:
            _ = try? db.execute("INSERT INTO parent (id, name, code) VALUES (?, ?, ?)", [parent, "n\(value)", code])
        case 2: _ = try? db.execute("UPDATE parent SET name = ? WHERE id = ?", ["n\(value)", parent])
        case 3: _ = try? db.execute("UPDATE parent SET code = ? WHERE id = ?", [code, parent])
        case 4: _ = try? db.execute("DELETE FROM parent WHERE id = ?", [parent])
        case 5: _ = try? db.execute("UPDATE parent SET id = ? WHERE id = ?", [other, parent])
        case 6:
            _ = try? db.insert(contentsOf: [
                Parent(id: parent, name: "orm\(value)", code: nil), Parent(id: other, name: "orm", code: code),
            ])
        case 7, 8:
            _ = try? db.execute("INSERT INTO child (parent_id, slot, value) VALUES (?, ?, ?)", [parent, slot, value])
        case 9:
            _ = try? db.execute("UPDATE child SET value = ? WHERE parent_id = ? AND slot = ?", [value, parent, slot])
        case 10:
            _ = try? db.execute(
                "UPDATE child SET slot = ? WHERE parent_id = ? AND slot = ?", [(slot + 1) % 4, parent, slot])
        default: _ = try? db.execute("DELETE FROM child WHERE parent_id = ? AND slot = ?", [parent, slot])
        }
    }

    static func dump(_ db: Database) throws -> String {
        let parents = try db.fetchRows("SELECT id, name, code, stock FROM parent ORDER BY id")
        let children = try db.fetchRows("SELECT parent_id, slot, value FROM child ORDER BY parent_id, slot")
        return (parents + children).map { $0.values.map(\.description).joined(separator: "|") }.joined(separator: "\n")
    }
}

extension ConvergenceScenario {
    /// The scenario's exchanges over replicas of another schema.
    init(seed: UInt64, replicas: [Database]) throws {
        self.seed = seed
        random = SeededGenerator(seed: seed)
        counterRandom = SeededGenerator(seed: seed ^ 0xC0_C0)
        scopeRandom = SeededGenerator(seed: seed ^ 0x5C_0BE)
        self.replicas = replicas
    }
}
