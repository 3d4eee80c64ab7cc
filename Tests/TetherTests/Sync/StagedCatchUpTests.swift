import CSQLite
import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A catch-up's batches are staged on disk and applied together with its last one
/// (`Database.receive`): a reader sees each source transaction whole and only states the source held.
@Suite struct StagedCatchUpTests {
    static let ledger = "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)"

    func sum(_ db: Database) throws -> Int {
        try db.fetchValue("SELECT total(balance) FROM accounts", as: Int.self) ?? -1
    }
    /// Runs `body` on the connection of `db`'s staging file.
    func staging<T>(of db: Database, _ body: (Connection) throws -> T) throws -> T {
        try db.stagingFile().withStore { try body($0.connection) }
    }
    func count(_ db: Database) throws -> Int { try db.fetchValue("SELECT count(*) FROM accounts", as: Int.self) ?? -1 }

    /// A new database file at `path` with the ledger, synced.
    func ledgerFile(at path: String) throws -> Database {
        let db = try Database(path: path)
        try db.execute(Self.ledger)
        try db.enableSync(table: "accounts")
        return db
    }

    func balances(_ db: Database) throws -> String? {
        try db.fetchValue(
            "SELECT group_concat(id || ':' || balance) FROM (SELECT id, balance FROM accounts ORDER BY id)",
            as: String.self)
    }

    /// Opens accounts `ids` on `db`, 100 each, in one transaction.
    func openAccounts(_ ids: ClosedRange<Int>, on db: Database) throws {
        try db.execute(
            """
            WITH RECURSIVE c(x) AS (SELECT \(ids.lowerBound) UNION ALL SELECT x + 1 FROM c \
            WHERE x < \(ids.upperBound)) \
            INSERT INTO accounts SELECT x, 100 FROM c
            """)
    }

    /// The next batch `from` sends `to`, after `to`'s cursor or what it staged.
    func nextBatch(from source: Database, to destination: Database, limit: Int) throws -> ChangeBatch {
        let after =
            try destination.stagedCatchUp(from: source.instanceKey)?.through
            ?? destination.cursor(for: source.instanceKey).after
        let batch = try source.extractChanges(
            for: destination.instanceKey, after: after, limits: BatchLimits(maximumChanges: limit))
        return try BatchCoding.decode(BatchCoding.encode(batch))
    }

