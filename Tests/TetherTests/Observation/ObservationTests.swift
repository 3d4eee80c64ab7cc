import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Listeners, committed-transaction streams and query observations: they see every committed
/// change, whatever made it, once, after the commit, and nothing of what was rolled back.
@Suite(.hangLimit) struct ObservationTests {
    struct Player: Model, Equatable {
        var id: Int64
        var name: String
        var score: Int
        static let tableName = "player"
    }

    struct Team: Model, Equatable {
        var code: String
        var name: String
        static let tableName = "team"
        static var primaryKey: [ColumnRef<Team>] { ["code"] }
    }

    /// A file database with `player` (synced) and `team` (not synced), polling every 10 ms where
    /// it does not watch files, unless `configure` says otherwise.
    static func database(
        in directory: URL, name: String = "observed.sqlite", capturingExternalWrites: Bool = false,
        _ configure: (inout Database.Configuration) -> Void = { _ in }
    ) throws -> Database {
        var configuration = Database.Configuration()
        configuration.observationPollInterval = .milliseconds(10)
        configure(&configuration)
        let db = try Database(path: directory.appendingPathComponent(name).path, configuration: configuration)
        try db.createTable(Player.self)
        try db.createTable(Team.self)
        try db.enableSync(for: Player.self, capturingExternalWrites: capturingExternalWrites)
        return db
    }

