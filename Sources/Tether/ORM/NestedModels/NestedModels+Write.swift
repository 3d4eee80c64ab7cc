// Saving a parent's children before the parent, each once, a cycle an error.

import Foundation

/// One write of a parent: the children saved so far (a child shared by two parents is
/// written once) and the chain of rows being saved (a row met again on it is a cycle).
final class NestedWrite {
    let connection: Connection
    private var path: [NestedNode] = []
    private var saved: Set<NestedNode> = []

    init(connection: Connection) { self.connection = connection }

    /// Saves the children of `model` (recursively), before `model` itself is written.
    func saveChildren<M: Model>(of model: M, _ schema: ModelSchema<M>, _ plan: NestedPlan) throws {
        let parts = try ModelParts.of(model, keyNames: schema.keyNames, nestedColumns: plan.columnsByName)
        let node = NestedNode(type: ObjectIdentifier(M.self), key: parts.key)
        path.append(node)
        defer { path.removeLast() }
        for (column, value) in parts.nested {
            try schema.columns[column].nested?.save(value, self)
        }
    }

    /// Saves one child: its own children first, then the child (upsert).
    func save<C: Model>(_ child: C) throws {
        let statements = try connection.statements(for: C.self)
        let schema = statements.schema
        let key = try ModelParts.of(child, keyNames: schema.keyNames, nestedColumns: [:]).key
        let node = NestedNode(type: ObjectIdentifier(C.self), key: key)
        if path.contains(node) {
            throw ModelError.nestedCycle(model: "\(C.self)", key: schema.describeKey(key))
        }
        guard saved.insert(node).inserted else { return }
        if let plan = schema.nested { try saveChildren(of: child, schema, plan) }
        // A child that collides on a unique key is the child's duplicate, not the parent's.
        try connection.reportingDuplicate(of: child, statements) {
            _ = try statements.run(.upsert, child, savingChildren: false)
        }
    }
}