    @Test("a catch-up of several batches shows nothing until its last batch, then everything, in one commit")
    func stagedUntilTheLastBatch() async throws {
        let a = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        let b = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try openAccounts(1...25, on: a)
        var commits = try b.committedTransactions(tables: ["accounts"]).makeAsyncIterator()
        var steps: [String] = []
        for _ in 0..<10 {
            let batch = try nextBatch(from: a, to: b, limit: 10)
            switch try b.receive(batch) {
            case let .staged(staged):
                steps.append("staged \(staged.batches) batch(es), \(staged.changes) change(s)")
                // Kept as it came: the bytes it was decoded from, not encoded again.
                let kept = try staging(of: b) {
                    try $0.fetchValue("SELECT batch FROM tether_staged_batches ORDER BY id DESC LIMIT 1", as: Data.self)
                }
                #expect(kept.map { [UInt8]($0) } == batch.decodedFrom && batch.decodedFrom != nil)
                #expect(try count(b) == 0)
                #expect(try b.cursor(for: a.instanceKey).after == 0)
            case let .applied(report):
                steps.append("applied \(report.applied)")
            }
            if batch.isLast { break }
        }
        #expect(steps == ["staged 1 batch(es), 10 change(s)", "staged 2 batch(es), 20 change(s)", "applied 25"])
        #expect(try count(b) == 25 && sum(b) == 2_500)
        #expect(try b.stagedCatchUp(from: a.instanceKey) == nil)
        #expect(try b.cursor(for: a.instanceKey).after == a.lastSequence())
        #expect(
            try staging(of: b) { try $0.fetchValue("SELECT count(*) FROM tether_staged_batches", as: Int.self) } == 0)
        // Observers see the catch-up as one transaction (staging committed nothing they watch).
        #expect(try await commits.next()?.changes.count == 25)
        try b.execute("INSERT INTO accounts VALUES (999, 0)")
        #expect(try await commits.next()?.changes.count == 1)
    }

    @Test("transfers made on the source between the batches of a catch-up: the peer shows only sums the source held")
    func ledgerCatchUpShowsOnlyStatesTheSourceHeld() throws {
        let a = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        let b = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try openAccounts(1...100, on: a)
        var random = SeededGenerator(seed: 37)
        var batches = 0
        while true {
            let batch = try nextBatch(from: a, to: b, limit: 7)
            batches += 1
            _ = try b.receive(batch)
            // Only the empty ledger or a whole one, whatever moved meanwhile.
            #expect(try count(b) == 0 || (count(b) == 100 && sum(b) == 10_000), "after batch \(batches)")
            if batch.isLast { break }
            // A transfer between a row already sent and one not yet: a batch-by-batch apply
            // would show money made or lost.
            let from = Int.random(in: 1...100, using: &random)
            let to = Int.random(in: 1...100, using: &random)
            try a.write { conn in
                try conn.execute("UPDATE accounts SET balance = balance - 7 WHERE id = ?", [from])
                try conn.execute("UPDATE accounts SET balance = balance + 7 WHERE id = ?", [to])
            }
        }
        #expect(batches > 10)
        #expect(try balances(b) == balances(a))
    }

    @Test("a reader of the staging file (the sqlite3 shell looking in) is waited for when the first batch is staged")
    func aReaderOfTheStagingFileIsWaitedFor() throws {
        let directory = try TemporaryDirectory()
        let a = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try openAccounts(1...30, on: a)
        let path = directory.file("b.db")
        let b = try ledgerFile(at: path)
        // The reader makes the file (a rollback journal: nobody asked for WAL yet) and reads it
        // without pause: the switch to WAL, which needs the file to itself, meets its locks.
        let reader = try StagingFileReader(path: path + "-catchup")
        defer { reader.stop() }
        reader.waitForFirstRead()
        for number in 1...2 {
            guard case .staged = try b.receive(try nextBatch(from: a, to: b, limit: 10)) else {
                Issue.record("batch \(number) of 3 was not staged")
                return
            }
        }
        #expect(try b.stagedCatchUp(from: a.instanceKey)?.batches == 2)
        #expect(try staging(of: b) { try $0.fetchValue("PRAGMA journal_mode", as: String.self) } == "wal")
        #expect(try count(b) == 0)
    }

    @Test("staged batches outlive the database's closing; a batch that does not follow them starts the catch-up again")
    func stagedBatchesSurviveAndRestart() throws {
        let directory = try TemporaryDirectory()
        let a = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try openAccounts(1...30, on: a)
        let path = directory.file("b.db")
        do {
            let b = try ledgerFile(at: path)
            for _ in 0..<2 { _ = try b.receive(try nextBatch(from: a, to: b, limit: 10)) }
        }
        let b = try Database(path: path)
        let staged = try #require(try b.stagedCatchUp(from: a.instanceKey))
        #expect(staged.batches == 2 && staged.changes == 20 && staged.after == 0)
        #expect(try count(b) == 0)
        // The catch-up goes on after what was staged: one more batch brings the rest.
        let rest = try nextBatch(from: a, to: b, limit: 10)
        #expect(rest.after == staged.through && rest.isLast && rest.changes.count == 10)
        // A batch from the cursor instead (the sender started again): what was staged goes.
        let again = try nextBatch(from: a, to: b, limit: 100)
        let fromCursor = try a.extractChanges(for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 100))
        #expect(again.after == staged.through)
        guard case let .applied(report) = try b.receive(fromCursor) else {
            Issue.record("a batch from the cursor that is the last was not applied")
            return
        }
        #expect(try report.applied == 30 && count(b) == 30)
        #expect(try b.stagedCatchUp(from: a.instanceKey) == nil)
    }

    @Test(
        "staged batches another session's apply left behind the cursor go when the next catch-up stages its first batch"
    )
    func aChainBehindTheCursorGivesWayToTheNextCatchUp() throws {
        let a = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        let b = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try openAccounts(1...30, on: a)
        _ = try b.receive(try nextBatch(from: a, to: b, limit: 10))
        // Another session applies everything at once, past the staged batch.
        let whole = try a.extractChanges(for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 100))
        _ = try b.apply(whole)
        #expect(try b.cursor(for: a.instanceKey).after == a.lastSequence())
        try openAccounts(31...50, on: a)
        let next = try a.extractChanges(
            for: b.instanceKey, after: b.cursor(for: a.instanceKey).after, limits: BatchLimits(maximumChanges: 10))
        guard case let .staged(chain) = try b.receive(next) else {
            Issue.record("the first batch of the next catch-up was not staged")
            return
        }
        #expect(chain.after == whole.through && chain.batches == 1 && chain.changes == 10)
        #expect(try count(b) == 30)
    }

    @Test(
        """
        a staged batch that cannot be read back (its bytes damaged on disk) fails the catch-up's apply with \
        nothing written; the staged batches go, and the next catch-up from the cursor brings everything
        """)
    func aDamagedStagedBatchFailsTheApplyAndTheCatchUpStartsAgain() throws {
        let a = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        let b = try makeDatabase(schema: Self.ledger, syncing: ["accounts"])
        try openAccounts(1...40, on: a)
        for _ in 0..<3 { _ = try b.receive(try nextBatch(from: a, to: b, limit: 10)) }
        #expect(try b.stagedCatchUp(from: a.instanceKey)?.batches == 3)
        // The second staged batch, decoded ahead while the first is applied, is damaged.
        try staging(of: b) {
            try $0.execute(
                """
                UPDATE tether_staged_batches SET batch = X'544254FF00' \
                WHERE id = (SELECT id FROM tether_staged_batches ORDER BY id LIMIT 1 OFFSET 1)
                """)
        }
        let last = try nextBatch(from: a, to: b, limit: 10)
        #expect(last.isLast)
        #expect(throws: SyncError.self) { _ = try b.receive(last) }
        #expect(try count(b) == 0)
        #expect(try b.cursor(for: a.instanceKey).after == 0)
        #expect(try b.stagedCatchUp(from: a.instanceKey) == nil)
        // Pulled again from the cursor: everything arrives, whole.
        let again = try a.extractChanges(for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 100))
        guard case let .applied(report) = try b.receive(again) else {
            Issue.record("the catch-up pulled again was not applied")
            return
        }
        #expect(report.applied == 40)
        #expect(try count(b) == 40 && sum(b) == 4_000)
    }
}

