// Deleting a parent's children but those another row still links to; where rows link (`tether_nested_links`).

import Foundation

/// One delete of a parent with its children, in two passes: first every row the parent's
/// links reach (a child shared twice, or a stored cycle, is met once), then those still
/// linked from a row outside that set are kept — a child another parent shares stays, with
/// everything below it — and the rest are deleted.
final class NestedDelete {
    /// A row met on the way, by table and rowid.
    struct Reached: Hashable {
        let table: String
        let rowid: Int64
    }

    /// Where rows of other tables link to a table's rows.
    struct LinkSource: Hashable {
        let parentTable: String
        let column: String
        let many: Bool
    }

    let connection: Connection
    private var visited: Set<NestedNode> = []
    /// Each row met, with the key its parents' links hold.
    private var reached: [Reached: DatabaseValue] = [:]
    private var sources: [String: Set<LinkSource>] = [:]

    init(connection: Connection) throws {
        self.connection = connection
        for link in try connection.recordedNestedLinks() { sources[link.childTable, default: []].insert(link.source) }
    }

    /// Deletes what the row of `M` with this key links to, recursively, except the rows that
    /// rows outside this delete still link to (the row itself stays, for the caller).
    func deleteChildren<M: Model>(of type: M.Type, key: [DatabaseValue]) throws {
        guard let root = try reach(M.self, key: key) else { return }
        var kept = Set<Reached>()
        while true {
            let linked = try rowsLinkedFromOutside(excluding: root, kept: kept)
            if linked.isEmpty { break }
            kept.formUnion(linked)
        }
        // A kept row links on to its own children, so they were kept in turn.
        for row in reached.keys where row != root && !kept.contains(row) {
            try connection.execute("DELETE FROM \(quoteIdentifier(row.table)) WHERE rowid = ?", [row.rowid])
        }
    }

    /// Records the row of `M` with this key and, recursively, the rows it links to.
    @discardableResult
    func reach<M: Model>(_ type: M.Type, key: [DatabaseValue]) throws -> Reached? {
        guard visited.insert(NestedNode(type: ObjectIdentifier(M.self), key: key)).inserted else { return nil }
        let schema = try ModelSchema<M>.shared()
        let plan = schema.nested
        let columns = (plan?.links ?? []).map {
            "\(schema.quotedTable).\(quoteIdentifier(schema.columns[$0.column].name))"
        }
        let selected = (["rowid"] + columns).joined(separator: ", ")
        guard
            let row = try connection.fetchRows(
                "SELECT \(selected) FROM \(schema.quotedTable) WHERE \(schema.primaryKeyCondition)",
                StatementArguments(values: key)
            ).first
        else { return nil }
        let me = Reached(table: M.tableName, rowid: try row.get(0, as: Int64.self))
        reached[me] = key.first ?? .null
        for (position, entry) in (plan?.links ?? []).enumerated() {
            sources[entry.link.childTable, default: []].insert(
                LinkSource(
                    parentTable: M.tableName, column: schema.columns[entry.column].name,
                    many: entry.link.shape == .many))
            try entry.link.reachChildren(link: row.values[position + 1], self)
        }
        return me
    }

    /// The rows met (not the root, not kept yet) that a row outside this delete, or a kept
    /// one, links to: one query per table and link into it, whatever the number of children.
    private func rowsLinkedFromOutside(excluding root: Reached, kept: Set<Reached>) throws -> Set<Reached> {
        var byTable: [String: [DatabaseValue: [Reached]]] = [:]
        for (row, key) in reached where row != root && !kept.contains(row) {
            byTable[row.table, default: [:]][key, default: []].append(row)
        }
        var found = Set<Reached>()
        for (table, rowsByKey) in byTable {
            let keys = DatabaseValue.text(try Self.jsonArray(of: Array(rowsByKey.keys)))
            for source in sources[table] ?? [] {
                let parent = quoteIdentifier(source.parentTable), column = quoteIdentifier(source.column)
                // Links are matched against the keys as SQLite reads them from JSON (a blob key
                // cannot be in JSON, nor in a many-link: a one-link to it is compared as is, below).
                let sql =
                    source.many
                    ? "SELECT p.rowid, j.value FROM \(parent) AS p, "
                        + "json_each(CASE WHEN json_valid(p.\(column)) THEN p.\(column) ELSE '[]' END) AS j "
                        + "WHERE j.value IN (SELECT value FROM json_each(?))"
                    : "SELECT rowid, \(column) FROM \(parent) WHERE \(column) IN (SELECT value FROM json_each(?))"
                for link in try connection.fetchRows(sql, [keys]) {
                    let linking = Reached(table: source.parentTable, rowid: try link.get(0, as: Int64.self))
                    guard reached[linking] == nil || kept.contains(linking) else { continue }
                    found.formUnion(rowsByKey[link.values[1]] ?? [])
                }
                for (key, rows) in rowsByKey where !source.many {
                    guard case .blob = key else { continue }
                    for link in try connection.fetchRows("SELECT rowid FROM \(parent) WHERE \(column) = ?", [key]) {
                        let linking = Reached(table: source.parentTable, rowid: try link.get(0, as: Int64.self))
                        if reached[linking] == nil || kept.contains(linking) { found.formUnion(rows) }
                    }
                }
            }
        }
        return found
    }

    /// `keys` as a JSON array (blobs and NULLs left out: JSON cannot hold them).
    private static func jsonArray(of keys: [DatabaseValue]) throws -> String {
        let elements: [Any] = keys.compactMap { key in
            switch key {
            case let .integer(value): return value
            case let .real(value): return value
            case let .text(value): return value
            case .blob, .null: return nil
            }
        }
        return String(decoding: try JSONSerialization.data(withJSONObject: elements), as: UTF8.self)
    }
}

extension Connection {
    /// Records where `M`'s rows link to other models' rows, so that deleting a parent with its
    /// children can tell which children other rows still link to.
    func recordNestedLinks<M: Model>(of type: M.Type) throws {
        let schema = try ModelSchema<M>.shared()
        guard let plan = schema.nested else { return }
        try execute(
            """
            CREATE TABLE IF NOT EXISTS tether_nested_links (parent_table TEXT NOT NULL, column_name TEXT NOT NULL, \
            child_table TEXT NOT NULL, many INTEGER NOT NULL, PRIMARY KEY (parent_table, column_name)) STRICT
            """)
        for entry in plan.links {
            try execute(
                "INSERT OR REPLACE INTO tether_nested_links (parent_table, column_name, child_table, many) "
                    + "VALUES (?, ?, ?, ?)",
                [M.tableName, schema.columns[entry.column].name, entry.link.childTable, entry.link.shape == .many])
        }
    }

    /// The links recorded by `recordNestedLinks`.
    func recordedNestedLinks() throws -> [(childTable: String, source: NestedDelete.LinkSource)] {
        guard try tableExists("tether_nested_links") else {
            return []
        }
        return try fetchRows("SELECT child_table, parent_table, column_name, many FROM tether_nested_links").map {
            (
                try $0.get(0, as: String.self),
                NestedDelete.LinkSource(
                    parentTable: try $0.get(1, as: String.self), column: try $0.get(2, as: String.self),
                    many: try $0.get(3, as: Bool.self))
            )
        }
    }
}
