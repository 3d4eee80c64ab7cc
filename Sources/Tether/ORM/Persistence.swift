import CSQLite

/// Where ORM operations run: a `Database` (each call is its own transaction
/// on the writer, or a snapshot read) or a `Connection` inside one (the calls
/// join the enclosing transaction). The operations are written once, here.
public protocol DatabaseContext {
    /// Runs `body` with a connection to read through: a snapshot read on a `Database`, the
    /// connection itself (inside its transaction) on a `Connection`.
    func withReadConnection<T>(_ body: (Connection) throws -> T) throws -> T
    /// Runs `body` with a connection to write through: a transaction of its own on a `Database`'s
    /// writer, the enclosing transaction on a `Connection`.
    func withWriteConnection<T>(_ body: (Connection) throws -> T) throws -> T
}

// The ORM's entry points: a core `StatementError` becomes the `ModelError` ORM users catch.

extension Database: DatabaseContext {
    /// Runs `body` in a read (see `Database.read(_:)`); a core failure is thrown as `ModelError`.
    public func withReadConnection<T>(_ body: (Connection) throws -> T) throws -> T { try ModelError.wrapping { try read(body) } }
    /// Runs `body` in a write transaction of its own (see `Database.write(_:)`); a core failure is
    /// thrown as `ModelError`.
    public func withWriteConnection<T>(_ body: (Connection) throws -> T) throws -> T { try ModelError.wrapping { try write(body) } }
}

extension Connection: DatabaseContext {
    /// Runs `body` on this connection, within its current transaction; a core failure is thrown as
    /// `ModelError`.
    public func withReadConnection<T>(_ body: (Connection) throws -> T) throws -> T { try ModelError.wrapping { try body(self) } }
    /// Runs `body` on this connection, within its current transaction; a core failure is thrown as
    /// `ModelError`.
    public func withWriteConnection<T>(_ body: (Connection) throws -> T) throws -> T { try ModelError.wrapping { try body(self) } }
}

/// One element of a best-effort batch that failed, and why.
public struct BatchFailure<Element: Sendable>: Error, Sendable {
    /// Position of the element in the batch.
    public let index: Int
    /// The element that failed; the rest of the batch went on.
    public let element: Element
    /// Why it failed (a `ModelError`, usually).
    public let error: any Error
}

/// A primary key value: one value, or one per column for a composite key.
public struct PrimaryKey: Sendable, Hashable, ExpressibleByArrayLiteral {
    /// The key's values, in the order of the model's primary key columns.
    public let values: [DatabaseValue]
    /// A key of several columns, values in the order of the primary key's columns.
    public init(_ values: [DatabaseValue]) { self.values = values }
    /// A key of one column: `PrimaryKey(42)`.
    public init(_ value: some DatabaseValueConvertible) { values = [value.databaseValue] }
    public init(arrayLiteral elements: DatabaseValue...) { values = elements }
}

// MARK: - Tables

extension DatabaseContext {
    /// Creates `M`'s table and indexes from its description.
    public func createTable<M: Model>(_ type: M.Type, ifNotExists: Bool = true) throws {
        try withWriteConnection { conn in
            try conn.transaction {
                // The tables of nested models too (they are rows of their own tables).
                var visited = Set<ObjectIdentifier>()
                try conn.createTables(M.self, ifNotExists: ifNotExists, visited: &visited)
            }
        }
    }

    /// Drops `M`'s table.
    public func dropTable<M: Model>(_ type: M.Type, ifExists: Bool = true) throws {
        try withWriteConnection { conn in
            try conn.execute("DROP TABLE \(ifExists ? "IF EXISTS " : "")\(quoteIdentifier(M.tableName))")
            conn.setAttachment(nil, as: ModelStatements<M>.self)
        }
    }

    /// Whether a table (or view) with this name exists.
    public func tableExists(_ name: String) throws -> Bool {
        try withReadConnection { conn in
            try conn.fetchValue("SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?", [name], as: Int.self) != nil
        }
    }
}

// MARK: - Insert, replace, save

