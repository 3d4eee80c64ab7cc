import CSQLite

/// What a migration's body is given: the writer connection, inside the migration's transaction
/// (foreign keys off until the check before commit), and helpers that change a table while
/// keeping its data, its indexes and triggers, and — on a synced table — the sync engine's
/// records of its columns (see `ChangeCapture+Schema.swift`).
///
/// ```swift
/// migrator.register("2-player-color") { migration in
///     try migration.addColumn("color", to: "player", "TEXT NOT NULL DEFAULT 'red'")
///     try migration.renameColumn("score", to: "points", in: "player")
///     try migration.combineColumns(["first_name", "last_name"], into: "full_name", in: "player",
///                                  "TEXT", sql: "first_name || ' ' || last_name")
/// }
/// ```
///
/// Values a helper derives from the rows (a combined column's) are not sent to peers as
/// changes: every peer that runs the migration computes the same ones. Rows the body writes
/// itself with `execute` are captured as any write is.
///
/// ## Topics
/// - ``execute(_:_:)``
/// - ``addColumn(_:to:_:)``
/// - ``addMissingColumns(of:)``
/// - ``dropColumn(_:from:)``
/// - ``renameColumn(_:to:in:)``
/// - ``renameProperty(_:from:)``
/// - ``combineColumns(_:into:in:_:sql:droppingSources:)``
/// - ``combineColumns(_:into:in:_:droppingSources:combine:)``
/// - ``rebuildTable(_:as:values:)``
public final class Migration {
    /// The migration's name, as recorded.
    public let name: String
    /// The writer, inside the migration's transaction.
    public let connection: Connection
    /// The sync capture, told of column changes on synced tables; nil when the database does not sync.
    let capture: ChangeCapture?

    init(name: String, connection: Connection, capture: ChangeCapture?) {
        self.name = name
        self.connection = connection
        self.capture = capture
    }

    /// Runs SQL (one statement with arguments, or a script without). A column added to a synced
    /// table this way becomes synced at the end of the migration; dropping or renaming a synced
    /// column this way is refused then (use the helpers, which tell the engine which it is).
    public func execute(_ sql: String, _ arguments: StatementArguments = StatementArguments()) throws {
        try connection.execute(sql, arguments)
    }

    // MARK: Columns

    /// Adds a column: `definition` is what follows the name in `ALTER TABLE … ADD COLUMN`
    /// (`"TEXT NOT NULL DEFAULT 'red'"`). No row is rewritten: on a synced table the column
    /// becomes synced, and no row is marked changed (no change per row goes to peers); values a
    /// peer sent for it before this database had it are applied now, and peers that had it
    /// first backfill only the rows holding a value other than its default.
    public func addColumn(_ column: String, to table: String, _ definition: String) throws {
        try changingColumns(of: table) {
            try connection.execute(
                "ALTER TABLE \(quoteIdentifier(table)) ADD COLUMN \(quoteIdentifier(column)) \(definition)")
        }
    }

    /// Adds the columns of `M` its table lacks, each as `M` declares it; returns their names.
    @discardableResult
    public func addMissingColumns<M: Model>(of type: M.Type) throws -> [String] {
        let schema = try ModelSchema<M>.shared()
        let present = try columnNames(of: M.tableName)
        let missing = try schema.tableParts(ifNotExists: false).columns.filter { !present.contains($0.name) }
        for column in missing {
            try changingColumns(of: M.tableName) {
                try connection.execute("ALTER TABLE \(schema.quotedTable) ADD COLUMN \(column.definition)")
            }
        }
        return missing.map(\.name)
    }

    /// Drops a column and its data; on a synced table it stops being synced. A column that
    /// identifies a synced table's rows across peers cannot be dropped.
    public func dropColumn(_ column: String, from table: String) throws {
        try requireColumn(column, in: table)
        try changingColumns(of: table, dropped: [column]) {
            try connection.execute("ALTER TABLE \(quoteIdentifier(table)) DROP COLUMN \(quoteIdentifier(column))")
        }
    }

    /// Renames a column, keeping its values; on a synced table the synced column is renamed
    /// with it (its values and versions stay, nothing is sent again), and peers learn of the
    /// rename at their next handshake: one that still has the old name syncs the column as the
    /// same one (Sync › Rolling upgrades in the README).
    public func renameColumn(_ column: String, to newName: String, in table: String) throws {
        try requireColumn(column, in: table)
        try changingColumns(of: table, renamed: [column: newName]) {
            try connection.execute(
                """
                ALTER TABLE \(quoteIdentifier(table)) RENAME COLUMN \(quoteIdentifier(column)) TO \
                \(quoteIdentifier(newName))
                """)
        }
    }

    /// The column of a model's property now has another name (AHDataModel's `renameProperty`):
    /// the values of `oldColumn` become those of the property's column.
    ///
    /// ```swift
    /// try migration.renameProperty(\User.gender, from: "sex")
    /// ```
    public func renameProperty<M: Model>(_ property: PartialKeyPath<M>, from oldColumn: String) throws {
        let schema = try ModelSchema<M>.shared()
        let column = schema.columns[try schema.column(property)].name
        try renameColumn(oldColumn, to: column, in: M.tableName)
    }

