import Foundation

/// A synced table as this database records it: what identifies its rows across peers, the
/// columns that sync, its conflict policy, and whether other programs' writes are captured.
public struct SyncedTableRecord: Sendable, Equatable {
    /// The table's name.
    public var name: String
    /// The columns that identify a row across peers, in key order.
    public var keyColumns: [String]
    /// The synced value columns, in the order they were recorded (the table's order, then the
    /// columns added by migrations).
    public var valueColumns: [String]
    /// The local INTEGER primary key when the identity is a secondary key (it does not sync).
    public var localKeyColumn: String?
    /// The conflict policy's name (``ConflictPolicy/description``: "lastWriterWins", "localWins",
    /// "remoteWins" or "custom").
    public var policyName: String
    /// Whether writes by other programs (the sqlite3 shell) are captured, by triggers.
    public var capturesExternalWrites: Bool
    /// The value columns that merge by a rule other than `ColumnMergeRule.lastWriterWins`.
    public var columnRules: [String: ColumnMergeRule] = [:]

    /// What wins between a delete and an update it did not see (`RowMergeRule.deleteWins` unless
    /// recorded otherwise).
    public var rowRule: RowMergeRule = .deleteWins

    /// `column`'s merge rule (`ColumnMergeRule.lastWriterWins` unless recorded otherwise).
    public func rule(of column: String) -> ColumnMergeRule { columnRules[column] ?? .lastWriterWins }

    /// The conflict policy; nil for a custom merge, whose function is not stored (it is set
    /// again each time the database is opened).
    public var conflictPolicy: ConflictPolicy? { ConflictPolicy(storedName: policyName, merge: nil) }
}

/// A synced column renamed by a migration: peers that still know it as `oldName` keep syncing it.
public struct SyncedColumnRename: Sendable, Hashable {
    /// The synced table the column belongs to.
    public var table: String
    /// The column's name before the rename.
    public var oldName: String
    /// The column's name now.
    public var newName: String
}

