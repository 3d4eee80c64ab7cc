import Dispatch
import Foundation
import Synchronization

/// Learns that another connection — another process, or another `Database` on the same file —
/// committed to a database, for whoever must then look (observation reads the changes back, a
/// sync server tells its sessions). One per database, however many watch.
///
/// While nobody writes it costs nothing: it sleeps until the kernel says the write-ahead log
/// (or, in rollback-journal mode, the database file) was written (`FileChangeNotifier`), then
/// reads `PRAGMA data_version` on the writer, which moves only for other connections' commits,
/// and tells its subscribers when it moved.
///
/// The kernel tells of a commit's last write to the log, its commit frame, not of the commit
/// being published: the writer then syncs the log (with `synchronous = FULL`: seconds on a busy
/// disk), updates the wal-index in the -shm file — a store to shared memory, which inotify does
/// not report — and releases the log's write lock. So each look first asks whether a
/// connection holds that lock (`WALWriteLock`, one system call: the writer is not touched while
/// it is held), and is repeated (`followUpDelays`) until one finds it free: every transaction
/// that wrote before had then ended, and the data version read next covers its commit. The
/// first look after a quiet spell is made at once, so that a lone commit is told within the
/// tenth of a millisecond its writer takes to publish it. In rollback-journal mode the look
/// itself waits for the writer's lock (the busy timeout).
///
/// Where files cannot be watched (no inotify, no way to ask for the lock, or
/// `Configuration.watchesFiles` off) it looks every `interval` its subscribers asked for
/// instead (the shortest), as everything did before.
final class ExternalCommitWatch: @unchecked Sendable {
    /// Looks after file writes: the first at once, then, while a connection holds the log's write
    /// lock, these apart (the last repeated): a commit is published microseconds after its last
    /// write, a long transaction (another program's bulk load) is looked at rarely.
    static let followUpDelays: [DispatchTimeInterval] = [
        .microseconds(100), .microseconds(300), .milliseconds(1), .milliseconds(10), .milliseconds(100),
    ]
    /// A write told while a look is due already (a burst of writes): that look comes no later
    /// than this, and the follow-ups after it start from the same delay.
    static let burstDelay = DispatchTimeInterval.milliseconds(1)

    private struct Subscriber {
        let pollInterval: Duration?
        let handler: @Sendable () -> Void
    }

    weak var database: Database?
    /// Everything below is used on this queue only.
    private let queue = DispatchQueue(label: "tether.external-commits")
    private var subscribers: [Int: Subscriber] = [:]
    private let nextID = Atomic<Int>(0)
    private var fileWatch: FileChangeNotifier.Watch?
    /// Asked before each look while files are watched in WAL mode.
    private var writeLock: WALWriteLock?
    /// Set once the files could not be watched (or the watch was lost): the watch polls.
    private var polls = false
    private var pollTimer: DispatchSourceTimer?
    private var pollInterval: Duration?
    /// The look after file writes, and which of `followUpDelays` comes next (past the end: the last).
    private var lookTimer: DispatchSourceTimer?
    private var lookDeadline: DispatchTime?
    private var nextFollowUp = 0
    /// `PRAGMA data_version` on the writer at the last look (nil: no look yet, so the first tells).
    private var lastDataVersion: Int64?

    /// How many times it looked at the database (tests bound an idle database's looks with it).
    let looks = Atomic<Int>(0)
    /// Whether it watches files (false: it polls, or nobody subscribed).
    private let watchingFiles = Atomic<Bool>(false)
    var isWatchingFiles: Bool { watchingFiles.load(ordering: .relaxed) }

    deinit {
        pollTimer?.cancel()
        lookTimer?.cancel()
    }

