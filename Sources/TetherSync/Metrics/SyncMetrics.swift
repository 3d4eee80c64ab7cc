import Metrics
import Tether
import TetherWire

/// What sync servers, links and clients record about their sessions, through the swift-metrics
/// API: the backend (Prometheus, StatsD, a test recorder) is the program's choice, never the
/// library's.
///
/// Every session records into the factory of its `SyncOptions.metricsFactory` (nil: the global
/// `MetricsSystem.factory`, which records nothing until the program bootstraps one). ``Name``
/// lists the metrics; the README (Sync › Metrics) has them as an operator's table. Names follow
/// Prometheus' conventions (`_total` counters, `_seconds` durations).
///
/// `peer` labels hold the peer's instance key, given only to peers whose HELLO was accepted (TLS
/// and the allowlists passed): a hostile peer cannot make the series grow without bound. The bytes
/// of connections that never got that far count under `peer="unauthenticated"`.
///
///     let registry = PrometheusCollectorRegistry()   // swift-prometheus
///     var options = SyncOptions()
///     options.metricsFactory = PrometheusMetricsFactory(registry: registry)
///     let server = try await SyncServer.start(database: db, port: 7400, tls: tls, options: options)
///     // at each scrape:
///     try SyncMetrics(factory: options.metricsFactory).recordPendingChanges(in: db)
///     let text = registry.emitToString()
public struct SyncMetrics: Sendable {
    /// The metrics' names (labels, in swift-metrics' terms), with their type and dimensions.
    public enum Name {
        /// Meter (gauge): sessions whose handshake (TLS, then HELLO) succeeded, still open.
        public static let sessionsOpen = "tether_sync_sessions_open"
        /// Counter: sessions whose handshake succeeded.
        public static let sessions = "tether_sync_sessions_total"
        /// Counter by `peer`: changes sent to the peer.
        public static let changesSent = "tether_sync_changes_sent_total"
        /// Counter by `peer`: changes received from the peer (not those of a batch refused or not applied).
        public static let changesReceived = "tether_sync_changes_received_total"
        /// Counter by `peer`: received changes that changed this database.
        public static let changesApplied = "tether_sync_changes_applied_total"
        /// Counter by `peer`: frame bytes sent (every message, after LZ4, before TLS).
        public static let bytesSent = "tether_sync_bytes_sent_total"
        /// Counter by `peer`: frame bytes received.
        public static let bytesReceived = "tether_sync_bytes_received_total"
        /// Counter by `peer`: conflicts met applying the peer's changes.
        public static let conflicts = "tether_sync_conflicts_total"
        /// Counter by `peer`: the peer's changes kept aside.
        public static let keptAside = "tether_sync_changes_kept_aside_total"
        /// Timer: how long applying and committing one batch received took.
        public static let batchApplySeconds = "tether_sync_batch_apply_seconds"
        /// Gauge by `peer`: this database's changes the peer has
        /// not acknowledged (``SyncMetrics/recordPendingChanges(in:)``).
        public static let pendingChanges = "tether_sync_pending_changes"
        /// Counter by `reason`: batches this side refused whole, by the ERROR code it sent.
        public static let batchesRefused = "tether_sync_batches_refused_total"
        /// Counter by `reason`: TLS handshakes that failed, by ``TLSError`` case.
        public static let tlsHandshakeFailures = "tether_sync_tls_handshake_failures_total"
        /// Counter by `result`: garbage collections the server ran (``GarbageCollectionSchedule``), `complete`,
        /// `partial` (stopped at its time limit, the rest for the next) or `failed`.
        public static let gcRuns = "tether_sync_gc_runs_total"
        /// Counter: tombstones the server's garbage collections removed.
        public static let gcTombstonesRemoved = "tether_sync_gc_tombstones_removed_total"
        /// Counter: records of rows evicted from scoped peers the server's garbage collections removed.
        public static let gcEvictionsRemoved = "tether_sync_gc_evictions_removed_total"
        /// Counter: peers forgotten, not seen within `GarbageCollectionSchedule.forgetPeersAfter`.
        public static let gcPeersForgotten = "tether_sync_gc_peers_forgotten_total"
        /// Gauge: tombstones kept after the last garbage collection (a peer has not acknowledged
        /// them, or they wait for the next run).
        public static let gcTombstonesKept = "tether_sync_gc_tombstones_kept"
        /// Timer: how long one garbage collection took.
        public static let gcRunSeconds = "tether_sync_gc_run_seconds"
    }

    /// The `peer` label of what connections record before their HELLO is accepted.
    public static let unauthenticatedPeer = "unauthenticated"

