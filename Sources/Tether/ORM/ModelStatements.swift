import CSQLite
import Foundation

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

    /// How rows of `M` are inserted: the statement, and where each column binds.
    struct InsertPlan {
        let statement: Statement
        let parameters: [Int32]
        /// The table has no triggers nor ON CONFLICT clause: an insert changes nothing but its
        /// row, so a bulk insert may report its rows as rowid ranges (`insertingInBulk`).
        let changesNothingElse: Bool
    }
    private var singleInsert: InsertPlan?
    private var bulkInsert: (schemaVersion: Int64, plan: InsertPlan)?

    /// The plan for one insert, or for a bulk insert (checked against the
    /// schema once per batch). A bulk insert into a table without triggers or
    /// ON CONFLICT clauses uses INSERT OR FAIL: for a single row it fails
    /// exactly like the default ABORT (constraints are checked before the row
    /// is written), without opening a statement journal per row.
    func insertPlan(bulk: Bool) throws -> InsertPlan {
        if !bulk, let cached = singleInsert { return cached }
        let schemaVersion = bulk ? (try connection.fetchValue("PRAGMA schema_version", as: Int64.self) ?? 0) : 0
        if bulk, let cached = bulkInsert, cached.schemaVersion == schemaVersion { return cached.plan }

        let changesNothingElse = try connection.insertsChangeNothingElse(into: schema.tableName)
        let sql =
            bulk && changesNothingElse
            ? schema.insertSQL.replacingOccurrences(of: "INSERT INTO", with: "INSERT OR FAIL INTO") : schema.insertSQL
        let prepared = try connection.prepareModelStatement(sql, for: M.self)
        let plan = InsertPlan(
            statement: prepared.statement, parameters: schema.allColumnParameters,
            changesNothingElse: changesNothingElse)
        if prepared.addedColumns { return plan }
        if bulk { bulkInsert = (schemaVersion, plan) } else { singleInsert = plan }
        return plan
    }

    /// How `update(_:columns:)` writes some columns: the statement, and where each column binds.
    struct ColumnsUpdatePlan {
        let statement: Statement
        let parameters: [Int32]
    }
    private var columnsUpdates: [[Int]: ColumnsUpdatePlan] = [:]

    /// The plan updating the schema columns `chosen` of the row with the model's primary key,
    /// checked and written once per set of columns.
    func columnsUpdatePlan(_ chosen: [Int]) throws -> ColumnsUpdatePlan {
        if let plan = columnsUpdates[chosen] { return plan }
        try schema.requirePrimaryKey(for: "update of a model")
        guard !chosen.isEmpty else { throw ModelError.invalidArgument("update of \(schema.modelName) names no column") }
        if let key = chosen.first(where: schema.primaryKey.contains) {
            throw ModelError.invalidArgument(
                "column \(schema.columns[key].name) is part of the primary key; delete and insert to change a key")
        }
        if let state = chosen.first(where: schema.syncStateColumns.contains) {
            throw ModelError.invalidArgument(
                "column \(schema.columns[state].name) is the row's sync state, which only the sync engine sets")
        }
        var parameters = Array(repeating: Int32(0), count: schema.columns.count)
        for (position, column) in (chosen + schema.primaryKey).enumerated() { parameters[column] = Int32(position + 1) }
        let assignments = chosen.map { "\(quoteIdentifier(schema.columns[$0].name)) = ?" }.joined(separator: ", ")
        let prepared = try connection.prepareModelStatement(
            "UPDATE \(schema.quotedTable) SET \(assignments) WHERE \(schema.primaryKeyCondition)", for: M.self)
        let plan = ColumnsUpdatePlan(statement: prepared.statement, parameters: parameters)
        if !prepared.addedColumns { columnsUpdates[chosen] = plan }
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
        case .upsert: try schema.requirePrimaryKey(for: "save")
        case .update: try schema.requirePrimaryKey(for: "update of a model")
        case .selectByKey, .deleteByKey: try schema.requirePrimaryKey(for: "a lookup by primary key")
        case .insert, .replace: break
        }
        switch kind {
        case .insert: return try cached(&insert, schema.insertSQL)
        case .replace: return try cached(&replace, schema.replaceSQL)
        case .upsert: return try cached(&upsert, schema.upsertSQL)
        case .update:
            guard !schema.updateSQL.isEmpty else {
                throw ModelError.invalidArgument(
                    "\(schema.modelName) has only primary-key columns: there is nothing to update")
            }
            return try cached(&update, schema.updateSQL)
        case .selectByKey: return try cached(&selectByKey, "\(schema.selectSQL) WHERE \(schema.primaryKeyCondition)")
        case .deleteByKey:
            return try cached(&deleteByKey, "DELETE FROM \(schema.quotedTable) WHERE \(schema.primaryKeyCondition)")
        }
    }

    private func cached(_ slot: inout Statement?, _ sql: String) throws -> Statement {
        if let statement = slot { return statement }
        let prepared = try connection.prepareModelStatement(sql, for: M.self)
        if !prepared.addedColumns { slot = prepared.statement }
        return prepared.statement
    }

    func parameters(_ kind: Kind) -> [Int32] {
        switch kind {
        case .insert, .replace, .upsert: return schema.allColumnParameters
        case .update: return schema.updateParameters
        case .selectByKey, .deleteByKey: return schema.primaryKeyParameters
        }
    }

    /// Binds `model` into `statement` (parameters per schema column): column by
    /// column when the model is `ColumnCodable`, through `Codable` otherwise.
    /// A model with nested properties saves its children first (`savingChildren`).
    @inline(__always)
    func bind(_ model: M, into statement: Statement, parameters: [Int32], savingChildren: Bool = true) throws {
        if savingChildren, let nested = schema.nested {
            try NestedWrite(connection: connection).saveChildren(of: model, schema, nested)
        }
        if let coding = schema.columnCoding {
            try coding.bind(model, into: statement, parameters: parameters, encoder: encoder)
        } else {
            try encoder.bind(model, into: statement.handle, parameters: parameters)
        }
    }

    /// Binds `model` into the statement of `kind` and runs it.
    @inline(__always)
    func run(_ kind: Kind, _ model: M, savingChildren: Bool = true) throws -> Statement {
        let statement = try statement(kind)
        try bind(
            model, into: statement, parameters: parameters(kind),
            savingChildren: savingChildren && kind != .deleteByKey && kind != .selectByKey)
        defer { statement.reset() }
        while try statement.step() {}
        return statement
    }
}

extension Connection {
    /// `M`'s statements and coders on this connection, kept as one of its attachments: an ORM
    /// call costs one lookup keyed by the type.
    func statements<M: Model>(for type: M.Type) throws -> ModelStatements<M> {
        if let cached = attachment(ModelStatements<M>.self) { return cached }
        _ = try liveHandle()
        let created = try ModelStatements<M>(connection: self)
        setAttachment(created, as: ModelStatements<M>.self)
        return created
    }
}
