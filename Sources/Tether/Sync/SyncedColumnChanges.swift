import Foundation

/// How the engine follows a change to a synced table's columns (a migration's helpers, a table
/// rebuild, a model's schema update), so that its records keep matching the table:
///
/// - the synced columns are recorded in the catalog (`SyncedTableCatalog`): what capture,
///   extract and apply use, and what a peer is told in the handshake (`LocalSchema` in
///   TetherSync reads the same records);
/// - `tether_dead_<table>` holds deleted rows' key and value columns: it gains, loses and
///   renames columns with the table;
/// - a row's `versions` (`RowVersions`) hold one version per value column, in the order of
///   `value_columns`: an added column is appended (rows keep their versions, and a column past
///   the stored count has the row's existence version, so no row is marked changed); a dropped
///   column's version is cut out of every row and tombstone that stores versions per column;
/// - the capture triggers (for tables synced with `capturingExternalWrites`) name the columns:
///   they are dropped before the change and made again after.
extension SyncEngine {
    /// The synced columns of `table` follow its new columns: `renamed` maps old names to new,
    /// `dropped` are gone on purpose, and every other column of the table that is not synced yet
    /// becomes a synced value column. A synced column that disappeared otherwise is an error (a
    /// raw `ALTER TABLE … DROP/RENAME COLUMN` the engine cannot tell apart), as is dropping a
    /// column that identifies rows across peers.
    func followColumnChanges(
        of table: String, renamed: [String: String] = [:], dropped: Set<String> = [], _ connection: Connection
    ) throws {
        guard let synced = tables[table] else { return }
        let columns = try connection.fetchRows("SELECT name FROM pragma_table_info(?) ORDER BY cid", [table]).map {
            try $0.get(0, as: String.self)
        }
        let presentSet = Set(columns)
        func rename(_ column: String) -> String { renamed[column] ?? column }

        if let key = synced.keyColumns.first(where: { dropped.contains($0) }) {
            throw MigrationError.invalidChange(
                table: table,
                reason: "column \(key) identifies the rows of this synced table across peers; it cannot be dropped")
        }
        let keys = synced.keyColumns.map(rename)
        let localKey = synced.localKeyColumn.map(rename)
        var values: [String] = []
        var removedIndices: [Int] = []
        for (index, column) in synced.valueColumns.enumerated() {
            if dropped.contains(column) { removedIndices.append(index) } else { values.append(rename(column)) }
        }
        for column in keys + values + (localKey.map { [$0] } ?? []) where !presentSet.contains(column) {
            throw MigrationError.invalidChange(
                table: table,
                reason: """
                    synced column \(column) is gone from the table, and the sync metadata cannot tell a drop from a \
                    rename: use Migration.dropColumn or renameColumn (or rebuildTable) on synced tables
                    """)
        }
        let known = Set(keys + values + (localKey.map { [$0] } ?? []))
        let added = columns.filter { !known.contains($0) && !$0.hasPrefix("tether_") }
        values += added
        let deadRenames = renamed.filter { synced.allColumns.contains($0.key) }
        let changed =
            !deadRenames.isEmpty || !removedIndices.isEmpty || !added.isEmpty || localKey != synced.localKeyColumn
        if changed {
            try connection.syncedTableCatalog.setColumns(
                of: table, keyColumns: keys, valueColumns: values, localKeyColumn: localKey)
            let dead = synced.layout.deadTable
            for (old, new) in deadRenames.sorted(by: { $0.key < $1.key }) {
                try connection.execute(
                    "ALTER TABLE \(dead) RENAME COLUMN \(quoteIdentifier(old)) TO \(quoteIdentifier(new))")
            }
            for index in removedIndices {
                try connection.execute("ALTER TABLE \(dead) DROP COLUMN \(quoteIdentifier(synced.valueColumns[index]))")
            }
            for column in added { try connection.execute("ALTER TABLE \(dead) ADD COLUMN \(quoteIdentifier(column))") }
            if !removedIndices.isEmpty { try removeVersions(at: removedIndices, of: synced, connection) }
            try recordColumnChanges(
                of: table, renamed: deadRenames, dropped: removedIndices.map { synced.valueColumns[$0] }, added: added,
                connection)
        }
        // The triggers name the columns: made again for the new ones, and after a rebuild (which drops them).
        let triggers = synced.layout.triggerNames
        let present =
            try connection.fetchValue(
                """
                SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ? AND name IN \
                (\(triggers.map { _ in "?" }.joined(separator: ", ")))
                """,
                StatementArguments(values: [.text(table)] + triggers.map { .text($0) }), as: Int.self) ?? 0
        if changed || present != (synced.capturesExternalWrites ? triggers.count : 0) {
            try synced.layout.dropTriggers(connection)
            if synced.capturesExternalWrites {
                var layout = RowMetadataLayout(
                    table: table, keyColumns: keys, valueColumns: values,
                    withoutRowidKey: try WithoutRowidKey.of(table, connection))
                layout.counterColumns = synced.counterColumns.map { rename(synced.valueColumns[$0]) }
                    .filter(values.contains)
                layout.orderedColumns = synced.orderedColumns.map {
                    (rename(synced.valueColumns[$0]), synced.columnRules[$0])
                }.filter { values.contains($0.column) }
                for sql in layout.createTriggers { try connection.execute(sql) }
            }
        }
        // Positions in the table may have moved even when the synced columns did not (a rebuild).
        try loadTables(connection)
        // Values a peer sent for the new columns before this database had them.
        if !added.isEmpty { try applyKeptForSchema(connection) }
    }

