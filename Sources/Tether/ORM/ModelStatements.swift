import CSQLite

/// A connection's prepared statements and coders for one model type, so that
/// an ORM call costs one lookup keyed by the type instead of hashing its SQL.
final class ModelStatements<M: Model> {
    let schema: ModelSchema<M>
    let encoder: RowEncoder
    private unowned let connection: Connection
    private var insert: Statement?
    private var replace: Statement?
    private var upsert: Statement?
    private var update: Statement?
    private var selectByKey: Statement?
    private var deleteByKey: Statement?

    /// The INSERT that also sets sync metadata, for a synced table.
    struct SyncedInsert {
        let table: SyncedTable
        let statement: Statement
        let parameters: [Int32]
        let sequenceParameter: Int32
        let versionsParameter: Int32
    }
    private var syncedInsert: (generation: Int, plan: SyncedInsert?)?

    /// The synced INSERT when `M`'s table is synced and captured by the
    /// library (not by triggers), rebuilt when the synced tables change.
    func syncedInsertPlan(_ engine: SyncEngine) throws -> SyncedInsert? {
        if let cached = syncedInsert, cached.generation == engine.generation { return cached.plan }
        var plan: SyncedInsert?
        if let table = engine.table(named: schema.tableName), !table.capturesExternalWrites {
            // Model properties mapped onto tether_ columns are the engine's to write.
            let stored = schema.columns.indices.filter { !schema.columns[$0].name.hasPrefix("tether_") }
            var parameters = Array(repeating: Int32(0), count: schema.columns.count)
            for (position, column) in stored.enumerated() { parameters[column] = Int32(position + 1) }
            let names = stored.map { quoteIdentifier(schema.columns[$0].name) } + ["tether_seq", "tether_status", "tether_in_flight", "tether_versions"]
            let placeholders = stored.map { schema.insertPlaceholders[$0] }.joined(separator: ", ")
            let sql = "INSERT INTO \(schema.quotedTable) (\(names.joined(separator: ", "))) VALUES (\(placeholders)\(stored.isEmpty ? "" : ", ")?, \(SyncStatus.created.rawValue), 0, ?)"
            plan = SyncedInsert(table: table, statement: try connection.prepare(sql), parameters: parameters,
                                sequenceParameter: Int32(stored.count + 1), versionsParameter: Int32(stored.count + 2))
        }
        syncedInsert = (engine.generation, plan)
        return plan
    }

    init(connection: Connection) throws {
        self.connection = connection
        schema = try ModelSchema<M>.shared()
        encoder = RowEncoder(schema: schema)
    }

    enum Kind { case insert, replace, upsert, update, selectByKey, deleteByKey }

    func statement(_ kind: Kind) throws -> Statement {
        switch kind {
        case .insert: return try cached(&insert, schema.insertSQL)
        case .replace: return try cached(&replace, schema.replaceSQL)
        case .upsert: return try cached(&upsert, schema.upsertSQL)
        case .update:
            guard !schema.updateSQL.isEmpty else {
                throw ModelError.invalidArgument("\(schema.modelName) has only primary-key columns: there is nothing to update")
            }
            return try cached(&update, schema.updateSQL)
        case .selectByKey: return try cached(&selectByKey, "\(schema.selectSQL) WHERE \(schema.primaryKeyCondition)")
        case .deleteByKey: return try cached(&deleteByKey, "DELETE FROM \(schema.quotedTable) WHERE \(schema.primaryKeyCondition)")
        }
    }

    private func cached(_ slot: inout Statement?, _ sql: String) throws -> Statement {
        if let statement = slot { return statement }
        let statement = try connection.prepare(sql)
        slot = statement
        return statement
    }

    func parameters(_ kind: Kind) -> [Int32] {
        switch kind {
        case .insert, .replace, .upsert: return schema.allColumnParameters
        case .update: return schema.updateParameters
        case .selectByKey, .deleteByKey: return schema.primaryKeyParameters
        }
    }

    /// Binds `model` into the statement of `kind` and runs it.
    @inline(__always)
    func run(_ kind: Kind, _ model: M) throws -> Statement {
        let statement = try statement(kind)
        try encoder.bind(model, into: statement.handle, parameters: parameters(kind), sql: statement.sql)
        defer { statement.reset() }
        while try statement.step() {}
        return statement
    }
}

extension Connection {
    func statements<M: Model>(for type: M.Type) throws -> ModelStatements<M> {
        let id = ObjectIdentifier(M.self)
        if let cached = modelStatements[id] as? ModelStatements<M> { return cached }
        _ = try liveHandle()
        let created = try ModelStatements<M>(connection: self)
        modelStatements[id] = created
        return created
    }
}
