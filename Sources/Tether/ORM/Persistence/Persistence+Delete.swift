// Deleting a model's row, rows by key, the rows a query selects; the WHERE clause UPDATE and DELETE share.

extension DatabaseContext {
    /// Deletes the row with `model`'s primary key; returns whether there was one.
    @discardableResult
    public func delete<M: Model>(_ model: M) throws -> Bool {
        try withWriteConnection { conn in
            _ = try conn.statements(for: M.self).run(.deleteByKey, model)
            return conn.changes > 0
        }
    }

    /// Deletes the row with this primary key; returns whether there was one.
    @discardableResult
    public func delete<M: Model>(_ type: M.Type, key: PrimaryKey) throws -> Bool {
        try withWriteConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try keyCondition(schema, key)
            try conn.execute(
                "DELETE FROM \(schema.quotedTable)\(clause.sql)",
                StatementArguments(values: clause.arguments))
            return conn.changes > 0
        }
    }

    /// Deletes the rows with these primary keys, all in one transaction; returns how many existed.
    @discardableResult
    public func delete<M: Model>(_ type: M.Type, keys: [PrimaryKey]) throws -> Int {
        try withWriteConnection { conn in
            try conn.transaction {
                try keys.reduce(0) { count, key in count + (try conn.delete(M.self, key: key) ? 1 : 0) }
            }
        }
    }

    /// Deletes the row of each key that can be, in one transaction; returns the
    /// keys that could not be deleted and why (AHDataModel's `delete(byPrimaryKeys:)`):
    /// `ModelError.notFound` for a key no row has, `.invalidArgument` for a key
    /// with the wrong number of values, a `DatabaseError` for a foreign key that
    /// restricts the delete. The others are deleted.
    ///
    /// ```swift
    /// let failures = try db.deleteEach(Player.self, keys: [PrimaryKey(1), PrimaryKey(99)])
    /// // failures[0].element == PrimaryKey(99), failures[0].error is ModelError.notFound
    /// ```
    public func deleteEach<M: Model>(_ type: M.Type, keys: [PrimaryKey]) throws -> [BatchFailure<PrimaryKey>] {
        let schema = try ModelSchema<M>.shared()
        return try eachInBatch(keys) { conn, key in
            guard try conn.delete(M.self, key: key) else {
                throw ModelError.notFound(table: schema.tableName, key: schema.describeKey(key.values))
            }
        }
    }

    /// Deletes all models' rows, or none.
    @discardableResult
    public func delete<M: Model>(contentsOf models: some Sequence<M>) throws -> Int {
        try withWriteConnection { conn in
            try conn.transaction { try models.reduce(0) { count, model in count + (try conn.delete(model) ? 1 : 0) } }
        }
    }

    /// Deletes each model's row that can be; returns those that could not, and why
    /// (a foreign key that restricts it, for example).
    public func deleteEach<M: Model>(_ models: [M]) throws -> [BatchFailure<M>] {
        try eachInBatch(models) { conn, model in _ = try conn.delete(model) }
    }

    /// Deletes the rows a query selects; returns how many.
    @discardableResult
    public func delete<M: Model>(_ query: Query<M>) throws -> Int {
        try withWriteConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try query.restrictingClause(schema, on: conn)
            try conn.execute(
                "DELETE FROM \(schema.quotedTable)\(clause.sql)",
                StatementArguments(values: clause.arguments))
            return conn.changes
        }
    }

    /// Deletes every row of `M`'s table; returns how many.
    @discardableResult
    public func deleteAll<M: Model>(_ type: M.Type) throws -> Int {
        try delete(Query<M>())
    }
}

extension Query {
    /// A WHERE clause selecting the query's rows for UPDATE / DELETE, which take
    /// no ORDER BY / LIMIT in this SQLite build: those become a sub-select on the key.
    func restrictingClause(
        _ schema: SchemaCore,
        on connection: Connection
    ) throws -> (sql: String, arguments: [DatabaseValue]) {
        guard hasOrderOrLimit else { return try clauses(on: connection, orderAndLimit: false) }
        let inner = try clauses(on: connection)
        // A table without a primary key has its rowid (Tether makes no WITHOUT ROWID tables).
        let key =
            schema.primaryKey.isEmpty
            ? "rowid"
            : schema.primaryKey.map { quoteIdentifier(schema.columns[$0].name) }.joined(separator: ", ")
        let keyTuple = schema.primaryKey.count == 1 ? key : "(\(key))"
        return (" WHERE \(keyTuple) IN (SELECT \(key) FROM \(schema.quotedTable)\(inner.sql))", inner.arguments)
    }
}
