import Dispatch
import NIOConcurrencyHelpers
import NIOCore
import Synchronization
import Tether

/// Tells the live sessions of one database (all of a server's, or a client connection's) how
/// far its changes go, so that an idle session costs nothing but its heartbeats. A commit
/// through this process's `Database` wakes them at once, from the commit itself
/// (`Database.observeCommittedSequences`); another program's commit, once the file system says
/// the database was written (`Database.observeExternalCommits`: inotify; a look every
/// `pollInterval` where that is unavailable), or at once on `checkNow` (`notifyLocalChanges`).
/// Nothing runs while nobody writes. Wakes are coalesced: one queued on the event loop carries
/// the newest sequence number when it runs.
final class LocalChangeMonitor: Sendable {
    private struct State {
        var latest: Int64 = 0
        /// A wake is queued on the event loop: newer commits only raise `latest`.
        var wakeQueued = false
        var checking = false
        var checkAgain = false
        var commits: ObservationToken?
        var externalCommits: ObservationToken?
        var stopped = false
    }

    private let database: Database
    private let queue: DispatchQueue
    private let eventLoop: EventLoop
    private let state = NIOLockedValueBox(State())
    /// Called on the event loop with the new last sequence number.
    private let wake: @Sendable (Int64) -> Void
    /// How many times it read the database (tests bound an idle monitor's reads with it).
    let checks = Atomic<Int>(0)

    init(database: Database, queue: DispatchQueue, eventLoop: EventLoop, wake: @escaping @Sendable (Int64) -> Void) {
        self.database = database
        self.queue = queue
        self.eventLoop = eventLoop
        self.wake = wake
    }

    /// Starts watching this process's commits and other programs' (polled every `pollInterval`
    /// where the file system cannot tell of them; nil: not then; `checkNow` still checks).
    /// Subscribing waits for the writer, so it happens on the monitor's queue, followed by one
    /// check for what was committed before.
    func start(pollInterval: TimeAmount?) {
        let poll = pollInterval.map { Duration.nanoseconds(max(1_000_000, $0.nanoseconds)) }
        queue.async { [self] in
            let commits = database.observeCommittedSequences { [weak self] latest in self?.advance(to: latest) }
            let external = database.observeExternalCommits(pollingEvery: poll) { [weak self] in self?.checkNow() }
            let stopped = state.withLockedValue { state -> Bool in
                if !state.stopped {
                    state.commits = commits
                    state.externalCommits = external
                }
                return state.stopped
            }
            if stopped {
                commits.cancel()
                external.cancel()
            } else {
                checkNow()
            }
        }
    }

    func stop() {
        let (commits, external) = state.withLockedValue { state -> (ObservationToken?, ObservationToken?) in
            state.stopped = true
            defer {
                state.commits = nil
                state.externalCommits = nil
            }
            return (state.commits, state.externalCommits)
        }
        commits?.cancel()
        external?.cancel()
    }

    /// Reads the last sequence number (after folding in other programs' writes) and wakes the
    /// sessions if it moved. Checks asked for while one runs are coalesced into one more.
    func checkNow() {
        let start = state.withLockedValue { state -> Bool in
            guard !state.stopped else { return false }
            if state.checking {
                state.checkAgain = true
                return false
            }
            state.checking = true
            return true
        }
        guard start else { return }
        let database = self.database
        queue.async { [self] in
            checks.add(1, ordering: .relaxed)
            let latest = try? database.lastSequenceIncludingExternalWrites()
            let again = state.withLockedValue { state -> Bool in
                state.checking = false
                defer { state.checkAgain = false }
                return state.checkAgain
            }
            if let latest { advance(to: latest) }
            if again { checkNow() }
        }
    }

    /// This database's changes go through `latest`: the sessions are woken if that is news.
    private func advance(to latest: Int64) {
        let queueWake = state.withLockedValue { state -> Bool in
            guard !state.stopped, latest > state.latest else { return false }
            state.latest = latest
            defer { state.wakeQueued = true }
            return !state.wakeQueued
        }
        guard queueWake else { return }
        eventLoop.execute { [self] in
            let latest = state.withLockedValue { state -> Int64 in
                state.wakeQueued = false
                return state.latest
            }
            wake(latest)
        }
    }
}

extension Database {
    /// The last sequence number, once other programs' writes have theirs: what a session
    /// compares with what its peer was sent.
    func lastSequenceIncludingExternalWrites() throws -> Int64 {
        try captureExternalWrites()
        return try lastSequence()
    }
}
