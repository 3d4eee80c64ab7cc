import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A peer applies what it receives in units of its own (a whole catch-up is one commit): the
/// changes still say which source transaction each belongs to (`DatabaseEvent.sourceTransaction`),
/// the same on the source, on a peer, through a relay and read back from the changelog.
@Suite struct SourceTransactionTests {
    static let shop = """
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL);
        CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL, item TEXT NOT NULL);
        """

    func shop() throws -> Database {
        try makeDatabase(schema: Self.shop, syncing: ["orders", "order_line"])
    }

    /// The groups of a commit, as "table key" lists per transaction.
    func groups(_ commit: CommittedTransaction) -> [(SourceTransaction?, [String])] {
        commit.bySourceTransaction.map { group in
            (group.transaction, group.changes.map { "\($0.table) \($0.key.values.map(\.description).joined())" })
        }
    }

    @Test(
        """
        a catch-up applied as one commit tells its source's transactions apart, with the ids the source's own \
        observers saw; so does a relay, and the changelog read back
        """)
    func catchUpKeepsSourceTransactions() async throws {
        let a = try shop(), b = try shop(), c = try shop()
        var madeOnA = try a.committedTransactions().makeAsyncIterator()
        // Three transactions on A: an order with two lines, a second order with one, then a line moved.
        try await a.write { conn in
            try conn.execute("INSERT INTO orders VALUES (1, 'ada')")
            try conn.execute("INSERT INTO order_line VALUES (10, 1, 'pen'), (11, 1, 'ink')")
        }
        try await a.write { conn in
            try conn.execute("INSERT INTO orders VALUES (2, 'bob')")
            try conn.execute("INSERT INTO order_line VALUES (20, 2, 'pad')")
        }
        try a.execute("UPDATE order_line SET order_id = 2 WHERE id = 11")
        var sourceIDs: [SourceTransaction] = []
        for _ in 0..<3 {
            let commit = try #require(await madeOnA.next())
            let ids = Set(commit.changes.map(\.sourceTransaction))
            #expect(ids.count == 1, "one id for a commit's changes: \(ids)")
            let id = try #require(ids.first ?? nil)
            #expect(id.origin == a.instanceKey)
            sourceIDs.append(id)
        }
        #expect(sourceIDs == sourceIDs.sorted() && Set(sourceIDs).count == 3)

        var appliedOnB = try b.committedTransactions().makeAsyncIterator()
        try b.apply(try a.extractChanges(for: b.instanceKey, after: 0, markInFlight: false))
        let onB = try #require(await appliedOnB.next())
        #expect(onB.changes.count == 5, "one commit for the whole catch-up: \(onB.changes)")
        let expected: [(SourceTransaction?, [String])] = [
            (sourceIDs[0], ["orders 1", "order_line 10"]),
            (sourceIDs[1], ["orders 2", "order_line 20"]),
            (sourceIDs[2], ["order_line 11"]),
        ]
        func same(_ left: [(SourceTransaction?, [String])], _ right: [(SourceTransaction?, [String])]) -> Bool {
            left.count == right.count
                && zip(left, right).allSatisfy { $0.0 == $1.0 && Set($0.1) == Set($1.1) }
        }
        // The line moved later carries only its last transaction: rows travel with their newest values.
        #expect(same(groups(onB), expected), "\(groups(onB))")
        #expect(onB.changes.allSatisfy { $0.origin == .peer(a.instanceKey) })

        // Through a relay: C receives A's transactions from B, with A's ids.
        var appliedOnC = try c.committedTransactions().makeAsyncIterator()
        try c.apply(try b.extractChanges(for: c.instanceKey, after: 0, markInFlight: false))
        let onC = try #require(await appliedOnC.next())
        #expect(same(groups(onC), expected), "\(groups(onC))")

        // Read back from B's changelog (how another process, `tether watch`, sees them).
        var readBack = try b.committedTransactions(resumingAfter: 0).makeAsyncIterator()
        let fromLog = try #require(await readBack.next())
        #expect(fromLog.isReadBack)
        #expect(same(groups(fromLog), expected), "\(groups(fromLog))")
    }

    @Test("a peer's delete, an update of one column and a bulk insert keep their source transactions")
    func deletesUpdatesAndBulkInserts() async throws {
        let a = try shop(), b = try shop()
        try a.execute("INSERT INTO orders VALUES (1, 'ada'), (2, 'bob')")
        try b.apply(try a.extractChanges(for: b.instanceKey, after: 0, markInFlight: false))
        let cursor = try b.cursor(for: a.instanceKey).after
        var madeOnA = try a.committedTransactions().makeAsyncIterator()
        try await a.write { conn in
            try conn.execute("DELETE FROM orders WHERE id = 1")
            try conn.execute("UPDATE orders SET customer = 'bea' WHERE id = 2")
        }
        // Many rows in one statement: an insert range on A, new rows applied in a run on B.
        try a.execute(
            "WITH RECURSIVE n(x) AS (SELECT 100 UNION ALL SELECT x + 1 FROM n WHERE x < 399) INSERT INTO orders "
                + "SELECT x, 'c' || x FROM n")
        let first = try #require(await madeOnA.next()), second = try #require(await madeOnA.next())
        let deleteAndUpdate = try #require(first.changes.first?.sourceTransaction)
        let bulk = try #require(second.changes.first?.sourceTransaction)
        #expect(second.changes.count == 300 && second.changes.allSatisfy { $0.sourceTransaction == bulk })

        var appliedOnB = try b.committedTransactions().makeAsyncIterator()
        try b.apply(try a.extractChanges(for: b.instanceKey, after: cursor, markInFlight: false))
        let onB = try #require(await appliedOnB.next())
        let grouped = onB.bySourceTransaction
        #expect(grouped.map(\.transaction) == [deleteAndUpdate, bulk])
        #expect(grouped.first.map { Set($0.changes.map(\.kind)) } == [.delete, .update])
        #expect(grouped.last?.changes.count == 300)
    }

    @Test("the writes of another program are a transaction of their own, not the one of the local write after them")
    func externalWritesAreTheirOwnTransaction() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("shop.sqlite")
        let a = try Database(path: path)
        try a.execute(Self.shop)
        try a.enableSync(table: "orders", capturingExternalWrites: true)
        try a.enableSync(table: "order_line", capturingExternalWrites: true)
        // Another connection (as the sqlite3 shell would): its triggers note the row.
        let other = try Database(path: path)
        try other.execute("INSERT INTO orders VALUES (1, 'shell')")
        try other.close()
        try a.execute("INSERT INTO orders VALUES (2, 'library')")
        let b = try shop()
        var appliedOnB = try b.committedTransactions().makeAsyncIterator()
        try b.apply(try a.extractChanges(for: b.instanceKey, after: 0, markInFlight: false))
        let onB = try #require(await appliedOnB.next())
        let grouped = groups(onB)
        #expect(grouped.map(\.1) == [["orders 1"], ["orders 2"]], "\(grouped)")
        #expect(grouped.allSatisfy { $0.0?.origin == a.instanceKey })
    }
}
