import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A hub and three scoped peers — two by site (orders by filter, their lines and the lines' notes
/// through references), one by a parameterised total whose threshold changes — edited at random
/// (inserts, updates moving rows between scopes, deletes, re-inserts of deleted keys, lines moved
/// between orders, peers writing inside their scope, scope edits) and synced at random moments.
/// Every run ends with each peer holding exactly the hub's `SELECT * FROM t WHERE scope`.
@Suite(.timeLimit(.minutes(5))) struct ScopePropertyTests {
    typealias F = ScopeFixture

    static let seeds: [UInt64] = ProcessInfo.processInfo.environment["TETHER_LONG_TESTS"] == nil ? Array(1...6) : Array(1...150)
    static let sites = ["north", "south", "east"]

    struct Peer {
        let db: Database
        var scope: SyncScope
        var queries: [String: String]
        /// The site whose orders the peer may write (nil: it writes nothing).
        var writesSite: String?
    }

    static func thresholdScope(_ minimum: Int) -> SyncScope {
        SyncScope(["orders": .filter("total >= :minimum"), "order_line": .reference(column: "order_id", parent: "orders")],
                  parameters: ["minimum": .integer(Int64(minimum))])
    }

    static func thresholdQueries(_ minimum: Int) -> [String: String] {
        ["orders": "SELECT * FROM orders WHERE total >= \(minimum) ORDER BY id",
         "order_line": "SELECT * FROM order_line WHERE order_id IN (SELECT id FROM orders WHERE total >= \(minimum)) ORDER BY id",
         "line_note": "SELECT * FROM line_note ORDER BY id", "notice": "SELECT * FROM notice ORDER BY id"]
    }

    @Test(arguments: seeds)
    func everyPeerConvergesToItsScopeOfTheHub(seed: UInt64) throws {
        var random = SeededGenerator(seed: seed)
        let hub = try F.database()
        var peers = [
            Peer(db: try F.database(), scope: F.site("north"), queries: F.expectedQueries(site: "north"), writesSite: "north"),
            Peer(db: try F.database(), scope: F.site("south"), queries: F.expectedQueries(site: "south"), writesSite: "south"),
            Peer(db: try F.database(), scope: Self.thresholdScope(50), queries: Self.thresholdQueries(50), writesSite: nil),
        ]
        var nextID: Int64 = 1
        func randomSite() -> String { Self.sites.randomElement(using: &random) ?? "north" }
        func anyID(_ table: String, on db: Database = hub) throws -> Int64? {
            try db.fetchValue("SELECT id FROM \(table) ORDER BY random() LIMIT 1", as: Int64.self)
        }
        // Keys deleted on the hub, to insert again.
        var deleted: [Int64] = []
        for step in 0..<160 {
            switch Int.random(in: 0..<100, using: &random) {
            case 0..<18:
                let id = deleted.popLast() ?? { nextID += 1; return nextID }()
                try hub.execute("INSERT INTO orders VALUES (?, ?, ?)", [id, randomSite(), Int.random(in: 0..<100, using: &random)])
            case 18..<30:
                if let id = try anyID("orders") { try hub.execute("UPDATE orders SET site = ? WHERE id = ?", [randomSite(), id]) }
            case 30..<40:
                if let id = try anyID("orders") { try hub.execute("UPDATE orders SET total = ? WHERE id = ?", [Int.random(in: 0..<100, using: &random), id]) }
            case 40..<46:
                if let id = try anyID("orders") { try hub.execute("DELETE FROM orders WHERE id = ?", [id]); deleted.append(id) }
            case 46..<58:
                nextID += 1
                let order = try anyID("orders") ?? 0
                try hub.execute("INSERT INTO order_line VALUES (?, ?, ?)", [nextID + 10_000, order, "item \(step)"])
            case 58..<64:
                if let id = try anyID("order_line"), let order = try anyID("orders") {
                    try hub.execute("UPDATE order_line SET order_id = ? WHERE id = ?", [order, id])
                }
            case 64..<68:
                if let id = try anyID("order_line") { try hub.execute("DELETE FROM order_line WHERE id = ?", [id]) }
            case 68..<74:
                nextID += 1
                if let line = try anyID("order_line") { try hub.execute("INSERT INTO line_note VALUES (?, ?, ?)", [nextID + 20_000, line, "note"]) }
            case 74..<77:
                nextID += 1
                try hub.execute("INSERT INTO notice VALUES (?, ?)", [nextID, "notice \(step)"])
            case 77..<84:
                // A peer writes inside its scope: a new order of its site, or a new total of one it holds.
                let index = Int.random(in: 0..<2, using: &random)
                guard let site = peers[index].writesSite else { break }
                if Bool.random(using: &random) {
                    nextID += 1
                    try peers[index].db.execute("INSERT INTO orders VALUES (?, ?, ?)", [nextID, site, Int.random(in: 0..<100, using: &random)])
                } else if let id = try anyID("orders", on: peers[index].db) {
                    try peers[index].db.execute("UPDATE orders SET total = ? WHERE id = ?", [Int.random(in: 0..<100, using: &random), id])
                }
            case 84..<88:
                // Scope edits: the threshold moves; a site peer widens to east for a while, or back.
                let minimum = Int.random(in: 0..<100, using: &random)
                peers[2].scope = Self.thresholdScope(minimum)
                peers[2].queries = Self.thresholdQueries(minimum)
                if Bool.random(using: &random) {
                    let wide = peers[0].scope.tables["orders"] == .filter("site = :peer_name")
                    peers[0].scope.tables["orders"] = .filter(wide ? "site IN (:peer_name, 'east')" : "site = :peer_name")
                    var queries = F.expectedQueries(site: "north")
                    if wide {
                        queries["orders"] = "SELECT * FROM orders WHERE site IN ('north', 'east') ORDER BY id"
                        queries["order_line"] = "SELECT * FROM order_line WHERE order_id IN (SELECT id FROM orders WHERE site IN ('north', 'east')) ORDER BY id"
                        queries["line_note"] = "SELECT * FROM line_note WHERE line_id IN (SELECT l.id FROM order_line l JOIN orders o ON o.id = l.order_id WHERE o.site IN ('north', 'east')) ORDER BY id"
                    }
                    peers[0].queries = queries
                }
            default:
                // A sync of one peer, both ways.
                let peer = peers[Int.random(in: 0..<peers.count, using: &random)]
                try sendChanges(from: peer.db, to: hub)
                try sendScopedChanges(from: hub, to: peer.db, scope: peer.scope,
                                      limits: BatchLimits(maximumChanges: Int.random(in: 1...40, using: &random)))
            }
        }
        // Peers send what they wrote, then each gets its scope of the hub.
        for peer in peers { try sendChanges(from: peer.db, to: hub) }
        for peer in peers {
            try sendScopedChanges(from: hub, to: peer.db, scope: peer.scope, limits: BatchLimits(maximumChanges: 25))
            try F.expectReadingRule(hub: hub, peer: peer.db, queries: peer.queries)
            // Nothing is left to send: a further exchange carries no change.
            let again = try sendScopedChanges(from: hub, to: peer.db, scope: peer.scope)
            #expect(again.allChanges.isEmpty, "seed \(seed)")
        }
    }
}
