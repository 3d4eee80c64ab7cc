import CSQLite
import Foundation
import Logging

/// A SQLite database: one serial writer and, for files, a pool of concurrent
/// readers (WAL mode lets readers run while a write is in progress).
/// Safe to share between threads and tasks.
///
/// ```swift
/// let db = try Database(path: "app.sqlite")
/// try db.write { conn in
///     try conn.createTable(Player.self)
///     try conn.insert(Player(id: 1, name: "Arthur", score: 100))
/// }
/// let players = try db.read { try $0.fetchAll(Player.self) }
/// ```
public final class Database: @unchecked Sendable {
    /// How a database is opened: lock waits, readers, durability, observation polling, duplicates.
    /// Change a default before opening; the database keeps a copy.
    ///
    /// ```swift
    /// var configuration = Database.Configuration()
    /// configuration.busyTimeout = .seconds(30)
    /// configuration.maximumReaderCount = 8
    /// let db = try Database(path: "app.sqlite", configuration: configuration)
    /// ```
    public struct Configuration: Sendable {
        /// How long a connection waits for a lock held by another process.
        public var busyTimeout: Duration = .seconds(5)
        /// Readers opened at most at the same time (files only).
        public var maximumReaderCount = 4
        /// `PRAGMA synchronous`; NORMAL in WAL mode survives process crashes
        /// (what the sync engine's guarantees need) without an fsync per commit.
        public var synchronous: String = "NORMAL"
        /// Open the file read-only: every write throws.
        public var readOnly = false
        /// How often observation looks for commits made by other processes while something observes
        /// (one `PRAGMA data_version` on the writer per look), where the system cannot tell of
        /// them (see `Database.observeExternalCommits`); nil: never.
        public var observationPollInterval: Duration? = .milliseconds(50)
        /// Whether other processes' commits are noticed from the file system (inotify) rather than
        /// by polling; off in tests of the polling, or with `TETHER_NO_INOTIFY=1` in the environment.
        var watchesFiles = ProcessInfo.processInfo.environment["TETHER_NO_INOTIFY"] != "1"
        /// sModel's `blindlyReplaceDuplicates`: an insert or save through the ORM
        /// that collides with other rows on a unique key replaces them (INSERT OR
        /// REPLACE: they are deleted, with their ON DELETE actions, and on a synced
        /// table the deletes are changes like any other) instead of throwing
        /// `ModelError.duplicate`. Raw SQL is not affected.
        ///
        /// ```swift
        /// var configuration = Database.Configuration()
        /// configuration.replacesDuplicates = true
        /// let db = try Database(path: "app.sqlite", configuration: configuration)
        /// ```
        public var replacesDuplicates = false
        /// Where the work the database does on its own is logged: the deletion of expired rows
        /// by its timer (`debug`; a failure, which has no caller to throw to, at `error`), the
        /// changes kept aside by an apply (`warning`), kept-aside retries and garbage collection
        /// (`debug`), a failed read-back of other connections' commits for observers (`error`;
        /// it is tried again, 10 ms, 100 ms, then every second, the success after at `notice`).
        /// Default: a logger that discards everything.
        ///
        /// ```swift
        /// var configuration = Database.Configuration()
        /// configuration.logger = Logger(label: "app.tether")
        /// ```
        public var logger = Logger(label: "tether.database", factory: { _ in SwiftLogNoOpLogHandler() })
        /// The defaults: a 5-second busy timeout, 4 readers, `synchronous = NORMAL`, read-write,
        /// observation polling every 50 ms, duplicates refused, nothing logged.
        public init() {}
    }

    /// The path the database was opened at (`:memory:`, or empty, for an in-memory database).
    public let path: String
    /// The configuration the database was opened with; changing it afterwards takes a new `Database`.
    public let configuration: Configuration
    let isMemory: Bool

