// The public API of nested models: fetching to a depth, the keys a nested property links to, deleting with children.

import Foundation

/// How far `fetch` follows nested models (properties whose type is another model).
public enum NestedLoading: Sendable, Equatable {
    /// Every level (a cycle of stored links is an error, not a hang).
    case all
    /// At most this many levels below the fetched rows: beyond it, an optional child is nil
    /// and an array of children is empty (a required child there is an error). 0 reads no child.
    case depth(Int)

    var maximumDepth: Int {
        switch self {
        case .all: return Int.max
        case let .depth(levels): return max(0, levels)
        }
    }
}

extension DatabaseContext {
    /// The model with this primary key, its nested models read as deep as `loading` says.
    ///
    /// ```swift
    /// let shallow = try db.fetch(Employer.self, key: PrimaryKey("E1"), loading: .depth(1))
    /// ```
    public func fetch<M: Model>(_ type: M.Type, key: PrimaryKey, loading: NestedLoading) throws -> M? {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try keyCondition(schema, key)
            let required = try schema.requiredRowsCondition().map { " AND \($0)" } ?? ""
            return try conn.fetchOwnModels(
                M.self, clause: clause.sql + required, arguments: StatementArguments(values: clause.arguments),
                loader: NestedLoader(connection: conn, loading: loading)
            ).first
        }
    }

    /// The rows a query selects, their nested models read as deep as `loading` says.
    ///
    /// ```swift
    /// let roots = try db.fetchAll(Node.where(\.name == "root"), loading: .depth(2))
    /// ```
    public func fetchAll<M: Model>(_ query: Query<M>, loading: NestedLoading) throws -> [M] {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try query.clauses(
                on: conn, requiring: try schema.requiredRowsCondition(), defaultOrder: schema.defaultOrderSQL)
            return try conn.fetchOwnModels(
                M.self, clause: clause.sql, arguments: StatementArguments(values: clause.arguments),
                loader: NestedLoader(connection: conn, loading: loading))
        }
    }

    /// The keys a nested property of the row with primary key `key` links to, without reading
    /// the children (AgileDB stores nested objects by key): one key for a model, one per
    /// element for an array of models, none for NULL. Nil when there is no such row.
    ///
    /// ```swift
    /// let keys = try db.linkedKeys(Employer.self, key: PrimaryKey("E1"), column: "employees")
    /// ```
    public func linkedKeys<M: Model>(_ type: M.Type, key: PrimaryKey, column: String) throws -> [PrimaryKey]? {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let index = try schema.column(named: column)
            guard let link = schema.columns[index].nested else {
                throw ModelError.invalidArgument(
                    "column \(schema.columns[index].name) of \(schema.modelName) "
                        + "is not a nested model or array of models")
            }
            let clause = try keyCondition(schema, key)
            let selected = "\(schema.quotedTable).\(quoteIdentifier(schema.columns[index].name))"
            let sql = "SELECT \(selected) FROM \(schema.quotedTable)\(clause.sql)"
            guard let row = try conn.fetchRows(sql, StatementArguments(values: clause.arguments)).first else {
                return nil
            }
            let value = row.values[0]
            let keys = link.shape == .one ? (value.isNull ? [] : [value]) : try conn.keys(inJSON: value)
            return keys.map { PrimaryKey([$0]) }
        }
    }

    /// Deletes the row with `model`'s primary key; with `deletingChildren`, the rows its nested
    /// properties link to as well, recursively (SundeedQLite's `deleteSubObjects`). Returns
    /// whether the row existed.
    ///
    /// A child that another row still links to (another parent sharing it, of this model or of
    /// one whose table `createTable` or `updateSchema(toMatch:)` made) is kept, with what it
    /// links to.
    ///
    /// ```swift
    /// try db.delete(employer, deletingChildren: true)    // its employees and addresses too
    /// ```
    @discardableResult
    public func delete<M: Model>(_ model: M, deletingChildren: Bool) throws -> Bool {
        try withWriteConnection { conn in
            try conn.transaction {
                let schema = try conn.statements(for: M.self).schema
                let key = try ModelParts.of(model, keyNames: schema.keyNames, nestedColumns: [:]).key
                return try conn.delete(M.self, key: PrimaryKey(key), deletingChildren: deletingChildren)
            }
        }
    }

    /// Deletes the row with this primary key, and with `deletingChildren` its nested models too.
    @discardableResult
    public func delete<M: Model>(_ type: M.Type, key: PrimaryKey, deletingChildren: Bool) throws -> Bool {
        try withWriteConnection { conn in
            try conn.transaction { try conn.delete(M.self, key: key, deletingChildren: deletingChildren) }
        }
    }
}

extension Connection {
    fileprivate func delete<M: Model>(_ type: M.Type, key: PrimaryKey, deletingChildren: Bool) throws -> Bool {
        let schema = try ModelSchema<M>.shared()
        let clause = try keyCondition(schema, key)
        if deletingChildren { try NestedDelete(connection: self).deleteChildren(of: M.self, key: key.values) }
        try execute("DELETE FROM \(schema.quotedTable)\(clause.sql)", StatementArguments(values: clause.arguments))
        return changes > 0
    }
}
