import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A scoped site the hub forgot (not seen within the horizon of garbage collection) comes back:
/// it takes the hub's resync of its scope before the hub takes its writes, and ends holding what
/// its scope gives on the hub — no row the hub deleted, its own new rows kept and sent.
@Suite struct ForgottenSiteTests {
    @Test func aForgottenSiteReturnsToWhatItsScopeHoldsOnTheHub() throws {
        let hub = try ScopeFixture.database(), site = try ScopeFixture.database(), other = try ScopeFixture.database()
        let scope = ScopeFixture.site("x")
        try hub.write { conn in
            for id in 1...4 {
                try conn.execute("INSERT INTO orders (id, site, total) VALUES (?, 'x', ?)", [id, id * 10])
                try conn.execute(
                    "INSERT INTO order_line (id, order_id, item) VALUES (?, ?, ?)", [id, id, "item \(id)"])
            }
        }
        try sendChanges(from: hub, to: other)
        try sendChanges(from: other, to: hub)
        try sendScopedChanges(from: hub, to: site, scope: scope)
        try sendScopedWrites(from: site, to: hub, scope: scope)
        #expect(
            try ScopeFixture.rows(site, "SELECT id FROM orders ORDER BY id")
                == [[1], [2], [3], [4]].map { $0.map { .integer($0) } })

        // The site is away: it edits an order and makes one.
        try site.execute("UPDATE orders SET total = 99 WHERE id = 2")
        try site.write { conn in
            try conn.execute("INSERT INTO orders (id, site, total) VALUES (10, 'x', 100)")
            try conn.execute("INSERT INTO order_line (id, order_id, item) VALUES (10, 10, 'item 10')")
        }
        // The hub deletes two of its orders, moves one to another site, forgets the site, collects.
        try hub.execute("DELETE FROM order_line WHERE order_id IN (2, 3)")
        try hub.execute("DELETE FROM orders WHERE id IN (2, 3)")
        try hub.execute("UPDATE orders SET site = 'y' WHERE id = 4")
        try sendChanges(from: hub, to: other)
        try hub.execute("UPDATE tether_peers SET last_seen = 0 WHERE instance_key = ?", [Data(site.instanceKey.bytes)])
        let collected = try hub.collectGarbage(Database.GarbageCollectionOptions(forgetPeersUnseenFor: .seconds(3_600)))
        #expect(collected.peersForgotten == [site.instanceKey])
        #expect(collected.tombstonesRemoved == 4)
        try other.collectGarbage()

        // Its writes wait for the resync: taken now, the edit would bring order 2 back.
        #expect(throws: SyncError.self) { try sendScopedWrites(from: site, to: hub, scope: scope) }
        #expect(try hub.fetchValue("SELECT count(*) FROM orders WHERE id = 2", as: Int.self) == 0)

        try sendScopedChanges(from: hub, to: site, scope: scope)
        try sendScopedWrites(from: site, to: hub, scope: scope)
        try sendScopedChanges(from: hub, to: site, scope: scope)
        try sendChanges(from: hub, to: other)
        try sendChanges(from: other, to: hub)

        let orders = [[1, 10], [4, 40], [10, 100]].map { $0.map { DatabaseValue.integer(Int64($0)) } }
        #expect(try ScopeFixture.rows(hub, "SELECT id, total FROM orders ORDER BY id") == orders)
        #expect(
            try ScopeFixture.rows(other, "SELECT * FROM orders ORDER BY id")
                == ScopeFixture.rows(hub, "SELECT * FROM orders ORDER BY id"))
        #expect(
            try ScopeFixture.rows(other, "SELECT * FROM order_line ORDER BY id")
                == ScopeFixture.rows(hub, "SELECT * FROM order_line ORDER BY id"))
        try ScopeFixture.expectReadingRule(
            hub: hub, peer: site, queries: ScopeFixture.expectedQueries(site: "x"), context: "on the returning site")
        #expect(try hub.peers().allSatisfy { $0.forgotten == nil })
    }
}