/// Another program reading a staging file over and over (creating it if absent), on a thread of
/// its own, until stopped.
private final class StagingFileReader: @unchecked Sendable {
    private let condition = NSCondition()
    private var reads = 0  // guarded by condition
    private var stopped = false  // guarded by condition
    private let handle: OpaquePointer

    init(path: String) throws {
        var opened: OpaquePointer?
        guard sqlite3_open_v2(path, &opened, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK,
            let opened
        else {
            sqlite3_close(opened)
            throw DatabaseError(extendedCode: SQLITE_CANTOPEN, message: "cannot open \(path) to read it")
        }
        handle = opened
        sqlite3_busy_timeout(handle, 1000)
        let thread = Thread { [self] in
            defer { sqlite3_close(handle) }
            while condition.withLock({ !stopped }) {
                // Errors (busy while the file switches to WAL) are the other side's to wait out.
                _ = sqlite3_exec(handle, "SELECT count(*) FROM sqlite_master", nil, nil, nil)
                condition.withLock {
                    reads += 1
                    condition.broadcast()
                }
            }
        }
        thread.start()
    }

    func waitForFirstRead() {
        condition.withLock {
            while reads == 0 { condition.wait() }
        }
    }

    func stop() {
        condition.withLock { stopped = true }
    }
}
