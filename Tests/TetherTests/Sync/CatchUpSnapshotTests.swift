import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A catch-up served from one snapshot of the source (`CatchUpSnapshot`) ends when the snapshot is
/// sent, however fast the source is written meanwhile, and lands the state the source held then.
@Suite struct CatchUpSnapshotTests {
    static let ledger = "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)"

    func balances(_ db: Database) throws -> String? {
        try db.fetchValue(
            "SELECT group_concat(id || ':' || balance) FROM (SELECT id, balance FROM accounts ORDER BY id)",
            as: String.self)
    }

    /// Twenty transfers of 1 between accounts of 1...45 (money kept), each its own transaction:
    /// more changes than a batch of 10 carries.
    func transfer(on a: Database, round: Int) throws {
        for step in 0..<20 {
            let from = (round * 7 + step * 3) % 45 + 1
            let to = (round * 11 + step * 5 + 1) % 45 + 1
            guard from != to else { continue }
            try a.write { conn in
                try conn.execute("UPDATE accounts SET balance = balance - 1 WHERE id = ?", [from])
                try conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = ?", [to])
            }
        }
    }

    /// Pulls batches of 10 from `a` into `b`, `a` making twenty transfers after each; the batches
    /// received until one was the last (nil if none was within `limit`), and `a`'s balances as the
    /// first batch was read.
    func catchUp(
        from a: Database, to b: Database, servedFrom snapshot: CatchUpSnapshot?, limit: Int
    ) throws -> (batches: Int?, atFirstBatch: String?) {
        var atFirstBatch: String?
        for round in 1...limit {
            let after =
                try b.stagedCatchUp(from: a.instanceKey)?.through ?? b.cursor(for: a.instanceKey).after
            let batch = try a.extractChanges(
                for: b.instanceKey, after: after, limits: BatchLimits(maximumChanges: 10), servedFrom: snapshot)
            if round == 1 { atFirstBatch = try balances(a) }
            _ = try b.receive(try BatchCoding.decode(BatchCoding.encode(batch)))
            if batch.isLast { return (round, atFirstBatch) }
            try transfer(on: a, round: round)
        }
        return (nil, atFirstBatch)
    }

    /// A source file with accounts 1...45, 100 each, and an empty peer.
    func ledger(in directory: TemporaryDirectory) throws -> (Database, Database) {
        let a = try Database(path: directory.file("a.db"))
        try a.execute(Self.ledger)
        try a.enableSync(table: "accounts")
        try a.execute(
            """
            WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 45) \
            INSERT INTO accounts SELECT x, 100 FROM c
            """)
        return (a, try makeDatabase(schema: Self.ledger, syncing: ["accounts"]))
    }

    @Test(
        """
        a source written faster than it sends: its catch-up, served from one snapshot, ends after the snapshot's \
        five batches with the state the source held then; read afresh, no batch is ever the last
        """)
    func aBusySourceStillEndsItsCatchUp() throws {
        let directory = try TemporaryDirectory()
        let (a, b) = try ledger(in: directory)
        let snapshot = CatchUpSnapshot()
        let served = try catchUp(from: a, to: b, servedFrom: snapshot, limit: 20)
        #expect(served.batches == 5)
        #expect(!snapshot.isOpen)
        // The state A held as the snapshot was taken (as its first batch was read), whole.
        #expect(try balances(b) == served.atFirstBatch)
        #expect(try b.fetchValue("SELECT sum(balance) FROM accounts", as: Int.self) == 4_500)
        // What A wrote since comes with the next catch-up; with A quiet, B then equals A.
        while case .staged = try b.receive(
            try a.extractChanges(
                for: b.instanceKey,
                after: b.stagedCatchUp(from: a.instanceKey)?.through ?? b.cursor(for: a.instanceKey).after,
                limits: BatchLimits(maximumChanges: 10), servedFrom: snapshot))
        {}
        #expect(try balances(b) == balances(a))

        // The same source read afresh for every batch: the transfers keep it ahead of its peer.
        let c = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        #expect(try catchUp(from: a, to: c, servedFrom: nil, limit: 20).batches == nil)
    }

    @Test("a pull that does not follow the batch served last ends the snapshot: the catch-up starts afresh")
    func aPullFromElsewhereEndsTheSnapshot() throws {
        let directory = try TemporaryDirectory()
        let (a, b) = try ledger(in: directory)
        let snapshot = CatchUpSnapshot()
        let first = try a.extractChanges(
            for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 10), servedFrom: snapshot)
        #expect(!first.isLast && snapshot.isOpen)
        try transfer(on: a, round: 1)
        // From the cursor again (the peer lost what it received): read afresh, A's transfers included.
        let again = try a.extractChanges(
            for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 100), servedFrom: snapshot)
        #expect(again.isLast && !snapshot.isOpen)
        _ = try b.receive(again)
        #expect(try balances(b) == balances(a))
    }
}