    /// What peers learn of a change to a synced table's columns (§8.2 of Protocol/README.md):
    /// columns added (a value written elsewhere wins over their default, see
    /// `mergeLastWriterWins`), renamed (announced in HELLO, so that a peer with the old name
    /// still syncs the column, and a peer's record of what it shared with this one follows), dropped.
    private func recordColumnChanges(
        of table: String, renamed: [String: String], dropped: [String], added: [String], _ connection: Connection
    ) throws {
        let catalog = connection.syncedTableCatalog
        for column in added { try catalog.recordAdded(column, of: table) }
        for column in dropped { try catalog.recordDropped(column, of: table) }
        for (old, new) in renamed.sorted(by: { $0.key < $1.key }) {
            try catalog.recordRenamed(old, to: new, of: table)
            try renameInPeerSchemas(table: table, from: old, to: new, connection)
        }
    }

    /// Cuts the versions of the value columns at `indices` out of every row and tombstone of
    /// `table` that stores versions per column (the uniform form has none to cut).
    private func removeVersions(at indices: [Int], of table: SyncedTable, _ connection: Connection) throws {
        let removed = Set(indices)
        /// The versions without the removed columns' (the uniform form as it is).
        func cutting(_ versions: RowVersions) -> RowVersions {
            guard let columns = versions.columns else { return versions }
            var cut = versions
            cut.columns = columns.enumerated().filter { !removed.contains($0.offset) }.map(\.element)
            cut.normalize()
            return cut
        }
        func cut(_ stored: Data) -> Data? {
            guard let versions = RowVersions(encoded: [UInt8](stored)), versions.columns != nil else { return nil }
            return Data(cutting(versions).encoded())
        }
        let layout = table.layout
        for row in try connection.fetchRows(
            "SELECT row_id, versions FROM \(layout.rowsTable) WHERE substr(versions, 1, 1) IN (x'01', x'02')")
        {
            guard let versions = cut(try row.get(1, as: Data.self)) else { continue }
            try connection.execute(
                "UPDATE \(layout.rowsTable) SET versions = ? WHERE row_id = ?",
                [versions, try row.get(0, as: Int64.self)])
        }
        for row in try connection.fetchRows(
            """
            SELECT rowid, tether_versions FROM \(layout.deadTable) WHERE substr(tether_versions, 1, 1) IN (x'01', \
            x'02')
            """
        ) {
            guard let versions = cut(try row.get(1, as: Data.self)) else { continue }
            try connection.execute(
                "UPDATE \(layout.deadTable) SET tether_versions = ? WHERE rowid = ?",
                [versions, try row.get(0, as: Int64.self)])
        }
        try rewriteRangeVersions(of: table, connection, cutting)
    }
}
