import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// What a node records that each scoped peer holds stays true whatever the peer came to hold the
/// row by — its own write, a table it held whole, a row it dropped — so that the peer ends at the
/// reading rule. Each case was found by ScopePropertyTests.
@Suite(.timeLimit(.minutes(1))) struct ScopeConvergenceTests {
    typealias F = ScopeFixture

    static let evenNotices: [String: SyncScope.Rule] = ["notice": .filter("id % 2 = 0")]

    func notices(_ db: Database) throws -> [[DatabaseValue]] { try F.rows(db, "SELECT id FROM notice ORDER BY id") }

    @Test func aTableGoingWholeIsBackfilledBatchAfterBatch() throws {
        let hub = try F.database()
        let north = try F.database()
        for id in 1...10 { try hub.execute("INSERT INTO notice VALUES (?, 'open')", [id]) }
        try sendScopedChanges(from: hub, to: north, scope: F.site("north").intersected(with: Self.evenNotices))
        #expect(try notices(north).count == 5)
        // Whole again: the five odd notices come in batches of two (the backfill had sent the same
        // first batch again and again).
        let exchange = try sendScopedChanges(
            from: hub, to: north, scope: F.site("north"), limits: BatchLimits(maximumChanges: 2))
        #expect(exchange.backfill.count == 3)
        #expect(try notices(north) == (1...10).map { [.integer(Int64($0))] })
    }

    @Test func aScopedWriterLosesItsOwnRowMovedOutBeforeItPulls() throws {
        let hub = try F.database()
        let north = try F.database()
        try hub.execute("INSERT INTO orders VALUES (1, 'north', 10)")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try north.execute("INSERT INTO orders VALUES (2, 'north', 20)")
        #expect(try sendScopedWrites(from: north, to: hub, scope: F.site("north")).isEmpty)
        // The hub moves the row out before north hears of its write again: the move supersedes the
        // echo, and only the hub's record that north holds the row makes it an eviction.
        try hub.execute("UPDATE orders SET site = 'south' WHERE id = 2")
        let exchange = try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        #expect(exchange.allChanges.contains { $0.isEvicted && $0.key == [.integer(2)] })
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    /// A site's change not sent yet to a row the hub moved out of the site's scope is not dropped
    /// by the eviction that comes first: it is sent, and the hub refuses it — even one that moves the
    /// row back into the site's scope, later than the hub's move (a site cannot take another's row
    /// by writing it) — and the site records the refusal, dropping the row then.
    @Test func anUnsentChangeOutlivesTheEvictionOfItsRow() throws {
        let hub = try F.database()
        let north = try F.database()
        try hub.execute("INSERT INTO orders VALUES (1, 'north', 10), (2, 'north', 20)")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try north.execute("UPDATE orders SET total = 11 WHERE id = 1")
        try hub.execute("UPDATE orders SET site = 'south' WHERE id IN (1, 2)")
        try north.execute("UPDATE orders SET site = 'north', total = 21 WHERE id = 2")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        #expect(
            try F.rows(north, "SELECT id, total FROM orders ORDER BY id") == [
                [.integer(1), .integer(11)], [.integer(2), .integer(21)],
            ],
            "the evictions keep the rows whose change is not sent yet")
        let refused = try sendScopedWrites(from: north, to: hub, scope: F.site("north"))
        #expect(refused.map(\.key) == [[.integer(1)], [.integer(2)]])
        #expect(try north.refusedChanges().map(\.key) == [[.integer(1)], [.integer(2)]])
        #expect(
            try F.rows(hub, "SELECT id, site, total FROM orders ORDER BY id")
                == [[.integer(1), .text("south"), .integer(10)], [.integer(2), .text("south"), .integer(20)]])
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        try F.expectReadingRule(hub: hub, peer: north, queries: F.expectedQueries(site: "north"))
    }

    @Test func aPartialNodeEvictsFromASiteTheRowsOfATableTheSiteHoldsWhole() throws {
        let hub = try F.database()
        let region = try F.database()
        let north = try F.database()
        try hub.execute("INSERT INTO notice VALUES (1, 'odd'), (2, 'even')")
        try sendScopedChanges(from: hub, to: region, scope: .whole)
        try sendScopedChanges(from: region, to: north, scope: F.site("north"))
        #expect(try notices(north).count == 2)
        // The region asks for even notices only: notice 1 leaves it, and so the site below it, which
        // holds the table whole (it holds what the region holds).
        try sendScopedChanges(from: hub, to: region, scope: SyncScope.whole.intersected(with: Self.evenNotices))
        #expect(try notices(region) == [[.integer(2)]])
        let exchange = try sendScopedChanges(from: region, to: north, scope: F.site("north"))
        #expect(exchange.allChanges.contains { $0.isEvicted && $0.key == [.integer(1)] })
        #expect(try notices(north) == [[.integer(2)]])
    }

    @Test func aSiteScopingATableItHeldWholeLosesTheRowsItsRegionEvictedMeanwhile() throws {
        let hub = try F.database()
        let region = try F.database()
        let north = try F.database()
        try hub.execute("INSERT INTO notice VALUES (1, 'odd'), (2, 'even'), (3, 'odd')")
        try sendScopedChanges(from: hub, to: region, scope: .whole)
        try sendScopedChanges(from: region, to: north, scope: F.site("north"))
        try sendScopedChanges(from: hub, to: region, scope: SyncScope.whole.intersected(with: Self.evenNotices))
        // The site narrows the table after the region evicted notices 1 and 3, before it pulled: it
        // may hold them (the region no longer does, so only its log of evictions knows them).
        try sendScopedChanges(from: region, to: north, scope: F.site("north").intersected(with: Self.evenNotices))
        #expect(try notices(north) == [[.integer(2)]])
    }

    @Test func aRowAScopedWriterSentBeforeItsFirstPullIsDeletedThere() throws {
        let hub = try F.database()
        let north = try F.database()
        try north.execute("INSERT INTO orders VALUES (5, 'north', 1)")
        #expect(try sendScopedWrites(from: north, to: hub, scope: F.site("north")).isEmpty)
        // North has pulled nothing yet, but holds the row it wrote: the delete reaches it.
        try hub.execute("DELETE FROM orders WHERE id = 5")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        #expect(try F.rows(north, "SELECT id FROM orders").isEmpty)
    }

    /// A hub, Europe (a partial node) and Paris under it, Paris holding row 1.
    func europeAndParis() throws -> (hub: Database, europe: Database, paris: Database) {
        let hub = try makeDatabase(schema: ScopeRelayTests.schema, syncing: ["stock"])
        let europe = try makeDatabase(schema: ScopeRelayTests.schema, syncing: ["stock"])
        let paris = try makeDatabase(schema: ScopeRelayTests.schema, syncing: ["stock"])
        try hub.execute("INSERT INTO stock VALUES (1, 'eu', 'paris', 5)")
        try sendScopedChanges(from: hub, to: europe, scope: ScopeRelayTests.europe)
        try sendScopedChanges(from: europe, to: paris, scope: ScopeRelayTests.paris)
        #expect(try F.rows(paris, "SELECT id FROM stock") == [[.integer(1)]])
        return (hub, europe, paris)
    }

    func expectParisAtTheReadingRule(
        _ hub: Database, _ paris: Database, sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        #expect(
            try F.rows(paris, "SELECT * FROM stock ORDER BY id")
                == (try F.rows(hub, "SELECT * FROM stock WHERE region = 'eu' AND site = 'paris' ORDER BY id")),
            sourceLocation: sourceLocation)
    }

    @Test func aRowEvictedAtAPartialNodeAndBackSinceStaysHeldByItsSite() throws {
        let (hub, europe, paris) = try europeAndParis()
        // Europe's write is refused: Europe drops the row (an eviction in its log), then gets it back.
        try europe.execute("UPDATE stock SET region = 'us' WHERE id = 1")
        #expect(try sendScopedWrites(from: europe, to: hub, scope: ScopeRelayTests.europe).count == 1)
        try sendScopedChanges(from: hub, to: europe, scope: ScopeRelayTests.europe)
        // Paris hears of both in one window: the eviction, then the row; it holds the row.
        try sendScopedChanges(from: europe, to: paris, scope: ScopeRelayTests.paris)
        try expectParisAtTheReadingRule(hub, paris)
        // So a later move out of Paris's scope evicts it there.
        try hub.execute("UPDATE stock SET site = 'lyon' WHERE id = 1")
        try sendScopedChanges(from: hub, to: europe, scope: ScopeRelayTests.europe)
        try sendScopedChanges(from: europe, to: paris, scope: ScopeRelayTests.paris)
        try expectParisAtTheReadingRule(hub, paris)
    }

    @Test func aPartialNodeEvictingARowItDeletedLetsItsSitesDropIt() throws {
        let (hub, europe, paris) = try europeAndParis()
        let berlin = try makeDatabase(schema: ScopeRelayTests.schema, syncing: ["stock"])
        let berlinScope = SyncScope(["stock": .filter("site = :peer_name")], parameters: ["peer_name": .text("berlin")])
        try sendScopedChanges(from: europe, to: berlin, scope: berlinScope)
        // Europe deletes the row; Berlin's pull settles the tombstone (no longer waiting to be sent)
        // before the hub moves the row out of Europe, whose eviction then drops the tombstone.
        try europe.execute("DELETE FROM stock WHERE id = 1")
        try sendScopedChanges(from: europe, to: berlin, scope: berlinScope)
        try hub.execute("UPDATE stock SET region = 'us' WHERE id = 1")
        try sendScopedChanges(from: hub, to: europe, scope: ScopeRelayTests.europe)
        // Paris, which held the row, drops it all the same.
        try sendScopedChanges(from: europe, to: paris, scope: ScopeRelayTests.paris)
        try expectParisAtTheReadingRule(hub, paris)
    }

    @Test func aDeleteAPartialNodeRelaysReachesTheHubThoughTheRowLeftTheNodeMeanwhile() throws {
        let (hub, europe, paris) = try europeAndParis()
        try paris.execute("DELETE FROM stock WHERE id = 1")
        #expect(try sendScopedWrites(from: paris, to: europe, scope: ScopeRelayTests.paris).isEmpty)
        try sendScopedChanges(from: europe, to: paris, scope: ScopeRelayTests.paris)
        // Europe asks for large stocks only before it sends the delete up: the eviction of row 1
        // keeps the tombstone, which the hub has not had.
        try sendScopedChanges(
            from: hub, to: europe, scope: ScopeRelayTests.europe.intersected(with: ["stock": .filter("qty >= 10")]))
        #expect(try sendScopedWrites(from: europe, to: hub, scope: ScopeRelayTests.europe).isEmpty)
        #expect(try F.rows(hub, "SELECT id FROM stock").isEmpty)
        try sendScopedChanges(from: hub, to: europe, scope: ScopeRelayTests.europe)
        try sendScopedChanges(from: europe, to: paris, scope: ScopeRelayTests.paris)
        try expectParisAtTheReadingRule(hub, paris)
    }

    @Test func aRowAPeerWroteAndDroppedComesBackToIt() throws {
        let hub = try makeDatabase(schema: ScopeRelayTests.schema, syncing: ["stock"])
        let europe = try makeDatabase(schema: ScopeRelayTests.schema, syncing: ["stock"])
        let paris = try makeDatabase(schema: ScopeRelayTests.schema, syncing: ["stock"])
        try hub.execute("INSERT INTO stock VALUES (1, 'eu', 'paris', 5)")
        try sendScopedChanges(from: hub, to: europe, scope: ScopeRelayTests.europe)
        try sendScopedChanges(from: europe, to: paris, scope: ScopeRelayTests.paris)
        try paris.execute("INSERT INTO stock VALUES (2, 'eu', 'paris', 1)")
        #expect(try sendScopedWrites(from: paris, to: europe, scope: ScopeRelayTests.paris).isEmpty)
        #expect(try sendScopedWrites(from: europe, to: hub, scope: ScopeRelayTests.europe).isEmpty)
        // Europe asks for large stocks only: Paris's row leaves Europe, and Paris.
        let large = ScopeRelayTests.europe.intersected(with: ["stock": .filter("qty >= 5")])
        try sendScopedChanges(from: hub, to: europe, scope: large)
        try sendScopedChanges(from: europe, to: paris, scope: ScopeRelayTests.paris)
        #expect(try F.rows(paris, "SELECT id FROM stock ORDER BY id") == [[.integer(1)]])
        // Europe takes every stock again and gets the row back, every version still Paris's: to
        // Paris it is its own write, which it no longer has, so it is sent all the same.
        try sendScopedChanges(from: hub, to: europe, scope: ScopeRelayTests.europe)
        try sendScopedChanges(from: europe, to: paris, scope: ScopeRelayTests.paris)
        #expect(
            try F.rows(paris, "SELECT * FROM stock ORDER BY id") == (try F.rows(hub, "SELECT * FROM stock ORDER BY id"))
        )
    }
}
