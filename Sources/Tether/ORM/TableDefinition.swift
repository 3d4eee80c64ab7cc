extension ModelSchema {
    /// CREATE TABLE (STRICT, so that a value of the wrong type is an error
    /// instead of being stored as is) and CREATE INDEX statements for `M`.
    func createStatements(ifNotExists: Bool) throws -> [String] {
        let parts = try tableParts(ifNotExists: ifNotExists)
        var definitions = parts.columns.map(\.definition)
        if let key = parts.compositePrimaryKey { definitions.append(key) }
        definitions += parts.tableConstraints
        let create = """
            CREATE TABLE \(ifNotExists ? "IF NOT EXISTS " : "")\(quotedTable) (\n  \
            \(definitions.joined(separator: ",\n  "))\n) STRICT
            """
        // A SyncableModel reads its sync state from the metadata, which exists before sync is on.
        let metadata = syncStateColumns.isEmpty ? [] : [RowMetadataLayout.createRowsTable(of: tableName)]
        return [create] + parts.indexes + metadata
    }

    /// The pieces of `M`'s CREATE TABLE: each stored column's definition (what `ALTER TABLE …
    /// ADD COLUMN` takes too), the composite primary key, the table constraints, and the
    /// CREATE INDEX statements.
    func tableParts(ifNotExists: Bool) throws -> (
        columns: [(name: String, definition: String)], compositePrimaryKey: String?,
        tableConstraints: [String], indexes: [String]
    ) {
        var columnNotNull = columns.map { !$0.isOptional }
        var columnCollation: [Collation?] = Array(repeating: nil, count: columns.count)
        var columnDefault: [DatabaseValue?] = Array(repeating: nil, count: columns.count)
        var tableConstraints: [String] = []
        var indexes: [String] = []
        var autoIncrement = false
        let quoted = columns.map { quoteIdentifier($0.name) }
        let names = { (indexes: [Int]) in indexes.map { quoted[$0] }.joined(separator: ", ") }

        for constraint in constraints {
            switch constraint {
            case let .notNull(ref): columnNotNull[try column(ref)] = true
            case let .uniqueColumns(refs): tableConstraints.append("UNIQUE (\(names(try refs.map(column))))")
            case let .defaultValue(ref, value): columnDefault[try column(ref)] = value
            case let .check(sql): tableConstraints.append("CHECK (\(sql))")
            case let .collate(ref, collation): columnCollation[try column(ref)] = collation
            case let .foreignKey(refs, table, parentColumns, onDelete, onUpdate):
                let local = try refs.map(column)
                guard local.count == parentColumns.count, !local.isEmpty else {
                    throw ModelError.invalidModel(
                        type: modelName,
                        reason:
                            "foreign key to \(table) has \(local.count) column(s) here and \(parentColumns.count) there"
                    )
                }
                tableConstraints.append(
                    """
                    FOREIGN KEY (\(names(local))) REFERENCES \(quoteIdentifier(table)) \
                    (\(parentColumns.map(quoteIdentifier).joined(separator: ", "))) ON DELETE \
                    \(onDelete.rawValue) ON UPDATE \(onUpdate.rawValue)
                    """)
            case let .indexOn(refs, unique, name):
                let indexColumns = try refs.map(column)
                guard !indexColumns.isEmpty else {
                    throw ModelError.invalidModel(type: modelName, reason: "an index needs at least one column")
                }
                let indexName =
                    name ?? "\(tableName)_on_\(indexColumns.map { columns[$0].name }.joined(separator: "_"))"
                indexes.append(
                    """
                    CREATE \(unique ? "UNIQUE " : "")INDEX \
                    \(ifNotExists ? "IF NOT EXISTS " : "")\(quoteIdentifier(indexName)) ON \(quotedTable) \
                    (\(names(indexColumns)))
                    """)
            case .autoIncrement: autoIncrement = true
            case .mandatory, .mandatoryElements, .dropsMissingElements: break
            }
        }
        for key in secondaryKeys where !key.isEmpty {
            tableConstraints.append("UNIQUE (\(names(key)))")
        }

        // A single INTEGER key is declared inline so that it aliases the rowid
        // (and NULL asks SQLite for the next one).
        let rowidKey = primaryKey.count == 1 && columns[primaryKey[0]].type == .integer ? primaryKey[0] : nil
        if autoIncrement && rowidKey == nil {
            throw ModelError.invalidModel(type: modelName, reason: "autoIncrement needs a single INTEGER primary key")
        }
        var definitions: [(name: String, definition: String)] = []
        for (index, info) in columns.enumerated() where !syncStateColumns.contains(index) {
            var definition = "\(quoted[index]) \(info.type.sqlType)"
            if index == rowidKey {
                definition += " PRIMARY KEY" + (autoIncrement ? " AUTOINCREMENT" : "")
            } else if columnNotNull[index] || primaryKey.contains(index) {
                definition += " NOT NULL"
            }
            if let value = columnDefault[index] { definition += " DEFAULT \(value.description)" }
            if let collation = columnCollation[index] { definition += " COLLATE \(collation.sql)" }
            if info.type == .json { definition += " CHECK (\(quoted[index]) IS NULL OR json_valid(\(quoted[index])))" }
            definitions.append((info.name, definition))
        }
        return (
            definitions, rowidKey == nil && !primaryKey.isEmpty ? "PRIMARY KEY (\(names(primaryKey)))" : nil,
            tableConstraints, indexes
        )
    }
}