    /// Calls `handler` on the watch's queue once the watch is in place (what was committed before
    /// is the subscriber's to look at then), and after each commit of another connection since
    /// (rarely also when it cannot tell: a spurious call costs the subscriber one look).
    /// `pollInterval`: how often to look where files cannot be watched (nil: never). Returns the
    /// id to unsubscribe.
    func subscribe(pollInterval: Duration?, _ handler: @escaping @Sendable () -> Void) -> Int {
        let id = nextID.add(1, ordering: .relaxed).newValue
        queue.async { [self] in
            subscribers[id] = Subscriber(pollInterval: pollInterval, handler: handler)
            update()
            handler()
        }
        return id
    }

    func unsubscribe(_ id: Int) {
        queue.async { [self] in
            subscribers[id] = nil
            update()
        }
    }

    /// The database is closing: nothing is watched any more.
    func stop() {
        queue.sync {
            subscribers.removeAll()
            update()
        }
    }

    // MARK: Watching (on the queue)

    /// Watches (or polls) while someone subscribes, nothing otherwise.
    private func update() {
        guard !subscribers.isEmpty, let database, !database.isMemory else {
            fileWatch = nil
            writeLock = nil
            watchingFiles.store(false, ordering: .relaxed)
            pollTimer?.cancel()
            pollTimer = nil
            pollInterval = nil
            lookTimer?.cancel()
            lookTimer = nil
            lookDeadline = nil
            return
        }
        if fileWatch == nil, !polls {
            if let watch = watchFiles(of: database) {
                fileWatch = watch
                watchingFiles.store(true, ordering: .relaxed)
            } else {
                polls = true
            }
            // Once watched: a commit from now on is told by the files, one before by the call
            // each subscriber gets as it joins.
            lastDataVersion = readState(of: database)?.dataVersion
        }
        if polls { updatePolling() }
    }

    /// Watches the write-ahead log and the database file (and finds how to ask for the log's
    /// write lock); nil where that cannot be done.
    private func watchFiles(of database: Database) -> FileChangeNotifier.Watch? {
        guard database.configuration.watchesFiles, let notifier = FileChangeNotifier.shared,
            !database.path.hasPrefix("file:")
        else { return nil }
        let log = database.path + "-wal"
        var paths = [database.path]
        var lock: WALWriteLock?
        if FileManager.default.fileExists(atPath: log) {
            // Without the lock, a commit published after its last write would go unnoticed.
            lock = WALWriteLock(databasePath: database.path)
            guard lock != nil else { return nil }
            paths.append(log)
        } else {
            // Without its log a database in WAL mode cannot be watched (commits go to a log not
            // there yet); in rollback-journal mode, they go to the file itself.
            let mode = try? database.writeWithoutTransaction {
                try $0.fetchValue("PRAGMA journal_mode", as: String.self)
            }
            guard let mode, mode.lowercased() != "wal" else { return nil }
        }
        guard let watch = notifier.watch(paths, { [weak self] change in self?.filesChanged(change) }) else {
            return nil
        }
        writeLock = lock
        return watch
    }

    private func filesChanged(_ change: FileChangeNotifier.Change) {
        queue.async { [self] in
            switch change {
            case .written:
                if lookDeadline == nil {
                    // The first write after a quiet spell: look now.
                    nextFollowUp = 0
                    lookTimerFired()
                } else {
                    nextFollowUp = Self.followUpDelays.firstIndex(of: Self.burstDelay) ?? 0
                    armLook(after: .now() + Self.burstDelay)
                }
            case .watchLost:
                // The file went (or events were dropped for good): look now, then poll.
                fileWatch = nil
                writeLock = nil
                watchingFiles.store(false, ordering: .relaxed)
                polls = true
                look()
                update()
            }
        }
    }

    /// Arms a look at `deadline` (by default `followUpDelays[nextFollowUp]`, or the last, from
    /// now), unless one is armed sooner.
    private func armLook(after deadline: DispatchTime? = nil) {
        guard !subscribers.isEmpty else { return }
        let deadline =
            deadline ?? DispatchTime.now() + Self.followUpDelays[min(nextFollowUp, Self.followUpDelays.count - 1)]
        if let armed = lookDeadline, armed <= deadline { return }
        let timer: DispatchSourceTimer
        if let existing = lookTimer {
            timer = existing
        } else {
            timer = DispatchSource.makeTimerSource(queue: queue)
            timer.setEventHandler { [weak self] in self?.lookTimerFired() }
            timer.resume()
            lookTimer = timer
        }
        timer.schedule(deadline: deadline, leeway: .microseconds(50))
        lookDeadline = deadline
    }