    /// The per-peer counters, each with the count of `SyncSummary` it follows and whether a
    /// connection can add to it before its HELLO is accepted: the one list `SessionMetrics`
    /// records from.
    private static var summaryCounters: [(name: String, count: WritableKeyPath<SyncSummary, Int>, beforeHello: Bool)] {
        [
            (Name.changesSent, \.changesSent, false), (Name.changesReceived, \.changesReceived, false),
            (Name.changesApplied, \.applied, false), (Name.bytesSent, \.bytesSent, true),
            (Name.bytesReceived, \.bytesReceived, true), (Name.conflicts, \.conflicts, false),
            (Name.keptAside, \.keptAside, false),
        ]
    }

    let factory: any MetricsFactory
    let sessionsOpen: Meter
    let sessions: Counter
    let batchApply: Timer

    /// Records into `factory` (nil: the global `MetricsSystem.factory`).
    public init(factory: (any MetricsFactory)? = nil) {
        let factory = factory ?? MetricsSystem.factory
        self.factory = factory
        sessionsOpen = Meter(label: Name.sessionsOpen, factory: factory)
        sessions = Counter(label: Name.sessions, factory: factory)
        batchApply = Timer(label: Name.batchApplySeconds, factory: factory)
    }

    /// Sets `tether_sync_pending_changes` for every peer `database` knows (those that completed a
    /// session with it): the rows changed here after what the peer acknowledged, leaving out those
    /// whose state came from the peer itself (an estimate, like `tether status`'s pending). Computed
    /// when called (at each scrape), not kept up to date by the sessions: it reads the database
    /// (three counts per synced table and peer), so call it off any event loop.
    ///
    ///     let metrics = SyncMetrics(factory: factory)
    ///     try metrics.recordPendingChanges(in: db)   // then export
    public func recordPendingChanges(in database: Database) throws {
        for peer in try database.peers() {
            let pending = try database.pendingChangeCount(
                after: peer.acknowledgedThrough, excludingChangesFrom: peer.instanceKey)
            Gauge(label: Name.pendingChanges, dimensions: [("peer", "\(peer.instanceKey)")], factory: factory).record(
                pending)
        }
    }

    /// The counters that follow `SyncSummary` for `peer` (nil: a connection not authenticated, whose
    /// bytes only are counted).
    func summaryCounters(for peer: InstanceKey?) -> [(counter: Counter, count: WritableKeyPath<SyncSummary, Int>)] {
        let label = peer.map { "\($0)" } ?? Self.unauthenticatedPeer
        return Self.summaryCounters.compactMap { name, count, beforeHello in
            guard peer != nil || beforeHello else { return nil }
            return (Counter(label: name, dimensions: [("peer", label)], factory: factory), count)
        }
    }

    /// Applies a batch with `body`, recording how long it took when it succeeds.
    func measuringApply<T>(_ body: () throws -> T) rethrows -> T {
        let start = ContinuousClock.now
        let result = try body()
        batchApply.record(duration: ContinuousClock.now - start)
        return result
    }

    /// A session failed with `error`: a refused batch is counted under the ERROR code sent.
    func sessionFailed(_ error: SyncSessionError) {
        guard let reason = Self.refusalReason(error) else { return }
        Counter(label: Name.batchesRefused, dimensions: [("reason", reason)], factory: factory).increment()
    }

    /// The `reason` label of a batch this side refused, or nil when `error` is not such a refusal.
    static func refusalReason(_ error: SyncSessionError) -> String? {
        switch error {
        case .batchRejected, .tableNotAllowed, .readOnly:
            return "\(error.code)"
        case let .malformedFrame(wire):
            // A BATCH that does not decode, or breaks a rule of its own (`ChangeBatch.validate()`).
            switch wire {
            case .batch, .malformedBody(type: .batch, _): return "\(error.code)"
            default: return nil
            }
        default:
            return nil
        }
    }

    /// A TLS handshake failed with `error`.
    func handshakeFailed(_ error: TLSError) {
        Counter(
            label: Name.tlsHandshakeFailures, dimensions: [("reason", Self.handshakeFailureReason(error))],
            factory: factory
        )
        .increment()
    }

    /// The `reason` label of a failed handshake: the name of `error`'s case.
    static func handshakeFailureReason(_ error: TLSError) -> String {
        switch error {
        case .notTLS: return "notTLS"
        case .handshakeFailed: return "handshakeFailed"
        case .peerCertificateRejected: return "peerCertificateRejected"
        case .peerCertificateMissing: return "peerCertificateMissing"
        case .pinMismatch: return "pinMismatch"
        case .peerAlert: return "peerAlert"
        case .closedDuringHandshake: return "closedDuringHandshake"
        case .handshakeTimedOut: return "handshakeTimedOut"
        case .uncleanShutdown: return "uncleanShutdown"
        case .connectionFailed: return "connectionFailed"
        case .connectionClosed: return "connectionClosed"
        case .openSSLFailure: return "openSSLFailure"
        }
    }
}
