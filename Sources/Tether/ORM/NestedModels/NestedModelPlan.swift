// A model's nested columns, settled with its schema; the condition its fetched rows meet; its nested tables.

import Foundation

/// The nested properties of a model and what its fetches require, built with its schema.
final class NestedPlan: @unchecked Sendable {
    /// Per nested column (schema index), its link.
    let links: [(column: Int, link: NestedLink)]
    /// Column name → schema index, for `ModelParts`.
    let columnsByName: [String: Int]

    init(links: [(column: Int, link: NestedLink)], columns: [ColumnInfo]) {
        self.links = links
        columnsByName = Dictionary(
            links.map { (columns[$0.column].name, $0.column) }, uniquingKeysWith: { first, _ in first })
    }
}

extension ModelSchema {
    var keyNames: [String] { primaryKey.map { columns[$0].name } }

    /// The columns of `derived` with each nested column's type settled (a link to one child
    /// holds the child's key type), the nested plan, and the columns rows must fill to be
    /// fetched (`mandatory` columns not NULL, `mandatoryElements` arrays not NULL nor empty).
    static func settleNested(
        _ columns: [ColumnInfo], primaryKey: [Int], mandatory: [Int], everyElement: [Int], dropping: [Int]
    ) throws -> (columns: [ColumnInfo], plan: NestedPlan?, required: (notNull: [Int], nonEmpty: [Int])) {
        var settled = columns
        var links: [(column: Int, link: NestedLink)] = []
        for (index, info) in columns.enumerated() {
            guard let link = info.nested else { continue }
            let type = try link.keyColumnType(
                parent: ObjectIdentifier(M.self), parentColumns: columns, parentKey: primaryKey)
            settled[index] = ColumnInfo(
                name: info.name, type: type, isOptional: info.isOptional, valueType: info.valueType,
                optionalValueType: info.optionalValueType, nested: link)
            link.isMandatory = mandatory.contains(index)
            links.append((index, link))
        }
        for index in everyElement + dropping where columns[index].nested?.shape != .many {
            throw ModelError.invalidModel(
                type: "\(M.self)",
                reason: "column \(columns[index].name) is not an array of models: mandatoryElements and "
                    + "dropsMissingElements apply to arrays of models")
        }
        for index in everyElement { columns[index].nested?.requiresEveryElement = true }
        for index in dropping { columns[index].nested?.dropsMissingElements = true }
        let plan = links.isEmpty ? nil : NestedPlan(links: links, columns: settled)
        return (settled, plan, (Set(mandatory + everyElement).sorted(), everyElement))
    }
}

extension SchemaCore {
    /// The SQL condition that holds for exactly the rows every read of the model returns (nil:
    /// every row), so that `fetchAll`, `fetch`, `count`, `exists`, `fetchKeys`, `lazyFetch` and
    /// the aggregates agree, and LIMIT counts only such rows: `.mandatory` columns are not NULL,
    /// `.mandatoryElements` arrays not empty, and the children a mandatory link names exist
    /// and meet their own model's condition — what decoding the row would otherwise find
    /// missing, leaving the row out (`ParentLeftOut`).
    ///
    /// The condition refers to the row by the quoted table name. A model met again below
    /// itself (one that nests itself through mandatory links) is checked for existence there,
    /// not again for its own children: the SQL must end. Built once per model (every read of
    /// a nested child asks for it).
    func requiredRowsCondition() throws -> String? {
        if let cached = requiredRowsConditionCache.withLock({ $0 }) { return cached }
        let condition = try requiredCondition(row: quotedTable, depth: 0, visiting: [tableName])
        requiredRowsConditionCache.withLock { $0 = .some(condition) }
        return condition
    }

    private func requiredCondition(row: String, depth: Int, visiting: Set<String>) throws -> String? {
        let column = { (index: Int) -> String in "\(row).\(quoteIdentifier(self.columns[index].name))" }
        var conditions = requiredColumns.notNull.map { "\(column($0)) IS NOT NULL" }
        conditions += requiredColumns.nonEmpty.map { "json_array_length(\(column($0))) > 0" }
        for (index, link) in nested?.links ?? [] where link.isMandatory || link.requiresEveryElement {
            let child = try link.childSchema()
            guard child.primaryKey.count == 1 else { throw link.compositeKey() }
            let alias = "tether_child\(depth)"
            let key = "\(alias).\(quoteIdentifier(child.columns[child.primaryKey[0]].name))"
            let childCondition =
                visiting.contains(child.tableName)
                ? nil
                : try child.requiredCondition(row: alias, depth: depth + 1, visiting: visiting.union([child.tableName]))
            let found = { (linked: String) -> String in
                "SELECT 1 FROM \(child.quotedTable) AS \(alias) WHERE \(key) = \(linked)"
                    + (childCondition.map { " AND \($0)" } ?? "")
            }
            switch link.shape {
            case .one:
                conditions.append("EXISTS (\(found(column(index))))")
            case .many:
                // Every element names a child that is there (a link that is not a JSON array
                // is no element: decoding it reports the error).
                let element = "tether_element\(depth)"
                let array = "CASE WHEN json_valid(\(column(index))) THEN \(column(index)) ELSE '[]' END"
                conditions.append(
                    "NOT EXISTS (SELECT 1 FROM json_each(\(array)) AS \(element) "
                        + "WHERE NOT EXISTS (\(found("\(element).value"))))")
            }
        }
        return conditions.isEmpty ? nil : conditions.joined(separator: " AND ")
    }
}

extension Connection {
    /// Creates `M`'s table and, first, the tables of its nested models.
    func createTables<M: Model>(_ type: M.Type, ifNotExists: Bool, visited: inout Set<ObjectIdentifier>) throws {
        guard visited.insert(ObjectIdentifier(M.self)).inserted else { return }
        let schema = try ModelSchema<M>.shared()
        for entry in schema.nested?.links ?? [] { try entry.link.createTable(self, visited: &visited) }
        for sql in try schema.createStatements(ifNotExists: ifNotExists) { try execute(sql) }
        try recordNestedLinks(of: M.self)
    }
}
