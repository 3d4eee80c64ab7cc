import ArgumentParser
import Dispatch
import Foundation
import Logging
import Prometheus
import ServiceLifecycle
import Tether
import TetherSync

#if canImport(Glibc)
    import Glibc
#endif

/// `tether serve`: a replication node (a `SyncNode`) run in a `ServiceGroup` (with the metrics
/// endpoint) until SIGINT or SIGTERM shuts the group down gracefully.
struct Serve: AsyncParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run as a sync node: accept peers, connect to the listed ones, relay changes between all of them.",
        discussion: """
            Prints "listening on HOST:PORT as KEY" on stdout once it accepts connections (with port 0, the port \
            chosen), \
            and with --metrics "metrics on HOST:PORT" once that endpoint answers (GET /metrics: Prometheus text; \
            GET /health: 200 while serving, 503 while stopping). \
            Peers that go away are reconnected with backoff. SIGINT or SIGTERM stop it cleanly: the batch being \
            applied is committed or rolled back whole, then it exits 0. Exit 69 when it cannot listen (the port is in \
            use). \
            SIGHUP reads the configuration file (--config) again: the peer policies (--allow, --read-only-peer, \
            --peer-policy), --interest and --log-level apply from the next session (sessions in progress keep theirs), \
            and it prints "reloaded configuration from FILE: …"; a configuration that is not valid is refused with a \
            logged \
            error, the previous one kept. --db, --listen, --cert, --key, --ca, --peer, --metrics, --max-clock-skew, \
            --gc-interval and --forget-peers-after change only at a restart (a reload that changes one says so). \
            It collects garbage by itself every --gc-interval and after 10,000 deletes, 200 ms at most a run \
            (the rest goes on a second later), forgetting first the peers not seen for --forget-peers-after; \
            a run that removed something is logged at info, each peer forgotten at notice.
            """)
    static let configKeys =
        DatabaseOption<ExistingDatabase>.configKeys + ["listen"] + TLSOptions.configKeys
        + ["peer", "max-clock-skew", "metrics", "gc-interval"] + ForgetPeersOption.configKeys
        + WholeCatchUpsOption.configKeys
        + PeerPolicyOptions.configKeys
        + InterestOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @Option(help: ArgumentHelp("The address to listen on (port 0: any free port).", valueName: "host:port"))
    var listen: String

    @OptionGroup(title: "TLS options") var tls: TLSOptions

    @Option(help: ArgumentHelp("A peer to connect to and keep in sync (repeatable).", valueName: "host:port"))
    var peer: [String] = []

    @OptionGroup var peerPolicies: PeerPolicyOptions

    @OptionGroup var interest: InterestOption

    @OptionGroup var clockSkew: ClockSkewOption

    @OptionGroup var wholeCatchUps: WholeCatchUpsOption

    @Option(
        help: ArgumentHelp(
            """
            Serve Prometheus metrics over HTTP on this address (GET /metrics, GET /health; port 0: any free \
            port). Off by default.
            """,
            valueName: "host:port"))
    var metrics: String?

    @Option(
        name: .customLong("gc-interval"),
        help: ArgumentHelp(
            """
            Collect garbage (tombstones every remembered peer acknowledged) this often (90s, 10m, 12h, 30d; \
            default 10m), and after 10,000 deletes; never: not at all (tether gc by hand).
            """,
            valueName: "duration"))
    var gcInterval: String?

    @OptionGroup var forgetPeers: ForgetPeersOption

    /// What a running node cannot change: a SIGHUP that finds one changed says it waits for a
    /// restart. (The certificate and key files are read at the start only, even where their paths stay.)
    var restartOnlySettings: [RestartOnlySetting] {
        [
            RestartOnlySetting(flag: "db", value: db.path), RestartOnlySetting(flag: "listen", value: listen),
            RestartOnlySetting(flag: "cert", value: tls.cert), RestartOnlySetting(flag: "key", value: tls.key),
            RestartOnlySetting(flag: "ca", value: tls.ca),
            RestartOnlySetting(flag: "peer", value: peer.isEmpty ? "none" : peer.joined(separator: ", ")),
            RestartOnlySetting(flag: "metrics", value: metrics ?? "off"),
            RestartOnlySetting(flag: "max-clock-skew", value: clockSkew.seconds.map { "\($0) s" } ?? "the default"),
            RestartOnlySetting(flag: "gc-interval", value: gcInterval ?? "the default"),
            RestartOnlySetting(flag: "forget-peers-after", value: forgetPeers.description),
        ]
    }

    func validate() throws {
        do {
            _ = try PeerAddress(parsing: listen, allowsAnyPort: true)
            if let metrics { _ = try PeerAddress(parsing: metrics, allowsAnyPort: true) }
            for address in peer { _ = try PeerAddress(parsing: address) }
        } catch let error as CLIError {
            throw ValidationError(error.message)
        }
        _ = try garbageCollection()
    }

    /// When the node collects garbage: `--gc-interval` (never: not at all) and `--forget-peers-after`.
    func garbageCollection() throws -> GarbageCollectionSchedule {
        var schedule = GarbageCollectionSchedule()
        if let gcInterval {
            guard let interval = try DurationFlag.parse(gcInterval, flag: "gc-interval", allowsNever: true) else {
                return .never
            }
            schedule.interval = interval
        }
        schedule.forgetPeersAfter = try forgetPeers.horizon()
        return schedule
    }

    /// The session options the flags ask for.
    func syncOptions() throws -> SyncOptions {
        var options = SyncOptions()
        options.peers = try peerPolicies.policies()
        options.interest = try interest.rules()
        options.garbageCollection = try garbageCollection()
        wholeCatchUps.apply(to: &options)
        return options
    }

    func run() async throws {
        var logger = common.bootstrapLogging(label: "tether.serve")
        // Signals are caught from here on, so that one arriving while the node starts is not lost;
        // `StopRequests` and `ConfigurationReloads` act on them once the service group runs.
        let stopSignals = await SignalWatcher(signals: [SIGINT, SIGTERM])
        let reloadSignals = await SignalWatcher(signals: [SIGHUP])
        let listenAddress = try PeerAddress(parsing: listen, allowsAnyPort: true)
        let peers = try peer.map { try PeerAddress(parsing: $0) }
        let serverTLS = try tls.context(role: .server)
        let clientTLS = try tls.context(role: .client)
        let metricsAddress = try metrics.map { try PeerAddress(parsing: $0, allowsAnyPort: true) }
        var options = try syncOptions()
        let database = try db.openExisting()
        try clockSkew.apply(to: database)
        guard !database.syncedTables.isEmpty else {
            throw CLIError(
                .dataError,
                "database \(db.path) syncs no table (turn sync on with: tether init --db \(db.path) --sync TABLE)")
        }
        logger[metadataKey: "node"] = "\(database.instanceKey)"
        try Self.check(options: options, against: database)

        let factory = metricsAddress.map { _ in Self.metricsFactory() }
        options.metricsFactory = factory
        // The sessions, the server and the links log to stderr too, at --log-level.
        options.logger = logger
        let node = try await SyncNode.start(
            database: database, host: listenAddress.host, port: listenAddress.port,
            serverTLS: serverTLS, clientTLS: clientTLS, peers: peers, options: options)
        let boundAddress = PeerAddress(host: listenAddress.host, port: node.port)
        Output.line("listening on \(boundAddress) as \(database.instanceKey)")
        logger.info(
            """
            serving \(db.path) (tables \(database.syncedTables.joined(separator: ", "))) on \(boundAddress); \
            peers: \(peers.isEmpty ? "none" : peers.map(\.description).joined(separator: ", "))
            """)
        var endpoint: MetricsEndpoint?
        if let metricsAddress, let factory {
            let started: MetricsEndpoint
            do {
                started = try await Self.startMetrics(
                    on: metricsAddress, factory: factory, database: database, logger: logger)
            } catch {
                try? await node.stop()
                throw error
            }
            endpoint = started
            Output.line("metrics on \(PeerAddress(host: metricsAddress.host, port: started.port))")
        }

        // Graceful shutdown goes through the services last to first: the stop is logged, /health
        // answers 503, then the node stops — the batch being applied committed or rolled back
        // whole. The endpoint closes after. The group traps no signal itself: `StopRequests`
        // is the one owner of SIGINT and SIGTERM (see there why).
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(service: node, serviceName: "sync node")
        ]
        if let endpoint {
            services.append(.init(service: HealthWhileServing(endpoint: endpoint), serviceName: "metrics endpoint"))
        }
        services.append(
            .init(
                service: ConfigurationReloads(
                    signals: reloadSignals, arguments: Array(CommandLine.arguments.dropFirst()),
                    path: common.config, startedWith: restartOnlySettings, node: node,
                    database: database, logger: logger),
                serviceName: "configuration reloads"))
        services.append(
            .init(
                service: StopRequests(signals: stopSignals, logger: logger),
                successTerminationBehavior: .gracefullyShutdownGroup, serviceName: "stop requests"))
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(services: services, logger: logger))
        do {
            try await group.run()
        } catch {
            await endpoint?.stop()
            try? await node.stop()
            throw error
        }
        await endpoint?.stop()
        let totals = node.totals
        logger.notice(
            """
            stopped after \(totals.sessions) session(s): sent \(totals.changesSent), received \
            \(totals.changesReceived), applied \(totals.applied), conflicts \(totals.conflicts), kept aside \
            \(totals.keptAside)
            """)
        try? database.close()
    }

    /// Fails before any session starts when a peer policy names a table the database does not
    /// sync, when a peer's scopes cannot be used on it (an unknown table or column, a filter that
    /// is not a condition…: the `ScopeError`), or when the interest cannot.
    static func check(options: SyncOptions, against database: Database) throws {
        let synced = Set(database.syncedTables)
        let rules = options.peers.rules.map { ($0.key.description, $0.value) } + [("*", options.peers.others)]
        for (name, policy) in rules.sorted(by: { $0.0 < $1.0 }) {
            for table in (policy.allowedTables ?? []).sorted() where !synced.contains(table) {
                throw CLIError(
                    .usage,
                    """
                    --peer-policy \(name): table \(table) is not synced by this database (it syncs \
                    \(synced.sorted().joined(separator: ", ")))
                    """)
            }
        }
        do {
            try options.peers.validate(against: database)
        } catch let error as PeerPolicyError {
            // PeerPolicies names the catch-all policy in words; the flag names it `*`.
            let name = options.peers.rules.keys.contains { $0.description == error.peer } ? error.peer : "*"
            throw CLIError(.usage, "--peer-policy \(name): \(error.scopeError)")
        }
        try InterestOption.check(options.interest, against: database)
    }

    /// The Prometheus factory the sessions record into: swift-prometheus' defaults, with finer
    /// buckets for the batch apply latency (most batches apply in a few milliseconds) and for a
    /// garbage collection's run (bounded to 200 ms, most far shorter).
    private static func metricsFactory() -> PrometheusMetricsFactory {
        var factory = PrometheusMetricsFactory(registry: PrometheusCollectorRegistry())
        let milliseconds: [Duration] = [
            .microseconds(500), .milliseconds(1), .milliseconds(2.5), .milliseconds(5), .milliseconds(10),
            .milliseconds(25),
            .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5),
            .seconds(5), .seconds(10),
        ]
        factory.durationHistogramBuckets[SyncMetrics.Name.batchApplySeconds] = milliseconds
        factory.durationHistogramBuckets[SyncMetrics.Name.gcRunSeconds] = milliseconds
        return factory
    }

    /// Starts the `--metrics` endpoint; each scrape first computes the pending changes per peer.
    private static func startMetrics(
        on address: PeerAddress, factory: PrometheusMetricsFactory, database: Database,
        logger: Logger
    ) async throws -> MetricsEndpoint {
        let metrics = SyncMetrics(factory: factory)
        return try await MetricsEndpoint.start(host: address.host, port: address.port, registry: factory.registry) {
            do {
                try metrics.recordPendingChanges(in: database)
            } catch {
                logger.warning("metrics: could not count the changes pending for each peer: \(error)")
            }
        }
    }
}

