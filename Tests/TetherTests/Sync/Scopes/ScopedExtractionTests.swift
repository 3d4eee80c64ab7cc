import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Partial replication through the library: a scoped peer holds exactly the rows of its scope,
/// whatever moves them in or out (their own changes, a parent's, a scope change).
@Suite(.timeLimit(.minutes(1))) struct ScopedExtractionTests {
    typealias F = ScopeFixture

    func seed(_ hub: Database) throws {
        try hub.execute(
            """
            INSERT INTO orders VALUES (1, 'north', 10), (2, 'south', 20), (3, 'north', 30);
            INSERT INTO order_line VALUES (11, 1, 'bolt'), (12, 2, 'nut'), (13, 3, 'gear');
            INSERT INTO line_note VALUES (101, 11, 'fragile'), (102, 12, 'late');
            INSERT INTO notice VALUES (1, 'closed monday');
            """)
    }

    @Test func aScopedPeerReceivesOnlyTheRowsOfItsScopeAndUnscopedTablesWhole() throws {
        let hub = try F.database()
        let north = try F.database()
        try seed(hub)
        let exchange = try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
        #expect(try F.rows(north, "SELECT id FROM orders ORDER BY id") == [[.integer(1)], [.integer(3)]])
        #expect(try F.rows(north, "SELECT id FROM line_note") == [[.integer(101)]])
        // Nothing outside the scope was sent: 2 orders, 2 lines, 1 note, 1 notice.
        #expect(exchange.allChanges.count == 6)
        #expect(exchange.allChanges.allSatisfy { !$0.isEvicted })
    }

    /// What PartialReplication says: an interest on `orders` narrows the tables held by reference
    /// to it (`order_line`, and `line_note` through it), since each link follows its parent's
    /// whole scope, the policy and the interest; and a reference names no parent column (the
    /// parent's single key is taken).
    @Test func anInterestOnTheParentNarrowsTheRowsHeldByReferenceToIt() throws {
        let hub = try F.database()
        let north = try F.database()
        try seed(hub)
        let scope = SyncScope(
            [
                "orders": .filter("site = :peer_name"),
                "order_line": .reference(column: "order_id", parent: "orders"),
                "line_note": .reference(column: "line_id", parent: "order_line"),
            ], interest: ["orders": .filter("total > 15")], parameters: ["peer_name": .text("north")])
        try sendScopedChanges(from: hub, to: north, scope: scope)
        // North's orders are 1 (total 10) and 3 (total 30); the interest keeps 3, and its line only.
        #expect(try F.rows(north, "SELECT id FROM orders") == [[.integer(3)]])
        #expect(try F.rows(north, "SELECT id FROM order_line") == [[.integer(13)]])
        #expect(try F.rows(north, "SELECT id FROM line_note").isEmpty, "note 101 is on line 11, of order 1")
    }

    @Test func aRowUpdatedIntoTheScopeMovesInWholeWithEveryColumnsVersion() throws {
        let hub = try F.database()
        let north = try F.database()
        try seed(hub)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        // total changed long ago, site now: the row moves in with both versions.
        try hub.execute("UPDATE orders SET total = 21 WHERE id = 2")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try hub.execute("UPDATE orders SET site = 'north' WHERE id = 2")
        let exchange = try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        let moved = try #require(exchange.changes.flatMap(\.delivered.changes).first { $0.key == [.integer(2)] })
        #expect(moved.isAlive && !moved.isPartial && moved.values == [.text("north"), .integer(21)])
        #expect(moved.versions.count == 2 && moved.versions[0] != moved.versions[1])
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    @Test func aRowLeavingTheScopeIsEvictedWithoutTombstoneAndIsNotRelayedAsADelete() throws {
        let hub = try F.database()
        let north = try F.database()
        let other = try F.database()
        try seed(hub)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try hub.execute("UPDATE orders SET site = 'south' WHERE id = 3")
        let exchange = try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        #expect(exchange.allChanges.contains { $0.isEvicted && $0.key == [.integer(3)] })
        #expect(exchange.evicted >= 1)
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
        // No tombstone, nothing pending: north sends no delete to anyone.
        #expect(try north.fetchValue("SELECT count(*) FROM tether_dead_orders", as: Int.self) == 0)
        #expect(try north.pendingChangeCount() == 0)
        let relayed = try north.extractChanges(for: other.instanceKey, after: 0)
        #expect(relayed.changes.allSatisfy { $0.isAlive })
        #expect(
            !relayed.changes.contains {
                $0.key == [.integer(3)] && $0.table == relayed.tables.firstIndex { $0.name == "orders" }
            })
    }

    @Test func deletesOfHeldRowsGoAsDeletesAndOthersNotAtAll() throws {
        let hub = try F.database()
        let north = try F.database()
        try seed(hub)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try hub.execute("DELETE FROM orders WHERE id IN (1, 2)")
        let exchange = try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        let orders = try #require(exchange.changes.first?.delivered.tables.firstIndex { $0.name == "orders" })
        let deletes = exchange.allChanges.filter { !$0.isAlive && !$0.isEvicted && $0.table == orders }
        #expect(deletes.map(\.key) == [[.integer(1)]])
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    @Test func aRowDeletedOutOfScopeAndRecreatedInScopeArrivesAsANewRow() throws {
        let hub = try F.database()
        let north = try F.database()
        try seed(hub)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try hub.execute("DELETE FROM orders WHERE id = 2")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try hub.execute("INSERT INTO orders VALUES (2, 'north', 99)")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        #expect(
            try F.rows(north, "SELECT * FROM orders WHERE id = 2") == [[.integer(2), .text("north"), .integer(99)]])
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    @Test func aParentMovingInOrOutMovesItsChildrenAndTheirChildren() throws {
        let hub = try F.database()
        let north = try F.database()
        try seed(hub)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        // Order 2 (line 12, note 102) moves in; order 1 (line 11, note 101) moves out.
        try hub.execute("UPDATE orders SET site = 'north' WHERE id = 2")
        try hub.execute("UPDATE orders SET site = 'south' WHERE id = 1")
        let exchange = try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
        #expect(try F.rows(north, "SELECT id FROM line_note") == [[.integer(102)]])
        // The children's own changes precede the cursor: they came in the backfill.
        #expect(exchange.backfill.flatMap(\.delivered.changes).count == 4)
        // A second exchange has nothing left to move.
        let again = try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        #expect(again.allChanges.isEmpty)
    }

    @Test func aScopeChangeEvictsAndBackfillsTheDifferenceWithoutMovingTheCursor() throws {
        let hub = try F.database()
        let peer = try F.database()
        try seed(hub)
        try sendScopedChanges(from: hub, to: peer, scope: F.site("north"))
        let cursor = try peer.cursor(for: hub.instanceKey).after
        // Widened to every site, then narrowed to south.
        var everything = F.site("north")
        everything.tables["orders"] = .filter("site IS NOT NULL")
        try sendScopedChanges(from: hub, to: peer, scope: everything)
        #expect(try peer.cursor(for: hub.instanceKey).after == cursor)
        try F.expectReadingRule(
            hub: hub, peer: peer,
            queries: [
                "orders": "SELECT * FROM orders ORDER BY id", "order_line": "SELECT * FROM order_line ORDER BY id",
                "line_note": "SELECT * FROM line_note ORDER BY id",
            ])
        let narrowed = try sendScopedChanges(from: hub, to: peer, scope: F.site("south"))
        #expect(narrowed.allChanges.allSatisfy { $0.isEvicted })
        try F.expectReadingRule(hub: hub, peer: peer, queries: F.expectedQueries(site: "south"))
        // Whole again: what it lacks comes back.
        try sendScopedChanges(from: hub, to: peer, scope: .whole)
        try F.expectReadingRule(
            hub: hub, peer: peer,
            queries: [
                "orders": "SELECT * FROM orders ORDER BY id", "order_line": "SELECT * FROM order_line ORDER BY id",
                "line_note": "SELECT * FROM line_note ORDER BY id", "notice": "SELECT * FROM notice ORDER BY id",
            ])
    }

    @Test func aTableNewlyScopedForAPeerThatHeldItWholeLosesTheRowsOutside() throws {
        let hub = try F.database()
        let peer = try F.database()
        try seed(hub)
        try sendChanges(from: hub, to: peer)
        #expect(try peer.fetchValue("SELECT count(*) FROM orders", as: Int.self) == 3)
        try sendScopedChanges(from: hub, to: peer, scope: F.site("north"))
        try F.expectReadingRule(hub: hub, peer: peer, queries: F.expectedQueries(site: "north"))
    }

    @Test func thePeersOwnWritesInsideTheScopeAreNotSentBackAndAreHeld() throws {
        let hub = try F.database()
        let north = try F.database()
        try seed(hub)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try north.execute("INSERT INTO orders VALUES (4, 'north', 40)")
        try sendChanges(from: north, to: hub)
        let exchange = try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        #expect(exchange.allChanges.isEmpty)
        // Moved out by the hub later: the peer's own row is evicted like any other.
        try hub.execute("UPDATE orders SET site = 'south' WHERE id = 4")
        let moved = try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        #expect(moved.allChanges.contains { $0.isEvicted && $0.key == [.integer(4)] })
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    @Test func aLostBatchOfEvictionsIsSentAgainFromTheOldCursor() throws {
        let hub = try F.database()
        let north = try F.database()
        try seed(hub)
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        let cursor = try north.cursor(for: hub.instanceKey).after
        try hub.execute("UPDATE orders SET site = 'south' WHERE id = 1")
        // Extracted, never delivered.
        _ = try hub.extractChanges(for: north.instanceKey, after: cursor, scope: F.site("north"))
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    @Test func bulkInsertedRowsAreScopedLikeAnyOther() throws {
        let hub = try F.database()
        let north = try F.database()
        try hub.write { conn in
            for id in 1...300 {
                try conn.execute("INSERT INTO orders VALUES (?, ?, ?)", [id, id % 3 == 0 ? "north" : "south", id])
            }
        }
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"), limits: BatchLimits(maximumChanges: 37))
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
        #expect(try north.fetchValue("SELECT count(*) FROM orders", as: Int.self) == 100)
    }
}

/// Membership records a row by its key as SQLite's quote() writes it: composite keys of blobs,
/// texts and reals move in and out like integer keys.
@Suite(.timeLimit(.minutes(1))) struct ScopedCompositeKeyTests {
    @Test func rowsWithCompositeBlobAndTextKeysMoveInAndOut() throws {
        let schema = """
            CREATE TABLE part (maker BLOB NOT NULL, code TEXT NOT NULL, weight REAL, site TEXT, PRIMARY KEY \
            (maker, code))
            """
        let hub = try makeDatabase(schema: schema, syncing: ["part"])
        let north = try makeDatabase(schema: schema, syncing: ["part"])
        let scope = SyncScope(["part": .filter("site = 'north'")])
        let query = "SELECT * FROM part WHERE site = 'north' ORDER BY maker, code"
        for (index, code) in ["a'b", "ü,1", "x"].enumerated() {
            try hub.execute(
                "INSERT INTO part VALUES (?, ?, ?, ?)",
                [Data([0, UInt8(index), 39]), code, Double(index) + 0.5, index == 1 ? "south" : "north"])
        }
        try sendScopedChanges(from: hub, to: north, scope: scope)
        #expect(
            try ScopeFixture.rows(north, "SELECT * FROM part ORDER BY maker, code")
                == (try ScopeFixture.rows(hub, query)))
        try hub.execute("UPDATE part SET site = CASE site WHEN 'north' THEN 'south' ELSE 'north' END")
        let exchange = try sendScopedChanges(from: hub, to: north, scope: scope)
        #expect(exchange.allChanges.filter(\.isEvicted).count == 2)
        #expect(
            try ScopeFixture.rows(north, "SELECT * FROM part ORDER BY maker, code")
                == (try ScopeFixture.rows(hub, query)))
        try hub.execute("DELETE FROM part")
        try sendScopedChanges(from: hub, to: north, scope: scope)
        #expect(try north.fetchValue("SELECT count(*) FROM part", as: Int.self) == 0)
    }
}

/// A filter that reads another table in a subquery: a change to that table moves the filtered
/// table's rows, whoever wrote it (the hub, or the peer itself, whose change is an echo the hub
/// leaves out of the peer's batches).
@Suite(.timeLimit(.minutes(1))) struct ScopedSubqueryTests {
    static let schema = """
        CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT);
        CREATE TABLE purchase (id INTEGER PRIMARY KEY, customer_id INTEGER, total INTEGER);
        """
    static let scope = SyncScope(
        ["purchase": .filter("customer_id IN (SELECT id FROM customer WHERE region = :peer_name)")],
        parameters: ["peer_name": .text("north")])
    static let expected =
        "SELECT * FROM purchase WHERE customer_id IN (SELECT id FROM customer WHERE region = 'north') ORDER BY id"

    func seeded() throws -> (hub: Database, north: Database) {
        let hub = try makeDatabase(schema: Self.schema, syncing: ["customer", "purchase"])
        let north = try makeDatabase(schema: Self.schema, syncing: ["customer", "purchase"])
        try hub.execute(
            """
            INSERT INTO customer VALUES (1, 'north'), (2, 'south');
            INSERT INTO purchase VALUES (10, 1, 100), (20, 2, 200);
            """)
        try sendScopedChanges(from: hub, to: north, scope: Self.scope)
        #expect(try ScopeFixture.rows(north, "SELECT id FROM purchase") == [[.integer(10)]])
        return (hub, north)
    }

    @Test func aChangeOfTheTableAFilterReadsMovesTheRowsItSelects() throws {
        let (hub, north) = try seeded()
        try hub.execute("UPDATE customer SET region = 'north' WHERE id = 2")
        try hub.execute("UPDATE customer SET region = 'south' WHERE id = 1")
        try sendScopedChanges(from: hub, to: north, scope: Self.scope)
        #expect(
            try ScopeFixture.rows(north, "SELECT * FROM purchase ORDER BY id")
                == (try ScopeFixture.rows(hub, Self.expected)))
        #expect(try ScopeFixture.rows(north, "SELECT id FROM purchase") == [[.integer(20)]])
    }

    @Test func thePeersOwnChangeOfTheTableAFilterReadsMovesTheRowsThoughItIsAnEcho() throws {
        let (hub, north) = try seeded()
        // North moves its customer away and the other in; the hub's batches to north leave both changes out.
        try north.execute("UPDATE customer SET region = 'south' WHERE id = 1")
        try north.execute("UPDATE customer SET region = 'north' WHERE id = 2")
        #expect(try sendScopedWrites(from: north, to: hub, scope: Self.scope).isEmpty)
        let exchange = try sendScopedChanges(from: hub, to: north, scope: Self.scope)
        let customerChanges = exchange.changes.flatMap { sent in
            sent.delivered.changes.filter { sent.delivered.tables[$0.table].name == "customer" }
        }
        #expect(customerChanges.isEmpty)
        #expect(
            try ScopeFixture.rows(north, "SELECT * FROM purchase ORDER BY id")
                == (try ScopeFixture.rows(hub, Self.expected)))
        #expect(try ScopeFixture.rows(north, "SELECT id FROM purchase") == [[.integer(20)]])
    }
}