    private let writerLock = ErrorCheckingLock()
    private var writer: Connection?  // guarded by writerLock
    /// Who holds the writer for long and gives it up when someone waits for it (see `WriterWaits`).
    let writerWaits = WriterWaits()
    /// What the layer above installed on the writer at open (the sync engine); the core keeps
    /// it for the database's lifetime, detaches it at close and knows nothing else of it.
    let attachment: any DatabaseAttachment
    /// Work the layer above needs done before reads and writes once a moment has come (the
    /// deletion of expired rows); checked as each read and write begins.
    let dueWork = DueWork()
    /// What the layers above keep on the database while it is open (observation's broker, see
    /// `Database+Observation.swift`), made by the attachment: the core tells them of the
    /// moments of `DatabaseService` and knows nothing else of them.
    let services: [any DatabaseService]
    /// Checkpoints the write-ahead log off the writer's commits (files opened for writing only).
    let checkpointer: BackgroundCheckpointer?

    private let readerCondition = NSCondition()
    private var idleReaders: [Connection] = []  // guarded by readerCondition
    private var openReaderCount = 0  // guarded by readerCondition
    private var isClosed = false  // guarded by readerCondition
    /// Readers held per thread, so that nested reads beyond the pool throw
    /// instead of waiting for themselves forever.
    private var readersHeldByThread: [UInt: Int] = [:]  // guarded by readerCondition

    /// Opens (creating it if needed) the database at `path`, then lets `attach` install what
    /// the layers above need on the writer before anyone can write. The public initializer
    /// (`init(path:configuration:)`, in the sync layer) is this with the sync engine attached.
    init(path: String, configuration: Configuration, attach: (Connection) throws -> any DatabaseAttachment) throws {
        self.path = path
        self.configuration = configuration
        isMemory = Self.isMemory(path)
        let flags = configuration.readOnly ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
        let connection = try Connection(path: path, flags: flags)
        try Self.configure(connection, isWriter: true, path: path, isMemory: isMemory, configuration: configuration)
        if isMemory || configuration.readOnly {
            checkpointer = nil
        } else {
            let checkpointer = BackgroundCheckpointer(path: path, busyTimeout: configuration.busyTimeout)
            try checkpointer.install(on: connection)
            self.checkpointer = checkpointer
        }
        attachment = try attach(connection)
        services = attachment.makeServices()
        writer = connection
        for service in services { service.databaseDidOpen(self, writer: connection) }
        let logger = configuration.logger
        dueWork.setWake { [weak self] in
            // The write runs the due work; from the timer, nobody is there to hear of a failure.
            do {
                try self?.writeWithoutTransaction { _ in }
            } catch {
                logger.error(
                    "could not run the database's due work (deleting expired rows)",
                    metadata: ["tether.database": "\(path)", "tether.reason": "\(error)"])
            }
        }
    }

    /// Whether a database opened at `path` lives in memory.
    static func isMemory(_ path: String) -> Bool {
        path == ":memory:" || path.isEmpty || path.hasPrefix("file::memory:")
    }

    deinit {
        dueWork.stop()
        checkpointer?.stop(removingHookFrom: writer)
        if let writer { attachment.detach(from: writer) }
        writer?.close()
        for reader in idleReaders { reader.close() }
    }

    private static func configure(
        _ connection: Connection, isWriter: Bool, path: String, isMemory: Bool, configuration: Configuration
    ) throws {
        let db = try connection.liveHandle()
        sqlite3_busy_timeout(db, Int32(clamping: configuration.busyTimeout.wholeMilliseconds))
        // Reading the schema here also tells a file that is not a database
        // (SQLITE_NOTADB) at open time rather than at first use.
        _ = try connection.fetchRow("SELECT count(*) FROM sqlite_master")
        try connection.execute("PRAGMA foreign_keys = ON")
        connection.configuration = configuration
        guard isWriter, !isMemory, !configuration.readOnly else { return }
        let mode = try connection.fetchValue("PRAGMA journal_mode = WAL", as: String.self)
        if mode?.lowercased() != "wal" {
            throw DatabaseError(
                extendedCode: SQLITE_ERROR,
                message: "cannot switch \(path) to WAL mode (journal_mode is \(mode ?? "unknown"))")
        }
        try connection.execute("PRAGMA synchronous = \(configuration.synchronous)")
    }

