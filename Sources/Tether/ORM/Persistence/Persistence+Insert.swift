// Insert, replace and save: one row or many (in bulk when nobody needs each), and what a collision does.

import CSQLite

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
                throw ModelError.invalidArgument(
                    "\(schema.modelName) cannot be inserted under a new key: its primary key is not one INTEGER column")
            }
            // The key's parameter is left out of the binding, and bindings are cleared first: it is NULL.
            let plan = try statements.insertPlan(bulk: false)
            var parameters = plan.parameters
            parameters[schema.primaryKey[0]] = 0
            sqlite3_clear_bindings(plan.statement.handle)
            return try conn.insertRow(
                model, statements,
                ModelStatements<M>.InsertPlan(
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
                return try coding.insertAll(
                    rows, with: plan.statement, parameters: plan.parameters,
                    encoder: statements.encoder, recordsRows: recordsRows
                ) { row, error in
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
    func insertRow<M: Model>(
        _ model: M, _ statements: ModelStatements<M>,
        _ plan: ModelStatements<M>.InsertPlan
    ) throws -> Int64 {
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
    private func resolvingDuplicate<M: Model>(
        of model: M, _ statements: ModelStatements<M>, saving: Bool = false,
        _ write: () throws -> Void
    ) throws {
        do {
            try write()
        } catch let error as DatabaseError where error.kind == .uniqueViolation {
            try settleDuplicate(of: model, statements, error: error, saving: saving)
        }
    }

    /// The collision half of `resolvingDuplicate`, kept out of line: rows that do
    /// not collide run only the write.
    @inline(never)
    private func settleDuplicate<M: Model>(
        of model: M, _ statements: ModelStatements<M>, error: DatabaseError,
        saving: Bool
    ) throws {
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
            try tableExists(RowMetadataLayout.rowsTableName(of: schema.tableName))
        else { return false }
        let values = try statements.encoder.collect(model)
        let rowid = "\(schema.quotedTable).rowid"
        let keyList = schema.primaryKey.map { "\(schema.quotedTable).\(quoteIdentifier(schema.columns[$0].name))" }
            .joined(separator: ", ")
        for secondaryKey in schema.secondaryKeys where !secondaryKey.isEmpty {
            let condition = secondaryKey.map { "\(schema.quotedTable).\(quoteIdentifier(schema.columns[$0].name)) = ?" }
                .joined(separator: " AND ")
            let sql =
                "SELECT \(RowMetadataLayout.statusSQL(table: schema.tableName, rowid: rowid)), "
                + "\(RowMetadataLayout.inFlightSQL(table: schema.tableName, rowid: rowid)), \(keyList) "
                + "FROM \(schema.quotedTable) WHERE \(condition)"
            guard let row = try fetchRow(sql, StatementArguments(values: secondaryKey.map { values[$0] })) else {
                continue
            }
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
    func reportingDuplicate<M: Model>(
        of model: M, _ statements: ModelStatements<M>,
        _ write: () throws -> Void
    ) throws {
        do {
            try write()
        } catch let error as DatabaseError where error.kind == .uniqueViolation {
            throw (try? duplicate(of: model, error: error, statements: statements)) ?? error
        }
    }

    /// The stored row `model` collided with, as `ModelError.duplicate`.
    private func duplicate<M: Model>(
        of model: M, error: DatabaseError,
        statements: ModelStatements<M>
    ) throws -> ModelError? {
        let schema = statements.schema
        let values = try statements.encoder.collect(model)
        var columns = error.constrainedColumns.compactMap { schema.indexByName[$0] }
        if columns.isEmpty { columns = schema.primaryKey }
        let condition = columns.map { "\(quoteIdentifier(schema.columns[$0].name)) = ?" }.joined(separator: " AND ")
        let existing = try fetchModels(
            M.self, sql: "\(schema.selectSQL) WHERE \(condition) LIMIT 1",
            arguments: StatementArguments(values: columns.map { values[$0] })
        ).first
        return existing.map { ModelError.duplicate(existing: $0, underlying: error) }
    }
}
