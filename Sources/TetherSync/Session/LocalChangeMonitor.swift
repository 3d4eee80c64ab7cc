import Dispatch
import NIOConcurrencyHelpers
import NIOCore
import Tether

/// Watches one database's last sequence number for all the sessions of a server, so that an
/// idle session costs nothing but its heartbeats: one check every `interval` for the whole
/// server (not one per session), and the live sessions woken only when a commit brought
/// changes — by this process (`checkNow`, called on `notifyLocalChanges` and after each
/// batch a node applies) or by another program (noticed by the periodic check).
final class LocalChangeMonitor: Sendable {
    private struct State {
        var latest: Int64 = 0
        var checking = false
        var checkAgain = false
        var timer: RepeatedTask?
        var stopped = false
    }

    private let database: Database
    private let queue: DispatchQueue
    private let eventLoop: EventLoop
    private let state = NIOLockedValueBox(State())
    /// Called on the event loop with the new last sequence number.
    private let wake: @Sendable (Int64) -> Void

    init(database: Database, queue: DispatchQueue, eventLoop: EventLoop, wake: @escaping @Sendable (Int64) -> Void) {
        self.database = database
        self.queue = queue
        self.eventLoop = eventLoop
        self.wake = wake
    }

    /// Starts the periodic check (nil interval: only `checkNow`).
    func start(interval: TimeAmount?) {
        guard let interval else { return }
        let period = max(.milliseconds(1), interval)
        let timer = eventLoop.scheduleRepeatedTask(initialDelay: period, delay: period) { [self] _ in checkNow() }
        state.withLockedValue { $0.timer = timer }
    }

    func stop() {
        let timer = state.withLockedValue { state -> RepeatedTask? in
            state.stopped = true
            defer { state.timer = nil }
            return state.timer
        }
        timer?.cancel()
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
            let latest = try? database.lastSequenceIncludingExternalWrites()
            let (moved, again) = state.withLockedValue { state -> (Int64?, Bool) in
                state.checking = false
                defer { state.checkAgain = false }
                guard let latest, latest > state.latest else { return (nil, state.checkAgain) }
                state.latest = latest
                return (latest, state.checkAgain)
            }
            if let moved { eventLoop.execute { self.wake(moved) } }
            if again { checkNow() }
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
