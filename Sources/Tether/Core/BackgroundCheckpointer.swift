import CSQLite
import Foundation

/// Folds the write-ahead log into the database file off the writer's path.
///
/// SQLite's own automatic checkpoint runs inside the COMMIT that takes the log past 1,000 pages:
/// that commit copies the log into the file and syncs both, so one commit in a few hundred
/// takes milliseconds instead of microseconds (the tail of the commit-to-peer latency). Here the
/// writer's WAL hook only asks, and a PASSIVE checkpoint runs on a connection of its own, on a
/// thread of its own, while the writer goes on appending (SQLite lets one checkpoint run beside
/// one writer). The writer still checkpoints in its commit when commits took the log past
/// `inlineLimitPages` while the checkpointer could have folded it (it cannot keep up): the log
/// stays bounded as before. A single transaction that alone takes a short log that far (a bulk
/// load, a whole catch-up) is folded in the background too: the log is that long whatever folds
/// it, and folding it in the commit only made the committer copy and sync it before returning.
///
/// Setting `PRAGMA wal_autocheckpoint` on the writer replaces the hook (SQLite's default then).
final class BackgroundCheckpointer: @unchecked Sendable {
    /// Pages in the log that ask for a background checkpoint (SQLite's default automatic threshold).
    static let requestPages: Int32 = 1_000
    /// Pages in the log beyond which the committing writer checkpoints itself.
    static let inlineLimitPages: Int32 = 8_000

    private let path: String
    private let busyTimeout: Duration
    private let condition = NSCondition()
    private var requested = false  // guarded by condition
    private var stopping = false  // guarded by condition
    private var thread: Thread?  // guarded by condition
    private var checkpointCount = 0  // guarded by condition
    private var lastFoldedWholeLog = false  // guarded by condition
    private var running = false  // guarded by condition
    /// The checkpointer's own connection, opened at its first checkpoint; used on its thread only.
    private var connection: OpaquePointer?
    /// The log's size in pages after the writer's last commit: written by the WAL hook, which
    /// runs on the writer only (one at a time).
    fileprivate var logPagesAfterLastCommit: Int32 = 0

    init(path: String, busyTimeout: Duration) {
        self.path = path
        self.busyTimeout = busyTimeout
    }