extension DatabaseContext {
    /// Inserts `model`. A collision on the primary key or a unique key throws
    /// `ModelError.duplicate` carrying the row already stored.
    /// Returns the new row's rowid (the key SQLite assigned, when it was nil).
    @discardableResult
    public func insert<M: Model>(_ model: M) throws -> Int64 {
        try withWriteConnection { conn in try conn.insertRow(model) }
    }

    /// Inserts `model` under a key SQLite assigns, whatever key it holds (0, nil
    /// or any other), and returns that key: SQLiteORM-Swift's `insert`, for
    /// models made with `id = 0`. The model's primary key must be one INTEGER
    /// column; otherwise `ModelError.invalidArgument`.
    ///
    /// ```swift
    /// let id = try db.insert(Task(id: 0, title: "Write"), assigningNewKey: true)   // 1, 2, …
    /// ```
    @discardableResult
    public func insert<M: Model>(_ model: M, assigningNewKey: Bool) throws -> Int64 {
        try withWriteConnection { conn in
            guard assigningNewKey else { return try conn.insertRow(model) }
            let statements = try conn.statements(for: M.self)
            let schema = statements.schema
            guard schema.primaryKey.count == 1, schema.columns[schema.primaryKey[0]].type == .integer else {
                throw ModelError.invalidArgument("\(schema.modelName) cannot be inserted under a new key: its primary key is not one INTEGER column")
            }
            // The key's parameter is left out of the binding, and bindings are cleared first: it is NULL.
            let plan = try statements.insertPlan(bulk: false)
            var parameters = plan.parameters
            parameters[schema.primaryKey[0]] = 0
            sqlite3_clear_bindings(plan.statement.handle)
            return try conn.insertRow(model, statements, ModelStatements<M>.InsertPlan(
                statement: plan.statement, parameters: parameters, changesNothingElse: plan.changesNothingElse))
        }
    }

    /// Inserts all models, or none: the first failure rolls the batch back and is thrown.
    public func insert<M: Model>(contentsOf models: some Sequence<M>) throws {
        try withWriteConnection { conn in
            try conn.transaction { try conn.insertRows(models) }
        }
    }

    /// Inserts each model that can be; returns those that could not, and why.
    public func insertEach<M: Model>(_ models: [M]) throws -> [BatchFailure<M>] {
        try eachInBatch(models) { conn, model in _ = try conn.insertRow(model) }
    }

    /// INSERT OR REPLACE: a row colliding on any unique key is deleted first
    /// (with its ON DELETE actions), then `model` is inserted.
    public func replace<M: Model>(_ model: M) throws {
        try withWriteConnection { conn in _ = try conn.statements(for: M.self).run(.replace, model) }
    }

    /// Inserts `model`, or updates the row with its primary key (upsert).
    public func save<M: Model>(_ model: M) throws {
        try withWriteConnection { conn in try conn.upsertRow(model) }
    }

    /// Saves all models, or none.
    public func save<M: Model>(contentsOf models: some Sequence<M>) throws {
        try withWriteConnection { conn in
            try conn.transaction {
                let statements = try conn.statements(for: M.self)
                for model in models { try conn.upsertRow(model, statements) }
            }
        }
    }

    /// Saves each model that can be; returns those that could not, and why.
    public func saveEach<M: Model>(_ models: [M]) throws -> [BatchFailure<M>] {
        try eachInBatch(models) { conn, model in try conn.upsertRow(model, conn.statements(for: M.self)) }
    }

    /// Runs `operation` on each element inside one transaction; a failing
    /// element is undone alone (SQLite undoes a failed statement) and reported.
    func eachInBatch<Element: Sendable>(_ elements: [Element], _ operation: (Connection, Element) throws -> Void) throws -> [BatchFailure<Element>] {
        try withWriteConnection { conn in
            try conn.transaction {
                var failures: [BatchFailure<Element>] = []
                for (index, element) in elements.enumerated() {
                    do {
                        try conn.savepoint { try operation(conn, element) }
                    } catch {
                        // A failure that ended the transaction (I/O, full disk) ends the batch.
                        if !conn.isInTransaction { throw error }
                        failures.append(BatchFailure(index: index, element: element, error: error))
                    }
                }
                return failures
            }
        }
    }
}

