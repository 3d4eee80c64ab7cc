import Tether

/// When a sync server collects garbage by itself — and so a `SyncNode` and `tether serve`: the
/// tombstones every remembered peer acknowledged, the records of evictions they were sent, insert
/// ranges with nothing left to tell (`Database.collectGarbage(_:)`), after forgetting the peers
/// not seen within `forgetPeersAfter`.
///
/// A run goes on the server's own queue, never on an event loop and never two at once, in steps of
/// one write transaction: the sessions' writes go on between two steps. It runs every `interval`,
/// and sooner when `afterDeletes` tombstones were written since the last run; one that stops at
/// its `timeLimit` goes on `catchUpDelay` later.
///
/// ```swift
/// var options = SyncOptions()
/// options.garbageCollection.interval = .seconds(60)
/// options.garbageCollection.forgetPeersAfter = .seconds(7 * 86_400)   // a week
/// ```
public struct GarbageCollectionSchedule: Sendable, Equatable {
    /// How long from one run to the next (default 10 minutes); nil: none on a schedule.
    public var interval: Duration?
    /// Peers not seen for this long are forgotten at the next run (default
    /// ``defaultForgetPeersAfter``, 30 days); nil: never. A forgotten peer no longer holds
    /// tombstones back; if it returns it gets a full resync, and its changes are taken once it
    /// acknowledged it.
    public var forgetPeersAfter: Duration?
    /// How long one run may take, roughly: it stops between two steps (default 200 ms); nil: until
    /// everything collectable is collected.
    public var timeLimit: Duration?
    /// How soon a run follows one that stopped at its time limit, or large deletes (default 1 s).
    public var catchUpDelay: Duration
    /// A run starts `catchUpDelay` after this many tombstones were written since the last one —
    /// rows deleted here or by a peer — rather than at the end of the interval (default 10,000);
    /// nil: only on the schedule. The server counts them once its commits advanced the sequence
    /// by that much, so the writers never count anything. While that many stay kept (the peers
    /// online have not acknowledged them yet), runs follow at twice the delay each time, up to
    /// 64 times `catchUpDelay`.
    public var afterDeletes: Int?

    /// 30 days: a peer away for a month (a site closed over a holiday, a laptop left in a drawer)
    /// is still remembered, and one gone for good holds back at most a month of deletes. A peer
    /// forgotten too early loses nothing: it gets a full resync when it returns.
    public static let defaultForgetPeersAfter: Duration = .seconds(30 * 86_400)

    /// The defaults: every 10 minutes and after 10,000 deletes, 200 ms at most a run, peers
    /// forgotten after 30 days unseen.
    public init(
        interval: Duration? = .seconds(600),
        forgetPeersAfter: Duration? = GarbageCollectionSchedule.defaultForgetPeersAfter,
        timeLimit: Duration? = .milliseconds(200), catchUpDelay: Duration = .seconds(1), afterDeletes: Int? = 10_000
    ) {
        self.interval = interval
        self.forgetPeersAfter = forgetPeersAfter
        self.timeLimit = timeLimit
        self.catchUpDelay = catchUpDelay
        self.afterDeletes = afterDeletes.map { max(1, $0) }
    }

    /// No run at all: the program calls `Database.collectGarbage(_:)` itself.
    public static let never = GarbageCollectionSchedule(interval: nil, afterDeletes: nil)

    /// Whether a run happens at all.
    var isEnabled: Bool { interval != nil || afterDeletes != nil }

    /// The options of one run.
    var runOptions: Database.GarbageCollectionOptions {
        Database.GarbageCollectionOptions(forgetPeersUnseenFor: forgetPeersAfter, timeLimit: timeLimit)
    }
}
