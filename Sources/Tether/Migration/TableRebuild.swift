import Foundation

/// Rebuilds a table with a new definition by SQLite's 12-step procedure
/// (https://www.sqlite.org/lang_altertable.html#otheralter). Steps 1, 2, 10, 11 and 12 — foreign
/// keys off, the transaction, `PRAGMA foreign_key_check`, commit, foreign keys back on — are the
/// migration runner's (`MigrationRun`); this does steps 3 to 9:
///
/// 3. remember the table's indexes and triggers, and the views and other triggers that may
///    refer to it (all views, the triggers whose SQL names it), and drop those;
/// 4–5. create the new table under a temporary name and copy the rows into it, rowids included;
/// 6–7. drop the old table, give the new one its name;
/// 8. make the indexes, triggers and views again (an AUTOINCREMENT table keeps its counter);
/// 9. on a synced table, the engine's records follow the new columns and its capture triggers
///    are made again.
struct TableRebuild {
    let table: String
    let definition: String
    let values: [String: String]
    let connection: Connection
    let capture: ChangeCapture?

    private var quoted: String { quoteIdentifier(table) }
    private var temporaryName: String { "tether_rebuild_\(table)" }

    func run() throws {
        guard let paren = definition.firstIndex(of: "("),
            definition.trimmingCharacters(in: .whitespacesAndNewlines).uppercased().hasPrefix("CREATE TABLE")
        else {
            throw MigrationError.invalidChange(
                table: table, reason: "the new definition must be a CREATE TABLE statement")
        }
        let oldColumns = try columns(of: table)
        guard !oldColumns.isEmpty else {
            throw MigrationError.invalidChange(table: table, reason: "there is no such table")
        }
        let oldHasRowid = try hasRowid(table)
        let synced = capture?.syncedTable(named: table)

        // 3. What refers to the table, to make again once it is rebuilt.
        let captureTriggers = Set(synced?.layout.triggerNames ?? [])
        let dependents = try connection.fetchRows(
            """
            SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND (
              (type IN ('index', 'trigger') AND tbl_name = ?1) OR type = 'view'
              OR (type = 'trigger' AND instr(lower(sql), lower(?1)) > 0))
            ORDER BY rowid
            """, [table]
        ).map {
            (
                type: try $0.get(0, as: String.self), name: try $0.get(1, as: String.self),
                sql: try $0.get(2, as: String.self)
            )
        }
        .filter { !captureTriggers.contains($0.name) }
        let sequence = try autoIncrementCounter()
        try capture?.columnsWillChange(of: table, connection)
        for object in dependents where object.type != "index" {
            try connection.execute("DROP \(object.type.uppercased()) IF EXISTS \(quoteIdentifier(object.name))")
        }

        try connection.withoutCapture {
            // 4. The new table.
            try connection.execute("CREATE TABLE \(quoteIdentifier(temporaryName)) \(definition[paren...])")
            let newColumns = try columns(of: temporaryName)
            if let synced {
                for key in synced.keyColumns where !newColumns.contains(where: { $0.name == key }) {
                    throw MigrationError.invalidChange(
                        table: table,
                        reason: """
                            column \(key) identifies the rows of this synced table across peers; the new \
                            definition must keep it
                            """)
                }
            }
            for name in values.keys where !newColumns.contains(where: { $0.name == name }) {
                throw MigrationError.invalidChange(
                    table: table, reason: "a value is given for column \(name), which the new definition does not have")
            }
            // 5. The rows, with their rowids (sync metadata is keyed by them).
            var targets: [String] = []
            var sources: [String] = []
            let newAlias = try rowidAlias(of: temporaryName)
            if synced != nil, let newAlias, try newAlias != rowidAlias(of: table) {
                throw MigrationError.invalidChange(
                    table: table,
                    reason: """
                        the new definition makes \(newAlias) the rowid, which would give the rows of this synced \
                        table new rowids (its sync metadata is keyed by them)
                        """)
            }
            let keepsRowid = oldHasRowid && newAlias == nil ? try hasRowid(temporaryName) : false
            if keepsRowid {
                targets.append("rowid")
                sources.append("rowid")
            }
            for column in newColumns where !column.generated {
                if let expression = values[column.name] {
                    targets.append(quoteIdentifier(column.name))
                    sources.append("(\(expression))")
                } else if oldColumns.contains(where: { $0.name == column.name && !$0.generated }) {
                    targets.append(quoteIdentifier(column.name))
                    sources.append(quoteIdentifier(column.name))
                }
            }
            do {
                try connection.execute(
                    """
                    INSERT INTO \(quoteIdentifier(temporaryName)) (\(targets.joined(separator: ", "))) SELECT \
                    \(sources.joined(separator: ", ")) FROM \(quoted)
                    """)
            } catch let error as DatabaseError {
                throw MigrationError.invalidChange(
                    table: table, reason: "its rows do not fit the new definition: \(error.message)")
            }
            // 6–7.
            try connection.execute("DROP TABLE \(quoted)")
            try connection.execute("ALTER TABLE \(quoteIdentifier(temporaryName)) RENAME TO \(quoted)")
        }

        // 8. Indexes, triggers and views again, in their original order.
        for object in dependents {
            do {
                try connection.execute(object.sql)
            } catch let error as DatabaseError {
                throw MigrationError.invalidChange(
                    table: table,
                    reason: """
                        its \(object.type) \(object.name) does not fit the new definition (\(error.message)); \
                        drop it before the rebuild, or make it again after
                        """)
            }
        }
        if let sequence {
            try connection.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?", [sequence, table])
            if connection.changes == 0 {
                try connection.execute(
                    """
                    INSERT INTO sqlite_sequence (name, seq) SELECT ?, ? WHERE EXISTS (SELECT 1 FROM sqlite_master \
                    WHERE name = 'sqlite_sequence')
                    """, [table, sequence])
            }
        }

        // 9. The sync engine's records: synced columns gone are dropped, new ones added.
        if let capture, let synced {
            let kept = Set(try columns(of: table).map(\.name))
            try capture.columnsDidChange(
                of: table, dropped: Set(synced.valueColumns.filter { !kept.contains($0) }), connection)
        }
    }

    private struct Column {
        let name: String
        let generated: Bool
    }

    private func columns(of table: String) throws -> [Column] {
        // hidden: 0 a column, 1 a virtual table's hidden column, 2 and 3 generated columns.
        try connection.fetchRows("SELECT name, hidden FROM pragma_table_xinfo(?) ORDER BY cid", [table])
            .map { Column(name: try $0.get(0, as: String.self), generated: try $0.get(1, as: Int.self) >= 2) }
    }

    private func hasRowid(_ table: String) throws -> Bool {
        try connection.fetchValue(
            "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", [table], as: Int.self) == 0
    }

    /// The table's INTEGER PRIMARY KEY, which is its rowid (copied as a column), if it has one.
    private func rowidAlias(of table: String) throws -> String? {
        guard try hasRowid(table) else { return nil }
        let key = try connection.fetchRows("SELECT name, type FROM pragma_table_info(?) WHERE pk > 0", [table])
        guard key.count == 1, try key[0].get(1, as: String.self).uppercased() == "INTEGER" else { return nil }
        return try key[0].get(0, as: String.self)
    }

    private func autoIncrementCounter() throws -> Int64? {
        guard
            try connection.fetchValue(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence')", as: Bool.self) == true
        else { return nil }
        return try connection.fetchValue("SELECT seq FROM sqlite_sequence WHERE name = ?", [table], as: Int64.self)
    }
}
