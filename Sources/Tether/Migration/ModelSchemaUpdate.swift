import CSQLite
import Foundation

/// What `Database.updateSchema(toMatch:rebuildingTables:dryRun:)` did to one model's table (or,
/// in a dry run, would do).
public struct TableSchemaUpdate: Sendable, Equatable, CustomStringConvertible {
    /// What was done to the table, or, when refused, why nothing was.
    public enum Action: Sendable, Equatable {
        /// The table did not exist: it was created.
        case created
        /// The table lacked these columns: they were added (`ALTER TABLE … ADD COLUMN`, no row rewritten).
        case addedColumns([String])
        /// Columns were removed or changed (type, NOT NULL, default, key, unique or foreign-key
        /// constraints): the table was rebuilt by SQLite's 12-step procedure, keeping every row.
        case rebuilt(removedColumns: [String], changedColumns: [String], addedColumns: [String])
        /// The table already matches the model.
        case unchanged
        /// The table differs in a way that needs a rebuild, which would drop the data of
        /// removed columns, and rebuilds were not asked for; or a rebuild cannot keep the rows
        /// (the reason says which). The table was left as it is.
        case refused(reason: String)
    }

    /// The model's table.
    public let table: String
    /// What was done to it (or would be, in a dry run).
    public let action: Action
    /// The model's indexes that did not exist and were created.
    public let createdIndexes: [String]

    public var description: String {
        switch action {
        case .created: return "\(table): created"
        case let .addedColumns(columns): return "\(table): added \(columns.joined(separator: ", "))"
        case let .rebuilt(removed, changed, added):
            let parts = [("removed", removed), ("changed", changed), ("added", added)].filter { !$0.1.isEmpty }
                .map { "\($0.0) \($0.1.joined(separator: ", "))" }
            return "\(table): rebuilt (\(parts.joined(separator: "; ")))"
        case .unchanged: return "\(table): unchanged"
        case let .refused(reason): return "\(table): left as it is: \(reason)"
        }
    }
}

extension Database {
    /// Makes the tables of `models` match them (SQLiteORM's `syncSchema`, AgileDB's automatic
    /// columns): creates missing tables, adds missing columns, and — with `rebuildingTables` —
    /// rebuilds tables whose columns were removed or changed, keeping every row (SQLite's
    /// 12-step procedure, see `Migration.rebuildTable`; a column made NOT NULL with a default
    /// takes the default where it held NULL). Without it such a table is left as it
    /// is and reported `refused`: a rebuild drops the values of removed columns. Tables and
    /// columns the models do not know are never touched otherwise. Everything runs in one
    /// transaction, foreign keys checked before commit; a dry run only reports.
    ///
    /// On a synced table, added columns become synced (no row is marked changed), removed ones
    /// stop being synced; a column that identifies its rows across peers is never removed.
    ///
    /// The tables of nested models (properties whose type is another model) are updated too,
    /// after their parent's, each once.
    ///
    /// CHECK constraints and collations are not compared (SQLite does not report them):
    /// change those with a migration's `rebuildTable`.
    ///
    /// ```swift
    /// let report = try db.updateSchema(toMatch: [Player.self, Team.self], dryRun: true)
    /// for table in report { print(table) }          // "player: added color"
    /// try db.updateSchema(toMatch: [Player.self, Team.self], rebuildingTables: true)
    /// ```
    @discardableResult
    public func updateSchema(toMatch models: [any Model.Type], rebuildingTables: Bool = false, dryRun: Bool = false)
        throws -> [TableSchemaUpdate]
    {
        let capture = syncEngine?.capture
        return try writeWithoutTransaction { conn in
            let all = try ModelTablePlan.withNestedModels(models)
            let plans = try all.map {
                try ModelTablePlan.make(for: $0, rebuildingTables: rebuildingTables, conn, capture)
            }
            if dryRun { return plans.map { TableSchemaUpdate(table: $0.table, action: $0.action, createdIndexes: []) } }
            return try MigrationRun.run(named: "updateSchema", conn, capture) { migration in
                let updates = try plans.map { try $0.apply(migration) }
                for model in all { try migration.connection.recordNestedLinks(of: model) }
                return updates
            }
        }
    }
}

/// One model's table compared with the model, and what to do about it.
struct ModelTablePlan {
    let table: String
    let action: TableSchemaUpdate.Action
    /// The model's CREATE TABLE and CREATE INDEX statements (and, for a SyncableModel, its rows table).
    let createStatements: [String]
    let columnDefinitions: [(name: String, definition: String)]
    /// For a rebuild: SQL giving a column its value from the old row, where it is not the old value
    /// as is (a column now NOT NULL with a default takes the default for NULL).
    var rebuildValues: [String: String] = [:]

    /// `models`, each followed by the models nested in it (depth first), each model once.
    static func withNestedModels(_ models: [any Model.Type]) throws -> [any Model.Type] {
        var seen = Set<ObjectIdentifier>()
        var result: [any Model.Type] = []
        func visit(_ model: any Model.Type) throws {
            guard seen.insert(ObjectIdentifier(model)).inserted else { return }
            result.append(model)
            for child in try nestedModels(of: model) { try visit(child) }
        }
        for model in models { try visit(model) }
        return result
    }