/// Turns SIGINT or SIGTERM, whenever it came — while the node started or since — into the group's
/// graceful shutdown (by returning: its success ends the group gracefully), and logs the stop.
///
/// The only watcher of those signals, never cancelled: cancelling a dispatch source drops a signal
/// it has taken but not yet handed to its handler. (When the group trapped them too and this
/// watch stopped as the group's began, a signal taken just before was lost by both.)
struct StopRequests: Service {
    let signals: SignalWatcher
    let logger: Logger

    func run() async throws {
        // Also ends on the group's graceful shutdown (nothing else asks for one today) and, silently,
        // when the group is cancelled.
        let signal = await cancelWhenGracefulShutdown { [signals] in await signals.next() }
        guard !Task.isCancelled else { return }
        logger.notice("stop requested: stopping", metadata: signal.map { ["signal": "\(Self.name(of: $0))"] } ?? [:])
    }

    static func name(of signal: Int32) -> String {
        switch signal {
        case SIGINT: return "SIGINT"
        case SIGTERM: return "SIGTERM"
        default: return "signal \(signal)"
        }
    }
}

/// The metrics endpoint in the service group: /health answers 200 until the group shuts down
/// gracefully, then 503 while the node stops (the endpoint closes once the group is over).
struct HealthWhileServing: Service {
    let endpoint: MetricsEndpoint

