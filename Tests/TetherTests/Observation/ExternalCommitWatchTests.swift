import Foundation
import Synchronization
import Testing
@testable import Tether
import TetherTestSupport

/// `Database.observeExternalCommits`: another connection's commit is told without polling where
/// the file system tells of writes (inotify), by polling where it cannot, and this database's
/// own commits are never told.
@Suite(.timeLimit(.minutes(1))) struct ExternalCommitWatchTests {
    /// Calls of a handler, awaited one by one (a stream: no sleeping).
    final class Calls: Sendable {
        let stream: AsyncStream<Void>
        private let continuation: AsyncStream<Void>.Continuation
        let count = Atomic<Int>(0)

        init() {
            (stream, continuation) = AsyncStream.makeStream(of: Void.self)
        }

        func add() {
            count.add(1, ordering: .relaxed)
            continuation.yield()
        }

        /// Waits for `n` more calls; false if they did not come within `seconds`.
        func next(_ n: Int = 1, seconds: Int = 10) async -> Bool {
            let stream = self.stream
            return await withTaskGroup(of: Bool.self) { group in
                group.addTask {
                    var iterator = stream.makeAsyncIterator()
                    for _ in 0..<n where await iterator.next() == nil { return false }
                    return true
                }
                group.addTask {
                    try? await Task.sleep(for: .seconds(seconds))
                    return false
                }
                let first = await group.next() ?? false
                group.cancelAll()
                return first
            }
        }
    }

    static func database(at path: String, watchesFiles: Bool = true) throws -> Database {
        var configuration = Database.Configuration()
        configuration.watchesFiles = watchesFiles
        let db = try Database(path: path, configuration: configuration)
        try db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, name TEXT)")
        return db
    }

    @Test func anotherConnectionsCommitIsToldFromTheFileSystemAndOwnCommitsAreNot() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("watched.sqlite").path
            let db = try Self.database(at: path)
            let calls = Calls()
            // No polling at all: only the file system can tell.
            let token = db.observeExternalCommits(pollingEvery: nil) { calls.add() }
            #expect(await calls.next(), "no call as the watch started")
            #expect(db.observation.externalCommits.isWatchingFiles)

            // This database's own commits are looked at (the log was written) but never told.
            let looksBefore = db.observation.externalCommits.looks.load(ordering: .relaxed)
            for id in 1...3 { try db.execute("INSERT INTO t (id, name) VALUES (?, 'own')", [id]) }
            // Two looks (the second a follow-up, after the first was done with) and no call.
            #expect(try await eventually { db.observation.externalCommits.looks.load(ordering: .relaxed) >= looksBefore + 2 })
            #expect(calls.count.load(ordering: .relaxed) == 1)

            // Another `Database` on the file is another connection: its commit is told.
            let other = try Database(path: path)
            try other.execute("INSERT INTO t (id, name) VALUES (10, 'other')")
            #expect(await calls.next(), "another connection's commit was not told")
            #expect(try await eventually { try db.fetchValue("SELECT count(*) FROM t", as: Int.self) == 4 })
            token.cancel()
            try other.close()
        }
    }

    @Test func withoutFileWatchingItPolls() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("polled.sqlite").path
            let db = try Self.database(at: path, watchesFiles: false)
            let calls = Calls()
            let token = db.observeExternalCommits(pollingEvery: .milliseconds(10)) { calls.add() }
            #expect(await calls.next())
            #expect(!db.observation.externalCommits.isWatchingFiles)
            let other = try Database(path: path)
            try other.execute("INSERT INTO t (id, name) VALUES (1, 'other')")
            #expect(await calls.next(), "the poll did not see another connection's commit")
            // Polling looks again and again, whether anyone wrote or not.
            let looks = db.observation.externalCommits.looks.load(ordering: .relaxed)
            #expect(try await eventually { db.observation.externalCommits.looks.load(ordering: .relaxed) >= looks + 3 })
            token.cancel()
            try other.close()
        }
    }

    @Test func anIdleWatchDoesNotLook() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("idle.sqlite").path
            let db = try Self.database(at: path)
            let calls = Calls()
            let token = db.observeExternalCommits(pollingEvery: .milliseconds(5)) { calls.add() }
            #expect(await calls.next())
            #expect(db.observation.externalCommits.isWatchingFiles)
            // Nobody writes: no look at all over a quiet spell that would have held forty polls.
            let looks = db.observation.externalCommits.looks.load(ordering: .relaxed)
            try await Task.sleep(for: .milliseconds(200))
            #expect(db.observation.externalCommits.looks.load(ordering: .relaxed) == looks)
            token.cancel()
        }
    }
}