    private static func nestedModels<M: Model>(of model: M.Type) throws -> [any Model.Type] {
        try ModelSchema<M>.shared().nested?.links.compactMap(\.link.childModel) ?? []
    }

    static func make(for model: any Model.Type, rebuildingTables: Bool, _ conn: Connection, _ capture: ChangeCapture?)
        throws -> ModelTablePlan
    {
        try make(model, rebuildingTables: rebuildingTables, conn, capture)
    }

    private static func make<M: Model>(
        _ model: M.Type, rebuildingTables: Bool, _ conn: Connection, _ capture: ChangeCapture?
    ) throws -> ModelTablePlan {
        let schema = try ModelSchema<M>.shared()
        let statements = try schema.createStatements(ifNotExists: false)
        let definitions = try schema.tableParts(ifNotExists: false).columns
        let table = M.tableName
        guard let actual = try TableShape.read(table, conn) else {
            return ModelTablePlan(
                table: table, action: .created, createStatements: statements, columnDefinitions: definitions)
        }
        let scratch = try Connection(path: ":memory:", flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
        defer { scratch.close() }
        try scratch.execute(statements[0])
        guard let wanted = try TableShape.read(table, scratch) else {
            throw MigrationError.invalidChange(table: table, reason: "the model's CREATE TABLE made no table")
        }

        // A rebuild keeps what the model does not say: a table made without STRICT (by another
        // library, or by hand) stays without it.
        let definition =
            actual.isStrict || !statements[0].hasSuffix(") STRICT")
            ? statements[0] : String(statements[0].dropLast(" STRICT".count))
        func plan(_ action: TableSchemaUpdate.Action) -> ModelTablePlan {
            ModelTablePlan(
                table: table, action: action, createStatements: [definition] + statements.dropFirst(),
                columnDefinitions: definitions)
        }

        let removed = actual.columnOrder.filter { wanted.columns[$0] == nil }
        let added = wanted.columnOrder.filter { actual.columns[$0] == nil }
        let changed = wanted.columnOrder.filter { name in
            actual.columns[name].map { $0 != wanted.columns[name] } ?? false
        }
        let tableChanged = actual.constraints != wanted.constraints
        if removed.isEmpty && changed.isEmpty && !tableChanged {
            if added.isEmpty { return plan(.unchanged) }
            // ALTER TABLE ADD COLUMN takes no key column, and NOT NULL only with a default.
            let addable = added.allSatisfy { name in
                wanted.columns[name].map { $0.primaryKey == 0 && (!$0.notNull || $0.defaultValue != nil) } ?? false
            }
            if addable { return plan(.addedColumns(added)) }
        }
        let differences =
            [("removed", removed), ("changed", changed), ("added", added)].filter { !$0.1.isEmpty }
            .map { "\($0.0) \($0.1.joined(separator: ", "))" } + (tableChanged ? ["table constraints changed"] : [])
        guard rebuildingTables else {
            let loss = removed.isEmpty ? "" : ", which drops the data of removed columns"
            return plan(
                .refused(
                    reason: """
                        the model's columns differ (\(differences.joined(separator: "; "))): the table must be \
                        rebuilt\(loss); pass rebuildingTables: true
                        """))
        }
        if let synced = capture?.syncedTable(named: table),
            let key = synced.keyColumns.first(where: { removed.contains($0) })
        {
            return plan(
                .refused(
                    reason: """
                        column \(key) identifies the rows of this synced table across peers; the model no longer \
                        has it
                        """))
        }
        let required = added.filter { name in
            wanted.columns[name].map { $0.notNull && $0.defaultValue == nil && $0.primaryKey == 0 } ?? false
        }
        if let column = required.first,
            try conn.fetchValue("SELECT EXISTS (SELECT 1 FROM \(quoteIdentifier(table)))", as: Bool.self) == true
        {
            return plan(
                .refused(
                    reason: """
                        new column \(column) is NOT NULL without a default, and the table has rows that have no \
                        value for it; add it with a migration that gives them one
                        """))
        }
        var rebuild = plan(.rebuilt(removedColumns: removed, changedColumns: changed, addedColumns: added))
        for name in changed {
            guard let column = wanted.columns[name], column.notNull, let value = column.defaultValue,
                actual.columns[name]?.notNull == false
            else { continue }
            rebuild.rebuildValues[name] = "coalesce(\(quoteIdentifier(name)), \(value))"
        }
        return rebuild
    }

    func apply(_ migration: Migration) throws -> TableSchemaUpdate {
        let conn = migration.connection
        let indexNames = createStatements.dropFirst().compactMap(Self.indexName)
        let existingIndexes = Set(
            try conn.fetchRows("SELECT name FROM sqlite_master WHERE type = 'index'").map {
                try $0.get(0, as: String.self)
            })
        switch action {
        case .created:
            try conn.execute(createStatements[0])
        case let .addedColumns(columns):
            for column in columnDefinitions where columns.contains(column.name) {
                try migration.addColumn(
                    column.name, to: table, String(column.definition.dropFirst(quoteIdentifier(column.name).count + 1)))
            }
        case let .rebuilt(removed, _, _):
            // Indexes on removed columns go with them (the rebuild would refuse to make them again).
            for index in try conn.fetchRows("SELECT name FROM pragma_index_list(?) WHERE origin = 'c'", [table]).map({
                try $0.get(0, as: String.self)
            }) {
                let columns = try conn.fetchRows("SELECT name FROM pragma_index_info(?)", [index]).map {
                    try $0.get(0, as: String.self)
                }
                if columns.contains(where: removed.contains) {
                    try conn.execute("DROP INDEX \(quoteIdentifier(index))")
                }
            }
            try migration.rebuildTable(table, as: createStatements[0], values: rebuildValues)
        case .unchanged, .refused:
            break
        }
        if case .refused = action { return TableSchemaUpdate(table: table, action: action, createdIndexes: []) }
        for statement in createStatements.dropFirst() {
            try conn.execute(
                statement.replacingOccurrences(of: "CREATE UNIQUE INDEX ", with: "CREATE UNIQUE INDEX IF NOT EXISTS ")
                    .replacingOccurrences(of: "CREATE INDEX ", with: "CREATE INDEX IF NOT EXISTS "))
        }
        return TableSchemaUpdate(
            table: table, action: action, createdIndexes: indexNames.filter { !existingIndexes.contains($0) })
    }

    /// The name a `CREATE [UNIQUE] INDEX "name" ON …` statement gives.
    private static func indexName(_ statement: String) -> String? {
        guard statement.hasPrefix("CREATE INDEX ") || statement.hasPrefix("CREATE UNIQUE INDEX "),
            let start = statement.firstIndex(of: "\"")
        else { return nil }
        var name = ""
        var index = statement.index(after: start)
        while index < statement.endIndex {
            let character = statement[index]
            let next = statement.index(after: index)
            if character == "\"" {
                guard next < statement.endIndex, statement[next] == "\"" else { return name }
                name.append("\"")
                index = statement.index(after: next)
                continue
            }
            name.append(character)
            index = next
        }
        return nil
    }
}

/// What SQLite reports of a table's columns and constraints, to compare a table with a model's.
struct TableShape {
    struct Column: Equatable {
        let type: String
        let notNull: Bool
        let defaultValue: String?
        let primaryKey: Int
    }
    let columnOrder: [String]
    let columns: [String: Column]
    /// Unique constraints, foreign keys and WITHOUT ROWID, as comparable text.
    let constraints: Set<String>
    /// Whether the table is STRICT: not compared (a model's table is STRICT when Tether makes
    /// it, and a table made otherwise keeps what it is).
    let isStrict: Bool

