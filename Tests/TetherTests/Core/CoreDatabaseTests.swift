import Dispatch
import Foundation
import Testing
@testable import Tether
import TetherTestSupport

// MARK: - Opening databases

@Suite("Core: opening databases")
struct CoreOpenTests {
    @Test func fileDatabaseIsWALWithForeignKeysAndBusyTimeoutOnWriterAndReaders() throws {
        try withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("db.sqlite").path
            let db = try Database(path: path)
            defer { try? db.close() }
            #expect(FileManager.default.fileExists(atPath: path))
            #expect(db.path == path)
            try db.writeWithoutTransaction { (conn) throws in
                #expect(try conn.fetchValue("PRAGMA journal_mode", as: String.self)?.lowercased() == "wal")
                #expect(try conn.fetchValue("PRAGMA foreign_keys", as: Int.self) == 1)
                #expect(try conn.fetchValue("PRAGMA busy_timeout", as: Int.self) == 5000)
                #expect(try conn.fetchValue("PRAGMA synchronous", as: Int.self) == 1)  // NORMAL
                #expect(try conn.fetchValue("PRAGMA query_only", as: Int.self) == 0)
            }
            try db.read { (conn) throws in
                #expect(try conn.fetchValue("PRAGMA journal_mode", as: String.self)?.lowercased() == "wal")
                #expect(try conn.fetchValue("PRAGMA foreign_keys", as: Int.self) == 1)
                #expect(try conn.fetchValue("PRAGMA busy_timeout", as: Int.self) == 5000)
                #expect(try conn.fetchValue("PRAGMA query_only", as: Int.self) == 1)
            }
        }
    }

    @Test func busyTimeoutComesFromTheConfiguration() throws {
        try withTemporaryDirectory { directory in
            var configuration = Database.Configuration()
            configuration.busyTimeout = .milliseconds(1250)
            let db = try Database(
                path: directory.appendingPathComponent("db.sqlite").path, configuration: configuration)
            defer { try? db.close() }
            #expect(try db.writeWithoutTransaction { try $0.fetchValue("PRAGMA busy_timeout", as: Int.self) } == 1250)
            #expect(try db.read { try $0.fetchValue("PRAGMA busy_timeout", as: Int.self) } == 1250)
        }
    }

    @Test func inMemoryDatabaseWorksAndIsPrivate() throws {
        let db = try Database.inMemory()
        let other = try Database.inMemory()
        #expect(try db.read { try $0.fetchValue("PRAGMA foreign_keys", as: Int.self) } == 1)
        #expect(try db.read { try $0.fetchValue("PRAGMA busy_timeout", as: Int.self) } == 5000)
        #expect(try db.read { try $0.fetchValue("PRAGMA journal_mode", as: String.self) }?.lowercased() == "memory")
        try db.execute("CREATE TABLE t (x INTEGER)")
        try db.execute("INSERT INTO t (x) VALUES (?)", [7])
        #expect(try db.fetchValue("SELECT x FROM t", as: Int.self) == 7)
        // Each in-memory database is its own.
        #expect(try other.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 't'", as: Int.self) == 0)
        #expect(try db.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 't'", as: Int.self) == 1)
    }

    @Test(
        """
        PRAGMA foreign_keys inside a transaction (which SQLite ignores without a word) is an error naming the \
        way; outside one it switches them, on a synced database too; reading it works anywhere
        """,
        arguments: [false, true])
    func foreignKeysSwitchedOnlyOutsideATransaction(synced: Bool) throws {
        let db = try Database.inMemory()
        try db.execute(
            """
            CREATE TABLE parent (id INTEGER PRIMARY KEY);
            CREATE TABLE child (id INTEGER PRIMARY KEY, parent INTEGER REFERENCES parent (id));
            """)
        if synced {
            try db.enableSync(table: "parent")
            try db.enableSync(table: "child")
        }
        do {
            try db.execute("PRAGMA foreign_keys = OFF")
            Issue.record("PRAGMA foreign_keys = OFF in a transaction was taken")
        } catch let error as DatabaseError {
            #expect(error.message.contains("PRAGMA foreign_keys does nothing inside a transaction"))
            #expect(error.message.contains("writeWithoutTransaction"))
        }
        #expect(try db.write { try $0.fetchValue("PRAGMA foreign_keys", as: Int.self) } == 1)
        #expect(throws: DatabaseError.self) { try db.execute("INSERT INTO child (id, parent) VALUES (1, 9)") }

        try db.writeWithoutTransaction { try $0.execute("PRAGMA foreign_keys = OFF") }
        #expect(try db.writeWithoutTransaction { try $0.fetchValue("PRAGMA foreign_keys", as: Int.self) } == 0)
        try db.execute("INSERT INTO child (id, parent) VALUES (1, 9)")
        #expect(try db.fetchValue("SELECT count(*) FROM child", as: Int.self) == 1)
    }

    @Test func reopeningAFileKeepsItsData() throws {
        try withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("db.sqlite").path
            do {
                let db = try Database(path: path)
                try db.write { conn in
                    try conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
                    try conn.execute("INSERT INTO t (id, name) VALUES (?, ?)", [1, "kept"])
                }
                try db.close()
            }
            let reopened = try Database(path: path)
            defer { try? reopened.close() }
            #expect(try reopened.fetchValue("SELECT name FROM t WHERE id = 1", as: String.self) == "kept")
            #expect(try reopened.read { try $0.fetchValue("SELECT count(*) FROM t", as: Int.self) } == 1)
            #expect(
                try reopened.writeWithoutTransaction { try $0.fetchValue("PRAGMA journal_mode", as: String.self) }?
                    .lowercased() == "wal")
        }
    }

    @Test func openingAFileThatIsNotADatabaseThrows() throws {
        try withTemporaryDirectory { directory in
            let url = directory.appendingPathComponent("garbage.sqlite")
            var generator = SystemRandomNumberGenerator()
            var bytes = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &generator) }
            bytes[0] = 0x42  // never the "SQLite format 3" header
            try Data(bytes).write(to: url)
            let error = #expect(throws: DatabaseError.self) { _ = try Database(path: url.path) }
            #expect(error?.kind == .corrupt || error?.message.contains("not a database") == true)
            #expect(error?.code == CoreCode.notADatabase)
            // The file is left alone.
            #expect(try Data(contentsOf: url) == Data(bytes))
        }
    }

    @Test func openingInAMissingDirectoryThrowsCannotOpen() throws {
        try withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("missing/deeper/db.sqlite").path
            let error = #expect(throws: DatabaseError.self) { _ = try Database(path: path) }
            #expect(error?.kind == .cannotOpen)
            #expect(error?.code == CoreCode.cannotOpen)
            #expect(error?.message.contains(path) == true)
            #expect(!FileManager.default.fileExists(atPath: path))
        }
    }

    @Test func useAfterCloseThrowsMisuse() throws {
        try withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            try db.execute("CREATE TABLE t (x)")
            _ = try db.read { try $0.fetchValue("SELECT count(*) FROM t", as: Int.self) }  // opens a reader
            try db.close()
            try db.close()  // idempotent
            for attempt in [
                { try db.execute("INSERT INTO t VALUES (1)") },
                { _ = try db.write { _ in 1 } },
                { _ = try db.read { _ in 1 } },
                { _ = try db.transaction(.immediate) { _ in 1 } },
                { _ = try db.writeWithoutTransaction { _ in 1 } },
                { _ = try db.fetchRows("SELECT * FROM t") },
            ] as [() throws -> Void] {
                let error = #expect(throws: DatabaseError.self) { try attempt() }
                #expect(error?.kind == .misuse)
                #expect(error?.code == CoreCode.misuse)
                #expect(error?.message == "the database is closed")
            }
        }
        let memory = try Database.inMemory()
        try memory.close()
        let error = #expect(throws: DatabaseError.self) { _ = try memory.read { _ in 1 } }
        #expect(error?.kind == .misuse)
        #expect(error?.message == "the database is closed")
    }
}