    @Test func aListenerSeesCommittedChangesOnceWithTheirKindKeyAndOrigin() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory)
            let events = ObservedEvents()
            let token = db.observe(.changes, of: Player.self) { events.add($0) }
            try db.insert(Player(id: 1, name: "Arthur", score: 10))
            try db.update(Player(id: 1, name: "Arthur", score: 20))
            #expect(try db.delete(Player(id: 1, name: "Arthur", score: 20)))
            let seen = try await events.next(3)
            #expect(seen.map(\.kind) == [.insert, .update, .delete])
            #expect(seen.allSatisfy { $0.table == "player" && $0.key == PrimaryKey(Int64(1)) && $0.origin == .local })
            token.cancel()
            try db.insert(Player(id: 2, name: "Barbara", score: 5))
            // A cancelled listener hears nothing more: a second listener sees the insert, the first did not.
            let after = ObservedEvents()
            let second = db.observe(in: "player") { after.add($0) }
            try db.insert(Player(id: 3, name: "Chris", score: 5))
            #expect(try await after.next(1).map(\.key) == [PrimaryKey(Int64(3))])
            #expect(events.count == 3)
            _ = second
        }
    }

    @Test func aListenerSeesNothingOfARolledBackTransactionOrSavepoint() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory)
            let events = ObservedEvents()
            let token = db.observe(in: "team") { events.add($0) }
            struct Undo: Error {}
            _ = try? await db.write { conn in
                try conn.insert(Team(code: "rb", name: "rolled back"))
                throw Undo()
            }
            try await db.write { conn in
                try conn.insert(Team(code: "k1", name: "kept"))
                _ = try? conn.savepoint {
                    try conn.insert(Team(code: "sp", name: "in a savepoint"))
                    try conn.execute("UPDATE team SET name = 'renamed' WHERE code = 'k1'")
                    throw Undo()
                }
                try conn.savepoint { try conn.insert(Team(code: "k2", name: "released")) }
            }
            // A failed statement is undone by SQLite: nothing of it either.
            #expect(throws: (any Error).self) { try db.insert(Team(code: "k1", name: "duplicate")) }
            try db.insert(Team(code: "k3", name: "barrier"))
            let seen = try await events.next(3)
            #expect(seen.map(\.key) == [PrimaryKey("k1"), PrimaryKey("k2"), PrimaryKey("k3")])
            #expect(seen.allSatisfy { $0.kind == .insert })
            _ = token
        }
    }

    /// Bulk inserts into an unsynced table keyed by rowid are recorded by the insert itself, not
    /// by the pre-update hook: each row once, and nothing of a bulk insert that failed or was undone.
    @Test func aBulkInsertIsSeenRowByRowAndNotAtAllWhenUndone() async throws {
        struct Note: Model, Equatable {
            var id: Int64
            var text: String
            static let tableName = "note"
        }
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory)
            try db.createTable(Note.self)
            let events = ObservedEvents()
            let token = db.observe(.changes, of: Note.self) { events.add($0) }
            defer { token.cancel() }
            try db.insert(contentsOf: [Note(id: 1, text: "a"), Note(id: 2, text: "b")])
            // The third note's key is taken: the whole bulk insert fails, and is not reported.
            #expect(throws: (any Error).self) {
                try db.insert(contentsOf: [Note(id: 3, text: "c"), Note(id: 1, text: "again")])
            }
            struct Undo: Error {}
            _ = try? await db.write { conn in
                try conn.insert(contentsOf: [Note(id: 4, text: "d")])
                throw Undo()
            }
            try await db.write { conn in
                _ = try? conn.savepoint {
                    try conn.insert(contentsOf: [Note(id: 5, text: "e")])
                    throw Undo()
                }
                try conn.insert(contentsOf: [Note(id: 6, text: "f"), Note(id: 7, text: "g")])
            }
            let seen = try await events.next(4)
            #expect(seen.map(\.key) == [1, 2, 6, 7].map { PrimaryKey(Int64($0)) })
            #expect(seen.allSatisfy { $0.kind == .insert && $0.table == "note" && $0.origin == .local })
            let stored = try await db.read { (conn: Connection) in
                try conn.fetchValue("SELECT group_concat(id) FROM note", as: String.self)
            }
            #expect(stored == "1,2,6,7")
            // Nothing else was reported in between: the next event is the next commit's.
            try db.insert(Note(id: 8, text: "barrier"))
            #expect(try await events.next(1).map(\.key) == [PrimaryKey(Int64(8))])
        }
    }

    @Test func aQueryObservationYieldsOncePerRelevantCommitAndNeverForOtherTables() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory)
            let fetches = LockedBox(0)
            var players = db.observe { connection in
                fetches.withLock { $0 += 1 }
                return try connection.fetchAll(Query<Player>().orderBy("id"))
            }.makeAsyncIterator()
            #expect(try await players.next() == [])
            try db.insert(Team(code: "x", name: "another table"))
            try db.execute("UPDATE team SET name = 'still another table'")
            let arthur = Player(id: 1, name: "Arthur", score: 10)
            try db.insert(arthur)
            #expect(try await players.next() == [arthur])
            // The initial fetch and the player commit's: none for the two commits to `team`.
            #expect(fetches.value == 2)
            let more = [Player(id: 2, name: "Barbara", score: 20), Player(id: 3, name: "Chris", score: 30)]
            try db.insert(contentsOf: more)
            #expect(try await players.next() == [arthur] + more)
            #expect(fetches.value == 3)
        }
    }

    @Test func aRawSQLObservationWatchesTheTablesItsQueryReadsAndCanDropDuplicates() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory)
            // count(*) reads no column: the authorizer still names the table.
            var teams = db.observe { try $0.fetchValue("SELECT count(*) FROM team", as: Int.self) ?? -1 }
                .removeDuplicates().makeAsyncIterator()
            #expect(try await teams.next() == 0)
            try db.insert(Team(code: "a", name: "A"))
            #expect(try await teams.next() == 1)
            // Same count after the rename: no value; the next insert's count is the next one.
            try db.execute("UPDATE team SET name = 'renamed'")
            try db.insert(Player(id: 1, name: "another table", score: 0))
            try db.insert(Team(code: "b", name: "B"))
            #expect(try await teams.next() == 2)
            var rows = db.observe(sql: "SELECT name FROM team WHERE code = ?", arguments: ["a"]).makeAsyncIterator()
            #expect(try await rows.next()?.map { try $0.get(0, as: String.self) } == ["renamed"])
        }
    }

    @Test func changesFromAPeerAndBulkInsertsOnBothSidesAreObservedWithTheirOrigin() async throws {
        try await withTemporaryDirectory { directory in
            let a = try Self.database(in: directory, name: "a.sqlite")
            let b = try Self.database(in: directory, name: "b.sqlite")
            let onA = ObservedEvents(), onB = ObservedEvents()
            let tokens = [a.observe(of: Player.self) { onA.add($0) }, b.observe(of: Player.self) { onB.add($0) }]
            // A bulk insert into a synced table is logged as insert ranges, without the capture hook.
            let players = (1...50).map { Player(id: Int64($0), name: "p\($0)", score: $0) }
            try a.insert(contentsOf: players)
            #expect(try await onA.next(50).map(\.key) == players.map { PrimaryKey($0.id) })
            // Applied on B by the fast path (no capture hook either).
            try SyncTestKit.sync(a, b)
            let received = try await onB.next(50)
            #expect(received.map(\.key) == players.map { PrimaryKey($0.id) })
            #expect(received.allSatisfy { $0.kind == .insert && $0.origin == .peer(a.instanceKey) })
            try b.update(Player(id: 7, name: "renamed on B", score: 7))
            try SyncTestKit.sync(b, a)
            let update = try await onA.next(1)
            #expect(update.map(\.kind) == [.update])
            #expect(update.map(\.origin) == [.peer(b.instanceKey)])
            _ = tokens
        }
    }

    @Test func changesImportedFromASyncFileAreObservedAsTheFiles() async throws {
        try await withTemporaryDirectory { directory in
            let a = try Self.database(in: directory, name: "a.sqlite")
            let b = try Self.database(in: directory, name: "b.sqlite")
            try a.insert(Player(id: 1, name: "by file", score: 1))
            let file = directory.appendingPathComponent("a-to-b.tether")
            try a.exportSyncFile(to: file, for: b.instanceKey, since: 0)
            let onB = ObservedEvents()
            let token = b.observe(of: Player.self) { onB.add($0) }
            try b.importSyncFile(from: file)
            let seen = try await onB.next(1)
            #expect(seen.map(\.origin) == [.syncFile(a.instanceKey)])
            #expect(seen.map(\.key) == [PrimaryKey(Int64(1))])
            _ = token
        }
    }

    @Test func writesByTheSqlite3ShellAreObserved() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory, capturingExternalWrites: true)
            let events = ObservedEvents()
            let token = db.observe(of: Player.self) { events.add($0) }
            var teams = db.observe { try $0.fetchAll(Query<Team>()) }.makeAsyncIterator()
            #expect(try await teams.next() == [])
            try Self.shell(
                db.path,
                """
                INSERT INTO player (id, name, score) VALUES (41, 'from the shell', 1); INSERT INTO team (code, \
                name) VALUES ('sh', 'shell');
                """)
            // The synced table's triggers recorded the row: a listener hears of it.
            let seen = try await events.next(1)
            #expect(seen.map(\.key) == [PrimaryKey(Int64(41))])
            #expect(seen.map(\.origin) == [.external])
            // `team` captures nothing: the query observation fetches again all the same.
            var latest = try await teams.next()
            while latest == [] { latest = try await teams.next() }
            #expect(latest == [Team(code: "sh", name: "shell")])
            // A second connection of this process (another `Database` on the file) is another writer too.
            let other = try Database(path: db.path)
            try other.insert(Player(id: 42, name: "from another connection", score: 2))
            #expect(try await events.next(1).map(\.key) == [PrimaryKey(Int64(42))])
            _ = token
        }
    }

    @Test(arguments: [true, false])
    func everyCommitOfAnotherConnectionIsToldHoweverCloseTogether(watchesFiles: Bool) async throws {
        // The observer reads other connections' changes back while they go on committing: a
        // commit that lands in the middle of a read-back must be told then or by the next one.
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory) {
                $0.observationPollInterval = .milliseconds(1)
                $0.watchesFiles = watchesFiles
            }
            let events = ObservedEvents()
            let token = db.observe(of: Player.self) { events.add($0) }
            let other = try Database(path: db.path)
            let commits = 300
            for id in 1...Int64(commits) { try other.insert(Player(id: id, name: "p\(id)", score: 0)) }
            let seen = try await events.next(commits)
            #expect(Set(seen.map(\.key)) == Set((1...Int64(commits)).map { PrimaryKey($0) }))
            #expect(seen.allSatisfy { $0.kind == .insert && $0.origin == .external })
            token.cancel()
            try other.close()
        }
    }

    @Test func aSlowConsumerOfCommittedTransactionsLosesNothing() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory)
            let transactions = try db.committedTransactions(tables: ["player"])
            for id in 1...200 { try db.insert(Player(id: Int64(id), name: "p", score: id)) }
            var iterator = transactions.makeAsyncIterator()
            var keys: [PrimaryKey] = []
            var sequences: [ClosedRange<Int64>] = []
            while keys.count < 200, let transaction = try await iterator.next() {
                keys += transaction.changes.map(\.key)
                sequences += transaction.sequences.map { [$0] } ?? []
            }
            #expect(keys == (1...200).map { PrimaryKey(Int64($0)) })
            // In commit order, one sequence number per row of this synced table.
            #expect(
                sequences.count == 200
                    && zip(sequences, sequences.dropFirst()).allSatisfy { $0.upperBound < $1.lowerBound })
        }
    }

    @Test func aConsumerThatFallsBehindIsToldAndResumesFromTheChangelog() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory)
            let transactions = try db.committedTransactions(bufferLimit: 3)
            for id in 1...10 { try db.insert(Player(id: Int64(id), name: "p", score: id)) }
            var seen: [PrimaryKey] = []
            var resumeAfter: Int64?
            do {
                for try await transaction in transactions { seen += transaction.changes.map(\.key) }
                Issue.record("the stream ended without saying the consumer fell behind")
            } catch let behind as CommittedTransactions.FellBehind {
                resumeAfter = behind.resumeAfter
            }
            #expect(seen == (1...3).map { PrimaryKey(Int64($0)) })
            guard let resumeAfter else {
                Issue.record("FellBehind gave no sequence to resume after")
                return
            }
            let resumed = try db.committedTransactions(resumingAfter: resumeAfter)
            var iterator = resumed.makeAsyncIterator()
            let catchUp = try #require(try await iterator.next())
            #expect(catchUp.isReadBack)
            #expect(catchUp.changes.map(\.key) == (4...10).map { PrimaryKey(Int64($0)) })
            try db.insert(Player(id: 11, name: "live again", score: 11))
            #expect(try await iterator.next()?.changes.map(\.key) == [PrimaryKey(Int64(11))])
        }
    }

    @Test func fetchListenersHearOfTheRowsTheORMReads() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory)
            try db.insert(contentsOf: [Team(code: "a", name: "A"), Team(code: "b", name: "B")])
            let events = ObservedEvents()
            let token = db.observe(.fetch, of: Team.self) { events.add($0) }
            _ = try db.fetchAll(Team.self)
            #expect(try await events.next(2).map(\.key) == [PrimaryKey("a"), PrimaryKey("b")])
            #expect(events.all.allSatisfy { $0.kind == .fetch })
            _ = token
        }
    }

    @Test func aRowListenerHearsOfItsRowOnly() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Self.database(in: directory)
            let arthur = Player(id: 1, name: "Arthur", score: 1)
            try db.insert(contentsOf: [arthur, Player(id: 2, name: "Barbara", score: 2)])
            let events = ObservedEvents()
            let token = try db.observe(.update, of: arthur) { events.add($0) }
            try db.execute("UPDATE player SET score = score + 1")
            try db.update(Player(id: 1, name: "Arthur", score: 5))
            #expect(try await events.next(2).map(\.key) == [PrimaryKey(Int64(1)), PrimaryKey(Int64(1))])
            _ = token
        }
    }

    static func shell(_ path: String, _ sql: String) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
        // The library writes as soon as it notices the shell's first commit (it gives the rows
        // their sync metadata): like any second writer, the shell waits for the lock.
        process.arguments = ["-cmd", ".timeout 10000", path, sql]
        try process.run()
        process.waitUntilExit()
        try #require(process.terminationStatus == 0)
    }
}