    static func read(_ table: String, _ conn: Connection) throws -> TableShape? {
        guard
            let list = try conn.fetchRow(
                "SELECT wr, strict FROM pragma_table_list WHERE schema = 'main' AND name = ? AND type = 'table'",
                [table])
        else {
            return nil
        }
        var order: [String] = []
        var columns: [String: Column] = [:]
        let withoutRowid = try list.get(0, as: Bool.self)
        let rows = try conn.fetchRows(
            "SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?) ORDER BY cid", [table])
        let keyCount = try rows.filter { try $0.get(4, as: Int.self) > 0 }.count
        for row in rows {
            let name = try row.get(0, as: String.self)
            let type = try row.get(1, as: String.self).uppercased()
            let primaryKey = try row.get(4, as: Int.self)
            // An INTEGER PRIMARY KEY is the rowid, never NULL: NOT NULL on it changes nothing.
            let isRowid = !withoutRowid && keyCount == 1 && primaryKey == 1 && type == "INTEGER"
            let notNull = try row.get(2, as: Bool.self)
            order.append(name)
            columns[name] = Column(
                type: type, notNull: isRowid || notNull,
                defaultValue: String.fromDatabaseValue(row[3]), primaryKey: primaryKey)
        }
        var constraints: Set<String> = ["without rowid: \(withoutRowid)"]
        for index in try conn.fetchRows("SELECT name FROM pragma_index_list(?) WHERE origin = 'u'", [table]) {
            let names = try conn.fetchRows(
                "SELECT name FROM pragma_index_info(?) ORDER BY seqno", [try index.get(0, as: String.self)]
            )
            .map { try $0.get(0, as: String.self) }
            constraints.insert("unique (\(names.joined(separator: ", ")))")
        }
        var foreignKeys: [Int: [String]] = [:]
        for row in try conn.fetchRows(
            """
            SELECT id, \"table\", \"from\", \"to\", on_update, on_delete FROM pragma_foreign_key_list(?) ORDER BY \
            id, seq
            """, [table])
        {
            let parts = (1...5).map { String.fromDatabaseValue(row[$0]) ?? "" }
            foreignKeys[try row.get(0, as: Int.self), default: []].append(parts.joined(separator: " "))
        }
        for key in foreignKeys.values { constraints.insert("foreign key \(key.joined(separator: "; "))") }
        return TableShape(
            columnOrder: order, columns: columns, constraints: constraints, isStrict: try list.get(1, as: Bool.self))
    }
}