// MARK: - One writer, concurrent readers

@Suite("Core: concurrency")
struct CoreConcurrencyTests {
    /// Read-modify-write in separate statements: only a truly serial writer
    /// gives the exact count.
    @Test func concurrentThreadWritesAreSerialized() throws {
        try withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            defer { try? db.close() }
            try db.write { conn in
                try conn.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
                try conn.execute("INSERT INTO counter (id, n) VALUES (1, 0)")
            }
            let errors = LockedBox<[String]>([])
            DispatchQueue.concurrentPerform(iterations: 8) { _ in
                for _ in 0..<25 {
                    do {
                        try db.write { conn in
                            let n = try conn.fetchValue("SELECT n FROM counter WHERE id = 1", as: Int.self) ?? -1000
                            try conn.execute("UPDATE counter SET n = ? WHERE id = 1", [n + 1])
                        }
                        // Readers run alongside.
                        _ = try db.read { try $0.fetchValue("SELECT n FROM counter", as: Int.self) }
                    } catch {
                        errors.withLock { $0.append("\(error)") }
                    }
                }
            }
            #expect(errors.value == [])
            #expect(try db.fetchValue("SELECT n FROM counter WHERE id = 1", as: Int.self) == 200)
        }
    }

    @Test func concurrentAsyncWritesAreSerialized() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            try await db.write { conn in
                try conn.execute("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
                try conn.execute("INSERT INTO counter (id, n) VALUES (1, 0)")
            }
            let observed = try await withThrowingTaskGroup(of: Int.self) { group in
                for index in 0..<100 {
                    group.addTask {
                        if index.isMultiple(of: 3) {
                            return try await db.read {
                                try $0.fetchValue("SELECT n FROM counter WHERE id = 1", as: Int.self) ?? -1
                            }
                        }
                        return try await db.write { conn in
                            let n = try conn.fetchValue("SELECT n FROM counter WHERE id = 1", as: Int.self) ?? -1000
                            try conn.execute("UPDATE counter SET n = ? WHERE id = 1", [n + 1])
                            return n + 1
                        }
                    }
                }
                var values: [Int] = []
                for try await value in group { values.append(value) }
                return values
            }
            let writes = (0..<100).filter { !$0.isMultiple(of: 3) }.count
            #expect(
                try await db.read { try $0.fetchValue("SELECT n FROM counter WHERE id = 1", as: Int.self) } == writes)
            #expect(observed.allSatisfy { (0...writes).contains($0) })
            try db.close()
        }
    }

    /// A writer moves amounts between two rows (the sum is wrong between its two
    /// statements); readers reading the rows in two separate statements must
    /// always see the constant sum.
    @Test func readersSeeConsistentSnapshotsDuringWrites() throws {
        try withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            defer { try? db.close() }
            try db.write { conn in
                try conn.execute("CREATE TABLE account (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
                try conn.execute("INSERT INTO account (id, amount) VALUES (1, 1000), (2, 0)")
            }
            let bad = LockedBox<[String]>([])
            let errors = LockedBox<[String]>([])
            let writerDone = LockedBox(false)
            let readCount = LockedBox(0)
            let readersStarted = DispatchSemaphore(value: 0)
            let readerCount = 3
            let writer: @Sendable () -> Void = {
                // Start writing only once every reader is running, so that they overlap.
                for _ in 0..<readerCount { readersStarted.wait() }
                do {
                    for step in 0..<300 {
                        let amount = step % 7 + 1
                        try db.write { conn in
                            try conn.execute("UPDATE account SET amount = amount - ? WHERE id = 1", [amount])
                            try conn.execute("UPDATE account SET amount = amount + ? WHERE id = 2", [amount])
                        }
                    }
                } catch {
                    errors.withLock { $0.append("writer: \(error)") }
                }
                writerDone.withLock { $0 = true }
            }
            let readers = (0..<readerCount).map { reader -> @Sendable () -> Void in
                {
                    readersStarted.signal()
                    var reads = 0
                    // Read until the writer is done (and at least a few times).
                    while reads < 10 || !writerDone.value {
                        do {
                            let (a, b) = try db.read { conn in
                                (
                                    try conn.fetchValue("SELECT amount FROM account WHERE id = 1", as: Int.self) ?? 0,
                                    try conn.fetchValue("SELECT amount FROM account WHERE id = 2", as: Int.self) ?? 0
                                )
                            }
                            if a + b != 1000 { bad.withLock { $0.append("reader \(reader): \(a) + \(b)") } }
                        } catch {
                            errors.withLock { $0.append("reader \(reader): \(error)") }
                            break
                        }
                        reads += 1
                    }
                    readCount.withLock { $0 += reads }
                }
            }
            coreRunOnThreads([writer] + readers)
            #expect(errors.value == [])
            #expect(
                bad.value.isEmpty,
                "\(bad.value.count) inconsistent reads of \(readCount.value), first: \(bad.value.prefix(3))")
            let total = (0..<300).reduce(0) { $0 + $1 % 7 + 1 }
            #expect(try db.fetchValue("SELECT amount FROM account WHERE id = 2", as: Int.self) == total)
        }
    }

    /// Deterministic form of the snapshot guarantee: a write that commits while
    /// a read is open is invisible to that read, and visible to the next one.
    @Test func aReadKeepsItsSnapshotWhileAWriteCommits() throws {
        try withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            defer { try? db.close() }
            try db.write { conn in
                try conn.execute("CREATE TABLE account (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)")
                try conn.execute("INSERT INTO account (id, amount) VALUES (1, 1000), (2, 0)")
            }
            let (a, b, aAgain) = try db.read { conn in
                let a = try conn.fetchValue("SELECT amount FROM account WHERE id = 1", as: Int.self)
                try db.write { conn in
                    try conn.execute("UPDATE account SET amount = amount - 100 WHERE id = 1")
                    try conn.execute("UPDATE account SET amount = amount + 100 WHERE id = 2")
                }
                let b = try conn.fetchValue("SELECT amount FROM account WHERE id = 2", as: Int.self)
                let aAgain = try conn.fetchValue("SELECT amount FROM account WHERE id = 1", as: Int.self)
                return (a, b, aAgain)
            }
            #expect(a == 1000)
            #expect(b == 0)
            #expect(aAgain == 1000)
            let after = try db.read { conn in
                try conn.fetchRows("SELECT amount FROM account ORDER BY id").map { try $0.get(0, as: Int.self) }
            }
            #expect(after == [900, 100])
        }
    }

    @Test func writeInsideWriteOnTheSameThreadThrowsMisuse() throws {
        try withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            defer { try? db.close() }
            try db.execute("CREATE TABLE t (x INTEGER)")
            var innerRan = false
            try db.write { conn in
                try conn.execute("INSERT INTO t (x) VALUES (1)")
                let error = #expect(throws: DatabaseError.self) {
                    try db.write { conn in
                        innerRan = true
                        try conn.execute("INSERT INTO t (x) VALUES (2)")
                    }
                }
                #expect(error?.kind == .misuse)
                #expect(error?.code == CoreCode.misuse)
                let nested = #expect(throws: DatabaseError.self) { _ = try db.transaction(.deferred) { _ in 1 } }
                #expect(nested?.kind == .misuse)
                // The outer transaction is still usable.
                try conn.execute("INSERT INTO t (x) VALUES (3)")
            }
            #expect(!innerRan)
            #expect(try db.fetchRows("SELECT x FROM t ORDER BY x").map { try $0.get(0, as: Int.self) } == [1, 3])
            // The lock was released: a later write works.
            try db.execute("INSERT INTO t (x) VALUES (4)")
            #expect(try coreCount(db, "t") == 3)
        }
    }

    @Test func writeOrReadInsideWriteOnAnInMemoryDatabaseThrowsMisuse() throws {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE t (x INTEGER)")
        try db.write { conn in
            try conn.execute("INSERT INTO t (x) VALUES (1)")
            let write = #expect(throws: DatabaseError.self) { try db.execute("INSERT INTO t (x) VALUES (2)") }
            #expect(write?.kind == .misuse)
            let read = #expect(throws: DatabaseError.self) { _ = try db.read { _ in 1 } }
            #expect(read?.kind == .misuse)
        }
        #expect(try db.fetchRows("SELECT x FROM t").map { try $0.get(0, as: Int.self) } == [1])
    }

    @Test func writingInsideReadThrowsReadOnlyAndChangesNothing() throws {
        try withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            defer { try? db.close() }
            try db.write { conn in
                try conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
                try conn.execute("INSERT INTO t (id, name) VALUES (1, 'one')")
            }
            let before = try coreDump(db, "t")
            for sql in [
                "INSERT INTO t (id, name) VALUES (2, 'two')",
                "UPDATE t SET name = 'changed'",
                "DELETE FROM t",
                "CREATE TABLE other (x)",
            ] {
                let error = #expect(throws: DatabaseError.self) {
                    try db.read { conn in try conn.execute(sql) }
                }
                #expect(error?.kind == .readOnly)
                #expect(error?.code == CoreCode.readOnly)
                #expect(error?.sql == sql)
            }
            let withArguments = #expect(throws: DatabaseError.self) {
                try db.read { conn in try conn.execute("INSERT INTO t (id, name) VALUES (?, ?)", [3, "three"]) }
            }
            #expect(withArguments?.kind == .readOnly)
            #expect(try coreDump(db, "t") == before)
            #expect(try db.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 'other'", as: Int.self) == 0)
        }
    }
}