    // MARK: Writing

    /// Runs `body` in an IMMEDIATE transaction on the writer: committed when it
    /// returns, rolled back (database unchanged) when it throws. Writes are
    /// serialized; calling `write` from inside `write` throws.
    @discardableResult
    public func write<T>(_ body: (Connection) throws -> T) throws -> T {
        try withWriter { conn in try conn.transaction(.immediate) { try body(conn) } }
    }

    /// Runs `body` in a transaction of the given kind on the writer.
    @discardableResult
    public func transaction<T>(_ kind: TransactionKind = .deferred, _ body: (Connection) throws -> T) throws -> T {
        try withWriter { conn in try conn.transaction(kind) { try body(conn) } }
    }

    /// Runs `body` on the writer without opening a transaction: for statements
    /// that cannot run in one (VACUUM, some PRAGMAs) or explicit control.
    @discardableResult
    public func writeWithoutTransaction<T>(_ body: (Connection) throws -> T) throws -> T {
        try withWriter(body)
    }

    /// Runs `body` on the writer in place of the due work, due or not: `body` does the work
    /// itself and returns the next deadline with its result. What the work does is then the
    /// caller's to count (`deleteExpiredRows`), not done uncounted as the write begins.
    func doingDueWork<T>(_ body: (Connection) throws -> (result: T, next: Double?)) throws -> T {
        try withWriter(runningDueWork: false) { conn in
            let done = try body(conn)
            dueWork.reset(to: done.next)
            return done.result
        }
    }

    /// `write`, unless another write holds the writer: then nil at once, without waiting (and
    /// without asking a long holder to give it up, see `WriterWaits`).
    func writeIfWriterFree<T>(_ body: (Connection) throws -> T) throws -> T? {
        try writeWithoutTransactionIfWriterFree { conn in try conn.transaction(.immediate) { try body(conn) } }
    }

    /// `writeWithoutTransaction`, unless another write holds the writer: then nil at once.
    func writeWithoutTransactionIfWriterFree<T>(_ body: (Connection) throws -> T) throws -> T? {
        guard writerLock.tryLock() else { return nil }
        defer { writerLock.unlock() }
        return try runOnWriter(runningDueWork: true, body)
    }

    /// Takes the writer's lock; while it waits, whoever holds the writer for long is asked to give
    /// it up. False when this thread holds it already.
    private func lockWriter() -> Bool {
        if writerLock.tryLock() { return true }
        return writerWaits.waiting { writerLock.lock() }
    }

    private func withWriter<T>(runningDueWork: Bool = true, _ body: (Connection) throws -> T) throws -> T {
        guard lockWriter() else {
            throw DatabaseError(
                extendedCode: SQLITE_MISUSE,
                message: """
                    Database.write was called from inside a write or read closure on the same thread; \
                    use the Connection the closure was given
                    """)
        }
        defer { writerLock.unlock() }
        return try runOnWriter(runningDueWork: runningDueWork, body)
    }

    /// Runs `body` on the writer, its lock held by the caller.
    private func runOnWriter<T>(runningDueWork: Bool, _ body: (Connection) throws -> T) throws -> T {
        guard let writer else { throw DatabaseError.closed() }
        for service in services { service.writerWillRun(writer) }
        if runningDueWork {
            do {
                try dueWork.runIfDue(writer)
            } catch let error as DatabaseError where error.isStorageFailure {
                // On a full disk the work stays due (it runs again at the next write), and the write
                // asked for goes on: it may need no room (an extraction, a read of the writer's state).
            }
        }
        return try body(writer)
    }