/// The catalog of synced tables — `tether_tables`, the value columns added since a table was
/// synced (`tether_added_columns`), the renamed ones (`tether_column_renames`), the columns that
/// merge by a rule other than last-writer-wins (`tether_column_rules`) and the standing
/// rule of `enableSync(allExcept:)` (`tether_sync_rule`) — and the only code that reads or
/// writes them. The engine loads its `SyncedTable`s from it; sessions and the
/// command line read it through ``Database/syncedTableRecords(includingInternal:)``.
struct SyncedTableCatalog {
    let connection: Connection

    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_tables (name TEXT PRIMARY KEY, key_columns TEXT NOT NULL, value_columns TEXT \
        NOT NULL, local_key TEXT, policy TEXT NOT NULL, captures_external INTEGER NOT NULL) STRICT;
        CREATE TABLE IF NOT EXISTS tether_added_columns (table_name TEXT NOT NULL, column_name TEXT NOT NULL, PRIMARY \
        KEY (table_name, column_name)) STRICT, WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS tether_column_renames (table_name TEXT NOT NULL, old_name TEXT NOT NULL, new_name \
        TEXT NOT NULL, PRIMARY KEY (table_name, old_name)) STRICT, WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS tether_column_rules (table_name TEXT NOT NULL, column_name TEXT NOT NULL, rule TEXT \
        NOT NULL, PRIMARY KEY (table_name, column_name)) STRICT, WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS tether_sync_rule (id INTEGER PRIMARY KEY CHECK (id = 1), excluded TEXT NOT NULL, \
        policy TEXT NOT NULL, captures_external INTEGER NOT NULL) STRICT;
        """

    // MARK: Tables

    /// Every synced table, by name.
    func records() throws -> [SyncedTableRecord] {
        let rules = try columnRules(), rowRules = try self.rowRules()
        return try connection.fetchRows(
            """
            SELECT name, key_columns, value_columns, local_key, policy, captures_external FROM tether_tables \
            ORDER BY name
            """
        )
        .map { row in
            var record = try Self.record(row)
            record.columnRules = rules[record.name] ?? [:]
            record.rowRule = rowRules[record.name] ?? .deleteWins
            return record
        }
    }

    func record(named name: String) throws -> SyncedTableRecord? {
        try connection.fetchRow(
            """
            SELECT name, key_columns, value_columns, local_key, policy, captures_external FROM tether_tables \
            WHERE name = ?
            """,
            [name]
        ).map { row in
            var record = try Self.record(row)
            record.columnRules = try columnRules()[name] ?? [:]
            record.rowRule = try rowRules()[name] ?? .deleteWins
            return record
        }
    }

    /// Records a newly synced table (or one synced again), replacing what was recorded of it.
    func save(_ record: SyncedTableRecord) throws {
        try connection.execute(
            """
            INSERT OR REPLACE INTO tether_tables (name, key_columns, value_columns, local_key, policy, \
            captures_external)
            VALUES (?, ?, ?, ?, ?, ?)
            """,
            [
                record.name, try Self.json(record.keyColumns), try Self.json(record.valueColumns),
                record.localKeyColumn,
                record.policyName, record.capturesExternalWrites,
            ])
        try connection.execute("DELETE FROM tether_column_rules WHERE table_name = ?", [record.name])
        for (column, rule) in record.columnRules where rule != .lastWriterWins {
            try connection.execute(
                "INSERT INTO tether_column_rules (table_name, column_name, rule) VALUES (?, ?, ?)",
                [record.name, column, rule.rawValue])
        }
        if record.rowRule != .deleteWins {
            try connection.execute(
                "INSERT INTO tether_column_rules (table_name, column_name, rule) VALUES (?, '', ?)",
                [record.name, record.rowRule.rawValue])
        }
    }

    /// The recorded row rules other than delete-wins, by table: in `tether_column_rules` under the
    /// empty column name (no column has it), so that a table's rules live in one place.
    func rowRules() throws -> [String: RowMergeRule] {
        var rules: [String: RowMergeRule] = [:]
        for row in try connection.fetchRows("SELECT table_name, rule FROM tether_column_rules WHERE column_name = ''") {
            let table = try row.get(0, as: String.self), name = try row.get(1, as: String.self)
            guard let rule = RowMergeRule(rawValue: name) else {
                throw SyncError.corruptMetadata(
                    "synced table \(table) has the unknown row rule \(name) in tether_column_rules")
            }
            rules[table] = rule
        }
        return rules
    }

    /// The recorded rules other than last-writer-wins, by table then column.
    func columnRules() throws -> [String: [String: ColumnMergeRule]] {
        var rules: [String: [String: ColumnMergeRule]] = [:]
        for row in try connection.fetchRows(
            "SELECT table_name, column_name, rule FROM tether_column_rules WHERE column_name <> ''")
        {
            let table = try row.get(0, as: String.self), column = try row.get(1, as: String.self)
            let name = try row.get(2, as: String.self)
            guard let rule = ColumnMergeRule(rawValue: name) else {
                throw SyncError.corruptMetadata(
                    """
                    column \(column) of synced table \(table) has the unknown merge rule \(name) in \
                    tether_column_rules
                    """
                )
            }
            rules[table, default: [:]][column] = rule
        }
        return rules
    }

    /// A migration changed the synced columns of `table`.
    func setColumns(of table: String, keyColumns: [String], valueColumns: [String], localKeyColumn: String?) throws {
        try connection.execute(
            "UPDATE tether_tables SET key_columns = ?, value_columns = ?, local_key = ? WHERE name = ?",
            [try Self.json(keyColumns), try Self.json(valueColumns), localKeyColumn, table])
    }

    func setPolicy(_ policy: ConflictPolicy, of table: String) throws {
        try setPolicy(named: policy.description, of: table)
    }

    /// The policy by its stored name: "custom" without its function, which is given again at each opening.
    func setPolicy(named name: String, of table: String) throws {
        try connection.execute("UPDATE tether_tables SET policy = ? WHERE name = ?", [name, table])
    }

    /// `table` stops syncing: everything recorded of it goes.
    func remove(_ table: String) throws {
        try connection.execute("DELETE FROM tether_tables WHERE name = ?", [table])
        try connection.execute("DELETE FROM tether_added_columns WHERE table_name = ?", [table])
        try connection.execute("DELETE FROM tether_column_renames WHERE table_name = ?", [table])
        try connection.execute("DELETE FROM tether_column_rules WHERE table_name = ?", [table])
    }

    private static func record(_ row: Row) throws -> SyncedTableRecord {
        let name = try row.get(0, as: String.self)
        let decoder = JSONDecoder()
        do {
            return SyncedTableRecord(
                name: name,
                keyColumns: try decoder.decode([String].self, from: Data(try row.get(1, as: String.self).utf8)),
                valueColumns: try decoder.decode([String].self, from: Data(try row.get(2, as: String.self).utf8)),
                localKeyColumn: row[3].isNull ? nil : try row.get(3, as: String.self),
                policyName: try row.get(4, as: String.self), capturesExternalWrites: try row.get(5, as: Bool.self))
        } catch let error as DecodingError {
            throw SyncError.corruptMetadata(
                "the columns recorded for synced table \(name) in tether_tables are not a JSON list: \(error)")
        }
    }

    private static func json(_ columns: [String]) throws -> String {
        String(decoding: try JSONEncoder().encode(columns), as: UTF8.self)
    }

    // MARK: The standing rule

    /// The rule `enableSync(allExcept:)` set, if any.
    func standingRule() throws -> StandingSyncRule? {
        let sql = "SELECT excluded, policy, captures_external FROM tether_sync_rule WHERE id = 1"
        guard let row = try connection.fetchRow(sql) else { return nil }
        let excluded: [String]
        do {
            excluded = try JSONDecoder().decode([String].self, from: Data(try row.get(0, as: String.self).utf8))
        } catch let error as DecodingError {
            throw SyncError.corruptMetadata(
                "the tables left out of sync recorded in tether_sync_rule are not a JSON list: \(error)")
        }
        return StandingSyncRule(
            excluded: excluded, policyName: try row.get(1, as: String.self),
            capturesExternalWrites: try row.get(2, as: Bool.self))
    }

    /// Records `rule`, replacing the one before.
    func saveStandingRule(_ rule: StandingSyncRule) throws {
        try connection.execute(
            "INSERT OR REPLACE INTO tether_sync_rule (id, excluded, policy, captures_external) VALUES (1, ?, ?, ?)",
            [try Self.json(rule.excluded), rule.policyName, rule.capturesExternalWrites])
    }

    // MARK: Columns added and renamed

    /// The value columns of `table` added after it was synced.
    func addedColumns(of table: String) throws -> Set<String> {
        Set(
            try connection.fetchRows("SELECT column_name FROM tether_added_columns WHERE table_name = ?", [table]).map {
                try $0.get(0, as: String.self)
            })
    }

    /// Every rename recorded, by table then old name.
    func renames() throws -> [SyncedColumnRename] {
        try connection.fetchRows(
            "SELECT table_name, old_name, new_name FROM tether_column_renames ORDER BY table_name, old_name"
        ).map { row in
            SyncedColumnRename(
                table: try row.get(0, as: String.self), oldName: try row.get(1, as: String.self),
                newName: try row.get(2, as: String.self))
        }
    }

    /// A migration added `column` to synced `table`.
    func recordAdded(_ column: String, of table: String) throws {
        try connection.execute(
            "INSERT OR IGNORE INTO tether_added_columns (table_name, column_name) VALUES (?, ?)", [table, column])
    }

    /// A migration dropped `column` of synced `table`: it is neither added nor a rename any more.
    func recordDropped(_ column: String, of table: String) throws {
        try connection.execute(
            "DELETE FROM tether_column_rules WHERE table_name = ? AND column_name = ?", [table, column])
        try connection.execute(
            "DELETE FROM tether_added_columns WHERE table_name = ? AND column_name = ?", [table, column])
        try connection.execute(
            "DELETE FROM tether_column_renames WHERE table_name = ? AND new_name = ?", [table, column])
    }

    /// A migration renamed `old` to `new` in synced `table`. Older names of the column now lead to
    /// the new one; a name reused is no longer an old one.
    func recordRenamed(_ old: String, to new: String, of table: String) throws {
        try connection.execute(
            "UPDATE tether_column_rules SET column_name = ? WHERE table_name = ? AND column_name = ?",
            [new, table, old])
        try connection.execute(
            "UPDATE tether_added_columns SET column_name = ? WHERE table_name = ? AND column_name = ?",
            [new, table, old])
        try connection.execute(
            "UPDATE tether_column_renames SET new_name = ? WHERE table_name = ? AND new_name = ?", [new, table, old])
        try connection.execute("DELETE FROM tether_column_renames WHERE table_name = ? AND old_name = ?", [table, new])
        try connection.execute(
            "INSERT OR REPLACE INTO tether_column_renames (table_name, old_name, new_name) VALUES (?, ?, ?)",
            [table, old, new])
    }
}

extension Connection {
    /// The catalog of synced tables, read and written on this connection.
    var syncedTableCatalog: SyncedTableCatalog { SyncedTableCatalog(connection: self) }
}

extension Database {
    /// The synced tables as this database records them, by name. With `includingInternal`, Tether's
    /// own synced store of expiry dates too (it is part of every sync session's schema).
    public func syncedTableRecords(includingInternal: Bool = false) throws -> [SyncedTableRecord] {
        try read { try $0.syncedTableCatalog.records() }.filter {
            includingInternal || $0.name != ExpiryStore.syncedTable
        }
    }

    /// The synced columns renamed by migrations, by table then old name (each still leads to a
    /// column of that name that syncs, unless a later migration dropped it).
    public func syncedColumnRenames() throws -> [SyncedColumnRename] {
        try read { try $0.syncedTableCatalog.renames() }
    }
}
