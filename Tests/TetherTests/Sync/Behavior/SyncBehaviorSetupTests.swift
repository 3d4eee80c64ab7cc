import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Instance keys and enabling sync on a table.
@Suite struct SyncBehaviorSetupTests {
    @Test func instanceKeyIsSixteenRandomBytesShownAsHex() throws {
        let a = try Database.inMemory()
        let b = try Database.inMemory()
        #expect(a.instanceKey.bytes.count == 16)
        #expect(a.instanceKey.hex.count == 32)
        #expect(a.instanceKey.hex.allSatisfy { "0123456789abcdef".contains($0) })
        #expect(a.instanceKey != b.instanceKey)
        #expect(InstanceKey(hex: a.instanceKey.hex) == a.instanceKey)
        #expect(InstanceKey(hex: a.instanceKey.hex.uppercased()) == a.instanceKey)
        #expect(InstanceKey(hex: String(a.instanceKey.hex.dropLast())) == nil)
        #expect(InstanceKey(hex: String(repeating: "zz", count: 16)) == nil)
        #expect(InstanceKey(bytes: Array(repeating: 0, count: 15)) == nil)
    }

    @Test func instanceKeyIsKeptAcrossReopen() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.url.appendingPathComponent("keyed.sqlite").path
        let first = try Database(path: path)
        let key = first.instanceKey
        try first.close()
        let second = try Database(path: path)
        #expect(second.instanceKey == key)
        try second.close()
        var readOnly = Database.Configuration()
        readOnly.readOnly = true
        let third = try Database(path: path, configuration: readOnly)
        #expect(third.instanceKey == key)
        try third.close()
        // Another file is another instance.
        let other = try Database(path: directory.url.appendingPathComponent("other.sqlite").path)
        #expect(other.instanceKey != key)
        try other.close()
    }

    @Test func enableSyncLeavesTheUsersTableAsDeclaredAndNumbersExistingRows() throws {
        let db = try Database.inMemory()
        try db.execute(SyncTestKit.schema)
        try db.execute("CREATE INDEX t_by_name ON t (name)")
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)")
        let schemaOf = { (db: Database) throws -> [String] in
            try db.fetchRows(
                """
                SELECT type || ' ' || name || ': ' || coalesce(sql, '') FROM sqlite_master WHERE tbl_name = 't' \
                ORDER BY name
                """
            )
            .map { try $0.get(0, as: String.self) }
        }
        let tableInfo = { (db: Database) throws -> [String] in
            try SyncTestKit.dump(db, "SELECT cid, name, type, \"notnull\", dflt_value, pk FROM pragma_table_info('t')")
        }
        let schemaBefore = try schemaOf(db)
        let infoBefore = try tableInfo(db)
        try db.enableSync(table: "t")
        #expect(db.syncedTables == ["t"])

        // The table, its columns and its indexes are exactly as declared; SELECT * and INSERT … VALUES see the user's
        // columns only.
        #expect(try schemaOf(db) == schemaBefore)
        #expect(try tableInfo(db) == infoBefore)
        #expect(try db.fetchRows("SELECT * FROM t WHERE id = 1").first?.columnNames == ["id", "name", "count"])
        try db.execute("INSERT INTO t VALUES (4, 'd', 4)")
        #expect(try SyncTestKit.status(db, id: 4) == .created)
        #expect(try db.tableExists("tether_rows_t"))
        #expect(try db.tableExists("tether_dead_t"))
        let deadColumns = try db.fetchRows("SELECT name FROM pragma_table_info('tether_dead_t')").map {
            try $0.get(0, as: String.self)
        }
        for column in ["id", "name", "count", "tether_seq", "tether_status", "tether_versions"] {
            #expect(deadColumns.contains(column), "tether_dead_t lacks \(column): \(deadColumns)")
        }
        try db.execute("DELETE FROM t WHERE id = 4")

        // The rows already there got sequence numbers: they reach peers.
        let rows = try db.fetchRows(
            "SELECT tether_seq, tether_status, tether_versions FROM \(SyncTestKit.meta("t")) WHERE id <= 3 ORDER BY id")
        let sequences = rows.compactMap { Int64.fromDatabaseValue($0[0]) }
        #expect(sequences.count == 3)
        #expect(Set(sequences).count == 3)
        #expect(sequences.allSatisfy { $0 > 0 && $0 <= (try? db.lastSequence()) ?? 0 })
        #expect(rows.allSatisfy { Int64.fromDatabaseValue($0[1]) == Int64(SyncStatus.created.rawValue) })
        #expect(rows.allSatisfy { !$0[2].isNull })
        let batch = try db.extractChanges(for: nil, after: 0, markInFlight: false)
        #expect(batch.changes.filter(\.isAlive).map(\.key) == [[.integer(1)], [.integer(2)], [.integer(3)]])

        let peer = try Database.inMemory()
        try peer.execute(SyncTestKit.schema)
        try peer.enableSync(table: "t")
        try peer.apply(batch)
        #expect(
            try SyncTestKit.dump(peer) == SyncTestKit.dump(db),
            "peer: \(String(describing: try? SyncTestKit.dump(peer)))")
    }

    @Test func enableSyncRefusesTablesItCannotSync() throws {
        let db = try Database.inMemory()
        try db.execute(
            """
            CREATE TABLE nokey (a TEXT, b TEXT);
            CREATE TABLE auto (id INTEGER PRIMARY KEY AUTOINCREMENT, uuid TEXT NOT NULL UNIQUE, title TEXT);
            """)
        #expect(SyncTestKit.syncErrorCase { try db.enableSync(table: "ghost") } == "invalidTable")
        #expect(SyncTestKit.syncErrorCase { try db.enableSync(table: "nokey") } == "invalidTable")
        #expect(SyncTestKit.syncErrorCase { try db.enableSync(table: "auto") } == "invalidTable")
        #expect(SyncTestKit.syncErrorCase { try db.enableSync(table: "auto", identity: ["title"]) } == "invalidTable")
        #expect(SyncTestKit.syncErrorCase { try db.enableSync(table: "auto", identity: ["missing"]) } == "invalidTable")
        #expect(SyncTestKit.syncErrorCase { try db.enableSync(table: "nokey", identity: ["a"]) } == "invalidTable")

        // A refusal changes nothing.
        #expect(db.syncedTables.isEmpty)
        for table in ["nokey", "auto"] {
            let columns = try db.fetchRows("SELECT name FROM pragma_table_info(?)", [table]).map {
                try $0.get(0, as: String.self)
            }
            #expect(!columns.contains { $0.hasPrefix("tether_") }, "\(table) was altered by a refused enableSync")
            #expect(try !db.tableExists("tether_dead_\(table)"))
            #expect(try !db.tableExists("tether_rows_\(table)"))
        }

        // With a unique identity, the AUTOINCREMENT table can be synced.
        try db.enableSync(table: "auto", identity: ["uuid"])
        #expect(db.syncedTables == ["auto"])
    }

    @Test func enableSyncForModelsFollowsTheirKeys() throws {
        let db = try Database.inMemory()
        try db.createTable(SyncTestCounter.self)
        #expect(SyncTestKit.syncErrorCase { try db.enableSync(for: SyncTestCounter.self) } == "invalidTable")
        try db.createTable(SyncTestNote.self)
        try db.enableSync(for: SyncTestNote.self)
        try db.createTable(SyncTestItem.self)
        try db.enableSync(for: SyncTestItem.self)
        #expect(db.syncedTables == ["sync_item", "sync_note"])
        try db.insert(SyncTestNote(id: nil, uuid: "u1", title: "one"))
        let batch = try db.extractChanges(for: nil, after: 0, markInFlight: false)
        let note = try #require(batch.tables.first { $0.name == "sync_note" })
        #expect(note.keyColumns == ["uuid"])
        #expect(note.valueColumns == ["title"])
    }

    @Test func setConflictPolicyOnAnUnsyncedTableThrows() throws {
        let db = try Database.inMemory()
        try db.execute(SyncTestKit.schema)
        #expect(SyncTestKit.syncErrorCase { try db.setConflictPolicy(.localWins, for: "t") } == "notSynced")
    }
}
