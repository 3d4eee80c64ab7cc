import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A hub serving three scoped peers — sites east and west (orders by filter, their lines and the
/// lines' notes through references) and one by total, whose threshold changes — and a regional
/// hub scoped to the orders of north and south, which serves two site nodes scoped to one site
/// each. Thousands of random steps: the hub inserts, moves rows between scopes, deletes and
/// re-inserts keys; every node but the threshold peer writes inside and outside its scope; policies
/// and interests (the rows a node asks for, intersected with its policy) change; each link syncs
/// at random moments, either way. Every run ends with each node holding exactly its upstream's
/// `SELECT * FROM t WHERE <effective scope>` (and so the hub's, through the chain), no refused
/// write present anywhere, every refusal recorded exactly once by its writer, nothing pending.
/// Seeds run one after the other: at once they took both cores for seconds, long enough for the
/// timers of the session tests running beside them to fire.
@Suite(.serialized, .timeLimit(.minutes(5))) struct ScopePropertyTests {
    /// TETHER_SCOPE_SEED=n replays one seed (n,m,… several).
    static let seeds: [UInt64] =
        ProcessInfo.processInfo.environment["TETHER_SCOPE_SEED"].map {
            $0.split(separator: ",").compactMap { UInt64($0) }
        }
        ?? (ProcessInfo.processInfo.environment["TETHER_LONG_TESTS"] == nil ? Array(1...6) : Array(1...150))
    static let steps = 1_500
    /// The fixture's tables, orders with a tag: every write sets a tag of its own, so that a row as
    /// one write left it is told apart from any other (a refused write's values exist nowhere).
    static let schema = """
        CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT, total INTEGER, tag TEXT);
        CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER, item TEXT);
        CREATE TABLE line_note (id INTEGER PRIMARY KEY, line_id INTEGER, body TEXT);
        CREATE TABLE notice (id INTEGER PRIMARY KEY, body TEXT);
        """
    /// No writer's scope ever holds it: a write moving a row there is outside, whenever it is sent.
    static let nowhere = "central"

    /// For each writing site, another that its scope never holds (east widens to west only).
    static let neverHeld = ["north": "south", "south": "north", "east": "north", "west": "east"]

    /// One node below the hub: its upstream, the scope the upstream applies to it (its policy, with
    /// its interest), and the same scope as conditions over the upstream's tables.
    struct Node {
        let name: String
        let db: Database
        /// Index of the node it syncs with (nil: the hub).
        let upstream: Int?
        var policy: SyncScope
        /// The policy's condition on orders, with literals.
        var policyOrders: String
        /// Whether line notes are scoped (through lines) or whole.
        let notesByReference: Bool
        var interest: [String: SyncScope.Rule] = [:]
        var interestOrders: String?
        var interestNotice: String?
        /// The sites whose orders it writes (empty: it writes nothing).
        let writesSites: [String]
        /// Its refusals as the receiver reported them.
        var refused: [RefusedChange] = []

        var effective: SyncScope { policy.intersected(with: interest) }
        var ordersConditions: [String] { [policyOrders] + (interestOrders.map { [$0] } ?? []) }
    }

    /// The reading rule of a chain of nodes (a node, then its upstreams below the hub), as queries
    /// on the database at the top of the chain.
    static func queries(_ chain: [Node]) -> [String: String] {
        let orders =
            "SELECT id FROM orders WHERE "
            + chain.flatMap(\.ordersConditions).map { "(\($0))" }.joined(separator: " AND ")
        let lines = "SELECT id FROM order_line WHERE order_id IN (\(orders))"
        let notices = chain.compactMap(\.interestNotice)
        return [
            "orders": "SELECT * FROM orders WHERE id IN (\(orders)) ORDER BY id",
            "order_line": "SELECT * FROM order_line WHERE id IN (\(lines)) ORDER BY id",
            "line_note": chain.contains { $0.notesByReference }
                ? "SELECT * FROM line_note WHERE line_id IN (\(lines)) ORDER BY id"
                : "SELECT * FROM line_note ORDER BY id",
            "notice": """
            SELECT * FROM notice\
            \(notices.isEmpty ? "" : " WHERE " + notices.map { "(\($0))" }.joined(separator: " AND ")) ORDER \
            BY id
            """,
        ]
    }

    static func site(_ name: String, widenedTo other: String? = nil) -> (SyncScope, String) {
        var scope = ScopeFixture.site(name)
        guard let other else { return (scope, "site = '\(name)'") }
        scope.tables["orders"] = .filter("site IN (:peer_name, '\(other)')")
        return (scope, "site IN ('\(name)', '\(other)')")
    }

    static func threshold(_ minimum: Int) -> (SyncScope, String) {
        (
            SyncScope(
                [
                    "orders": .filter("total >= :minimum"),
                    "order_line": .reference(column: "order_id", parent: "orders"),
                ],
                parameters: ["minimum": .integer(Int64(minimum))]), "total >= \(minimum)"
        )
    }

    static func region(_ sites: [String]) -> (SyncScope, String) {
        let list = sites.map { "'\($0)'" }.joined(separator: ", ")
        return (
            SyncScope([
                "orders": .filter("site IN (\(list))"), "order_line": .reference(column: "order_id", parent: "orders"),
                "line_note": .reference(column: "line_id", parent: "order_line"),
            ]), "site IN (\(list))"
        )
    }

    static func node(
        _ name: String, upstream: Int?, _ scope: (SyncScope, String), notesByReference: Bool = true, writes: [String]
    ) throws -> Node {
        Node(
            name: name, db: try makeDatabase(schema: schema, syncing: ScopeFixture.tables), upstream: upstream,
            policy: scope.0,
            policyOrders: scope.1, notesByReference: notesByReference, writesSites: writes)
    }

    @Test(arguments: seeds)
    func everyNodeConvergesToItsScopeOfItsUpstream(seed: UInt64) throws {
        var random = SeededGenerator(seed: seed)
        let hub = try makeDatabase(schema: Self.schema, syncing: ScopeFixture.tables)
        var nodes = [
            try Self.node("east", upstream: nil, Self.site("east"), writes: ["east"]),
            try Self.node("west", upstream: nil, Self.site("west"), writes: ["west"]),
            try Self.node("threshold", upstream: nil, Self.threshold(50), notesByReference: false, writes: []),
            try Self.node("region", upstream: nil, Self.region(["north", "south"]), writes: ["north", "south"]),
            try Self.node("north", upstream: 3, Self.site("north"), writes: ["north"]),
            try Self.node("south", upstream: 3, Self.site("south"), writes: ["south"]),
        ]
        let hubSites = ["north", "south", "east", "west", Self.nowhere]
        func upstream(of index: Int) -> Database { nodes[index].upstream.map { nodes[$0].db } ?? hub }
        func chain(from index: Int) -> [Node] {
            var chain = [nodes[index]]
            while let up = chain[chain.count - 1].upstream { chain.append(nodes[up]) }
            return chain
        }
        var nextID: Int64 = 1
        func newID() -> Int64 { nextID += 1; return nextID }
        func newTag(_ prefix: String) -> String { "\(prefix)\(newID())" }
        func anyID(_ table: String, on db: Database) throws -> Int64? {
            // Chosen by the seeded generator (SQLite's random() would make a run impossible to replay).
            let ids = try db.fetchRows("SELECT id FROM \(table) ORDER BY id").map { try $0.get(0, as: Int64.self) }
            return ids.randomElement(using: &random)
        }
        func total() -> Int { Int.random(in: 0..<100, using: &random) }
        // The rows refused writes sent (by table, the whole row): none may exist anywhere at the end.
        var refusedRows: [(table: String, row: [DatabaseValue])] = []
        // Sends node `index`'s writes up, checked against its policy (not its interest), as a session does.
        func sendWrites(_ index: Int) throws {
            let writer = nodes[index].db
            var before: [String: [DatabaseValue: [DatabaseValue]]] = [:]
            for table in ["orders", "order_line"] {
                for row in try ScopeFixture.rows(writer, "SELECT * FROM \(table)") {
                    before[table, default: [:]][row[0]] = row
                }
            }
            let refused = try sendScopedWrites(
                from: writer, to: upstream(of: index), scope: nodes[index].policy,
                limits: BatchLimits(maximumChanges: Int.random(in: 5...60, using: &random)))
            nodes[index].refused += refused
            for refusal in refused {
                if let key = refusal.key.first, let row = before[refusal.table]?[key] {
                    refusedRows.append((refusal.table, row))
                }
            }
        }
        func sendChanges(_ index: Int) throws {
            try sendScopedChanges(
                from: upstream(of: index), to: nodes[index].db, scope: nodes[index].effective,
                limits: BatchLimits(maximumChanges: Int.random(in: 5...60, using: &random)))
        }
        var deleted: [Int64] = []
        for step in 0..<Self.steps {
            switch Int.random(in: 0..<100, using: &random) {
            case 0..<14:
                let id = deleted.popLast() ?? newID()
                try hub.execute(
                    "INSERT INTO orders VALUES (?, ?, ?, ?)",
                    [id, hubSites.randomElement(using: &random), total(), newTag("h")])
            case 14..<24:
                if let id = try anyID("orders", on: hub) {
                    try hub.execute(
                        "UPDATE orders SET site = ?, tag = ? WHERE id = ?",
                        [hubSites.randomElement(using: &random), newTag("h"), id])
                }
            case 24..<30:
                if let id = try anyID("orders", on: hub) {
                    try hub.execute("UPDATE orders SET total = ?, tag = ? WHERE id = ?", [total(), newTag("h"), id])
                }
            case 30..<34:
                if let id = try anyID("orders", on: hub) {
                    try hub.execute("DELETE FROM orders WHERE id = ?", [id]); deleted.append(id)
                }
            case 34..<42:
                let order = try anyID("orders", on: hub) ?? 0
                try hub.execute("INSERT INTO order_line VALUES (?, ?, ?)", [newID(), order, newTag("h")])
            case 42..<45:
                if let id = try anyID("order_line", on: hub), let order = try anyID("orders", on: hub) {
                    try hub.execute(
                        "UPDATE order_line SET order_id = ?, item = ? WHERE id = ?", [order, newTag("h"), id])
                }
            case 45..<47:
                if let id = try anyID("order_line", on: hub) {
                    try hub.execute("DELETE FROM order_line WHERE id = ?", [id])
                }
            case 47..<51:
                if let line = try anyID("order_line", on: hub) {
                    try hub.execute("INSERT INTO line_note VALUES (?, ?, ?)", [newID(), line, "note"])
                }
            case 51..<53:
                try hub.execute("INSERT INTO notice VALUES (?, ?)", [newID(), "notice \(step)"])
            case 53..<70:
                // A node writes: mostly inside its scope, sometimes outside (tagged x: never accepted).
                let writers = nodes.indices.filter { !nodes[$0].writesSites.isEmpty }
                guard let index = writers.randomElement(using: &random) else { break }
                let db = nodes[index].db
                let sites = nodes[index].writesSites
                switch Int.random(in: 0..<20, using: &random) {
                case 0..<6:
                    try db.execute(
                        "INSERT INTO orders VALUES (?, ?, ?, ?)",
                        [newID(), sites.randomElement(using: &random), total(), newTag("w")])
                case 6..<10:
                    if let id = try anyID("orders", on: db) {
                        try db.execute("UPDATE orders SET total = ?, tag = ? WHERE id = ?", [total(), newTag("w"), id])
                    }
                case 10..<12:
                    // A move between the regional hub's sites (inside), or a site's move to a site it never holds.
                    if let id = try anyID("orders", on: db) {
                        let inside = sites.count > 1
                        let site = inside ? sites.randomElement(using: &random) : Self.neverHeld[sites[0]]
                        try db.execute(
                            "UPDATE orders SET site = ?, tag = ? WHERE id = ?", [site, newTag(inside ? "w" : "x"), id])
                    }
                case 12..<13:
                    try db.execute(
                        "INSERT INTO orders VALUES (?, ?, ?, ?)", [newID(), Self.nowhere, total(), newTag("x")])
                case 13..<14:
                    if let id = try anyID("orders", on: db) {
                        try db.execute(
                            "UPDATE orders SET site = ?, tag = ? WHERE id = ?", [Self.nowhere, newTag("x"), id])
                    }
                case 14..<17:
                    if let order = try anyID("orders", on: db) {
                        try db.execute("INSERT INTO order_line VALUES (?, ?, ?)", [newID(), order, newTag("w")])
                    }
                case 17..<19:
                    if let id = try anyID("order_line", on: db), let order = try anyID("orders", on: db) {
                        try db.execute(
                            "UPDATE order_line SET order_id = ?, item = ? WHERE id = ?", [order, newTag("w"), id])
                    }
                default:
                    if let id = try anyID("orders", on: db) { try db.execute("DELETE FROM orders WHERE id = ?", [id]) }
                }
            case 70..<73:
                // Policy edits: the threshold moves; east widens to west and back; the region takes east in and back.
                let minimum = total()
                (nodes[2].policy, nodes[2].policyOrders) = Self.threshold(minimum)
                switch Int.random(in: 0..<3, using: &random) {
                case 0:
                    (nodes[0].policy, nodes[0].policyOrders) = Self.site(
                        "east", widenedTo: nodes[0].policyOrders.contains("west") ? nil : "west")
                case 1:
                    (nodes[3].policy, nodes[3].policyOrders) = Self.region(
                        nodes[3].policyOrders.contains("east") ? ["north", "south"] : ["north", "south", "east"])
                default: break
                }
            case 73..<77:
                // Interest edits: a node asks for orders by total, for half the notices, or for all it may hold.
                let index = Int.random(in: 0..<nodes.count, using: &random)
                let minimum = total()
                switch Int.random(in: 0..<4, using: &random) {
                case 0:
                    nodes[index].interest["orders"] = .filter("total >= \(minimum)")
                    nodes[index].interestOrders = "total >= \(minimum)"
                case 1:
                    nodes[index].interest["orders"] = .filter("total < \(minimum)")
                    nodes[index].interestOrders = "total < \(minimum)"
                case 2:
                    nodes[index].interest["notice"] = .filter("id % 2 = 0")
                    nodes[index].interestNotice = "id % 2 = 0"
                default:
                    nodes[index].interest = [:]
                    (nodes[index].interestOrders, nodes[index].interestNotice) = (nil, nil)
                }
            default:
                // A sync of one link: writes up, changes down, or both.
                let index = Int.random(in: 0..<nodes.count, using: &random)
                let way = Int.random(in: 0..<4, using: &random)
                switch way {
                case 0: try sendWrites(index)
                case 1: try sendChanges(index)
                default:
                    try sendWrites(index)
                    try sendChanges(index)
                }
            }
        }
        // Writes go up level by level, then changes down level by level.
        for index in nodes.indices where nodes[index].upstream != nil { try sendWrites(index) }
        for index in nodes.indices where nodes[index].upstream == nil { try sendWrites(index) }
        for index in nodes.indices where nodes[index].upstream == nil { try sendChanges(index) }
        for index in nodes.indices where nodes[index].upstream != nil { try sendChanges(index) }

        let context = "seed \(seed) (TETHER_SCOPE_SEED=\(seed) replays it)"
        for (index, node) in nodes.enumerated() {
            // The reading rule on its upstream, and on the hub through the chain.
            try ScopeFixture.expectReadingRule(
                hub: upstream(of: index), peer: node.db, queries: Self.queries([node]),
                context: "\(context), \(node.name)")
            try ScopeFixture.expectReadingRule(
                hub: hub, peer: node.db, queries: Self.queries(chain(from: index)),
                context: "\(context), \(node.name) on the hub")
            #expect(try node.db.pendingChangeCount() == 0, "\(context), \(node.name)")
            // The latest refusal of each row the receiver reported is recorded by the writer (in place of
            // the earlier ones of that row, so that what is kept stays bounded), and nothing else is.
            func described(_ refusals: [RefusedChange]) -> [String] {
                var latest: [String: RefusedChange] = [:]
                for refusal in refusals { latest["\(refusal.table) \(refusal.key)"] = refusal }
                return latest.values.map { "\($0.table) \($0.key) \($0.sequence)" }.sorted()
            }
            #expect(described(try node.db.refusedChanges()) == described(node.refused), "\(context), \(node.name)")
            // Nothing is left to send either way.
            #expect(
                try sendScopedWrites(from: node.db, to: upstream(of: index), scope: node.policy).isEmpty,
                "\(context), \(node.name)")
            #expect(
                try sendScopedChanges(from: upstream(of: index), to: node.db, scope: node.effective).allChanges.isEmpty,
                "\(context), \(node.name)")
        }
        // No refused write is present anywhere: no row as a refused change sent it, no write made outside.
        for db in [hub] + nodes.map(\.db) {
            for (table, row) in refusedRows {
                #expect(
                    try ScopeFixture.rows(db, "SELECT * FROM \(table) WHERE id = ?", [row[0]]) != [row],
                    "\(context): refused \(table) \(row)")
            }
            #expect(try ScopeFixture.rows(db, "SELECT id FROM orders WHERE tag LIKE 'x%'").isEmpty, "\(context)")
        }
        #expect(nodes.reduce(0) { $0 + $1.refused.count } > 0, "\(context): the run refused nothing")
    }
}
