import CSQLite
import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Other connections' commits, read back from the changelog: each told once wherever it lands
/// while a subscription starts, and told without waiting for another commit when a read-back
/// fails. The other connection is a second `Database` on the file, whose commits a hook on the
/// observing database's writer makes land exactly between two of its reads.
@Suite(.hangLimit) struct ReadBackTests {
    typealias Player = ObservationTests.Player
    typealias Step = ObservationTestHooks.SubscriptionStep

    /// Collects the changes of a stream of committed transactions, awaited by count.
    static func collect(_ transactions: CommittedTransactions) -> (ObservedEvents, Task<Void, any Error>) {
        let events = ObservedEvents()
        let pump = Task {
            for try await transaction in transactions {
                for change in transaction.changes { events.add(change) }
            }
        }
        return (events, pump)
    }

    /// Makes `other` insert player `id` when `db`'s subscription reaches `step`; the box says
    /// whether it did (or the error it met).
    static func commit(
        _ id: Int64, by other: Database, when db: Database,
        reaches step: Step
    ) -> LockedBox<Result<Bool, any Error>> {
        let done = LockedBox<Result<Bool, any Error>>(.success(false))
        db.observation.testHooks.withLock {
            $0.subscription = (
                step,
                {
                    let result = Result { try other.insert(Player(id: id, name: "landed \(step)", score: 0)) }
                    done.withLock { $0 = result.map { _ in true } }
                }
            )
        }
        return done
    }

    /// The stream resumes after player 1; player 2 was committed since, player 3 by another
    /// connection while the stream subscribes (at `step`), player 4 by it after: each comes once.
    @Test(arguments: Step.allCases)
    func aResumedStreamGetsAnotherConnectionsCommitOnceWhereverItLands(step: Step) async throws {
        try await withTemporaryDirectory { directory in
            let db = try ObservationTests.database(in: directory)
            let other = try Database(path: db.path)
            try db.insert(Player(id: 1, name: "given before", score: 0))
            let resumeAfter = try db.lastSequence()
            try db.insert(Player(id: 2, name: "missed", score: 0))
            let landed = Self.commit(3, by: other, when: db, reaches: step)
            let (events, pump) = Self.collect(try db.committedTransactions(resumingAfter: resumeAfter))
            #expect(try landed.value.get(), "the hook at \(step) did not run")
            try other.insert(Player(id: 4, name: "after", score: 0))
            // A copy of 3 would come before 4 at the latest: whatever tells of 4 reads 3 too.
            let keys = try await events.next(3).map(\.key)
            #expect(keys.count == 3 && Set(keys) == Set([2, 3, 4].map { PrimaryKey(Int64($0)) }), "\(keys)")
            pump.cancel()
            try other.close()
        }
    }

    /// Another connection commits while the broker reads where the changelog ends and the data
    /// version: the commit is either before both or after both, and in either case it is told.
    @Test func aCommitOfAnotherConnectionLandingAsObservationStartsIsToldWithoutAnotherCommit() async throws {
        try await withTemporaryDirectory { directory in
            let db = try ObservationTests.database(in: directory)
            let other = try Database(path: db.path)
            let landed = Self.commit(1, by: other, when: db, reaches: .activating)
            let (events, pump) = Self.collect(try db.committedTransactions())
            #expect(try landed.value.get(), "the hook did not run")
            #expect(try await events.next(1).map(\.key) == [PrimaryKey(Int64(1))])
            pump.cancel()
            try other.close()
        }
    }

    /// The read-back of another connection's one commit fails once: it is logged, and the commit
    /// is told all the same, though nobody commits again (watching files or polling).
    @Test(arguments: [true, false])
    func aFailedReadBackIsLoggedAndRetriedWithoutAnotherCommit(watchesFiles: Bool) async throws {
        try await withTemporaryDirectory { directory in
            let log = LogRecorder()
            let db = try ObservationTests.database(in: directory) {
                $0.watchesFiles = watchesFiles
                $0.logger = log.logger()
            }
            let events = ObservedEvents()
            let token = db.observe(of: Player.self) { events.add($0) }
            db.observation.testHooks.withLock {
                $0.readBackFailure = DatabaseError(extendedCode: SQLITE_BUSY, message: "database is locked (injected)")
            }
            let other = try Database(path: db.path)
            try other.insert(Player(id: 1, name: "committed once", score: 0))
            #expect(try await events.next(1).map(\.key) == [PrimaryKey(Int64(1))])
            #expect(db.observation.testHooks.withLock { $0.readBackFailure == nil }, "no read-back failed")
            let errors = log.entries.filter { $0.level == .error }
            #expect(errors.count == 1, "\(log.entries)")
            #expect(errors.allSatisfy { $0.metadata["tether.error"]?.contains("injected") == true }, "\(errors)")
            token.cancel()
            try other.close()
        }
    }
}
