import CSQLite
import Foundation

extension SyncEngine {
    /// Makes `table` synced: adds its metadata columns and tombstone table,
    /// and gives every existing row a sequence number (so it reaches peers).
    ///
    /// A table WITHOUT ROWID is always captured by triggers, `capturesExternalWrites` or not:
    /// SQLite's hooks do not see its rows (see `RowMetadataLayout`).
    func enableSync(
        table name: String, keyColumns requestedKey: [String]?, policy: ConflictPolicy,
        capturesExternalWrites requestedCapture: Bool, columnRules: [String: ColumnMergeRule] = [:],
        rowRule: RowMergeRule = .deleteWins,
        connection: Connection, allowingInternalTable: Bool = false
    ) throws {
        guard allowingInternalTable || !SyncedTable.isInternal(name) else {
            throw SyncError.invalidTable("\(name) is an internal table")
        }
        guard
            let info = try connection.fetchRow(
                "SELECT type, wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", [name])
        else {
            throw SyncError.invalidTable("no table named \(name)")
        }
        guard try info.get(0, as: String.self) == "table" else {
            throw SyncError.invalidTable("\(name) is not a table")
        }
        let withoutRowidKey = try info.get(1, as: Int.self) == 0 ? nil : try WithoutRowidKey.of(name, connection)
        let capturesExternalWrites = requestedCapture || withoutRowidKey != nil

        let columns = try connection.fetchRows("SELECT name, type, pk FROM pragma_table_info(?) ORDER BY cid", [name])
        let userColumns = try columns.map { try $0.get(0, as: String.self) }.filter { !$0.hasPrefix("tether_") }
        let primaryKey = try columns.filter { try $0.get(2, as: Int.self) > 0 }
            .sorted { try $0.get(2, as: Int.self) < $1.get(2, as: Int.self) }
            .map { try $0.get(0, as: String.self) }
        let rowidAlias =
            try withoutRowidKey == nil && primaryKey.count == 1
            && columns.contains {
                try $0.get(0, as: String.self) == primaryKey[0] && $0.get(1, as: String.self).uppercased() == "INTEGER"
            }
        let createSQL = try connection.tableDefinition(name) ?? ""
        let autoIncrement = createSQL.uppercased().contains("AUTOINCREMENT")

        let keyColumns = requestedKey ?? primaryKey
        guard !keyColumns.isEmpty else {
            throw SyncError.invalidTable(
                "\(name) has no primary key; declare one, or name the columns that identify a row across peers")
        }
        for column in keyColumns where !userColumns.contains(column) {
            throw SyncError.invalidTable("\(name) has no column \(column)")
        }
        if requestedKey == nil && autoIncrement {
            throw SyncError.invalidTable(
                """
                \(name)'s primary key is a local AUTOINCREMENT integer; name a secondary key (unique columns) \
                that identifies a row across peers
                """)
        }
        guard try isUnique(keyColumns, in: name, primaryKey: primaryKey, connection) else {
            throw SyncError.invalidTable(
                """
                the columns \(keyColumns.joined(separator: ", ")) of \(name) are not a primary key or unique: \
                they cannot identify a row
                """)
        }
        // With a secondary key as identity, an INTEGER primary key stays local.
        let localKey = keyColumns != primaryKey && rowidAlias ? primaryKey[0] : nil
        let valueColumns = userColumns.filter { !keyColumns.contains($0) && $0 != localKey }

        let rules = try checkedRules(columnRules, of: name, valueColumns: valueColumns, policy: policy)
        var layout = RowMetadataLayout(
            table: name, keyColumns: keyColumns, valueColumns: valueColumns, withoutRowidKey: withoutRowidKey)
        layout.counterColumns = rules.filter { $0.value == .counter }.keys.sorted()
        layout.orderedColumns = rules.filter(\.value.isOrdered).sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
        try materializeInsertRanges(of: name, layout, connection)
        for sql in layout.createTables { try connection.execute(sql) }
        try changeRules(of: name, to: rules, layout, connection)
        if let insertMissingKeys = layout.insertMissingKeys { try connection.execute(insertMissingKeys) }
        try connection.syncedTableCatalog.save(
            SyncedTableRecord(
                name: name, keyColumns: keyColumns, valueColumns: valueColumns, localKeyColumn: localKey,
                policyName: policy.description, capturesExternalWrites: capturesExternalWrites, columnRules: rules,
                rowRule: rowRule))
        if case let .custom(merge) = policy { syncedTables.mergeFunctions[name] = merge }
        try layout.dropTriggers(connection)
        if capturesExternalWrites { for sql in layout.createTriggers { try connection.execute(sql) } }
        try loadTables(connection)

        // Rows already there become local changes, so that peers receive them.
        guard let table = tables[name] else { throw SyncError.corruptMetadata("table \(name) did not load") }
        try prepareClock(connection)
        let version = capture.localChangeVersion()
        let versions = RowVersions.uniform(version).encoded()
        let rowids = try connection.fetchRows(layout.selectRowsWithoutMetadata).map { try $0.get(0, as: Int64.self) }
        // Not inserted now: observers reading the changelog back see them as they are (updates).
        for rowid in rowids {
            try stamp(table, rowid: rowid, status: .created, versions: versions, inserted: .earlier(nil), connection)
        }
        // Expiry dates sync with the rows: every database that syncs a table syncs them.
        if name != ExpiryStore.syncedTable { try ExpiryStore.enableSynced(self, connection) }
        // Changes a peer sent for this table before it was synced here.
        try applyKeptForSchema(connection)
    }

