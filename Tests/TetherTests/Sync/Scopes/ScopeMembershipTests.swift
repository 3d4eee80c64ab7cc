import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// How a scoped extraction reads what a peer holds: a table keyed by its rowid has its members
/// merged with the rows of a range (recorded keys read back as integers), any other table has them
/// joined by key. Both must see held and leaving rows alike.
@Suite(.timeLimit(.minutes(1))) struct ScopeMembershipTests {
    typealias F = ScopeFixture

    @Test(arguments: [
        ("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)", true),
        ("CREATE TABLE t (id integer primary key, v TEXT)", true),
        ("CREATE TABLE t (id INTEGER, v TEXT, PRIMARY KEY (id DESC))", true),
        // Not aliases of the rowid: each has a primary key index of its own, or no INTEGER type.
        ("CREATE TABLE t (id INTEGER PRIMARY KEY DESC, v TEXT)", false),
        ("CREATE TABLE t (id INT PRIMARY KEY, v TEXT)", false),
        ("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT)", false),
        ("CREATE TABLE t (a INTEGER, b INTEGER, v TEXT, PRIMARY KEY (a, b))", false),
    ])
    func aKeyIsTheRowidOnlyWhenSQLiteMakesItTheRowidsAlias(schema: String, isRowid: Bool) throws {
        let db = try makeDatabase(schema: schema, syncing: ["t"])
        let engine = try #require(db.syncEngine)
        let table = try #require(try db.write { _ in engine.tables["t"] })
        #expect(try db.write { conn in try engine.keyIsRowid(table, conn) } == isRowid)
    }

    @Test func rowsOfARangeAPeerHoldsOrIsLeavingAreSeenSoWhenExtractedAgain() throws {
        // The relay receives the orders whole: applied inserts, rows of one insert range (which
        // takes `SyncEngine.smallestAppliedRange` rows: the others are another site's).
        let hub = try F.database()
        let relay = try F.database()
        let peer = try F.database()
        let others = (5...40).map { "(\($0), 'east', \($0 * 10))" }.joined(separator: ", ")
        let mine = "(1, 'north', 10), (2, 'south', 20), (3, 'north', 30), (4, 'south', 40)"
        try hub.execute("INSERT INTO orders VALUES \(mine), \(others)")
        try sendChanges(from: hub, to: relay)
        #expect(
            try relay.fetchValue("SELECT count(*) FROM tether_insert_ranges WHERE table_name = 'orders'", as: Int.self)
                ?? 0 > 0)
        #expect(try relay.fetchValue("SELECT count(*) FROM tether_rows_orders", as: Int.self) == 0)
        try sendScopedChanges(from: relay, to: peer, scope: F.site("north"))
        // South now: the backfill evicts 1 and 3 (leaving until acknowledged) and sends 2 and 4.
        try sendScopedChanges(from: relay, to: peer, scope: F.site("south"))
        try F.expectReadingRule(hub: hub, peer: peer, queries: F.expectedQueries(site: "south"))
        // The peer's cursor lost: from the start, held rows go as they are, leaving ones are evicted again.
        let again = try relay.extractChanges(
            for: peer.instanceKey, after: 0, markInFlight: false, scope: F.site("south"))
        let orders = try #require(again.tables.firstIndex { $0.name == "orders" })
        let sent = again.changes.filter { $0.table == orders }
        #expect(sent.filter(\.isEvicted).map(\.key) == [[.integer(1)], [.integer(3)]])
        #expect(sent.filter(\.isAlive).map(\.key) == [[.integer(2)], [.integer(4)]])
        #expect(sent.count == 4)
    }
}
