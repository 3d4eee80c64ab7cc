import Metrics
import Tether

/// What one session records into its `SyncMetrics`: the session calls one method per event, on
/// its event loop.
final class SessionMetrics {
    let shared: SyncMetrics
    /// The counters following the session's summary: the peer's once its HELLO is accepted
    /// (before that, the unauthenticated ones, made only if the connection exchanged bytes).
    private var counters: [(counter: Counter, count: WritableKeyPath<SyncSummary, Int>)]?
    /// The highest value of each count recorded: a count the session takes back (a batch counted
    /// as received but not applied, which comes again) is not counted twice.
    private var recorded = SyncSummary()
    private var open = false

    init(_ shared: SyncMetrics) { self.shared = shared }

    /// The peer's HELLO was accepted.
    func sessionOpened(peer: InstanceKey) {
        guard !open else { return }
        open = true
        shared.sessionsOpen.increment()
        shared.sessions.increment()
        counters = shared.summaryCounters(for: peer)
    }

    /// The session's summary is now `summary`: what it adds is counted.
    func progressed(to summary: SyncSummary) {
        if counters == nil {
            guard summary.bytesSent > recorded.bytesSent || summary.bytesReceived > recorded.bytesReceived else {
                return
            }
            counters = shared.summaryCounters(for: nil)
        }
        for (counter, count) in counters ?? [] where summary[keyPath: count] > recorded[keyPath: count] {
            counter.increment(by: summary[keyPath: count] - recorded[keyPath: count])
            recorded[keyPath: count] = summary[keyPath: count]
        }
    }

    /// The session failed with `error` (its first error).
    func sessionFailed(_ error: SyncSessionError) {
        shared.sessionFailed(error)
    }

    /// The connection closed.
    func sessionClosed() {
        guard open else { return }
        open = false
        shared.sessionsOpen.decrement()
    }
}