    /// Puts the hook on the writer: from now on its commits ask rather than checkpoint.
    func install(on writer: Connection) throws {
        let handle = try writer.liveHandle()
        sqlite3_wal_hook(handle, walHook, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Takes the hook off the writer (which then runs no checkpoint until closed: closing the last
    /// connection folds the log), waits for a running checkpoint and closes the connection.
    func stop(removingHookFrom writer: Connection?) {
        if let handle = writer?.handle { sqlite3_wal_hook(handle, nil, nil) }
        condition.lock()
        stopping = true
        condition.broadcast()
        while thread != nil { condition.wait() }
        condition.unlock()
    }

    /// Whether the commit that left the log `pages` long took it past `inlineLimitPages` alone,
    /// from a short log (`before`: its length after the commit before, unless folded whole
    /// since): a bulk load, a whole catch-up. A log that stays long (commits the checkpointer did
    /// not keep up with, bulk loads back to back) is folded by the writer, which keeps it bounded.
    fileprivate func tookShortLogPastLimitAlone(_ pages: Int32, before: Int32) -> Bool {
        let limit = Self.inlineLimitPages
        // Every frame before this commit folded: the log restarted with its transaction (a log
        // shorter than after the last commit was restarted too).
        let folded = isCaughtUpWithTheLog
        let written = folded || pages < before ? pages : pages - before
        return written >= limit && (before < limit || folded)
    }

    /// From the writer's WAL hook, after a commit: asks the thread for a checkpoint.
    fileprivate func logGrew() {
        condition.lock()
        defer { condition.unlock() }
        guard !stopping else { return }
        requested = true
        if thread == nil {
            let thread = Thread { [self] in runLoop() }
            thread.name = "tether.checkpoint"
            self.thread = thread
            thread.start()
        } else {
            condition.signal()
        }
    }

    /// How many checkpoints ran here, whether or not they folded the whole log (for tests).
    var completedCheckpoints: Int {
        condition.lock()
        defer { condition.unlock() }
        return checkpointCount
    }

    /// Whether the checkpoints asked for are all done and the last folded the whole log (one
    /// that met commits still being written folds only part of it, and the commits after it ask
    /// again): what the WAL hook and the tests ask.
    var isCaughtUpWithTheLog: Bool {
        condition.lock()
        defer { condition.unlock() }
        return lastFoldedWholeLog && !requested && !running
    }

    /// Looks again after a checkpoint that could not fold the whole log (a reader on an older
    /// snapshot, a writer resetting the log): the writer may commit nothing more to ask again.
    /// After the last, only the next commit asks.
    static let retryDelays: [TimeInterval] = [0.01, 0.1, 1]

    private func runLoop() {
        var retryDelays = ArraySlice<TimeInterval>()
        while true {
            condition.lock()
            var isRetry = false
            if !requested, !stopping, let delay = retryDelays.popFirst() {
                _ = condition.wait(until: Date(timeIntervalSinceNow: delay))
                isRetry = !requested
                requested = true
            }
            while !requested && !stopping { condition.wait() }
            if stopping {
                if let connection { sqlite3_close_v2(connection) }
                connection = nil
                thread = nil
                condition.broadcast()
                condition.unlock()
                return
            }
            requested = false
            running = true
            condition.unlock()
            let foldedWholeLog = checkpoint()
            condition.lock()
            checkpointCount += 1
            lastFoldedWholeLog = foldedWholeLog
            running = false
            condition.unlock()
            if foldedWholeLog {
                retryDelays = []
            } else if !isRetry {
                retryDelays = Self.retryDelays[...]
            }
        }
    }

    /// One PASSIVE checkpoint: as many frames as no reader still needs, waiting for no one.
    /// Returns whether the whole log was folded (or nothing can be done: the file cannot be
    /// opened, which the writer's next commit will find out).
    private func checkpoint() -> Bool {
        if connection == nil {
            var db: OpaquePointer?
            let rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI, nil)
            guard rc == SQLITE_OK, let db else {
                sqlite3_close_v2(db)
                return true
            }
            sqlite3_busy_timeout(db, Int32(clamping: busyTimeout.wholeMilliseconds))
            // A connection finds the log only once it reads: until then it checkpoints nothing.
            guard sqlite3_exec(db, "SELECT count(*) FROM sqlite_master", nil, nil, nil) == SQLITE_OK else {
                sqlite3_close_v2(db)
                return true
            }
            connection = db
        }
        var logPages: Int32 = 0
        var foldedPages: Int32 = 0
        let rc = sqlite3_wal_checkpoint_v2(connection, "main", SQLITE_CHECKPOINT_PASSIVE, &logPages, &foldedPages)
        return rc == SQLITE_OK && foldedPages >= logPages
    }
}

/// The writer's WAL hook, called after each commit with the log's size in pages.
private func walHook(
    _ context: UnsafeMutableRawPointer?, _ db: OpaquePointer?, _ name: UnsafePointer<CChar>?, _ pages: Int32
) -> Int32 {
    guard let context else { return SQLITE_OK }
    let checkpointer = Unmanaged<BackgroundCheckpointer>.fromOpaque(context).takeUnretainedValue()
    let before = checkpointer.logPagesAfterLastCommit
    checkpointer.logPagesAfterLastCommit = pages
    if pages >= BackgroundCheckpointer.inlineLimitPages, !checkpointer.tookShortLogPastLimitAlone(pages, before: before)
    {
        // As SQLite's automatic checkpoint does: in the commit, PASSIVE, errors ignored (busy
        // at once while the checkpointer folds the log).
        _ = sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
    } else if pages >= BackgroundCheckpointer.requestPages {
        checkpointer.logGrew()
    }
    return SQLITE_OK
}