    /// Adds `column` (`definition` as in `addColumn`) with a value computed from other columns
    /// by an SQL expression (AHDataModel's `combineProperties`), and drops the sources if asked.
    ///
    /// ```swift
    /// try migration.combineColumns(["last_name", "first_name"], into: "full_name", in: "user",
    ///                              "TEXT", sql: "last_name || ', ' || first_name", droppingSources: true)
    /// ```
    public func combineColumns(
        _ sources: [String], into column: String, in table: String, _ definition: String, sql expression: String,
        droppingSources: Bool = false
    ) throws {
        for source in sources { try requireColumn(source, in: table) }
        try addColumn(column, to: table, definition)
        // Every peer that runs the migration computes the same values: none is sent.
        try connection.withoutCapture {
            try connection.execute("UPDATE \(quoteIdentifier(table)) SET \(quoteIdentifier(column)) = (\(expression))")
        }
        if droppingSources { for source in sources { try dropColumn(source, from: table) } }
    }

    /// `combineColumns` with the value computed in Swift from the sources' values, row by row.
    ///
    /// ```swift
    /// try migration.combineColumns(["first_name", "last_name"], into: "initials", in: "user", "TEXT") { values in
    ///     .text(values.compactMap { String.fromDatabaseValue($0)?.first.map(String.init) }.joined())
    /// }
    /// ```
    public func combineColumns(
        _ sources: [String], into column: String, in table: String, _ definition: String,
        droppingSources: Bool = false, combine: ([DatabaseValue]) throws -> DatabaseValue
    ) throws {
        for source in sources { try requireColumn(source, in: table) }
        try addColumn(column, to: table, definition)
        let quoted = quoteIdentifier(table)
        let rows = try connection.fetchRows(
            "SELECT rowid, \(sources.map(quoteIdentifier).joined(separator: ", ")) FROM \(quoted)")
        try connection.withoutCapture {
            let update = "UPDATE \(quoted) SET \(quoteIdentifier(column)) = ? WHERE rowid = ?"
            for row in rows {
                try connection.execute(
                    update, StatementArguments(values: [try combine(Array(row.values.dropFirst())), row.values[0]]))
            }
        }
        if droppingSources { for source in sources { try dropColumn(source, from: table) } }
    }

    // MARK: Rebuilding a table

    /// Rebuilds `table` with a new definition by SQLite's 12-step procedure
    /// (<https://www.sqlite.org/lang_altertable.html#otheralter>), for what `ALTER TABLE`
    /// cannot do: change a column's type or constraints, add a table constraint.
    ///
    /// `definition` is the new `CREATE TABLE` statement of `table`. Each new column takes the
    /// value of the old column of its name, or of an SQL expression over the old columns given
    /// in `values`; a new column with neither gets its default. Rows keep their rowids (so sync
    /// metadata, keyed by rowid, stays right), and the table's indexes, triggers, and the
    /// database's views are made again; one that no longer fits the table is an error naming
    /// it (drop it first). On a synced table, old columns gone stop being synced and new ones
    /// start; a column that identifies rows across peers cannot go.
    ///
    /// ```swift
    /// try migration.rebuildTable("player", as: """
    ///     CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT NOT NULL,
    ///                          score INTEGER NOT NULL CHECK (score >= 0)) STRICT
    ///     """, values: ["score": "coalesce(score, 0)"])
    /// ```
    public func rebuildTable(_ table: String, as definition: String, values: [String: String] = [:]) throws {
        try TableRebuild(table: table, definition: definition, values: values, connection: connection, capture: capture)
            .run()
    }

    // MARK: Support

    private func changingColumns(
        of table: String, renamed: [String: String] = [:], dropped: Set<String> = [], _ ddl: () throws -> Void
    ) throws {
        guard let capture, let synced = capture.syncedTable(named: table) else { return try ddl() }
        if let key = synced.keyColumns.first(where: dropped.contains) {
            throw MigrationError.invalidChange(
                table: table,
                reason: "column \(key) identifies the rows of this synced table across peers; it cannot be dropped")
        }
        try capture.columnsWillChange(of: table, connection)
        try connection.withoutCapture(.everything, ddl)
        try capture.columnsDidChange(of: table, renamed: renamed, dropped: dropped, connection)
    }

    private func requireColumn(_ column: String, in table: String) throws {
        guard try columnNames(of: table).contains(column) else {
            throw MigrationError.invalidChange(table: table, reason: "it has no column \(column)")
        }
    }

    func columnNames(of table: String) throws -> Set<String> {
        let names = try connection.fetchRows("SELECT name FROM pragma_table_xinfo(?)", [table]).map {
            try $0.get(0, as: String.self)
        }
        guard !names.isEmpty else { throw MigrationError.invalidChange(table: table, reason: "there is no such table") }
        return Set(names)
    }
}
