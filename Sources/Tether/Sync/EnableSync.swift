import CSQLite
import Foundation

extension SyncEngine {
    /// Makes `table` synced: adds its metadata columns and tombstone table,
    /// and gives every existing row a sequence number (so it reaches peers).
    func enableSync(table name: String, keyColumns requestedKey: [String]?, policy: ConflictPolicy,
                    capturesExternalWrites: Bool, connection: Connection) throws {
        guard !name.hasPrefix("tether_"), !name.hasPrefix("sqlite_") else {
            throw SyncError.invalidTable("\(name) is an internal table")
        }
        guard let info = try connection.fetchRow("SELECT type, wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", [name]) else {
            throw SyncError.invalidTable("no table named \(name)")
        }
        guard try info.get(0, as: String.self) == "table" else { throw SyncError.invalidTable("\(name) is not a table") }
        guard try info.get(1, as: Int.self) == 0 else {
            throw SyncError.invalidTable("\(name) is a WITHOUT ROWID table; synced tables need a rowid")
        }

        let columns = try connection.fetchRows("SELECT name, type, pk FROM pragma_table_info(?) ORDER BY cid", [name])
        let userColumns = try columns.map { try $0.get(0, as: String.self) }.filter { !$0.hasPrefix("tether_") }
        let primaryKey = try columns.filter { try $0.get(2, as: Int.self) > 0 }
            .sorted { try $0.get(2, as: Int.self) < $1.get(2, as: Int.self) }
            .map { try $0.get(0, as: String.self) }
        let rowidAlias = try primaryKey.count == 1 && columns.contains {
            try $0.get(0, as: String.self) == primaryKey[0] && $0.get(1, as: String.self).uppercased() == "INTEGER"
        }
        let createSQL = try connection.fetchValue("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [name], as: String.self) ?? ""
        let autoIncrement = createSQL.uppercased().contains("AUTOINCREMENT")

        let keyColumns = requestedKey ?? primaryKey
        guard !keyColumns.isEmpty else {
            throw SyncError.invalidTable("\(name) has no primary key; declare one, or name the columns that identify a row across peers")
        }
        for column in keyColumns where !userColumns.contains(column) {
            throw SyncError.invalidTable("\(name) has no column \(column)")
        }
        if requestedKey == nil && autoIncrement {
            throw SyncError.invalidTable("\(name)'s primary key is a local AUTOINCREMENT integer; name a secondary key (unique columns) that identifies a row across peers")
        }
        guard try isUnique(keyColumns, in: name, primaryKey: primaryKey, connection) else {
            throw SyncError.invalidTable("the columns \(keyColumns.joined(separator: ", ")) of \(name) are not a primary key or unique: they cannot identify a row")
        }
        // With a secondary key as identity, an INTEGER primary key stays local.
        let localKey = keyColumns != primaryKey && rowidAlias ? primaryKey[0] : nil
        let valueColumns = userColumns.filter { !keyColumns.contains($0) && $0 != localKey }

        suppression += 1
        defer { suppression -= 1 }
        try materializeInsertRanges(of: name, connection)
        let existing = Set(try columns.map { try $0.get(0, as: String.self) })
        let quoted = quoteIdentifier(name)
        // tether_via: the peer this row's state was received from (NULL once
        // changed here): it is not sent back to that peer.
        for (column, definition) in [("tether_seq", "INTEGER"), ("tether_status", "INTEGER NOT NULL DEFAULT 1"),
                                     ("tether_in_flight", "INTEGER NOT NULL DEFAULT 0"), ("tether_versions", "BLOB"), ("tether_via", "INTEGER")]
        where !existing.contains(column) {
            try connection.execute("ALTER TABLE \(quoted) ADD COLUMN \(column) \(definition)")
        }
        // Rows of insert ranges have no sequence number of their own and need
        // no index entry; trigger-captured tables look their new rows up by
        // NULL sequence, so their index covers those too.
        try connection.execute("DROP INDEX IF EXISTS \(quoteIdentifier("tether_seq_\(name)"))")
        try connection.execute("CREATE INDEX \(quoteIdentifier("tether_seq_\(name)")) ON \(quoted) (tether_seq)"
                               + (capturesExternalWrites ? "" : " WHERE tether_seq IS NOT NULL"))
        let dead = quoteIdentifier("tether_dead_\(name)")
        let deadColumns = (keyColumns + valueColumns).map(quoteIdentifier).joined(separator: ", ")
        try connection.execute("""
            CREATE TABLE IF NOT EXISTS \(dead) (\(deadColumns), tether_seq INTEGER, tether_status INTEGER NOT NULL DEFAULT 3,
              tether_in_flight INTEGER NOT NULL DEFAULT 0, tether_versions BLOB, tether_via INTEGER, PRIMARY KEY (\(keyColumns.map(quoteIdentifier).joined(separator: ", "))))
            """)
        try connection.execute("CREATE INDEX IF NOT EXISTS \(quoteIdentifier("tether_seq_tether_dead_\(name)")) ON \(dead) (tether_seq)")
        let encoder = JSONEncoder()
        try connection.execute("""
            INSERT OR REPLACE INTO tether_tables (name, key_columns, value_columns, local_key, policy, captures_external)
            VALUES (?, ?, ?, ?, ?, ?)
            """, [name, String(decoding: try encoder.encode(keyColumns), as: UTF8.self),
                  String(decoding: try encoder.encode(valueColumns), as: UTF8.self), localKey, policy.description, capturesExternalWrites])
        if case let .custom(merge) = policy { mergeFunctions[name] = merge }
        try dropTriggers(for: name, connection)
        if capturesExternalWrites { try createTriggers(table: name, keyColumns: keyColumns, valueColumns: valueColumns, connection) }
        try loadTables(connection)

        // Rows already there become local changes, so that peers receive them.
        guard let table = tables[name] else { throw SyncError.corruptMetadata("table \(name) did not load") }
        try prepareClock(connection)
        let version = LocalVersion(timestamp: nextTimestamp().rawValue, site: Self.localSite)
        let versions = RowVersions.uniform(version).encoded()
        let rowids = try connection.fetchRows("SELECT rowid FROM \(quoted) WHERE tether_seq IS NULL ORDER BY rowid").map { try $0.get(0, as: Int64.self) }
        for rowid in rowids { try stamp(table, rowid: rowid, status: .created, versions: versions, connection) }
    }

    /// Gives the rows of `table`'s insert ranges their own sequence numbers
    /// and versions (the same ones), so that the table can change how it is
    /// captured without its rows being read differently.
    private func materializeInsertRanges(of table: String, _ connection: Connection) throws {
        guard tables[table] != nil else { return }
        for row in try connection.fetchRows("SELECT first_rowid, last_rowid, first_seq, timestamp, site, via FROM tether_insert_ranges WHERE table_name = ?", [table]) {
            let version = LocalVersion(timestamp: UInt64(bitPattern: try row.get(3, as: Int64.self)), site: try row.get(4, as: Int32.self))
            try connection.execute("""
                UPDATE \(quoteIdentifier(table)) SET tether_seq = ? + (rowid - ?), tether_versions = ?, tether_via = ?
                WHERE rowid BETWEEN ? AND ? AND tether_seq IS NULL
                """, StatementArguments(values: [row[2], row[0], .blob(Data(RowVersions.uniform(version).encoded())), row[5], row[0], row[1]]))
        }
        try connection.execute("DELETE FROM tether_insert_ranges WHERE table_name = ?", [table])
    }

    private func isUnique(_ columns: [String], in table: String, primaryKey: [String], _ connection: Connection) throws -> Bool {
        if Set(columns) == Set(primaryKey) { return true }
        for index in try connection.fetchRows("SELECT name FROM pragma_index_list(?) WHERE \"unique\" = 1", [table]) {
            let indexColumns = try connection.fetchRows("SELECT name FROM pragma_index_info(?)", [try index.get(0, as: String.self)])
                .map { try $0.get(0, as: String.self) }
            if Set(indexColumns) == Set(columns) { return true }
        }
        return false
    }

    /// Stops syncing `table`: drops its triggers, tombstones and registration;
    /// the metadata columns stay (harmless, and dropping columns rewrites the table).
    func disableSync(table name: String, connection: Connection) throws {
        guard tables[name] != nil else { throw SyncError.notSynced(name) }
        suppression += 1
        defer { suppression -= 1 }
        try dropTriggers(for: name, connection)
        try connection.execute("DROP TABLE IF EXISTS \(quoteIdentifier("tether_dead_\(name)"))")
        try connection.execute("DELETE FROM tether_tables WHERE name = ?", [name])
        try connection.execute("DELETE FROM tether_kept_aside WHERE table_name = ?", [name])
        try connection.execute("DELETE FROM tether_insert_ranges WHERE table_name = ?", [name])
        mergeFunctions[name] = nil
        // Without synced tables, COMMIT no longer passes through the capturing step.
        try writeClock(connection)
        try loadTables(connection)
    }

    // MARK: Writes by other programs

    private func triggerNames(_ table: String) -> [String] {
        ["update", "rekey", "delete"].map { "tether_\($0)_\(table)" }
    }

    private func dropTriggers(for table: String, _ connection: Connection) throws {
        for trigger in triggerNames(table) { try connection.execute("DROP TRIGGER IF EXISTS \(quoteIdentifier(trigger))") }
    }

    /// Triggers that record what any program writes (the sqlite3 shell included);
    /// the engine gives those changes their metadata when it next runs.
    /// Cost: a trigger runs per changed row, and the engine later rewrites the
    /// row's metadata, so writes to such a table are several times slower than
    /// to a table captured by the library alone.
    private func createTriggers(table: String, keyColumns: [String], valueColumns: [String], _ connection: Connection) throws {
        let quoted = quoteIdentifier(table)
        let names = triggerNames(table)
        let keyChanged = keyColumns.map { "OLD.\(quoteIdentifier($0)) IS NOT NEW.\(quoteIdentifier($0))" }.joined(separator: " OR ")
        // Only a change of a synced value is a change: the engine's own writes
        // to the tether_ columns (in flight, acknowledged) must not fire it.
        let valueChanged = valueColumns.isEmpty ? "0" :
            valueColumns.map { "OLD.\(quoteIdentifier($0)) IS NOT NEW.\(quoteIdentifier($0))" }.joined(separator: " OR ")
        let mask = valueColumns.count > 62 || valueColumns.isEmpty ? "-1" :
            valueColumns.enumerated().map { "((OLD.\(quoteIdentifier($1)) IS NOT NEW.\(quoteIdentifier($1))) << \($0))" }.joined(separator: " | ")
        let all = keyColumns + valueColumns
        let dead = quoteIdentifier("tether_dead_\(table)")
        let copyOld = """
            INSERT OR REPLACE INTO \(dead) (\(all.map(quoteIdentifier).joined(separator: ", ")), tether_seq, tether_status, tether_in_flight, tether_versions, tether_via)
            VALUES (\(all.map { "OLD.\(quoteIdentifier($0))" }.joined(separator: ", ")), NULL, 3, 0, OLD.tether_versions, NULL);
            """
        try connection.execute("""
            CREATE TRIGGER \(quoteIdentifier(names[0])) AFTER UPDATE ON \(quoted)
            WHEN NEW.tether_seq IS OLD.tether_seq AND NEW.tether_seq IS NOT NULL AND NOT (\(keyChanged)) AND (\(valueChanged))
            BEGIN INSERT INTO tether_pending_updates (table_name, row_id, mask) VALUES (\(DatabaseValue.text(table).description), NEW.rowid, \(mask)); END
            """)
        try connection.execute("""
            CREATE TRIGGER \(quoteIdentifier(names[1])) AFTER UPDATE ON \(quoted)
            WHEN NEW.tether_seq IS OLD.tether_seq AND (\(keyChanged))
            BEGIN \(copyOld) UPDATE \(quoted) SET tether_seq = NULL WHERE rowid = NEW.rowid; END
            """)
        try connection.execute("CREATE TRIGGER \(quoteIdentifier(names[2])) AFTER DELETE ON \(quoted) BEGIN \(copyOld) END")
    }

    /// Notices commits made by other connections (PRAGMA data_version), whose
    /// changes to trigger-captured tables are waiting for their metadata.
    func noticeExternalWrites(_ connection: Connection) throws {
        guard tableList.contains(where: \.capturesExternalWrites) else { return }
        let version = try connection.fetchValue("PRAGMA data_version", as: Int64.self) ?? 0
        if version != lastDataVersion {
            lastDataVersion = version
            externalFoldNeeded = true
        }
    }

    /// Gives the rows that triggers recorded their sequence numbers and versions.
    func foldExternalChanges(_ connection: Connection) throws {
        externalFoldNeeded = false
        let triggered = tableList.filter(\.capturesExternalWrites)
        guard !triggered.isEmpty else { return }
        suppression += 1
        defer { suppression -= 1 }
        var version: LocalVersion?
        func foldVersion() throws -> LocalVersion {
            if let version { return version }
            try prepareClock(connection)
            let made = LocalVersion(timestamp: nextTimestamp().rawValue, site: Self.localSite)
            version = made
            return made
        }
        for table in triggered {
            let dead = quoteIdentifier(table.deadTableName)
            // Deleted rows (and the old identity of re-keyed rows).
            let keys = table.keyColumns.map(quoteIdentifier)
            for row in try connection.fetchRows("SELECT \(keys.joined(separator: ", ")), tether_versions FROM \(dead) WHERE tether_seq IS NULL") {
                let now = try foldVersion()
                var versions = row.values.last.flatMap { Data.fromDatabaseValue($0) }.flatMap { RowVersions(encoded: [UInt8]($0)) } ?? .uniform(now)
                versions.markDeleted(at: now, columnCount: table.valueColumns.count)
                try connection.execute("UPDATE \(dead) SET tether_seq = ?, tether_versions = ? WHERE \(keys.map { "\($0) = ?" }.joined(separator: " AND "))",
                                       StatementArguments(values: [.integer(nextSequence()), .blob(Data(versions.encoded()))] + row.values.dropLast()))
                table.mayHaveDeadRows = true
            }
            // Updated rows, with the columns that changed.
            for row in try connection.fetchRows("SELECT row_id, mask FROM tether_pending_updates WHERE table_name = ? ORDER BY id", [table.name]) {
                let rowid = try row.get(0, as: Int64.self)
                let mask = try row.get(1, as: Int64.self)
                // Recorded by a trigger of an older version for a metadata-only update.
                if mask == 0 { continue }
                guard let meta = try connection.fetchRow("SELECT tether_status, tether_versions, tether_seq FROM \(table.quotedName) WHERE rowid = ?", [rowid]),
                      !meta[2].isNull else { continue }  // deleted since, or inserted since (folded below)
                let now = try foldVersion()
                var versions = Data.fromDatabaseValue(meta[1]).flatMap { RowVersions(encoded: [UInt8]($0)) } ?? .uniform(now)
                for column in table.valueColumns.indices where mask == -1 || (column < 63 && mask & (1 << Int64(column)) != 0) {
                    versions.setColumn(column, to: now, columnCount: table.valueColumns.count)
                }
                try stamp(table, rowid: rowid, status: Self.statusAfterUpdate(Int64.fromDatabaseValue(meta[0]) ?? 0), versions: versions.encoded(), connection)
            }
            try connection.execute("DELETE FROM tether_pending_updates WHERE table_name = ?", [table.name])
            // Inserted rows (and the new identity of re-keyed rows).
            for row in try connection.fetchRows("SELECT rowid FROM \(table.quotedName) WHERE tether_seq IS NULL") {
                let rowid = try row.get(0, as: Int64.self)
                try stampInserted(table, rowid: rowid, versions: RowVersions.uniform(try foldVersion()).encoded(), connection)
            }
        }
    }
}
