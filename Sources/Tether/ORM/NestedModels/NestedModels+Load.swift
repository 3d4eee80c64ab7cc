// Loading a parent's children as deep as the fetch asks, each once, a cycle an error.

import Foundation

/// Why a parent is left out of the results (a mandatory child or element is missing).
struct ParentLeftOut: Error {}

/// One fetch of models with nested properties: how deep it goes, the children read so far
/// (each read once), and those being read (one met again while being read is a cycle).
final class NestedLoader {
    let connection: Connection
    let maximumDepth: Int
    private(set) var depth = 0
    private var reading: Set<NestedNode> = []
    private var read: [NestedNode: Any?] = [:]

    init(connection: Connection, loading: NestedLoading) {
        self.connection = connection
        maximumDepth = loading.maximumDepth
    }

    /// The child of type `C` with this key, or nil when it is missing (or left out).
    func child<C: Model>(_ type: C.Type, key: DatabaseValue) throws -> C? {
        let node = NestedNode(type: ObjectIdentifier(C.self), key: [key])
        if let known = read[node] { return known as? C }
        if reading.contains(node) {
            throw ModelError.nestedCycle(model: "\(C.self)", key: key.description)
        }
        reading.insert(node)
        depth += 1
        defer {
            reading.remove(node)
            depth -= 1
        }
        let schema = try ModelSchema<C>.shared()
        let condition =
            " WHERE \(schema.primaryKeyCondition)"
            + (try schema.requiredRowsCondition().map { " AND \($0)" } ?? "")
        let found = try connection.fetchOwnModels(
            C.self, clause: condition, arguments: StatementArguments(values: [key]), loader: self
        ).first
        read[node] = .some(found)
        return found
    }

    func keys(in link: DatabaseValue, column: String) throws -> [DatabaseValue] {
        if link.isNull { return [] }
        do {
            return try connection.keys(inJSON: link)
        } catch {
            throw ModelError.typeMismatch(
                column: column, expected: "a JSON array of keys",
                found: "\(link.storageName) \(String(link.description.prefix(80)))", sql: nil)
        }
    }
}

extension Connection {
    /// The elements of a JSON array, as SQLite reads them (integers stay integers).
    func keys(inJSON link: DatabaseValue) throws -> [DatabaseValue] {
        if link.isNull { return [] }
        return try fetchRows("SELECT value FROM json_each(?)", StatementArguments(values: [link])).map { $0.values[0] }
    }
}