extension Connection {
    func insertRow<M: Model>(_ model: M) throws -> Int64 {
        let statements = try statements(for: M.self)
        return try insertRow(model, statements, statements.insertPlan(bulk: false))
    }

    /// Inserts rows of `M` all at once: one plan and, when an insert changes nothing but its
    /// row, the rows reported to observers as rowid ranges (`insertingInBulk`) rather than each
    /// through the pre-update hook.
    func insertRows<M: Model>(_ models: some Sequence<M>) throws {
        let statements = try statements(for: M.self)
        // Nested models write their children too: every write must be observed, one by one.
        if statements.schema.nested != nil {
            for model in models { _ = try insertRow(model) }
            return
        }
        let plan = try statements.insertPlan(bulk: true)
        // A contiguous array is iterated without going through Sequence's witnesses.
        let rows = Array(models)
        // INSERT OR REPLACE deletes the rows it collides with: those must be observed.
        guard plan.changesNothingElse, !configuration.replacesDuplicates else {
            for index in rows.indices { _ = try insertRow(rows[index], statements, plan) }
            return
        }
        try insertingInBulk(into: M.tableName, rowCount: rows.count) { recordsRows in
            if let coding = statements.schema.columnCoding {
                return try coding.insertAll(rows, with: plan.statement, parameters: plan.parameters, encoder: statements.encoder,
                                            recordsRows: recordsRows) { row, error in
                    try self.settleDuplicate(of: rows[row], statements, error: error, saving: false)
                }
            }
            // Two loops, so that an insert nobody observes pays nothing per row for the recording.
            guard recordsRows else {
                for index in rows.indices { _ = try insertRow(rows[index], statements, plan) }
                return
            }
            for index in rows.indices {
                _ = try insertRow(rows[index], statements, plan)
                try noteBulkInsertedRow()
            }
        }
    }

    @inline(__always)
    func insertRow<M: Model>(_ model: M, _ statements: ModelStatements<M>, _ plan: ModelStatements<M>.InsertPlan) throws -> Int64 {
        let statement = plan.statement
        try resolvingDuplicate(of: model, statements) {
            try statements.bind(model, into: statement, parameters: plan.parameters)
            defer { statement.reset() }
            while try statement.step() {}
        }
        return lastInsertedRowID
    }

    func upsertRow<M: Model>(_ model: M) throws {
        try upsertRow(model, statements(for: M.self))
    }

    @inline(__always)
    func upsertRow<M: Model>(_ model: M, _ statements: ModelStatements<M>) throws {
        try resolvingDuplicate(of: model, statements, saving: true) { _ = try statements.run(.upsert, model) }
    }

    /// Runs a write of `model` that may collide on a unique key, and settles a
    /// collision: for a save of a `SyncableModel`, sModel's rule (a row with the
    /// same secondary key that is synced and not in flight is updated, keeping
    /// its own primary key); then, with `Configuration.replacesDuplicates`, the
    /// colliding rows are replaced; else `ModelError.duplicate`.
    @inline(__always)
    private func resolvingDuplicate<M: Model>(of model: M, _ statements: ModelStatements<M>, saving: Bool = false, _ write: () throws -> Void) throws {
        do {
            try write()
        } catch let error as DatabaseError where error.kind == .uniqueViolation {
            try settleDuplicate(of: model, statements, error: error, saving: saving)
        }
    }

    /// The collision half of `resolvingDuplicate`, kept out of line: rows that do
    /// not collide run only the write.
    @inline(never)
    private func settleDuplicate<M: Model>(of model: M, _ statements: ModelStatements<M>, error: DatabaseError, saving: Bool) throws {
        if saving, try updateSyncedRowBySecondaryKey(model, statements) { return }
        if configuration.replacesDuplicates {
            _ = try statements.run(.replace, model)
            return
        }
        throw (try? duplicate(of: model, error: error, statements: statements)) ?? error
    }

