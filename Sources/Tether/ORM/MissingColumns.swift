import Foundation

/// A model whose table lacks one of its columns (a property added, the table not migrated):
/// the ORM's statements fail to prepare (its SELECT names each column qualified by the table,
/// so that SQLite cannot read a missing `"color"` as the string 'color'), and the failure
/// becomes `ModelError.columnNotInTable` — or, for a model with `addsMissingColumns`, the
/// columns are added by a write and read as NULL until then.
extension Connection {
    /// The stored columns of `schema` that its table lacks; empty when the table does not exist
    /// (SQLite's own error says so).
    func columnsMissing(from schema: SchemaCore) throws -> [String] {
        let present = Set(
            try fetchRows("SELECT name FROM pragma_table_xinfo(?)", [schema.tableName]).map {
                try $0.get(0, as: String.self)
            })
        guard !present.isEmpty else { return [] }
        return schema.storedColumns.map { schema.columns[$0].name }.filter { !present.contains($0) }
    }

    /// Prepares an ORM write statement of `M`, turning a missing column into a typed error or,
    /// for a model that adds its missing columns, adding them and preparing again. `addedColumns`
    /// says the statement needs columns added in the current transaction: it must not be kept
    /// beyond it (a rollback takes the columns away again).
    func prepareModelStatement<M: Model>(_ sql: String, for type: M.Type) throws -> (
        statement: Statement, addedColumns: Bool
    ) {
        do {
            return (try prepare(sql), false)
        } catch let error as DatabaseError {
            let schema = try ModelSchema<M>.shared()
            let missing = try columnsMissing(from: schema)
            guard let first = missing.first else { throw error }
            guard M.addsMissingColumns else {
                throw ModelError.columnNotInTable(model: schema.modelName, table: schema.tableName, column: first)
            }
            try addColumns(missing, of: schema)
            return (try prepare(sql), true)
        }
    }

    /// Runs an ORM read of `M` (its own SELECT followed by `clause`): a column missing from
    /// the table is an error, or NULL for a model that adds its missing columns.
    func fetchOwnModels<M: Model>(
        _ type: M.Type, clause: String, arguments: StatementArguments, loader: NestedLoader? = nil,
        reportingFetches: Bool = true
    ) throws -> [M] {
        let schema = try ModelSchema<M>.shared()
        do {
            return try fetchModels(
                M.self, sql: schema.selectSQL + clause, arguments: arguments, loader: loader,
                reportingFetches: reportingFetches)
        } catch let error as DatabaseError {
            let missing = try columnsMissing(from: schema)
            guard let first = missing.first else { throw error }
            guard M.addsMissingColumns else {
                throw ModelError.columnNotInTable(model: schema.modelName, table: schema.tableName, column: first)
            }
            return try fetchModels(
                M.self, sql: schema.selectSQL(readingAsNull: Set(missing)) + clause, arguments: arguments,
                loader: loader,
                reportingFetches: reportingFetches)
        }
    }

    /// Adds `columns` to `M`'s table as `M` declares them.
    private func addColumns<M: Model>(_ columns: [String], of schema: ModelSchema<M>) throws {
        let definitions = try schema.tableParts(ifNotExists: false).columns.filter { columns.contains($0.name) }
        // Observers of the schema's changes (a synced table's capture) follow the new columns.
        try transaction {
            for column in definitions {
                try execute("ALTER TABLE \(schema.quotedTable) ADD COLUMN \(column.definition)")
            }
        }
    }
}
