import ArgumentParser
import Dispatch
import Foundation
import Logging
import Prometheus
import Tether
import TetherSync

#if canImport(Glibc)
import Glibc
#endif

/// `tether serve`: a replication node (a `SyncNode`) until SIGINT or SIGTERM.
struct Serve: AsyncParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run as a sync node: accept peers, connect to the listed ones, relay changes between all of them.",
        discussion: """
            Prints "listening on HOST:PORT as KEY" on stdout once it accepts connections (with port 0, the port chosen), \
            and with --metrics "metrics on HOST:PORT" once that endpoint answers (GET /metrics: Prometheus text; \
            GET /health: 200 while serving, 503 while stopping). \
            Peers that go away are reconnected with backoff. SIGINT or SIGTERM stop it cleanly: the batch being \
            applied is committed or rolled back whole, then it exits 0. Exit 69 when it cannot listen (the port is in use).
            """)
    static let configKeys = DatabaseOption<ExistingDatabase>.configKeys + ["listen"] + TLSOptions.configKeys
        + ["peer", "max-clock-skew", "metrics"] + PeerPolicyOptions.configKeys + InterestOption.configKeys

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

    @Option(help: ArgumentHelp("Serve Prometheus metrics over HTTP on this address (GET /metrics, GET /health; port 0: any free port). Off by default.",
                               valueName: "host:port"))
    var metrics: String?

    func validate() throws {
        do {
            _ = try PeerAddress(parsing: listen, allowsAnyPort: true)
            if let metrics { _ = try PeerAddress(parsing: metrics, allowsAnyPort: true) }
            for address in peer { _ = try PeerAddress(parsing: address) }
        } catch let error as CLIError {
            throw ValidationError(error.message)
        }
    }

    /// The session options the flags ask for.
    func syncOptions() throws -> SyncOptions {
        var options = SyncOptions()
        options.peers = try peerPolicies.policies()
        options.interest = try interest.rules()
        return options
    }

    func run() async throws {
        var logger = common.bootstrapLogging(label: "tether.serve")
        let listenAddress = try PeerAddress(parsing: listen, allowsAnyPort: true)
        let peers = try peer.map { try PeerAddress(parsing: $0) }
        let serverTLS = try tls.context(role: .server)
        let clientTLS = try tls.context(role: .client)
        let metricsAddress = try metrics.map { try PeerAddress(parsing: $0, allowsAnyPort: true) }
        var options = try syncOptions()
        let database = try db.openExisting()
        try clockSkew.apply(to: database)
        guard !database.syncedTables.isEmpty else {
            throw CLIError(.dataError, "database \(db.path) syncs no table (turn sync on with: tether init --db \(db.path) --sync TABLE)")
        }
        logger[metadataKey: "node"] = "\(database.instanceKey)"
        try Self.check(options: options, against: database)

        let factory = metricsAddress.map { _ in Self.metricsFactory() }
        options.metricsFactory = factory
        // Signals are caught from the start, so that one arriving while the node starts is not lost.
        let stopRequests = SignalWatcher(signals: [SIGINT, SIGTERM])
        let node = try await SyncNode.start(database: database, host: listenAddress.host, port: listenAddress.port,
                                            serverTLS: serverTLS, clientTLS: clientTLS, peers: peers, options: options)
        let boundAddress = PeerAddress(host: listenAddress.host, port: node.port)
        Output.line("listening on \(boundAddress) as \(database.instanceKey)")
        logger.info("serving \(db.path) (tables \(database.syncedTables.joined(separator: ", "))) on \(boundAddress); peers: \(peers.isEmpty ? "none" : peers.map(\.description).joined(separator: ", "))")
        var endpoint: MetricsEndpoint?
        if let metricsAddress, let factory {
            let started: MetricsEndpoint
            do {
                started = try await Self.startMetrics(on: metricsAddress, factory: factory, database: database, logger: logger)
            } catch {
                try? await node.stop()
                throw error
            }
            endpoint = started
            Output.line("metrics on \(PeerAddress(host: metricsAddress.host, port: started.port))")
        }

        let eventLog = Task { [logger] in
            for await event in node.events { Self.log(event, to: logger) }
        }
        let signal = await stopRequests.next()
        logger.notice("\(signal.map(Self.signalName) ?? "a stop request") received: stopping")
        endpoint?.stopServing()
        try await node.stop()
        await endpoint?.stop()
        await eventLog.value
        let totals = node.totals
        logger.notice("stopped after \(totals.sessions) session(s): sent \(totals.changesSent), received \(totals.changesReceived), applied \(totals.applied), conflicts \(totals.conflicts), kept aside \(totals.keptAside)")
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
                throw CLIError(.usage, "--peer-policy \(name): table \(table) is not synced by this database (it syncs \(synced.sorted().joined(separator: ", ")))")
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
    /// buckets for the batch apply latency (most batches apply in a few milliseconds).
    private static func metricsFactory() -> PrometheusMetricsFactory {
        var factory = PrometheusMetricsFactory(registry: PrometheusCollectorRegistry())
        factory.durationHistogramBuckets[SyncMetrics.Name.batchApplySeconds] = [
            .microseconds(500), .milliseconds(1), .milliseconds(2.5), .milliseconds(5), .milliseconds(10), .milliseconds(25),
            .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5),
            .seconds(5), .seconds(10),
        ]
        return factory
    }

    /// Starts the `--metrics` endpoint; each scrape first computes the pending changes per peer.
    private static func startMetrics(on address: PeerAddress, factory: PrometheusMetricsFactory, database: Database,
                                     logger: Logger) async throws -> MetricsEndpoint {
        let metrics = SyncMetrics(factory: factory)
        return try await MetricsEndpoint.start(host: address.host, port: address.port, registry: factory.registry) {
            do {
                try metrics.recordPendingChanges(in: database)
            } catch {
                logger.warning("metrics: could not count the changes pending for each peer: \(error)")
            }
        }
    }

    private static func log(_ event: SyncNodeEvent, to logger: Logger) {
        switch event {
        case let .acceptedSessionEnded(.success(summary)):
            logger.info("session with \(summary.peer.map { "\($0)" } ?? "a peer") ended: sent \(summary.changesSent), received \(summary.changesReceived), conflicts \(summary.conflicts)")
        case let .acceptedSessionEnded(.failure(error)):
            logger.warning("a peer's session failed: \(error)")
        case let .link(address, .connected(peer)):
            logger.info("connected to \(address) (\(peer)), caught up")
        case let .link(address, .disconnected(reason, retryingIn)):
            let why = reason.map { "\($0)" } ?? "the peer said BYE"
            logger.warning("link to \(address) down (\(why)); retrying in \(retryingIn.formatted(.units(allowed: [.seconds, .milliseconds], width: .narrow)))")
        }
    }

    private static func signalName(_ signal: Int32) -> String {
        switch signal {
        case SIGINT: return "SIGINT"
        case SIGTERM: return "SIGTERM"
        default: return "signal \(signal)"
        }
    }
}

/// Turns the given signals into values to await (their default action, ending the process, is turned off).
final class SignalWatcher {
    private let stream: AsyncStream<Int32>
    private let sources: [any DispatchSourceSignal]

    init(signals: [Int32]) {
        let (stream, continuation) = AsyncStream.makeStream(of: Int32.self)
        self.stream = stream
        sources = signals.map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { continuation.yield(number) }
            source.resume()
            return source
        }
    }

    /// The next signal caught (nil never happens in practice: the stream is not finished).
    func next() async -> Int32? {
        var iterator = stream.makeAsyncIterator()
        return await iterator.next()
    }
}
