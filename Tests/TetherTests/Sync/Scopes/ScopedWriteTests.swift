import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A scoped peer writes only inside its scope: the receiver checks each change before and after,
/// refuses the others (the rest of the batch applies), and the writer records the refusals and
/// gets the receiver's row back at its next pull.
@Suite(.timeLimit(.minutes(1))) struct ScopedWriteTests {
    typealias F = ScopeFixture

    func sendWrites(from writer: Database, to hub: Database, scope: SyncScope) throws -> [RefusedChange] {
        try sendScopedWrites(from: writer, to: hub, scope: scope)
    }

    func seeded() throws -> (hub: Database, north: Database) {
        let hub = try F.database()
        let north = try F.database()
        try hub.execute(
            """
            INSERT INTO orders VALUES (1, 'north', 10), (2, 'south', 20), (3, 'north', 30);
            INSERT INTO order_line VALUES (11, 1, 'bolt'), (12, 2, 'nut');
            """)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        return (hub, north)
    }

    @Test func writesInsideTheScopeApplyAndOthersAreRefusedWithTheirReasons() throws {
        let (hub, north) = try seeded()
        try north.execute(
            """
            INSERT INTO orders VALUES (4, 'north', 40);
            INSERT INTO orders VALUES (5, 'south', 50);
            UPDATE orders SET site = 'south' WHERE id = 3;
            UPDATE orders SET total = 11 WHERE id = 1;
            """)
        let refused = try sendWrites(from: north, to: hub, scope: F.site("north"))
        #expect(Set(refused.map { $0.key }) == [[.integer(5)], [.integer(3)]])
        #expect(refused.allSatisfy { $0.table == "orders" && $0.sequence > 0 && !$0.reason.isEmpty })
        #expect(
            refused.first { $0.key == [.integer(5)] }?.reason.hasPrefix(
                "the row as written is outside the writer's scope")
                == true)
        // Nothing of a refused change was written on the hub; the rest was.
        #expect(
            try F.rows(hub, "SELECT * FROM orders ORDER BY id") == [
                [.integer(1), .text("north"), .integer(11)], [.integer(2), .text("south"), .integer(20)],
                [.integer(3), .text("north"), .integer(30)], [.integer(4), .text("north"), .integer(40)],
            ])
        // The writer lists them, dropped its versions, and gets the hub's back at its next pull.
        #expect(Set(try north.refusedChanges().map(\.key)) == [[.integer(5)], [.integer(3)]])
        #expect(try north.refusedChanges().allSatisfy { $0.refusedBy == hub.instanceKey })
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
        // Nothing is retried: a further exchange both ways carries nothing.
        #expect(try sendWrites(from: north, to: hub, scope: F.site("north")).isEmpty)
        #expect(try north.pendingChangeCount() == 0)
    }

    @Test func deletesMustBeOfRowsInsideTheScopeAndDependentsOfARefusedChangeAreRefusedToo() throws {
        let (hub, north) = try seeded()
        // Order 2 is south's: north cannot even see it, but a forged delete of it is refused.
        try north.execute("INSERT INTO orders VALUES (2, 'south', 20)")
        try north.execute("DELETE FROM orders WHERE id = 2")
        try north.execute("DELETE FROM orders WHERE id = 1")
        // A south order and its line: the line references an order outside the scope.
        try north.execute("INSERT INTO orders VALUES (7, 'south', 70); INSERT INTO order_line VALUES (17, 7, 'cog')")
        let refused = try sendWrites(from: north, to: hub, scope: F.site("north"))
        #expect(Set(refused.map { "\($0.table) \($0.key)" }) == ["orders [2]", "orders [7]", "order_line [17]"])
        #expect(try F.rows(hub, "SELECT id FROM orders ORDER BY id") == [[.integer(2)], [.integer(3)]])
        #expect(try F.rows(hub, "SELECT id FROM order_line ORDER BY id") == [[.integer(11)], [.integer(12)]])
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    /// A row the writer opened and closed between two of its syncs reaches the hub as a delete of a
    /// row the hub never held: taken with nothing to write (no refusal for the writer to record, and
    /// no tombstone on the hub that would pass for a delete of a row it never had).
    @Test func aDeleteOfARowTheHubNeverHeldIsTakenWithNothingWritten() throws {
        let (hub, north) = try seeded()
        try north.execute("INSERT INTO orders VALUES (6, 'north', 60)")
        try north.execute("DELETE FROM orders WHERE id = 6")
        let refused = try sendWrites(from: north, to: hub, scope: F.site("north"))
        #expect(refused.isEmpty)
        #expect(try north.refusedChanges().isEmpty)
        #expect(try F.rows(hub, "SELECT id FROM orders ORDER BY id") == [[.integer(1)], [.integer(2)], [.integer(3)]])
        // Nothing about order 6 goes on from the hub: an unscoped peer pulling everything gets no change of it.
        let other = try F.database()
        let sent = try sendChanges(from: hub, to: other).flatMap(\.delivered.changes)
        #expect(!sent.isEmpty)
        #expect(!sent.contains { $0.key == [.integer(6)] })
    }

    /// A child written before its parent in one transaction (numbered first, as the capture
    /// numbers writes) is judged with the batch it came in: the order makes its line and the
    /// line's note inside the writer's scope. A line of another site's order stays refused.
    @Test func aChildNumberedBeforeItsParentIsJudgedWithItsBatch() throws {
        let (hub, north) = try seeded()
        try north.write { conn in
            try conn.execute("INSERT INTO line_note VALUES (21, 18, 'fragile')")
            try conn.execute("INSERT INTO order_line VALUES (18, 8, 'gear')")
            try conn.execute("INSERT INTO orders VALUES (8, 'north', 80)")
            try conn.execute("INSERT INTO order_line VALUES (19, 9, 'cog')")
            try conn.execute("INSERT INTO orders VALUES (9, 'south', 90)")
        }
        let refused = try sendWrites(from: north, to: hub, scope: F.site("north"))
        #expect(Set(refused.map { "\($0.table) \($0.key)" }) == ["orders [9]", "order_line [19]"])
        #expect(try F.rows(hub, "SELECT id FROM orders WHERE id >= 8") == [[.integer(8)]])
        #expect(try F.rows(hub, "SELECT id FROM order_line WHERE id >= 18") == [[.integer(18)]])
        #expect(try F.rows(hub, "SELECT id FROM line_note") == [[.integer(21)]])
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    /// A catch-up cut into several batches is judged as one: a line whose order the capture numbered
    /// after it, so that the order comes in a later batch of the same catch-up, is inside the
    /// writer's scope once the catch-up is written (issue 37). A line of another site's order stays
    /// refused, with its order, each with its reason.
    @Test func aChildWhoseParentComesInALaterBatchOfTheCatchUpIsJudgedWithTheCatchUp() throws {
        let (hub, north) = try seeded()
        try north.write { conn in
            try conn.execute("INSERT INTO order_line VALUES (18, 8, 'gear'), (19, 9, 'cog')")
            try conn.execute("INSERT INTO orders VALUES (8, 'north', 80), (9, 'south', 90)")
        }
        // Batches of two changes: the lines in the first, their orders in the second (the last).
        var steps: [String] = []
        var report: ApplyReport?
        while report == nil, steps.count < 5 {
            let after =
                try hub.stagedCatchUp(from: north.instanceKey)?.through ?? hub.cursor(for: north.instanceKey).after
            let batch = try BatchCoding.decode(
                BatchCoding.encode(
                    north.extractChanges(for: hub.instanceKey, after: after, limits: BatchLimits(maximumChanges: 2))))
            switch try hub.receive(batch, scope: F.site("north")) {
            case let .staged(staged): steps.append("staged \(staged.changes)")
            case let .applied(applied):
                steps.append("applied \(applied.applied)")
                report = applied
            }
        }
        #expect(steps == ["staged 2", "applied 2"])
        let refused = try #require(report).refused
        // Each reason says why, then names the source transaction and what of it its batch refused.
        let why = refused.map { "\($0.table) \($0.key): \($0.reason.prefix { $0 != "[" })" }.sorted()
        #expect(
            why == [
                "order_line [19]: the row as written is outside the writer's scope ",
                "orders [9]: the row as written is outside the writer's scope ",
            ])
        let transaction = try #require(refused.first?.sourceTransaction)
        #expect(transaction.origin == north.instanceKey && refused.allSatisfy { $0.sourceTransaction == transaction })
        #expect(
            refused.allSatisfy {
                $0.reason.hasSuffix(
                    "[transaction \(transaction): 1 of its 2 changes in the batch refused, the others accepted]")
            }, "\(refused)")
        #expect(try F.rows(hub, "SELECT id FROM orders WHERE id >= 8") == [[.integer(8)]])
        #expect(try F.rows(hub, "SELECT id FROM order_line WHERE id >= 18") == [[.integer(18)]])
        // The writer drops what was refused, keeps the line that was not, and holds the reading rule.
        try north.acknowledge(peer: hub.instanceKey, through: try #require(report).cursor)
        try north.recordRefusals(refused, by: hub.instanceKey)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        #expect(try F.rows(north, "SELECT id FROM order_line WHERE id >= 18") == [[.integer(18)]])
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    /// The writer moves an order out of its scope (refused) and adds a line and a line's note to it
    /// (accepted: the hub's order is inside): dropping its order, the writer loses the line and the
    /// note to ON DELETE CASCADE, and gets all three back from the hub at its next pull.
    @Test func rowsBelowARefusedRowThatTheHubAcceptedComeBackToTheWriter() throws {
        let schema = """
            CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT, total INTEGER);
            CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER REFERENCES orders(id) ON DELETE \
            CASCADE, item TEXT);
            CREATE TABLE line_note (id INTEGER PRIMARY KEY, line_id INTEGER REFERENCES order_line(id) ON DELETE \
            CASCADE, body TEXT);
            """
        let tables = ["orders", "order_line", "line_note"]
        let hub = try makeDatabase(schema: schema, syncing: tables)
        let north = try makeDatabase(schema: schema, syncing: tables)
        let scope = SyncScope(
            [
                "orders": .filter("site = 'north'"), "order_line": .reference(column: "order_id", parent: "orders"),
                "line_note": .reference(column: "line_id", parent: "order_line"),
            ])
        try hub.execute("INSERT INTO orders VALUES (1, 'north', 10)")
        try sendScopedChanges(from: hub, to: north, scope: scope)
        try north.execute(
            """
            UPDATE orders SET site = 'south' WHERE id = 1;
            INSERT INTO order_line VALUES (11, 1, 'bolt');
            INSERT INTO line_note VALUES (21, 11, 'fragile');
            """)
        let refused = try sendWrites(from: north, to: hub, scope: scope)
        #expect(refused.map { "\($0.table) \($0.key)" } == ["orders [1]"])
        #expect(try F.rows(north, "SELECT count(*) FROM order_line") == [[.integer(0)]])
        try sendScopedChanges(from: hub, to: north, scope: scope)
        for table in tables {
            let all = "SELECT * FROM \(table) ORDER BY id"
            #expect(try F.rows(north, all) == F.rows(hub, all), "\(table)")
        }
        #expect(try F.rows(north, "SELECT id FROM line_note") == [[.integer(21)]])
        #expect(try north.pendingChangeCount() == 0)
    }
}
