import NIOConcurrencyHelpers
import Tether

/// A sync session's progress: what it did so far (`done`), and how much it
/// expects to do in each direction.
///
/// The expected counts are estimates made from sequence numbers (the peer's
/// latest sequence, announced by CHANGED, minus the cursor): an upper bound,
/// since a row changed several times is sent once. They become exact (equal
/// to what was done) once a direction has received or sent its last batch.
/// Nil while unknown (before the first PULL, or for a peer that announces nothing).
public struct SyncSessionProgress: Sendable, Equatable {
    /// What the session did so far, counted as in its final summary.
    public var done: SyncSummary
    /// The changes this side expects to send in all (an estimate until the last batch; nil: unknown).
    public var changesExpectedToSend: Int?
    /// The changes this side expects to receive in all (an estimate until the last batch; nil:
    /// unknown).
    public var changesExpectedToReceive: Int?
    /// Whether both directions have caught up (each side had nothing more to send).
    public var caughtUp: Bool

    /// A progress snapshot; the default is that of a session that has done nothing yet.
    public init(
        done: SyncSummary = SyncSummary(), changesExpectedToSend: Int? = nil, changesExpectedToReceive: Int? = nil,
        caughtUp: Bool = false
    ) {
        self.done = done
        self.changesExpectedToSend = changesExpectedToSend
        self.changesExpectedToReceive = changesExpectedToReceive
        self.caughtUp = caughtUp
    }

    /// How many snapshots a progress stream keeps for a slow reader (the newest): a few per
    /// batch are made, so a reader that keeps up sees every one, and memory stays bounded.
    static let bufferedSnapshots = 64

    /// Bytes expected each way, extrapolated from the bytes per change so far (nil while unknown).
    public var bytesExpectedToSend: Int? { Self.extrapolate(done.bytesSent, done.changesSent, changesExpectedToSend) }
    /// Bytes expected to be received in all, extrapolated like `bytesExpectedToSend`.
    public var bytesExpectedToReceive: Int? {
        Self.extrapolate(done.bytesReceived, done.changesReceived, changesExpectedToReceive)
    }

    private static func extrapolate(_ bytes: Int, _ changes: Int, _ expected: Int?) -> Int? {
        guard let expected, changes > 0 else { return nil }
        return Int((Double(bytes) / Double(changes) * Double(expected)).rounded())
    }
}

/// Totals over every session of a server or a link: what `SyncServer.totals`
/// and `SyncLink.totals` report. Sessions add to them as they go (after each
/// batch sent, applied or acknowledged), not only when they end.
public struct SyncTotals: Sendable, Equatable {
    /// Sessions whose handshake succeeded.
    public var sessions = 0
    /// Changes sent to peers.
    public var changesSent = 0
    /// Changes received from peers.
    public var changesReceived = 0
    /// Received changes that changed this database.
    public var applied = 0
    /// Conflicts met applying peers' changes.
    public var conflicts = 0
    /// Received changes kept aside (they could not be applied yet).
    public var keptAside = 0
    /// Frame bytes sent (after LZ4, before TLS).
    public var bytesSent = 0
    /// Frame bytes received (after LZ4, before TLS).
    public var bytesReceived = 0

    /// Totals of nothing yet: every count 0.
    public init() {}

    /// The counts a session's summary contributes, each with its place in the totals: the one
    /// list `merge` and `add` go through.
    private static var counted: [(total: WritableKeyPath<SyncTotals, Int>, session: KeyPath<SyncSummary, Int>)] {
        [
            (\.changesSent, \.changesSent), (\.changesReceived, \.changesReceived), (\.applied, \.applied),
            (\.conflicts, \.conflicts), (\.keptAside, \.keptAside), (\.bytesSent, \.bytesSent),
            (\.bytesReceived, \.bytesReceived),
        ]
    }

    /// Adds `other`'s counts to these.
    public mutating func merge(_ other: SyncTotals) {
        sessions += other.sessions
        for (total, _) in Self.counted { self[keyPath: total] += other[keyPath: total] }
    }

    /// Adds what a session did between two of its summaries.
    mutating func add(from old: SyncSummary, to new: SyncSummary) {
        for (total, session) in Self.counted { self[keyPath: total] += new[keyPath: session] - old[keyPath: session] }
    }
}

/// Where the sessions of one server or link add up their counts (any thread).
final class SyncTotalsRecorder: Sendable {
    private let box = NIOLockedValueBox(SyncTotals())

    var snapshot: SyncTotals { box.withLockedValue { $0 } }

    func sessionStarted() { box.withLockedValue { $0.sessions += 1 } }

    func add(from old: SyncSummary, to new: SyncSummary) { box.withLockedValue { $0.add(from: old, to: new) } }
}