    /// sModel's save rule: when `model`'s secondary key matches a row that is
    /// synced and not in flight, that row takes `model`'s values and keeps its
    /// primary key. False when `M` is not a `SyncableModel`, has no secondary
    /// key, or no such row is synced and idle (a pending or in-flight row is
    /// the application's own change, which a save by secondary key must not overwrite).
    private func updateSyncedRowBySecondaryKey<M: Model>(_ model: M, _ statements: ModelStatements<M>) throws -> Bool {
        let schema = statements.schema
        guard M.self is any SyncableModel.Type, !schema.secondaryKeys.isEmpty,
              try tableExists(RowMetadataLayout.rowsTableName(of: schema.tableName)) else { return false }
        let values = try statements.encoder.collect(model)
        let rowid = "\(schema.quotedTable).rowid"
        let keyList = schema.primaryKey.map { "\(schema.quotedTable).\(quoteIdentifier(schema.columns[$0].name))" }.joined(separator: ", ")
        for secondaryKey in schema.secondaryKeys where !secondaryKey.isEmpty {
            let condition = secondaryKey.map { "\(schema.quotedTable).\(quoteIdentifier(schema.columns[$0].name)) = ?" }.joined(separator: " AND ")
            let sql = "SELECT \(RowMetadataLayout.statusSQL(table: schema.tableName, rowid: rowid)), "
                + "\(RowMetadataLayout.inFlightSQL(table: schema.tableName, rowid: rowid)), \(keyList) FROM \(schema.quotedTable) WHERE \(condition)"
            guard let row = try fetchRow(sql, StatementArguments(values: secondaryKey.map { values[$0] })) else { continue }
            guard row[0] == SyncStatus.synced.databaseValue, row[1] == .integer(0) else { return false }
            let existingKey = Array(row.values.dropFirst(2))
            // The update statement binds the model's values, then the stored row's key over the model's.
            let statement = try statements.statement(.update)
            let parameters = statements.parameters(.update)
            try statements.bind(model, into: statement, parameters: parameters)
            defer { statement.reset() }
            for (position, column) in schema.primaryKey.enumerated() {
                let rc = existingKey[position].bindValue(to: statement.handle, at: parameters[column])
                if rc != SQLITE_OK { throw statements.encoder.bindError(rc, in: statement.handle) }
            }
            while try statement.step() {}
            return true
        }
        return false
    }

    /// Runs a write of `model`: a collision on the primary key or a unique key
    /// becomes `ModelError.duplicate`, carrying the row already stored.
    @inline(__always)
    func reportingDuplicate<M: Model>(of model: M, _ statements: ModelStatements<M>, _ write: () throws -> Void) throws {
        do {
            try write()
        } catch let error as DatabaseError where error.kind == .uniqueViolation {
            throw (try? duplicate(of: model, error: error, statements: statements)) ?? error
        }
    }

    /// The stored row `model` collided with, as `ModelError.duplicate`.
    private func duplicate<M: Model>(of model: M, error: DatabaseError, statements: ModelStatements<M>) throws -> ModelError? {
        let schema = statements.schema
        let values = try statements.encoder.collect(model)
        var columns = error.constrainedColumns.compactMap { schema.indexByName[$0] }
        if columns.isEmpty { columns = schema.primaryKey }
        let condition = columns.map { "\(quoteIdentifier(schema.columns[$0].name)) = ?" }.joined(separator: " AND ")
        let existing = try fetchModels(M.self, sql: "\(schema.selectSQL) WHERE \(condition) LIMIT 1",
                                       arguments: StatementArguments(values: columns.map { values[$0] })).first
        return existing.map { ModelError.duplicate(existing: $0, underlying: error) }
    }
}

// MARK: - Update

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
}

extension Connection {
    func updateRow<M: Model>(_ model: M) throws {
        let statements = try statements(for: M.self)
        _ = try statements.run(.update, model)
        if changes == 0 { throw try notFound(model, statements) }
    }