    private func lookTimerFired() {
        lookDeadline = nil
        guard !look() else { return }
        armLook()
        nextFollowUp += 1
    }

    private func updatePolling() {
        let interval = subscribers.values.compactMap(\.pollInterval).min()
        guard interval != pollInterval else { return }
        pollTimer?.cancel()
        pollTimer = nil
        pollInterval = interval
        guard let interval else { return }
        let nanoseconds = max(1_000_000, Int(clamping: interval.wholeNanoseconds))
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + .nanoseconds(nanoseconds), repeating: .nanoseconds(nanoseconds))
        timer.setEventHandler { [weak self] in self?.look() }
        timer.resume()
        pollTimer = timer
    }

    /// One look: tells the subscribers when another connection committed since the last. Returns
    /// whether it settled the writes told before it: no connection held the log's write lock as
    /// it began (each transaction that wrote had ended, its commit published) and the data
    /// version could be read after.
    @discardableResult
    private func look() -> Bool {
        guard let database, !subscribers.isEmpty else { return true }
        // A transaction still writing: nothing to read yet, and the writer is left alone.
        if writeLock?.isHeld() == true { return false }
        looks.add(1, ordering: .relaxed)
        guard let state = readState(of: database) else { return false }
        if state.dataVersion != lastDataVersion {
            lastDataVersion = state.dataVersion
            for subscriber in subscribers.values { subscriber.handler() }
        }
        return !state.logWriteLocked
    }

    /// `PRAGMA data_version` on the writer — it moves with each commit of another connection
    /// only — and whether a connection held the log's write lock just before it was read (true
    /// when that could not be told). Asked on the writer, so never of this database's own
    /// transactions. Nil, without waiting, while the writer is held for long (`WriterWaits`: a
    /// catch-up applied as it arrives, whose own log writes wake the watch, would otherwise be
    /// asked to give the writer up by the look they caused; no other connection commits during
    /// its transaction, and the look is made again later).
    private func readState(of database: Database) -> (dataVersion: Int64, logWriteLocked: Bool)? {
        func read(_ connection: Connection) throws -> (dataVersion: Int64, logWriteLocked: Bool)? {
            let locked = writeLock == nil ? false : writeLock?.isHeld() ?? true
            return try connection.fetchValue("PRAGMA data_version", as: Int64.self).map { ($0, locked) }
        }
        if database.writerWaits.someoneHoldsForLong {
            return (try? database.writeWithoutTransactionIfWriterFree(read)) ?? nil
        }
        return (try? database.writeWithoutTransaction(read)) ?? nil
    }
}

extension Database {
    /// Calls `handler` after another connection committed to this database — another process
    /// (the sqlite3 shell, a `tether` command), or another `Database` on the same file — never
    /// for this `Database`'s own commits (`observeCommittedSequences` tells those). The handler
    /// runs on a queue of the database; it may use the database.
    ///
    /// On Linux the kernel tells of the file writes (inotify), so nothing runs while nobody
    /// writes. Elsewhere, or when the process cannot get an inotify instance, the database is
    /// looked at every `pollInterval` instead (one `PRAGMA data_version` on the writer; nil: never).
    ///
    /// - Returns: the token that keeps the handler: it is removed when the token is released.
    public func observeExternalCommits(
        pollingEvery pollInterval: Duration? = .milliseconds(50),
        _ handler: @escaping @Sendable () -> Void
    ) -> ObservationToken {
        let watch = observation.externalCommits
        let id = watch.subscribe(pollInterval: pollInterval, handler)
        return ObservationToken { [weak watch] in watch?.unsubscribe(id) }
    }
}
