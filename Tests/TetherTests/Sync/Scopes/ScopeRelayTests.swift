import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A node holding a scoped subset (a regional hub) serves peers scoped within it: what it holds
/// goes down, what it evicts leaves them too, and their writes go up through it.
@Suite(.timeLimit(.minutes(1))) struct ScopeRelayTests {
    static let schema = "CREATE TABLE stock (id INTEGER PRIMARY KEY, region TEXT, site TEXT, qty INTEGER)"

    func database() throws -> Database { try makeDatabase(schema: Self.schema, syncing: ["stock"]) }

    static let europe = SyncScope(["stock": .filter("region = :region")], parameters: ["region": .text("eu")])
    static let paris = SyncScope(["stock": .filter("site = :peer_name")], parameters: ["peer_name": .text("paris")])

    func expectParisHoldsItsRows(_ hub: Database, _ paris: Database, sourceLocation: SourceLocation = #_sourceLocation)
        throws
    {
        let parisRowsOnTheHub = try ScopeFixture.rows(
            hub, "SELECT * FROM stock WHERE region = 'eu' AND site = 'paris' ORDER BY id")
        #expect(
            try ScopeFixture.rows(paris, "SELECT * FROM stock ORDER BY id") == parisRowsOnTheHub,
            sourceLocation: sourceLocation)
    }

    @Test func aRegionalHubRelaysWhatItHoldsAndTheEvictionsOfWhatLeavesIt() throws {
        let hub = try database()
        let europe = try database()
        let paris = try database()
        try hub.execute(
            """
            INSERT INTO stock VALUES (1, 'eu', 'paris', 5), (2, 'eu', 'berlin', 6), (3, 'us', 'nyc', 7), (4, \
            'us', 'paris', 8)
            """)
        try sendScopedChanges(from: hub, to: europe, scope: Self.europe)
        try sendScopedChanges(from: europe, to: paris, scope: Self.paris)
        try expectParisHoldsItsRows(hub, paris)

        // Row 1 leaves Europe (and so Paris), row 2 moves to Paris.
        try hub.execute("UPDATE stock SET region = 'us' WHERE id = 1")
        try hub.execute("UPDATE stock SET site = 'paris' WHERE id = 2")
        try sendScopedChanges(from: hub, to: europe, scope: Self.europe)
        #expect(try ScopeFixture.rows(europe, "SELECT id FROM stock ORDER BY id") == [[.integer(2)]])
        let down = try sendScopedChanges(from: europe, to: paris, scope: Self.paris)
        #expect(down.allChanges.contains { $0.isEvicted && $0.key == [.integer(1)] })
        try expectParisHoldsItsRows(hub, paris)
        #expect(try paris.fetchValue("SELECT count(*) FROM tether_dead_stock", as: Int.self) == 0)

        // Paris writes inside its scope: up through Europe to the hub; outside: refused by Europe.
        try paris.execute("INSERT INTO stock VALUES (9, 'eu', 'paris', 1)")
        try paris.execute("UPDATE stock SET site = 'lyon' WHERE id = 2")
        let refused = try sendScopedWrites(from: paris, to: europe, scope: Self.paris)
        #expect(refused.map(\.key) == [[.integer(2)]])
        #expect(try sendScopedWrites(from: europe, to: hub, scope: Self.europe).isEmpty)
        try sendScopedChanges(from: hub, to: europe, scope: Self.europe)
        try sendScopedChanges(from: europe, to: paris, scope: Self.paris)
        #expect(
            try ScopeFixture.rows(hub, "SELECT site FROM stock WHERE id IN (2, 9) ORDER BY id") == [
                [.text("paris")], [.text("paris")],
            ])
        try expectParisHoldsItsRows(hub, paris)
    }
}
