extension DatabaseContext {
    /// Reads every row of `M`'s table as `M` and returns those that cannot be
    /// read, and why (AgileDB's `validateObjects`, for rows): a value of the
    /// wrong type (`ModelError.typeMismatch`), text that is not the column's
    /// JSON, a NULL in a column the model does not make optional. Each failure's
    /// `element` is the row's primary key (its rowid when the table has none)
    /// and `index` its position in rowid order. Empty when every row reads.
    ///
    /// ```swift
    /// for failure in try db.validateRows(Player.self) {
    ///     print("row \(failure.element.values) of player: \(failure.error)")
    /// }
    /// ```
    ///
    /// A column the model has and the table lacks fails the whole check with
    /// `ModelError.columnNotInTable` (or the `DatabaseError` of the SELECT).
    public func validateRows<M: Model>(_ type: M.Type) throws -> [BatchFailure<PrimaryKey>] {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let keyColumns =
                schema.primaryKey.isEmpty
                ? ["rowid"] : schema.primaryKey.map { quoteIdentifier(schema.columns[$0].name) }
            let keys = try conn.fetchRows(
                "SELECT rowid, \(keyColumns.joined(separator: ", ")) FROM \(schema.quotedTable) ORDER BY rowid")
            let sql = "\(schema.selectSQL) WHERE \(schema.quotedTable).rowid = ?"
            var failures: [BatchFailure<PrimaryKey>] = []
            for (index, row) in keys.enumerated() {
                let key = PrimaryKey(Array(row.values.dropFirst()))
                do {
                    _ = try conn.fetchModels(M.self, sql: sql, arguments: StatementArguments(values: [row[0]]))
                } catch let error as ModelError {
                    failures.append(BatchFailure(index: index, element: key, error: error))
                }
            }
            return failures
        }
    }
}