    /// Gives the rows of `table`'s insert ranges their own metadata (the same sequence numbers
    /// and versions), so that the table can be synced again with other columns or another
    /// capture without its rows being read differently.
    private func materializeInsertRanges(of table: String, _ layout: RowMetadataLayout, _ connection: Connection) throws
    {
        guard let synced = tables[table] else { return }
        for range in try insertRanges(of: synced, startingAtOrBefore: Int64.max, connection) {
            let rows = try connection.fetchRows(
                """
                SELECT t.rowid FROM \(layout.quotedTable) AS t WHERE t.rowid BETWEEN ? AND ?
                AND NOT EXISTS (SELECT 1 FROM \(layout.rowsTable) AS m WHERE m.row_id = t.rowid)
                """, [range.firstRowid, range.lastRowid])
            for row in rows {
                let rowid = try row.get(0, as: Int64.self)
                let state = range.state(ofRowid: rowid)
                try connection.execute(
                    layout.insertRowMetadata,
                    [
                        rowid, range.sequence(ofRowid: rowid), Int64(state.status.rawValue), state.inFlight,
                        Data(range.rowVersions.encoded()), range.via,
                    ])
            }
        }
        try Self.forgetInsertRanges(of: table, connection)
    }

    private func isUnique(_ columns: [String], in table: String, primaryKey: [String], _ connection: Connection) throws
        -> Bool
    {
        if Set(columns) == Set(primaryKey) { return true }
        for index in try connection.fetchRows("SELECT name FROM pragma_index_list(?) WHERE \"unique\" = 1", [table]) {
            let indexColumns = try connection.fetchRows(
                "SELECT name FROM pragma_index_info(?)", [try index.get(0, as: String.self)]
            )
            .map { try $0.get(0, as: String.self) }
            if Set(indexColumns) == Set(columns) { return true }
        }
        return false
    }

    /// Stops syncing `table`: drops its triggers, its metadata, tombstones and registration, and
    /// its scope records (membership, evictions, refusals, whether it is held in part); its rows stay as they are.
    func disableSync(table name: String, connection: Connection) throws {
        guard let table = tables[name] else { throw SyncError.notSynced(name) }
        try table.layout.dropTriggers(connection)
        for sql in table.layout.dropTables { try connection.execute(sql) }
        try connection.syncedTableCatalog.remove(name)
        try connection.keptAside.removeAll(of: name)
        try Self.forgetInsertRanges(of: name, connection)
        try ChangeCapture.forgetExternalChanges(of: name, connection)
        // What peers hold of it, the rows evicted here and the changes refused: all of the table's sync.
        try connection.scopeMembership.forgetTable(name)
        try EvictionLog.forget(table: name, connection)
        try RefusalStore.forget(table: name, connection)
        try PartialTables.forget(table: name, connection)
        syncedTables.mergeFunctions[name] = nil
        try loadTables(connection)
        if tables.keys.allSatisfy({ $0 == ExpiryStore.syncedTable }), tables[ExpiryStore.syncedTable] != nil {
            // The last of the user's tables: the expiry dates stop syncing too (their rows stay).
            return try disableSync(table: ExpiryStore.syncedTable, connection: connection)
        }
        // Without synced tables, COMMIT no longer passes through the capturing step.
        try clock.write(connection)
    }
}
