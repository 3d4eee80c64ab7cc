import Foundation
import Synchronization
import Testing
@testable import Tether
import TetherTestSupport

/// `Database.observeExternalCommits`: another connection's commit is told without polling where
/// the file system tells of writes (inotify), by polling where it cannot, and this database's
/// own commits are never told.
@Suite(.hangLimit) struct ExternalCommitWatchTests {
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
            // A look (no follow-up: nobody holds the log's write lock by then) and no call.
            #expect(
                try await eventually {
                    db.observation.externalCommits.looks.load(ordering: .relaxed) >= looksBefore + 1
                })
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

    /// Who commits in `aCommitPublishedLongAfterItsLastWriteToTheLogIsTold`.
    enum SlowWriter: CaseIterable, Sendable {
        case anotherConnection, anotherProcess
    }

    @Test(arguments: SlowWriter.allCases)
    func aCommitPublishedLongAfterItsLastWriteToTheLogIsTold(writer: SlowWriter) async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("slow.sqlite").path
            let db = try Self.database(at: path)
            let calls = Calls()
            let token = db.observeExternalCommits(pollingEvery: nil) { calls.add() }
            #expect(await calls.next(), "no call as the watch started")
            #expect(db.observation.externalCommits.isWatchingFiles)

            // The commit's last write to the log, its commit frame, wakes the watch at once; the
            // commit is published 2.5 s later, after a slow sync of the log, and the writer then
            // keeps its connection open, writing nothing (closing the log would tell the kernel).
            let sql = "INSERT INTO t (id, name) VALUES (1, 'slow')"
            let delaySeconds = 2.5
            switch writer {
            case .anotherConnection:
                let connection = try SlowLogWriter(path: path, syncDelay: .milliseconds(Int(delaySeconds * 1000)))
                try await Self.onAThreadOfItsOwn { try connection.commit(sql) }
                #expect(await calls.next(), "a commit published long after its last write to the log was not told")
                connection.close()
            case .anotherProcess:
                let worker = try WorkerProcess(["commit-slowly", path, "\(delaySeconds)", sql])
                #expect(await worker.nextLine() == "committed")
                #expect(await calls.next(), "a commit published long after its last write to the log was not told")
                #expect(await worker.exitStatusOnceInputEnds() == 0)
            }
            #expect(try db.fetchValue("SELECT name FROM t WHERE id = 1", as: String.self) == "slow")
            token.cancel()
        }
    }

    /// Runs `body`, which blocks, on a thread of its own (not one of the tasks' few).
    static func onAThreadOfItsOwn(_ body: @escaping @Sendable () throws -> Void) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
        }
    }

    /// TetherTestWorker running with `arguments`, its standard input and output piped.
    /// Unchecked: `Process` and `Pipe` are not marked Sendable; they are set up once here.
    final class WorkerProcess: @unchecked Sendable {
        private let process = Process()
        private let input = Pipe()
        private let lines: AsyncStream<String>

        init(_ arguments: [String]) throws {
            process.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
                .appendingPathComponent("TetherTestWorker")
            process.arguments = arguments
            let output = Pipe()
            process.standardInput = input
            process.standardOutput = output
            let (lines, continuation) = AsyncStream.makeStream(of: String.self)
            self.lines = lines
            // Blocking reads until the end, on a thread of their own.
            Thread.detachNewThread {
                var buffer = Data()
                while true {
                    let chunk = output.fileHandleForReading.availableData
                    if chunk.isEmpty { break }
                    buffer.append(chunk)
                    while let newline = buffer.firstIndex(of: 0x0A) {
                        continuation.yield(String(decoding: buffer[buffer.startIndex..<newline], as: UTF8.self))
                        buffer.removeSubrange(buffer.startIndex...newline)
                    }
                }
                continuation.finish()
            }
            try process.run()
        }

        /// The next line it prints (nil once its output ended).
        func nextLine() async -> String? {
            var iterator = lines.makeAsyncIterator()
            return await iterator.next()
        }

        /// Ends its standard input, and waits for it to exit: its status.
        func exitStatusOnceInputEnds() async -> Int32 {
            try? input.fileHandleForWriting.close()
            return await withCheckedContinuation { continuation in
                Thread.detachNewThread { [process] in
                    process.waitUntilExit()
                    continuation.resume(returning: process.terminationStatus)
                }
            }
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
