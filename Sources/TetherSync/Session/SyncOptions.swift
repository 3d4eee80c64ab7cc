import CoreMetrics
import Logging
import NIOCore
import Tether
import TetherWire

/// How a session asks for changes, and which peers it accepts. The same options serve a
/// server, a client and a node; each property says which side it matters to.
///
/// ```swift
/// var options = SyncOptions(idleTimeout: .seconds(60))
/// options.peers[.name("north")] = PeerPolicy(readOnly: true)
/// options.peers.acceptsOthers = false
/// let server = try await SyncServer.start(database: db, port: 7400, tls: tls, options: options)
/// ```
public struct SyncOptions: Sendable {
    /// The `maxChanges` / `maxBytes` this side puts in its PULLs (reference defaults 10,000 and
    /// 4 MiB: fewer, larger batches cost less per change, and stay far below the 16 MiB frame limit).
    public var batchLimits: BatchLimits
    /// The frame limits this side accepts and respects.
    public var wireLimits: WireLimits
    /// Which peers are accepted and what each may do, by the certificate each presents in the
    /// TLS handshake (never by the instance key it declares). Default: every peer the CA vouches
    /// for, allowed everything.
    public var peers: PeerPolicies
    /// What this side asks to receive, per table, from any peer (partial replication): the peer
    /// sends the rows both this interest and its own policy for this side hold. The same rules as
    /// `PeerPolicy.scopes` (without parameters); sent in HELLO, so only to a version 3 peer.
    /// Default: every row.
    public var interest: [String: SyncScope.Rule] = [:]
    /// How long this side may spend evaluating a peer's interest for one batch (see
    /// `InterestBudget`): past it, the session ends with ERROR 2 naming the tables, and nothing of
    /// the batch is sent. A session's evaluation also stops when its connection closes. Default 10 s.
    public var interestTimeLimit: TimeAmount = .seconds(10)
    /// How long the peer has, from the moment the connection is set up, to complete the TLS
    /// handshake and send its HELLO; then ERROR 10 `timeout` and the connection closes (default 10 s).
    public var helloTimeout: TimeAmount
    /// How long, once the handshake is done, the peer may send nothing at all (not even PONG)
    /// before ERROR 10 `timeout` and the connection closes (default 30 s).
    ///
    /// For `syncOnce`, it is also how long a client that does not accept the server's changes
    /// (read-only policy) waits for the server's first PULL: when none comes, the server does
    /// not accept the client's changes either, there is nothing to do both ways, and the client
    /// says BYE and returns its (empty) summary.
    public var idleTimeout: TimeAmount
    /// The heartbeat interval (nil: a third of `idleTimeout`). The connecting side sends PING when it
    /// has sent nothing for this long; the accepting side only when nothing arrived for half as
    /// long again, or to confirm that the peer read what it sent (Protocol/README.md §8.5).
    public var pingInterval: TimeAmount?
    /// Whether this side offers quiet heartbeats (capability `quietHeartbeats`, Protocol/README.md
    /// §8.5; default on). Negotiated with a peer that offers them too, a session in which nothing
    /// but PING and PONG went either way for 60 s pings every 300 s (or `pingInterval`, if longer)
    /// and allows 900 s of silence (or `idleTimeout`, if longer), until any other frame: a hub
    /// holding thousands of idle peers then hardly wakes for them. The price: a peer that vanishes
    /// from a quiet session (its host gone, the network cut) is noticed only by TCP keepalive
    /// (which the sessions enable: about two minutes) or by the idle timeout, and one whose process
    /// hangs only by the quiet idle timeout or at the next change either side sends. Turn it off
    /// where a quiet peer's hang must be noticed within `idleTimeout`.
    public var quietHeartbeats = true
    /// Live sessions (`livePush` negotiated, §8.4): how often the database is checked for
    /// changes other programs committed where the system cannot tell of them (default 50 ms;
    /// nil: never). A commit through the same `Database` needs no check: it tells the sessions
    /// at once. On Linux, another program's commit is noticed from the file system (inotify on
    /// the write-ahead log, see `Database.observeExternalCommits`) within a millisecond or two,
    /// and nothing is checked while nobody writes; this interval applies only where inotify is
    /// unavailable (another system, or the process could not get an instance: the kernel allows
    /// `fs.inotify.max_user_instances`, 128 by default, per user). A check folds in other
    /// programs' writes and reads `lastSequence()` off the event loop.
    public var changeCheckInterval: TimeAmount? = .milliseconds(50)
    /// Sessions kept open without `livePush` negotiated (a peer that does not offer it): how
    /// long this side waits, once caught up, before pulling the peer's changes again (§8.4
    /// polling; default 1 s).
    public var pollInterval: TimeAmount = .seconds(1)
    /// A session kept open whose peer's single change did not fit on the disk tries again after
    /// this long (default 1 s); batches are made smaller first, see `SyncSessionError.storage`.
    public var noRoomRetryDelay: TimeAmount = .seconds(1)
    /// A session kept open that deferred the peer's batch because the peer's clock is ahead
    /// (`Database.setMaximumClockSkew`) pulls it again after the time it takes this clock to
    /// catch up, but at least every this long (default 30 s), in case the limit was raised.
    public var clockSkewRetryInterval: TimeAmount = .seconds(30)
    /// When the server (a `SyncNode`'s included) collects garbage by itself: every 10 minutes and
    /// after 10,000 deletes, 200 ms at most a run, peers not seen for 30 days forgotten (see
    /// ``GarbageCollectionSchedule``; `.never` to call `Database.collectGarbage(_:)` yourself).
    /// Read once as the server starts, like `changeCheckInterval`; clients do not collect.
    public var garbageCollection = GarbageCollectionSchedule()
    /// Whether a catch-up from the peer is applied whole (Protocol/README.md §8.3, *Whole
    /// catch-ups*): so that a reader of this database sees only states the peer held — each of
    /// its transactions whole, never a prefix of the catch-up — its batches are applied as they
    /// arrive in one transaction that commits with the last (a file database; one in memory
    /// applies them all at the last), and staged on disk meanwhile. A cut catch-up (a crash, a
    /// lost link) leaves the state before it, and the next session goes on after what was staged.
    /// The peer serves a catch-up from one snapshot of its database, so that a busy peer still
    /// ends it.
    ///
    /// On by default. Off (`--no-whole-catch-ups` for `tether sync` and `tether serve`), each batch
    /// is applied and committed as it comes: a large catch-up shows its progress, and a writer
    /// in another process never waits for one.
    public var wholeCatchUps = true
    /// Called on the session's event loop after each batch received from the peer is applied
    /// and committed, with the number of changes it held (before its ACK is sent). The batches of
    /// a whole catch-up are applied together, with its last one: called once then, with all their
    /// changes.
    public var onBatchApplied: (@Sendable (Int) -> Void)?
    /// Where the sessions record their metrics (see ``SyncMetrics`` for the list); nil: the global
    /// `MetricsSystem.factory`, which records nothing unless the program bootstrapped one.
    /// Set it to record without touching the global one (a test, or an embedder with a
    /// registry of its own):
    ///
    ///     options.metricsFactory = PrometheusMetricsFactory(registry: registry)
    public var metricsFactory: (any MetricsFactory)?
    /// Where the sessions, the server and the links log, with the session's metadata (see
    /// ``SyncLogMetadataKey``): one line at `info` as each session opens and as it ends, one at
    /// `debug` per batch sent or applied, a failure at `warning` (the peer or the network) or
    /// `error` (this side: its database, its disk). Default: a logger that discards everything,
    /// so nothing is printed unless asked.
    ///
    ///     options.logger = Logger(label: "app.sync")
    public var logger = Logger(label: "tether.sync", factory: { _ in SwiftLogNoOpLogHandler() })

    /// Options with the given limits, peer policies and timeouts; the other properties keep their
    /// defaults and are set afterwards.
    public init(
        batchLimits: BatchLimits = SyncOptions.defaultBatchLimits, wireLimits: WireLimits = .default,
        peers: PeerPolicies = PeerPolicies(), helloTimeout: TimeAmount = .seconds(10),
        idleTimeout: TimeAmount = .seconds(30), pingInterval: TimeAmount? = nil
    ) {
        self.batchLimits = batchLimits
        self.wireLimits = wireLimits
        self.peers = peers
        self.helloTimeout = helloTimeout
        self.idleTimeout = idleTimeout
        self.pingInterval = pingInterval
    }

    /// 10,000 changes or 4 MiB per batch: the reference defaults of the protocol.
    public static let defaultBatchLimits = BatchLimits(maximumChanges: 10_000, maximumBytes: 4 << 20)

    /// The ping interval in effect: `pingInterval`, or a third of `idleTimeout`; at least 1 ms.
    var effectivePingInterval: TimeAmount {
        max(.milliseconds(1), pingInterval ?? .nanoseconds(idleTimeout.nanoseconds / 3))
    }

    /// What tests change in a session's behaviour; never set by the public API.
    var testHooks = SessionTestHooks()
}
