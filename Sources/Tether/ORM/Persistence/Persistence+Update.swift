// Updating a model's row, some of its columns, a row by key, the rows a query selects.

extension DatabaseContext {
    /// Updates every column of the row with `model`'s primary key; throws
    /// `ModelError.notFound` when there is no such row.
    public func update<M: Model>(_ model: M) throws {
        try withWriteConnection { conn in try conn.updateRow(model) }
    }

    /// Updates only `columns` of the row with `model`'s primary key.
    public func update<M: Model>(_ model: M, columns: [ColumnRef<M>]) throws {
        try withWriteConnection { conn in
            let statements = try conn.statements(for: M.self)
            let plan = try statements.columnsUpdatePlan(columns.map(statements.schema.column))
            let statement = plan.statement
            try statements.bind(model, into: statement, parameters: plan.parameters)
            defer { statement.reset() }
            while try statement.step() {}
            if conn.changes == 0 { throw try notFound(model, statements) }
        }
    }

    /// Sets columns of the row with primary key `key` (NULL included).
    public func update<M: Model>(_ type: M.Type, key: PrimaryKey, set assignments: [Assignment<M>]) throws {
        try withWriteConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let changed = try conn.updateRows(M.self, set: assignments, where: try keyCondition(schema, key))
            if changed == 0 { throw ModelError.notFound(table: schema.tableName, key: schema.describeKey(key.values)) }
        }
    }

    /// Updates all models, or none (a missing row throws `notFound` and rolls back).
    public func update<M: Model>(contentsOf models: some Sequence<M>) throws {
        try withWriteConnection { conn in
            try conn.transaction { for model in models { try conn.updateRow(model) } }
        }
    }

    /// Updates each model that can be; returns those that could not, and why.
    public func updateEach<M: Model>(_ models: [M]) throws -> [BatchFailure<M>] {
        try eachInBatch(models) { conn, model in try conn.updateRow(model) }
    }

    /// Sets columns on every row a query selects; returns how many changed.
    @discardableResult
    public func update<M: Model>(_ query: Query<M>, set assignments: [Assignment<M>]) throws -> Int {
        try withWriteConnection { conn in
            try conn.updateRows(
                M.self, set: assignments,
                where: try query.restrictingClause(try ModelSchema<M>.shared(), on: conn))
        }
    }
}

extension Connection {
    func updateRow<M: Model>(_ model: M) throws {
        let statements = try statements(for: M.self)
        _ = try statements.run(.update, model)
        if changes == 0 { throw try notFound(model, statements) }
    }

    /// UPDATE … SET assignments WHERE condition; returns the rows changed.
    func updateRows<M: Model>(
        _ type: M.Type, set assignments: [Assignment<M>],
        where clause: (sql: String, arguments: [DatabaseValue])
    ) throws -> Int {
        let schema = try ModelSchema<M>.shared()
        guard !assignments.isEmpty else {
            throw ModelError.invalidArgument("update of \(schema.modelName) sets no column")
        }
        var arguments: [DatabaseValue] = []
        var sets: [String] = []
        for assignment in assignments {
            sets.append("\(quoteIdentifier(try assignment.column.get())) = ?")
            arguments.append(try assignment.value.get())
        }
        try execute(
            "UPDATE \(schema.quotedTable) SET \(sets.joined(separator: ", "))\(clause.sql)",
            StatementArguments(values: arguments + clause.arguments))
        return changes
    }
}

private func notFound<M: Model>(_ model: M, _ statements: ModelStatements<M>) throws -> ModelError {
    let values = try statements.encoder.collect(model)
    return ModelError.notFound(
        table: statements.schema.tableName,
        key: statements.schema.describeKey(statements.schema.primaryKey.map { values[$0] }))
}
