import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A file database applies a whole catch-up as its batches arrive, in one transaction held from the
/// first batch to the last (`CatchUpAppliers`): readers see nothing of it until the last batch
/// commits, and whoever else needs the writer gets it without waiting for the catch-up.
@Suite(.timeLimit(.minutes(2))) struct CatchUpApplierTests {
    static let ledger = "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)"

    /// A database file in `directory` holding the ledger, synced; its appliers wait an hour for a
    /// batch, so that only a writer waiting can make them give the writer up, and try for a minute
    /// to take the writer as they start (a look at the file may hold it for long on a busy machine).
    func ledgerFile(_ directory: TemporaryDirectory, _ name: String) throws -> Database {
        let db = try Database(path: directory.file(name))
        try db.execute(Self.ledger)
        try db.enableSync(table: "accounts")
        db.sync.catchUpAppliers.setLimits(idle: 3600, start: 60)
        return db
    }

    func count(_ db: Database) throws -> Int { try db.fetchValue("SELECT count(*) FROM accounts", as: Int.self) ?? -1 }
    func sum(_ db: Database) throws -> Int {
        try db.fetchValue("SELECT total(balance) FROM accounts", as: Int.self) ?? -1
    }

    /// Source A with accounts 1 through 45, 100 each, written in one transaction.
    func source() throws -> Database {
        let a = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try a.execute(
            """
            WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 45) \
            INSERT INTO accounts SELECT x, 100 FROM c
            """)
        return a
    }

    /// The next batch of 10 changes `source` sends `destination`, after what it staged, as decoded off the wire.
    func nextBatch(from source: Database, to destination: Database) throws -> ChangeBatch {
        let after =
            try destination.stagedCatchUp(from: source.instanceKey)?.through
            ?? destination.cursor(for: source.instanceKey).after
        let batch = try source.extractChanges(
            for: destination.instanceKey, after: after, limits: BatchLimits(maximumChanges: 10))
        return try BatchCoding.decode(BatchCoding.encode(batch))
    }

    /// Stages the next batch (not the last) and waits until the applier has applied `applied` batches.
    func stage(from a: Database, to b: Database, expectingApplied applied: Int) throws {
        let batch = try nextBatch(from: a, to: b)
        try #require(!batch.isLast)
        guard case .staged = try b.receive(batch) else {
            Issue.record("batch \(batch.after)–\(batch.through) was not staged")
            return
        }
        #expect(
            b.sync.catchUpAppliers.waitUntilApplied(applied, from: a.instanceKey, timeout: 60),
            "the applier did not apply \(applied) batch(es) ahead")
    }

    /// A source, and a database file that applied two batches of its catch-up ahead.
    func twoBatchesAppliedAhead(in directory: TemporaryDirectory) throws -> (Database, Database) {
        let a = try source()
        let b = try ledgerFile(directory, "b.db")
        try stage(from: a, to: b, expectingApplied: 1)
        try stage(from: a, to: b, expectingApplied: 2)
        return (a, b)
    }

    /// B holding C's rows as a relay does: they get sequences of B's, none in flight (nothing of
    /// them goes back to C, which pulled from B since); and B's last sequence, which C acknowledges
    /// when B sends it nothing.
    func relayOfC(in directory: TemporaryDirectory) throws -> (b: Database, c: Database, relayed: Int64) {
        let c = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try c.execute("INSERT INTO accounts VALUES (500, 1), (501, 2)")
        let b = try ledgerFile(directory, "b.db")
        try sendChanges(from: c, to: b)
        let relayed = try b.lastSequence()
        // A batch of echoes only: it marks nothing in flight (had it moved the bound of what was,
        // C's acknowledgement would visit B's rows and could not wait).
        #expect(try b.extractChanges(for: c.instanceKey, after: 0).changes.isEmpty)
        return (b, c, relayed)
    }

    /// What `b` records `peer` acknowledged.
    func acknowledged(by peer: Database, on b: Database) throws -> Int64? {
        try b.peers().first { $0.instanceKey == peer.instanceKey }?.acknowledgedThrough
    }

    /// Receives a catch-up's last batch: the report of its apply (nil, recorded as an issue, if it was staged).
    func receiveLast(_ batch: ChangeBatch, on b: Database) throws -> ApplyReport? {
        guard case let .applied(report) = try b.receive(batch) else {
            Issue.record("the last batch \(batch.after)–\(batch.through) was not applied")
            return nil
        }
        return report
    }

    @Test(
        """
        the batches before the last are applied as they arrive, uncommitted: readers see nothing, then all in one \
        commit
        """)
    func appliedAsTheyArrive() async throws {
        let directory = try TemporaryDirectory()
        let a = try source()
        let b = try ledgerFile(directory, "b.db")
        var commits = try b.committedTransactions(tables: ["accounts"]).makeAsyncIterator()
        // Once the observation runs (its start takes the writer, which would make a starting applier give up).
        try b.execute("INSERT INTO accounts VALUES (999, 0)")
        #expect(try await commits.next()?.changes.count == 1)
        for applied in 1...4 {
            try stage(from: a, to: b, expectingApplied: applied)
            #expect(try count(b) == 1)
            #expect(try b.cursor(for: a.instanceKey).after == 0)
        }
        // Applied ahead: the writer is the applier's until the last batch.
        #expect(try b.writeIfWriterFree { _ in } == nil)
        let last = try nextBatch(from: a, to: b)
        #expect(last.isLast)
        #expect(try receiveLast(last, on: b)?.applied == 45)
        #expect(try count(b) == 46 && sum(b) == 4_500)
        #expect(try b.cursor(for: a.instanceKey).after == a.lastSequence())
        #expect(try b.stagedCatchUp(from: a.instanceKey) == nil)
        #expect(try await commits.next()?.changes.count == 45)
    }

    @Test(
        """
        a write during the catch-up takes the writer without waiting for it: the applier rolls back, a later \
        batch starts it again from what was staged, and the catch-up lands whole
        """)
    func aWriteMeanwhileTakesTheWriter() throws {
        let directory = try TemporaryDirectory()
        let (a, b) = try twoBatchesAppliedAhead(in: directory)
        // The applier would hold the writer for an hour waiting for a batch: the write makes it give up.
        try b.execute("INSERT INTO accounts VALUES (1000, 7)")
        #expect(try count(b) == 1 && sum(b) == 7)
        #expect(try b.stagedCatchUp(from: a.instanceKey)?.batches == 2)
        // The next batch starts an applier again: it applies the two staged batches, then this one.
        try stage(from: a, to: b, expectingApplied: 3)
        #expect(try count(b) == 1)
        try stage(from: a, to: b, expectingApplied: 4)
        #expect(try receiveLast(try nextBatch(from: a, to: b), on: b)?.applied == 45)
        #expect(try count(b) == 46 && sum(b) == 4_507)
        #expect(try b.cursor(for: a.instanceKey).after == a.lastSequence())
    }

    @Test(
        """
        an acknowledgement through 0 (all a peer that only receives can send back) takes no writer: the applier \
        keeps its transaction; one through a sequence given is recorded
        """)
    func anAcknowledgementOfNothingLeavesTheApplierBe() throws {
        let directory = try TemporaryDirectory()
        let a = try source()
        let b = try ledgerFile(directory, "b.db")
        // B has given A nothing; A's first acknowledgement records A as a peer of B.
        try b.acknowledge(peer: a.instanceKey, through: 0)
        #expect(try b.peers().first { $0.instanceKey == a.instanceKey }?.acknowledgedThrough == 0)
        try stage(from: a, to: b, expectingApplied: 1)
        try stage(from: a, to: b, expectingApplied: 2)
        // Would wait for the writer, after asking the applier to roll back and give it up.
        try b.acknowledge(peer: a.instanceKey, through: 0)
        #expect(try b.writeIfWriterFree { _ in } == nil, "the applier gave the writer up")
        #expect(b.sync.catchUpAppliers.waitUntilApplied(2, from: a.instanceKey, timeout: 0))
        try stage(from: a, to: b, expectingApplied: 3)
        try stage(from: a, to: b, expectingApplied: 4)
        #expect(try receiveLast(try nextBatch(from: a, to: b), on: b)?.applied == 45)
        #expect(try count(b) == 45 && sum(b) == 4_500)
        try b.execute("INSERT INTO accounts VALUES (1000, 7)")
        try b.acknowledge(peer: a.instanceKey, through: b.lastSequence())
        #expect(try b.peers().first { $0.instanceKey == a.instanceKey }?.acknowledgedThrough == b.lastSequence())
    }

    @Test(
        """
        an acknowledgement that marks no row synced (a relay's rows, none sent) waits for the catch-up holding the \
        writer, and is recorded with its commit, or by the next acknowledgement if it rolls back
        """)
    func anAcknowledgementOfNoRowWaitsForTheCatchUp() throws {
        let directory = try TemporaryDirectory()
        let (b, c, relayed) = try relayOfC(in: directory)
        #expect(relayed >= 2)
        func acknowledged(by peer: Database) throws -> Int64? { try self.acknowledged(by: peer, on: b) }
        let before = try acknowledged(by: c)

        let a = try source()
        try stage(from: a, to: b, expectingApplied: 1)
        try stage(from: a, to: b, expectingApplied: 2)
        // C acknowledges what B sent it back (nothing) through B's last sequence.
        try b.acknowledge(peer: c.instanceKey, through: relayed)
        #expect(try b.writeIfWriterFree { _ in } == nil, "the applier gave the writer up")
        #expect(b.sync.catchUpAppliers.waitUntilApplied(2, from: a.instanceKey, timeout: 0))
        #expect(try acknowledged(by: c) == before)
        try stage(from: a, to: b, expectingApplied: 3)
        try stage(from: a, to: b, expectingApplied: 4)
        #expect(try receiveLast(try nextBatch(from: a, to: b), on: b)?.applied == 45)
        #expect(try count(b) == 47)
        #expect(try acknowledged(by: c) == relayed, "recorded with the catch-up's commit")
        #expect(b.sync.postponedAcknowledgements.pending.isEmpty)

        // Postponed again, then the catch-up rolls back (a write takes the writer): the next
        // acknowledgement that takes the writer records it first (here one from a peer B never
        // heard of, which cannot wait: it records the peer).
        try a.execute("UPDATE accounts SET balance = balance + 1")
        try stage(from: a, to: b, expectingApplied: 1)
        try b.acknowledge(peer: c.instanceKey, through: relayed + 1)
        #expect(b.sync.postponedAcknowledgements.pending.count == 1)
        try b.execute("INSERT INTO accounts VALUES (1000, 7)")
        let newcomer = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try b.acknowledge(peer: newcomer.instanceKey, through: 0)
        #expect(try acknowledged(by: newcomer) == 0)
        #expect(try acknowledged(by: c) == relayed + 1)
        #expect(b.sync.postponedAcknowledgements.pending.isEmpty)
    }

    @Test(
        """
        an acknowledgement that marks no row synced, received as the catch-up's first batch is staged (its applier \
        not holding the writer yet), waits for the catch-up instead of making it start again
        """)
    func anAcknowledgementAsTheApplierStartsWaits() throws {
        let directory = try TemporaryDirectory()
        let (b, c, relayed) = try relayOfC(in: directory)
        let before = try acknowledged(by: c, on: b)

        // The session's next request right after the first batch's: the applier's thread may not
        // have taken the writer yet (flights.update.sync met that in one run of three).
        let a = try source()
        let first = try nextBatch(from: a, to: b)
        guard case .staged = try b.receive(first) else {
            Issue.record("the first batch was not staged")
            return
        }
        try b.acknowledge(peer: c.instanceKey, through: relayed)
        #expect(b.sync.postponedAcknowledgements.pending.count == 1, "postponed for the catch-up")
        #expect(b.sync.catchUpAppliers.waitUntilApplied(1, from: a.instanceKey, timeout: 60))
        try stage(from: a, to: b, expectingApplied: 2)
        try stage(from: a, to: b, expectingApplied: 3)
        try stage(from: a, to: b, expectingApplied: 4)
        #expect(try receiveLast(try nextBatch(from: a, to: b), on: b)?.applied == 45, "applied by the first applier")
        #expect(try acknowledged(by: c, on: b) == relayed)
        #expect(before != relayed)
        #expect(b.sync.postponedAcknowledgements.pending.isEmpty)
    }

    @Test(
        """
        an acknowledgement postponed for an applier that could not take the writer is recorded with the catch-up \
        applied at its end
        """)
    func anAcknowledgementPostponedForAnApplierThatDidNotStart() throws {
        let directory = try TemporaryDirectory()
        let (b, c, relayed) = try relayOfC(in: directory)
        // A catch-up of two batches: 10 changes staged, then the last 5.
        let a = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try a.execute(
            """
            WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 15) \
            INSERT INTO accounts SELECT x, 100 FROM c
            """)

        // Another write holds the writer over the applier's whole start window: it never starts.
        b.sync.catchUpAppliers.setLimits(idle: 2, start: 1)
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let holder = Thread {
            _ = try? b.write { _ in
                holding.signal()
                release.wait()
            }
        }
        holder.start()
        holding.wait()
        guard case .staged = try b.receive(try nextBatch(from: a, to: b)) else {
            release.signal()
            Issue.record("the first batch was not staged")
            return
        }
        // On a thread of its own: had it waited for the writer, the test would hang, not fail.
        let returned = DispatchSemaphore(value: 0)
        Thread {
            try? b.acknowledge(peer: c.instanceKey, through: relayed)
            returned.signal()
        }.start()
        #expect(returned.wait(timeout: .now() + 30) == .success, "the acknowledgement waited for the writer")
        #expect(b.sync.postponedAcknowledgements.pending.count == 1, "postponed for the applier")
        #expect(!b.sync.catchUpAppliers.waitUntilApplied(1, from: a.instanceKey, timeout: 60), "it did not start")
        release.signal()
        #expect(try receiveLast(try nextBatch(from: a, to: b), on: b)?.applied == 15)
        #expect(try acknowledged(by: c, on: b) == relayed)
        #expect(b.sync.postponedAcknowledgements.pending.isEmpty, "recorded with the catch-up applied at its end")
    }

    @Test(
        """
        closing the database during the catch-up rolls the applier back; opened again, the catch-up goes on from \
        what was staged
        """)
    func closedMidCatchUp() throws {
        let directory = try TemporaryDirectory()
        let a = try source()
        let path = directory.file("b.db")
        do {
            let b = try ledgerFile(directory, "b.db")
            try stage(from: a, to: b, expectingApplied: 1)
            try stage(from: a, to: b, expectingApplied: 2)
            try b.close()
        }
        let b = try Database(path: path)
        #expect(try count(b) == 0)
        #expect(try b.stagedCatchUp(from: a.instanceKey)?.batches == 2)
        var step = try b.receive(try nextBatch(from: a, to: b))
        while case .staged = step { step = try b.receive(try nextBatch(from: a, to: b)) }
        #expect(try count(b) == 45 && sum(b) == 4_500)
        #expect(try b.stagedCatchUp(from: a.instanceKey) == nil)
    }

    @Test(
        """
        a batch that does not follow the applied ones rolls the applier back; the catch-up starts again from the \
        cursor
        """)
    func aBatchFromElsewhereRollsBack() throws {
        let directory = try TemporaryDirectory()
        let (a, b) = try twoBatchesAppliedAhead(in: directory)
        // The sender started again from the cursor (a new session): its whole catch-up in one batch.
        let fromCursor = try a.extractChanges(for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 100))
        #expect(try receiveLast(fromCursor, on: b)?.applied == 45)
        #expect(try count(b) == 45 && sum(b) == 4_500)
        #expect(try b.stagedCatchUp(from: a.instanceKey) == nil)
    }

    @Test(
        """
        while an applier holds the writer, a pull of the source with nothing new here is answered without \
        the writer: the applier goes on in the same transaction
        """)
    func aPullWithNothingNewLeavesTheApplierAlone() throws {
        let directory = try TemporaryDirectory()
        let (a, b) = try twoBatchesAppliedAhead(in: directory)
        let end = try b.lastSequence()
        let empty = try #require(try b.batchWithNothingToSend(for: a.instanceKey, after: end))
        #expect(empty.changes.isEmpty && empty.isLast && empty.through == end && empty.source == b.instanceKey)
        // Not the end of the log (a peer's cursor beyond it): the writer's extraction says what is wrong.
        #expect(try b.batchWithNothingToSend(for: a.instanceKey, after: end + 1) == nil)
        // The applier held on: it applies the next batches in the same transaction.
        try stage(from: a, to: b, expectingApplied: 3)
        try stage(from: a, to: b, expectingApplied: 4)
        let rest = try nextBatch(from: a, to: b)
        try #require(rest.isLast)
        #expect(try receiveLast(rest, on: b)?.applied == 45)
        #expect(try count(b) == 45 && sum(b) == 4_500)
        #expect(try b.batchWithNothingToSend(for: a.instanceKey, after: try b.lastSequence()) == nil)
    }
}