    /// UPDATE … SET assignments WHERE condition; returns the rows changed.
    func updateRows<M: Model>(_ type: M.Type, set assignments: [Assignment<M>], where clause: (sql: String, arguments: [DatabaseValue])) throws -> Int {
        let schema = try ModelSchema<M>.shared()
        guard !assignments.isEmpty else { throw ModelError.invalidArgument("update of \(schema.modelName) sets no column") }
        var arguments: [DatabaseValue] = []
        var sets: [String] = []
        for assignment in assignments {
            sets.append("\(quoteIdentifier(try assignment.column.get())) = ?")
            arguments.append(try assignment.value.get())
        }
        try execute("UPDATE \(schema.quotedTable) SET \(sets.joined(separator: ", "))\(clause.sql)",
                    StatementArguments(values: arguments + clause.arguments))
        return changes
    }
}

private func notFound<M: Model>(_ model: M, _ statements: ModelStatements<M>) throws -> ModelError {
    let values = try statements.encoder.collect(model)
    return ModelError.notFound(table: statements.schema.tableName, key: statements.schema.describeKey(statements.schema.primaryKey.map { values[$0] }))
}

/// ` WHERE pk = ?` for a key given by value.
func keyCondition(_ schema: SchemaCore, _ key: PrimaryKey) throws -> (sql: String, arguments: [DatabaseValue]) {
    try schema.requirePrimaryKey(for: "a lookup by primary key")
    guard key.values.count == schema.primaryKey.count else {
        throw ModelError.invalidArgument("the primary key of \(schema.tableName) has \(schema.primaryKey.count) column(s); \(key.values.count) value(s) were given")
    }
    return (" WHERE \(schema.primaryKeyCondition)", key.values)
}

// MARK: - Delete

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
            try conn.execute("DELETE FROM \(schema.quotedTable)\(clause.sql)", StatementArguments(values: clause.arguments))
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
            try conn.execute("DELETE FROM \(schema.quotedTable)\(clause.sql)", StatementArguments(values: clause.arguments))
            return conn.changes
        }
    }

    /// Deletes every row of `M`'s table; returns how many.
    @discardableResult
    public func deleteAll<M: Model>(_ type: M.Type) throws -> Int {
        try delete(Query<M>())
    }

    /// Sets columns on every row a query selects; returns how many changed.
    @discardableResult
    public func update<M: Model>(_ query: Query<M>, set assignments: [Assignment<M>]) throws -> Int {
        try withWriteConnection { conn in
            try conn.updateRows(M.self, set: assignments, where: try query.restrictingClause(try ModelSchema<M>.shared(), on: conn))
        }
    }
}

extension Query {
    /// A WHERE clause selecting the query's rows for UPDATE / DELETE, which take
    /// no ORDER BY / LIMIT in this SQLite build: those become a sub-select on the key.
    func restrictingClause(_ schema: SchemaCore, on connection: Connection) throws -> (sql: String, arguments: [DatabaseValue]) {
        guard hasOrderOrLimit else { return try clauses(on: connection, orderAndLimit: false) }
        let inner = try clauses(on: connection)
        // A table without a primary key has its rowid (Tether makes no WITHOUT ROWID tables).
        let key = schema.primaryKey.isEmpty ? "rowid" : schema.primaryKey.map { quoteIdentifier(schema.columns[$0].name) }.joined(separator: ", ")
        let keyTuple = schema.primaryKey.count == 1 ? key : "(\(key))"
        return (" WHERE \(keyTuple) IN (SELECT \(key) FROM \(schema.quotedTable)\(inner.sql))", inner.arguments)
    }
}

// MARK: - Fetch