    /// Folds the write-ahead log into the database file and truncates it, giving back the room the
    /// log held (on a full disk, that room may be all there is). Returns whether there was a log
    /// and every frame of it was folded (no reader held an older snapshot).
    func reclaimLogSpace() throws -> Bool {
        guard !isMemory else { return false }
        return try writeWithoutTransaction { conn in
            guard let result = try conn.fetchRow("PRAGMA wal_checkpoint(TRUNCATE)") else { return false }
            return try result.get(0, as: Int.self) == 0 && result.get(1, as: Int.self) >= 0
        }
    }

    /// Runs the due work before a read on a reader. A read from inside a write on this thread
    /// cannot take the writer: it reads what the write sees (the work ran as the write began).
    private func runDueWorkBeforeRead() throws {
        guard dueWork.isDue, lockWriter() else { return }
        defer { writerLock.unlock() }
        guard let writer else { throw DatabaseError.closed() }
        try dueWork.runIfDue(writer)
    }

    // MARK: Reading

    /// Runs `body` on a reader, in a deferred transaction so that it sees one
    /// consistent snapshot. Readers run concurrently with each other and with
    /// the writer. Writes inside `body` throw (the reader is read-only).
    @discardableResult
    public func read<T>(_ body: (Connection) throws -> T) throws -> T {
        if isMemory {
            // An in-memory database lives in a single connection: make it
            // read-only for the read, as a reader would be.
            return try withWriter { conn in
                try conn.execute("PRAGMA query_only = ON")
                defer { try? conn.execute("PRAGMA query_only = OFF") }
                return try conn.transaction(.deferred) { try body(conn) }
            }
        }
        try runDueWorkBeforeRead()
        let reader = try checkOutReader()
        defer { checkIn(reader) }
        return try reader.transaction(.deferred) { try body(reader) }
    }

    private func checkOutReader() throws -> Connection {
        readerCondition.lock()
        defer { readerCondition.unlock() }
        let thread = UInt(pthread_self())
        while true {
            if isClosed { throw DatabaseError.closed() }
            if let reader = idleReaders.popLast() {
                readersHeldByThread[thread, default: 0] += 1
                return reader
            }
            if openReaderCount < max(1, configuration.maximumReaderCount) { break }
            if readersHeldByThread[thread, default: 0] > 0 {
                throw DatabaseError(
                    extendedCode: SQLITE_MISUSE,
                    message: """
                        nested reads on one thread exceed maximumReaderCount \
                        (\(configuration.maximumReaderCount)); use the Connection the outer read was \
                        given
                        """)
            }
            readerCondition.wait()
        }
        readersHeldByThread[thread, default: 0] += 1
        openReaderCount += 1
        do {
            let reader = try Connection(path: path, flags: SQLITE_OPEN_READONLY)
            try Self.configure(reader, isWriter: false, path: path, isMemory: isMemory, configuration: configuration)
            try reader.execute("PRAGMA query_only = ON")
            for service in services { service.readerDidOpen(reader) }
            return reader
        } catch {
            openReaderCount -= 1
            readersHeldByThread[thread, default: 1] -= 1
            throw error
        }
    }

    /// A reader of its own, outside the pool, for a read held across calls (a catch-up served from
    /// one snapshot, see `CatchUpSnapshot`); the caller closes it. Nil for an in-memory database,
    /// which has no connection but the writer.
    func openDetachedReader() throws -> Connection? {
        guard !isMemory else { return nil }
        let reader = try Connection(path: path, flags: SQLITE_OPEN_READONLY)
        try Self.configure(reader, isWriter: false, path: path, isMemory: isMemory, configuration: configuration)
        try reader.execute("PRAGMA query_only = ON")
        for service in services { service.readerDidOpen(reader) }
        return reader
    }

    private func checkIn(_ reader: Connection) {
        readerCondition.lock()
        let thread = UInt(pthread_self())
        readersHeldByThread[thread, default: 1] -= 1
        if readersHeldByThread[thread] == 0 { readersHeldByThread[thread] = nil }
        if isClosed {
            reader.close()
            openReaderCount -= 1
        } else {
            idleReaders.append(reader)
        }
        readerCondition.signal()
        readerCondition.unlock()
    }

