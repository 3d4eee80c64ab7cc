import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Databases and checks shared by the scope tests: orders by site, their lines, their lines'
/// notes (a chain of two references) and an unscoped table.
enum ScopeFixture {
    static let schema = """
        CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT, total INTEGER);
        CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER, item TEXT);
        CREATE TABLE line_note (id INTEGER PRIMARY KEY, line_id INTEGER, body TEXT);
        CREATE TABLE notice (id INTEGER PRIMARY KEY, body TEXT);
        """
    static let tables = ["orders", "order_line", "line_note", "notice"]

    static func database() throws -> Database {
        try makeDatabase(schema: schema, syncing: tables)
    }

    /// The scope of site `name`: its orders, their lines, the lines' notes.
    static func site(_ name: String) -> SyncScope {
        SyncScope(
            [
                "orders": .filter("site = :peer_name"),
                "order_line": .reference(column: "order_id", parent: "orders"),
                "line_note": .reference(column: "line_id", parent: "order_line"),
            ], parameters: ["peer_name": .text(name)])
    }

    /// What site `name` must hold of each table: the reading rule, written out by hand.
    static func expectedQueries(site name: String) -> [String: String] {
        let site = DatabaseValue.text(name).description
        return [
            "orders": "SELECT * FROM orders WHERE site = \(site) ORDER BY id",
            "order_line":
                "SELECT * FROM order_line WHERE order_id IN (SELECT id FROM orders WHERE site = \(site)) ORDER BY id",
            "line_note": """
            SELECT * FROM line_note WHERE line_id IN (SELECT l.id FROM order_line l JOIN orders o ON o.id = \
            l.order_id WHERE o.site = \(site)) ORDER BY id
            """,
            "notice": "SELECT * FROM notice ORDER BY id",
        ]
    }

    static func rows(_ db: Database, _ sql: String, _ arguments: [DatabaseValue] = []) throws -> [[DatabaseValue]] {
        try db.fetchRows(sql, StatementArguments(values: arguments)).map { Array($0.values) }
    }

    /// Whether `peer` holds exactly what the reading rule gives on `hub` for every table.
    static func expectReadingRule(
        hub: Database, peer: Database, queries: [String: String], context: String = "",
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        for (table, query) in queries.sorted(by: { $0.key < $1.key }) {
            let expected = try rows(hub, query)
            let held = try rows(peer, "SELECT * FROM \(table) ORDER BY id")
            #expect(held == expected, "table \(table) \(context)", sourceLocation: sourceLocation)
        }
    }
}