/// Events a listener was given, awaited by count (never by sleeping).
final class ObservedEvents: @unchecked Sendable {
    private let lock = NSLock()
    private var events: [DatabaseEvent] = []
    private var waiters: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []

    func add(_ event: DatabaseEvent) {
        lock.lock()
        events.append(event)
        let ready = waiters.filter { $0.count <= events.count }
        waiters.removeAll { $0.count <= events.count }
        lock.unlock()
        for waiter in ready { waiter.continuation.resume() }
    }

    var count: Int { lock.withLock { events.count } }
    var all: [DatabaseEvent] { lock.withLock { events } }

    /// The next `count` events after those already taken, waiting up to `seconds` for them.
    func next(_ count: Int, within seconds: Double = 10, sourceLocation: SourceLocation = #_sourceLocation) async throws
        -> [DatabaseEvent]
    {
        let start = taken
        let wanted = start + count
        let arrived = await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in self.wait(until: wanted, continuation) }
                return true
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(seconds))
                return false
            }
            let first = await group.next() ?? false
            // Release a waiter left behind, so that the group can end.
            if !first { releaseWaiters() }
            group.cancelAll()
            return first
        }
        let snapshot = all
        taken = min(snapshot.count, wanted)
        guard arrived else {
            Issue.record(
                """
                expected \(count) more event(s) within \(seconds) s, got \(snapshot.count - start): \
                \(snapshot.dropFirst(start))
                """, sourceLocation: sourceLocation)
            return Array(snapshot.dropFirst(start))
        }
        return Array(snapshot[start..<wanted])
    }

    private func wait(until count: Int, _ continuation: CheckedContinuation<Void, Never>) {
        lock.lock()
        if events.count >= count {
            lock.unlock()
            continuation.resume()
        } else {
            waiters.append((count, continuation))
            lock.unlock()
        }
    }

    private func releaseWaiters() {
        lock.lock()
        let pending = waiters
        waiters.removeAll()
        lock.unlock()
        for waiter in pending { waiter.continuation.resume() }
    }

    private var takenStorage = 0
    private var taken: Int {
        get { lock.withLock { takenStorage } }
        set { lock.withLock { takenStorage = newValue } }
    }
}