    // MARK: Async

    /// `write` for async code: runs off the cooperative thread pool.
    @discardableResult
    public func write<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T {
        try await runDetached { try self.write(body) }
    }

    /// `read` for async code: runs off the cooperative thread pool.
    @discardableResult
    public func read<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T {
        try await runDetached { try self.read(body) }
    }

    /// `transaction` for async code.
    @discardableResult
    public func transaction<T: Sendable>(
        _ kind: TransactionKind = .deferred, _ body: @escaping @Sendable (Connection) throws -> T
    ) async throws -> T {
        try await runDetached { try self.transaction(kind, body) }
    }

    private func runDetached<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        // SQLite blocks; keep it off Swift's cooperative threads.
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(with: Result { try work() }) }
        }
    }

    // MARK: Closing

    /// Closes every connection. Waits for running reads and writes to finish;
    /// any later use throws `DatabaseError` "the database is closed". Closing
    /// from inside a write closure throws (the write holds the writer).
    public func close() throws {
        guard lockWriter() else {
            throw DatabaseError(
                extendedCode: SQLITE_MISUSE,
                message: "Database.close was called from inside a write closure; close after it returns")
        }
        writerLock.unlock()
        readerCondition.lock()
        isClosed = true
        for reader in idleReaders { reader.close() }
        openReaderCount -= idleReaders.count
        idleReaders.removeAll()
        readerCondition.broadcast()
        readerCondition.unlock()
        for service in services { service.databaseWillClose() }
        _ = lockWriter()
        dueWork.stop()
        // Before the writer closes: the last connection to close folds the log and removes it.
        checkpointer?.stop(removingHookFrom: writer)
        if let writer { attachment.detach(from: writer) }
        writer?.close()
        writer = nil
        writerLock.unlock()
    }
}

// MARK: - Raw SQL on a Database

extension Database {
    /// Runs SQL on the writer in its own transaction. `PRAGMA foreign_keys = …`, which SQLite
    /// ignores inside a transaction, is refused here: run it with `writeWithoutTransaction`.
    public func execute(_ sql: String, _ arguments: StatementArguments = StatementArguments()) throws {
        try write { try $0.execute(sql, arguments) }
    }
    /// All rows of a query, read from a snapshot.
    public func fetchRows(_ sql: String, _ arguments: StatementArguments = StatementArguments()) throws -> [Row] {
        try read { try $0.fetchRows(sql, arguments) }
    }
    /// The first column of the first row, or nil.
    public func fetchValue<V: DatabaseValueConvertible>(
        _ sql: String, _ arguments: StatementArguments = StatementArguments(), as type: V.Type = V.self
    ) throws -> V? {
        try read { try $0.fetchValue(sql, arguments, as: V.self) }
    }
}

/// Something a layer above the core installs on a database's writer when it opens (the sync
/// engine's capture is one): kept alive as long as the database, detached as it closes.
protocol DatabaseAttachment: AnyObject {
    func detach(from writer: Connection)
    /// What orders the database's commits, for observation to read changes back from (nil: nothing does).
    var changelog: (any ChangelogSource)? { get }
    /// The services the database keeps while it is open (observation provides the default).
    func makeServices() -> [any DatabaseService]
}

/// Something a layer above keeps on a database while it is open (observation's broker), told of
/// the moments it must act on; the core knows nothing else of it.
protocol DatabaseService: AnyObject {
    /// The database opened; nothing has used `writer` yet.
    func databaseDidOpen(_ database: Database, writer: Connection)
    /// A read or write takes the writer (under its lock).
    func writerWillRun(_ writer: Connection)
    /// A reader connection opened.
    func readerDidOpen(_ reader: Connection)
    /// The database is closing: nothing will run on it any more.
    func databaseWillClose()
}
