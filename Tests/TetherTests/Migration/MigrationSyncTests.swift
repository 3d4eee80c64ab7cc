import Foundation
import Testing
@testable import Tether

/// Migrations on synced tables: the engine's records follow, nothing is re-sent, sync goes on.
@Suite("Migrations on synced tables keep sync")
struct MigrationSyncTests {
    private func migrate(
        _ db: Database, _ name: String = "under test", _ body: @escaping @Sendable (Migration) throws -> Void
    ) throws {
        var migrator = Migrator()
        migrator.allowsUnknownMigrations = true
        migrator.register(name, body)
        try migrator.migrate(db)
    }

    /// Two synced peers holding the same `rowCount` rows, everything acknowledged both ways.
    private func syncedPair(rows rowCount: Int = 50, capturingExternalWrites: Bool = false) throws -> (
        Database, Database
    ) {
        let peers = try SyncTestKit.peers(2, capturingExternalWrites: capturingExternalWrites)
        try peers[0].write { conn in
            for id in 1...rowCount {
                try conn.execute("INSERT INTO t (id, name, count) VALUES (?, ?, ?)", [id, "row \(id)", id])
            }
        }
        try peers[0].captureExternalWrites()
        try SyncTestKit.sync(peers[0], peers[1])
        try SyncTestKit.sync(peers[1], peers[0])
        return (peers[0], peers[1])
    }

    private func syncedColumns(_ db: Database, _ table: String = "t") throws -> [String] {
        let json =
            try db.fetchValue("SELECT value_columns FROM tether_tables WHERE name = ?", [table], as: String.self)
            ?? "[]"
        return try JSONDecoder().decode([String].self, from: Data(json.utf8))
    }

    private func rows(_ db: Database, _ columns: String = "id, name, count") throws -> [[DatabaseValue]] {
        try db.fetchRows("SELECT \(columns) FROM t ORDER BY id").map(\.values)
    }

