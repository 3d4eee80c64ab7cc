import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// The records partial replication keeps of a table (what each peer holds of it and the scope it
/// was sent under, the rows evicted here, the changes of it peers refused) go with its sync.
@Suite(.timeLimit(.minutes(1))) struct ScopeRecordsTests {
    typealias F = ScopeFixture

    /// How many records of `table` each of the scope's tables holds.
    func records(of table: String, in db: Database) throws -> [String: Int] {
        var counts: [String: Int] = [:]
        for store in [
            "tether_scope_members", "tether_scope_rules", "tether_evictions", "tether_refusals",
            "tether_partial_tables",
        ] {
            counts[store] = try db.fetchValue(
                "SELECT count(*) FROM \(store) WHERE table_name = ?", [table], as: Int.self)
        }
        return counts
    }

    @Test func disablingSyncOfATableForgetsItsScopeRecordsAndOnlyItsOwn() throws {
        let hub = try F.database()
        // North is a scoped peer of the hub and serves a kiosk scoped in turn.
        let north = try F.database()
        let kiosk = try F.database()
        try hub.execute(
            """
            INSERT INTO orders VALUES (1, 'north', 10), (2, 'south', 20), (3, 'north', 30);
            INSERT INTO order_line VALUES (11, 1, 'bolt'), (13, 3, 'gear');
            """)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try sendScopedChanges(from: north, to: kiosk, scope: F.site("north"))
        // Order 1 and its line leave north (evictions there); north's write of a south order is refused.
        try hub.execute("UPDATE orders SET site = 'south' WHERE id = 1")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try north.execute("INSERT INTO orders VALUES (5, 'south', 50)")
        #expect(try sendScopedWrites(from: north, to: hub, scope: F.site("north")).map(\.key) == [[.integer(5)]])
        try sendScopedChanges(from: north, to: kiosk, scope: F.site("north"))
        // The hub sends north only part of both tables (as a session records it from the hub's SCOPE).
        try north.recordPartialTables(["orders", "order_line"], from: hub.instanceKey)

        let before = try records(of: "orders", in: north)
        #expect(before.values.allSatisfy { $0 > 0 }, "every kind of record of orders exists before: \(before)")
        let lines = try records(of: "order_line", in: north)
        #expect(
            lines["tether_scope_members"] ?? 0 > 0 && lines["tether_scope_rules"] ?? 0 > 0
                && lines["tether_evictions"] ?? 0 > 0
                && lines["tether_partial_tables"] == 1)

        try north.disableSync(table: "orders")
        #expect(try records(of: "orders", in: north).values.allSatisfy { $0 == 0 })
        #expect(try records(of: "order_line", in: north) == lines)
        #expect(try north.refusedChanges().isEmpty)
    }
}
