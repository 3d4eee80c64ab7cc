// Fetching models by key, by query or by SQL; counting, existence, keys and aggregates.

extension DatabaseContext {
    /// The model with this primary key, or nil.
    public func fetch<M: Model>(_ type: M.Type, key: PrimaryKey) throws -> M? {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try keyCondition(schema, key)
            let required = try schema.requiredRowsCondition().map { " AND \($0)" } ?? ""
            return try conn.fetchOwnModels(
                M.self, clause: clause.sql + required,
                arguments: StatementArguments(values: clause.arguments)
            ).first
        }
    }

    /// Every row of `M`'s table.
    public func fetchAll<M: Model>(_ type: M.Type) throws -> [M] {
        try fetchAll(Query<M>())
    }

    /// The rows a query selects.
    public func fetchAll<M: Model>(_ query: Query<M>) throws -> [M] {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try query.clauses(
                on: conn, requiring: try schema.requiredRowsCondition(),
                defaultOrder: schema.defaultOrderSQL)
            return try conn.fetchOwnModels(
                M.self, clause: clause.sql,
                arguments: StatementArguments(values: clause.arguments))
        }
    }

    /// The first row a query selects, or nil.
    public func fetchFirst<M: Model>(_ query: Query<M>) throws -> M? {
        try fetchAll(query.limit(min(query.limitCount ?? 1, 1), offset: query.offsetCount ?? 0)).first
    }

    /// Models decoded from raw SQL; columns are matched by name.
    public func fetchAll<M: Model>(
        _ type: M.Type, sql: String,
        arguments: StatementArguments = StatementArguments()
    ) throws -> [M] {
        try withReadConnection { conn in try conn.fetchModels(M.self, sql: sql, arguments: arguments) }
    }

    /// How many rows a query selects.
    public func count<M: Model>(_ query: Query<M>) throws -> Int {
        try aggregate(.count, of: query, as: Int.self) ?? 0
    }

    /// How many rows `M`'s table has.
    public func count<M: Model>(_ type: M.Type) throws -> Int { try count(Query<M>()) }

    /// Whether a query selects at least one row.
    public func exists<M: Model>(_ query: Query<M>) throws -> Bool {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try query.clauses(on: conn, requiring: try schema.requiredRowsCondition())
            return try conn.fetchValue(
                "SELECT EXISTS (SELECT 1 FROM \(schema.quotedTable)\(clause.sql))",
                StatementArguments(values: clause.arguments), as: Bool.self) ?? false
        }
    }

    /// Whether a row has this primary key (and is one `fetch` returns).
    public func exists<M: Model>(_ type: M.Type, key: PrimaryKey) throws -> Bool {
        let schema = try ModelSchema<M>.shared()
        let clause = try keyCondition(schema, key)
        let required = try schema.requiredRowsCondition().map { " AND \($0)" } ?? ""
        return try withReadConnection { conn in
            try conn.fetchValue(
                "SELECT EXISTS (SELECT 1 FROM \(schema.quotedTable)\(clause.sql)\(required))",
                StatementArguments(values: clause.arguments), as: Bool.self) ?? false
        }
    }

    /// The primary keys of the rows a query selects (AgileDB's keysInTable).
    public func fetchKeys<M: Model>(_ query: Query<M>) throws -> [PrimaryKey] {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            try schema.requirePrimaryKey(for: "fetchKeys")
            let clause = try query.clauses(
                on: conn, requiring: try schema.requiredRowsCondition(),
                defaultOrder: schema.defaultOrderSQL)
            let key = schema.primaryKey.map { quoteIdentifier(schema.columns[$0].name) }.joined(separator: ", ")
            return try conn.fetchRows(
                "SELECT \(key) FROM \(schema.quotedTable)\(clause.sql)",
                StatementArguments(values: clause.arguments)
            )
            .map { PrimaryKey($0.values) }
        }
    }

    /// An aggregate over the rows a query selects, as `V`; nil when SQL gives NULL
    /// (sum, min or max of no rows).
    public func aggregate<M: Model, V: DatabaseValueConvertible>(
        _ aggregate: Aggregate<M>,
        of query: Query<M> = Query<M>(),
        as type: V.Type = V.self
    ) throws -> V? {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            var arguments: [DatabaseValue] = []
            let expression = try aggregate.sql(arguments: &arguments)
            let clause = try query.clauses(on: conn, requiring: try schema.requiredRowsCondition())
            // With ORDER BY / LIMIT the aggregate must run over the limited rows.
            let sql =
                query.hasOrderOrLimit
                ? "SELECT \(expression) FROM (SELECT * FROM \(schema.quotedTable)\(clause.sql))"
                : "SELECT \(expression) FROM \(schema.quotedTable)\(clause.sql)"
            return try conn.fetchValue(sql, StatementArguments(values: arguments + clause.arguments), as: V.self)
        }
    }

    /// An aggregate over every row of `M`'s table, with the aggregate named by
    /// column: `db.aggregate(.sum("age"), of: Master.self, as: Int.self)`.
    public func aggregate<M: Model, V: DatabaseValueConvertible>(
        _ aggregate: Aggregate<M>, of type: M.Type,
        as valueType: V.Type = V.self
    ) throws -> V? {
        try self.aggregate(aggregate, of: Query<M>(), as: V.self)
    }
}

extension Connection {
    /// Decodes every row of `sql` as `M`, straight from the statement.
    /// A model with nested properties reads its children with `loader` (every level by default),
    /// and a row whose mandatory child is missing is left out. Fetch listeners hear of the rows
    /// unless `reportingFetches` is false (observation's own reads of committed rows).
    func fetchModels<M: Model>(
        _ type: M.Type, sql: String, arguments: StatementArguments, loader: NestedLoader? = nil,
        reportingFetches: Bool = true
    ) throws -> [M] {
        let statement = try cachedStatement(sql)
        try statement.bind(arguments)
        statement.isBusy = true
        defer { statement.isBusy = false; statement.reset() }
        let schema = try ModelSchema<M>.shared()
        let decoder = RowDecoder(schema: schema, statement: statement)
        var models: [M] = []
        if let coding = schema.columnCoding {
            models = try coding.decodeAll(statement, decoder: decoder)
        } else if schema.nested == nil {
            while try statement.step() { models.append(try decoder.decode(M.self)) }
        } else {
            decoder.nestedLoader = loader ?? NestedLoader(connection: self, loading: .all)
            while try statement.step() {
                do {
                    models.append(try decoder.decode(M.self))
                } catch is ParentLeftOut {
                    continue
                }
            }
        }
        if reportingFetches, let broker = observationBroker, broker.listensToFetches {
            try reportFetch(of: models, schema, to: broker)
        }
        return models
    }
}