    @Test("adding a nullable or defaulted column makes it synced without marking any row changed")
    func addColumnNoBackfill() throws {
        let (a, _) = try syncedPair(rows: 200)
        let sequence = try a.lastSequence()
        #expect(try a.pendingChangeCount() == 0)
        try migrate(a) { migration in
            try migration.addColumn("color", to: "t", "TEXT DEFAULT 'red'")
            try migration.addColumn("note", to: "t", "TEXT")
        }
        #expect(try syncedColumns(a) == ["name", "count", "color", "note"])
        #expect(try a.lastSequence() == sequence)  // the changelog did not grow by the row count
        #expect(try a.pendingChangeCount() == 0)
        #expect(try a.extractChanges(for: nil, after: sequence).changes.isEmpty)
        #expect(
            try a.fetchValue(
                "SELECT count(*) FROM pragma_table_info('tether_dead_t') WHERE name IN ('color', 'note')", as: Int.self)
                == 2)
    }

    @Test("a column added on both sides syncs its values; inserts carry it")
    func addedColumnSyncs() throws {
        let (a, b) = try syncedPair()
        for db in [a, b] { try migrate(db) { try $0.addColumn("color", to: "t", "TEXT DEFAULT 'red'") } }
        try a.execute("UPDATE t SET color = 'blue' WHERE id = 3")
        try b.execute("INSERT INTO t (id, name, count, color) VALUES (100, 'new', 0, 'green')")
        try SyncTestKit.sync(a, b)
        try SyncTestKit.sync(b, a)
        #expect(try rows(a, "id, name, count, color") == rows(b, "id, name, count, color"))
        #expect(try b.fetchValue("SELECT color FROM t WHERE id = 3", as: String.self) == "blue")
        #expect(try a.fetchValue("SELECT color FROM t WHERE id = 100", as: String.self) == "green")
        #expect(try a.fetchValue("SELECT count(*) FROM t WHERE color = 'red'", as: Int.self) == 49)
    }

    @Test("renaming a synced column keeps its values and versions; dropping one stops syncing it")
    func renameAndDrop() throws {
        let (a, b) = try syncedPair()
        // Column versions stored one by one (an update of `count` only), to see them cut on drop.
        try a.execute("UPDATE t SET count = count + 1000 WHERE id <= 5")
        try SyncTestKit.sync(a, b)
        let sequence = try a.lastSequence()
        for db in [a, b] {
            try migrate(db) { migration in
                try migration.renameColumn("count", to: "amount", in: "t")
                try migration.addColumn("extra", to: "t", "INTEGER")
                try migration.dropColumn("name", from: "t")
            }
        }
        #expect(try syncedColumns(a) == ["amount", "extra"])
        #expect(try a.lastSequence() == sequence)
        let versions = try a.fetchRows("SELECT versions FROM tether_rows_t").compactMap {
            RowVersions(encoded: [UInt8](try $0.get(0, as: Data.self)))
        }
        #expect(versions.allSatisfy { ($0.columns?.count ?? 0) <= 1 })  // the dropped column's version is gone
        #expect(versions.contains { $0.columns != nil })
        try a.execute("UPDATE t SET amount = -1, extra = 7 WHERE id = 2")
        try b.execute("DELETE FROM t WHERE id = 4")
        try SyncTestKit.sync(a, b)
        try SyncTestKit.sync(b, a)
        #expect(try rows(a, "id, amount, extra") == rows(b, "id, amount, extra"))
        #expect(try b.fetchValue("SELECT amount FROM t WHERE id = 2", as: Int.self) == -1)
        #expect(try a.fetchValue("SELECT count(*) FROM t WHERE id = 4", as: Int.self) == 0)
    }

    @Test("a rebuilt synced table keeps its rowids, metadata and triggers, and keeps syncing")
    func rebuiltTableKeepsSyncing() throws {
        let (a, b) = try syncedPair(capturingExternalWrites: true)
        let metadataBefore = try a.fetchRows("SELECT row_id, seq, versions FROM tether_rows_t ORDER BY row_id").map(
            \.values)
        let sequence = try a.lastSequence()
        for db in [a, b] {
            try migrate(db) { migration in
                try migration.rebuildTable(
                    "t",
                    as: """
                        CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, count INTEGER NOT NULL CHECK \
                        (count >= 0), color TEXT DEFAULT 'red') STRICT
                        """)
            }
        }
        #expect(
            try a.fetchRows("SELECT row_id, seq, versions FROM tether_rows_t ORDER BY row_id").map(\.values)
                == metadataBefore)
        #expect(try a.lastSequence() == sequence)
        #expect(try syncedColumns(a) == ["name", "count", "color"])
        #expect(
            try a.fetchValue(
                "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 't'", as: Int.self) == 4)
        // A write by another program (raw SQL, captured by the triggers made again) and an ORM-like write.
        try a.execute("UPDATE t SET color = 'blue', count = 99 WHERE id = 7")
        try a.captureExternalWrites()
        try b.execute("INSERT INTO t (id, name, count, color) VALUES (500, 'b', 1, 'green')")
        try b.captureExternalWrites()
        try SyncTestKit.sync(a, b)
        try SyncTestKit.sync(b, a)
        #expect(try rows(a, "id, name, count, color") == rows(b, "id, name, count, color"))
        #expect(try b.fetchValue("SELECT color FROM t WHERE id = 7", as: String.self) == "blue")
        #expect(try a.fetchValue("SELECT count(*) FROM t", as: Int.self) == 51)
    }

    @Test("identity columns cannot go; raw SQL adding a column syncs it, raw SQL dropping a synced one is refused")
    func refusalsAndRawSQL() throws {
        let (a, _) = try syncedPair(rows: 3)
        let before = try migrationDump(a)
        var dropKey = Migrator()
        dropKey.register("drop id") { try $0.rebuildTable("t", as: "CREATE TABLE t (name TEXT, count INTEGER)") }
        #expect(migrationError { try dropKey.migrate(a) }?.description.contains("identifies the rows") == true)
        var rawDrop = Migrator()
        rawDrop.register("raw drop") { try $0.execute("ALTER TABLE t DROP COLUMN count") }
        #expect(migrationError { try rawDrop.migrate(a) } != nil)
        #expect(try migrationDump(a) == before)

        try migrate(a, "raw add") { try $0.execute("ALTER TABLE t ADD COLUMN size INTEGER") }
        #expect(try syncedColumns(a) == ["name", "count", "size"])
    }
}