extension DatabaseContext {
    /// The model with this primary key, or nil.
    public func fetch<M: Model>(_ type: M.Type, key: PrimaryKey) throws -> M? {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try keyCondition(schema, key)
            let required = try schema.requiredRowsCondition().map { " AND \($0)" } ?? ""
            return try conn.fetchOwnModels(M.self, clause: clause.sql + required, arguments: StatementArguments(values: clause.arguments)).first
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
            let clause = try query.clauses(on: conn, requiring: try schema.requiredRowsCondition(), defaultOrder: schema.defaultOrderSQL)
            return try conn.fetchOwnModels(M.self, clause: clause.sql, arguments: StatementArguments(values: clause.arguments))
        }
    }

    /// The first row a query selects, or nil.
    public func fetchFirst<M: Model>(_ query: Query<M>) throws -> M? {
        try fetchAll(query.limit(min(query.limitCount ?? 1, 1), offset: query.offsetCount ?? 0)).first
    }

    /// Models decoded from raw SQL; columns are matched by name.
    public func fetchAll<M: Model>(_ type: M.Type, sql: String, arguments: StatementArguments = StatementArguments()) throws -> [M] {
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
            return try conn.fetchValue("SELECT EXISTS (SELECT 1 FROM \(schema.quotedTable)\(clause.sql))", StatementArguments(values: clause.arguments), as: Bool.self) ?? false
        }
    }

    /// Whether a row has this primary key (and is one `fetch` returns).
    public func exists<M: Model>(_ type: M.Type, key: PrimaryKey) throws -> Bool {
        let schema = try ModelSchema<M>.shared()
        let clause = try keyCondition(schema, key)
        let required = try schema.requiredRowsCondition().map { " AND \($0)" } ?? ""
        return try withReadConnection { conn in
            try conn.fetchValue("SELECT EXISTS (SELECT 1 FROM \(schema.quotedTable)\(clause.sql)\(required))", StatementArguments(values: clause.arguments), as: Bool.self) ?? false
        }
    }

    /// The primary keys of the rows a query selects (AgileDB's keysInTable).
    public func fetchKeys<M: Model>(_ query: Query<M>) throws -> [PrimaryKey] {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            try schema.requirePrimaryKey(for: "fetchKeys")
            let clause = try query.clauses(on: conn, requiring: try schema.requiredRowsCondition(), defaultOrder: schema.defaultOrderSQL)
            let key = schema.primaryKey.map { quoteIdentifier(schema.columns[$0].name) }.joined(separator: ", ")
            return try conn.fetchRows("SELECT \(key) FROM \(schema.quotedTable)\(clause.sql)", StatementArguments(values: clause.arguments))
                .map { PrimaryKey($0.values) }
        }
    }

    /// An aggregate over the rows a query selects, as `V`; nil when SQL gives NULL
    /// (sum, min or max of no rows).
    public func aggregate<M: Model, V: DatabaseValueConvertible>(_ aggregate: Aggregate<M>, of query: Query<M> = Query<M>(), as type: V.Type = V.self) throws -> V? {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            var arguments: [DatabaseValue] = []
            let expression = try aggregate.sql(arguments: &arguments)
            let clause = try query.clauses(on: conn, requiring: try schema.requiredRowsCondition())
            // With ORDER BY / LIMIT the aggregate must run over the limited rows.
            let sql = query.hasOrderOrLimit
                ? "SELECT \(expression) FROM (SELECT * FROM \(schema.quotedTable)\(clause.sql))"
                : "SELECT \(expression) FROM \(schema.quotedTable)\(clause.sql)"
            return try conn.fetchValue(sql, StatementArguments(values: arguments + clause.arguments), as: V.self)
        }
    }

    /// An aggregate over every row of `M`'s table, with the aggregate named by
    /// column: `db.aggregate(.sum("age"), of: Master.self, as: Int.self)`.
    public func aggregate<M: Model, V: DatabaseValueConvertible>(_ aggregate: Aggregate<M>, of type: M.Type, as valueType: V.Type = V.self) throws -> V? {
        try self.aggregate(aggregate, of: Query<M>(), as: V.self)
    }
}

extension Connection {
    /// Decodes every row of `sql` as `M`, straight from the statement.
    /// A model with nested properties reads its children with `loader` (every level by default),
    /// and a row whose mandatory child is missing is left out. Fetch listeners hear of the rows
    /// unless `reportingFetches` is false (observation's own reads of committed rows).
    func fetchModels<M: Model>(_ type: M.Type, sql: String, arguments: StatementArguments, loader: NestedLoader? = nil,
                               reportingFetches: Bool = true) throws -> [M] {
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
        if reportingFetches, let broker = observationBroker, broker.listensToFetches { try reportFetch(of: models, schema, to: broker) }
        return models
    }
}
