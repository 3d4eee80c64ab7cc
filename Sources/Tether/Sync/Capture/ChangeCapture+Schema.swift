import Foundation

/// What a schema change asks of the capture. An ALTER TABLE reaches it through the seam
/// (`schemaWillChange` / `schemaDidChange`); a migration's helpers, which run their DDL unobserved
/// (`Connection.withoutCapture`) and know what the seam cannot tell — a rename from a drop and an
/// add — say it here. The synced columns themselves follow in the engine
/// (`SyncEngine.followColumnChanges`, `SyncedColumnChanges.swift`).
extension ChangeCapture {
    /// The synced table `name`, as loaded.
    func syncedTable(named name: String) -> SyncedTable? { tables.byName[name] }

    /// The names of the synced tables, sorted.
    var syncedTableNames: [String] { tables.byName.keys.sorted() }

    /// A migration's transaction began: writes by other programs still waiting for their metadata
    /// are folded now, while their column masks still match the recorded columns.
    func migrationWillBegin(_ connection: Connection) throws {
        guard tables.list.contains(where: \.capturesExternalWrites) else { return }
        try foldExternalChanges(connection)
    }

    /// `table`'s columns are about to change: what other programs wrote is folded, and the
    /// capture triggers, which name the columns, go (a DDL statement would trip on them).
    func columnsWillChange(of table: String, _ connection: Connection) throws {
        try migrationWillBegin(connection)
        try tables.byName[table]?.layout.dropTriggers(connection)
    }

    /// `table`'s columns changed: `renamed` maps old names to new, `dropped` are gone on purpose;
    /// the synced columns and the triggers follow (`SyncEngine.followColumnChanges`).
    func columnsDidChange(
        of table: String, renamed: [String: String] = [:], dropped: Set<String> = [],
        _ connection: Connection
    ) throws {
        try engine.followColumnChanges(of: table, renamed: renamed, dropped: dropped, connection)
    }

    /// The end of a migration's work, before its commit: columns added by raw SQL to synced tables
    /// become synced; synced columns gone without a helper are refused.
    func migrationWillCommit(_ connection: Connection) throws {
        for table in syncedTableNames { try columnsDidChange(of: table, connection) }
    }

    /// A migration rolled back: the tables are loaded again as committed.
    func migrationDidRollBack(_ connection: Connection) throws {
        try engine.loadTables(connection)
    }
}
