import CSQLite
import Foundation
import Synchronization

/// A connection of its own to a database, through a SQLite VFS that is the default one except
/// that each sync of a write-ahead log first waits a while, as on a slow disk. A commit in WAL
/// mode with `synchronous = FULL` syncs the log after writing its commit frame, and only then
/// publishes the commit (in the -shm file's wal-index) and releases the write lock: here, that
/// long after its last write to the log.
public final class SlowLogWriter: @unchecked Sendable {
    public static let vfsName = "tether-test-slow-log-sync"

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Used by one thread at a time.
    private var db: OpaquePointer?

    /// Opens the database at `path`; each sync of its log will take `syncDelay` more.
    public init(path: String, syncDelay: Duration) throws {
        guard shim.register() else { throw Failure(description: "no default VFS to wrap") }
        shim.delay.store(
            Int(syncDelay.components.seconds) * 1_000_000_000 + Int(syncDelay.components.attoseconds / 1_000_000_000),
            ordering: .relaxed)
        guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, Self.vfsName) == SQLITE_OK else {
            defer { close() }
            throw Failure(description: "cannot open \(path): \(String(cString: sqlite3_errmsg(db)))")
        }
        sqlite3_busy_timeout(db, 10_000)
        try execute("PRAGMA synchronous = FULL")
    }

    deinit { close() }

    /// Commits `sql` (run in one transaction); returns once committed, with the connection still
    /// open: closing it would tell the file system (the log closed after writing).
    public func commit(_ sql: String) throws {
        for statement in ["BEGIN IMMEDIATE", sql, "COMMIT"] { try execute(statement) }
    }

    public func close() {
        sqlite3_close_v2(db)
        db = nil
    }

    private func execute(_ statement: String) throws {
        guard sqlite3_exec(db, statement, nil, nil, nil) == SQLITE_OK else {
            throw Failure(description: "\(statement): \(String(cString: sqlite3_errmsg(db)))")
        }
    }
}

/// The VFS, registered once. Its files are the default VFS's own (same size, same methods), but
/// for a log's methods: a copy whose xSync waits `delay` nanoseconds first.
private final class Shim: @unchecked Sendable {
    let delay = Atomic<Int>(0)
    private let lock = NSLock()
    private var registered = false
    /// The default VFS's methods for a log and their xSync, once a log was opened (guarded by lock).
    private var slowMethods: UnsafeMutablePointer<sqlite3_io_methods>?
    private var baseSync: (@convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int32) -> Int32)?

    func register() -> Bool {
        lock.withLock {
            if registered { return true }
            guard let base = sqlite3_vfs_find(nil) else { return false }
            let vfs = UnsafeMutablePointer<sqlite3_vfs>.allocate(capacity: 1)
            vfs.initialize(to: base.pointee)
            vfs.pointee.zName = UnsafePointer(strdup(SlowLogWriter.vfsName))
            vfs.pointee.xOpen = { _, name, file, flags, outFlags in
                // The default VFS opens the file, with itself as the VFS (its xOpen reads its own pAppData).
                guard let base = sqlite3_vfs_find(nil), let open = base.pointee.xOpen else { return SQLITE_ERROR }
                let rc = open(base, name, file, flags, outFlags)
                if rc == SQLITE_OK, flags & SQLITE_OPEN_WAL != 0, let file, let methods = file.pointee.pMethods {
                    file.pointee.pMethods = UnsafePointer(shim.slowCopy(of: methods))
                }
                return rc
            }
            registered = sqlite3_vfs_register(vfs, 0) == SQLITE_OK
            return registered
        }
    }

    func slowCopy(of methods: UnsafePointer<sqlite3_io_methods>) -> UnsafeMutablePointer<sqlite3_io_methods> {
        lock.withLock {
            if let slowMethods { return slowMethods }
            let copy = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
            copy.initialize(to: methods.pointee)
            baseSync = methods.pointee.xSync
            copy.pointee.xSync = { file, flags in
                // Standing for a slow disk, not waiting for an event.
                let nanoseconds = shim.delay.load(ordering: .relaxed)
                if nanoseconds > 0 { Thread.sleep(forTimeInterval: Double(nanoseconds) / 1e9) }
                guard let sync = shim.syncOfDefaultVFS() else { return SQLITE_IOERR }
                return sync(file, flags)
            }
            slowMethods = copy
            return copy
        }
    }

    func syncOfDefaultVFS() -> (@convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int32) -> Int32)? {
        lock.withLock { baseSync }
    }
}

private let shim = Shim()