    func run() async throws {
        try? await gracefulShutdown()
        endpoint.stopServing()
    }
}

/// Turns the given signals into values to await, from its creation for the life of the process
/// (a signal caught before anyone awaits is kept for the next `next()`).
///
/// A signal's default action, ending the process, applies until the watch is in place: creating
/// the watcher waits for that. On Linux libdispatch then has a handler of its own installed,
/// which forwards each signal to the source; on Darwin the signal must be ignored for the source
/// to get it, which is done only then too (ignored any earlier, a signal would be lost).
/// Unchecked: Dispatch does not mark its sources Sendable, though they are thread-safe; they are
/// set once here and never changed.
final class SignalWatcher: @unchecked Sendable {
    private let stream: AsyncStream<Int32>
    private let sources: [any DispatchSourceSignal]

    init(signals: [Int32]) async {
        let (stream, continuation) = AsyncStream.makeStream(of: Int32.self)
        self.stream = stream
        sources = signals.map { number in
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { continuation.yield(number) }
            return source
        }
        // A source is registered asynchronously once resumed: each is awaited.
        for (source, number) in zip(sources, signals) {
            await withCheckedContinuation { (registered: CheckedContinuation<Void, Never>) in
                source.setRegistrationHandler {
                    #if canImport(Darwin)
                        signal(number, SIG_IGN)
                    #endif
                    registered.resume()
                }
                source.resume()
            }
        }
    }

    /// The next signal caught (nil only if the awaiting task is cancelled).
    func next() async -> Int32? {
        var iterator = stream.makeAsyncIterator()
        return await iterator.next()
    }
}
