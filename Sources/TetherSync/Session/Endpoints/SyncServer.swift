// The sync server: listening, accepting sessions, new options for the next ones, stopping.

import Dispatch
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import Tether

/// A sync server: accepts TLS connections and runs a session on each, serving
/// the database's changes and applying the clients'.
///
/// The synced schema announced in HELLO is read for each connection: a migration while the
/// server runs is announced to the peers that connect after it (§8.2 of Protocol/README.md).
///
/// ```swift
/// let tls = try TLSContext(configuration: .server(
///     certificateChainFile: "hub.pem", privateKeyFile: "hub.key", trustedCAFile: "ca.pem"))
/// let server = try await SyncServer.start(database: db, host: "0.0.0.0", port: 7400, tls: tls)
/// // … until the program stops
/// try await server.stop()
/// ```
///
/// It is a swift-service-lifecycle `Service`: started, it can join a `ServiceGroup`, whose
/// graceful shutdown stops it (see `run()`).
public final class SyncServer: Service, Sendable {
    /// The port it listens on (the one chosen by the system when started with port 0).
    public let port: Int
    /// How each session ended, in the order they ended: its summary after a
    /// graceful BYE, or why it failed. Finishes when the server stops.
    public let sessionResults: AsyncStream<Result<SyncSummary, SyncSessionError>>
    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let sessions: SessionRegistry
    /// Tells the sessions of this database's new changes (tests count its checks).
    let monitor: LocalChangeMonitor
    /// Collects the database's garbage as `SyncOptions.garbageCollection` says.
    private let collector: ScheduledGarbageCollector
    private let recorder: SyncTotalsRecorder
    private let logger: Logger
    /// The options each accepted session starts with.
    private let sessionOptions: NextSessionOptions
    /// Opens when the listening socket closes. Not the channel's `closeFuture`: awaited after
    /// the stop, that would need the event loop, shut down by then.
    private let closed = OneTimeSignal()
    /// The one stop, which every call of `stop()` (and the end of `run()`) awaits.
    private let stopping = SharedStop()

    private init(
        port: Int, group: MultiThreadedEventLoopGroup, channel: Channel, sessions: SessionRegistry,
        results: AsyncStream<Result<SyncSummary, SyncSessionError>>, recorder: SyncTotalsRecorder,
        monitor: LocalChangeMonitor,
        collector: ScheduledGarbageCollector, logger: Logger, sessionOptions: NextSessionOptions
    ) {
        self.monitor = monitor
        self.collector = collector
        self.logger = logger
        self.sessionOptions = sessionOptions
        channel.closeFuture.whenComplete { [closed] _ in closed.open() }
        self.port = port
        self.group = group
        self.channel = channel
        self.sessions = sessions
        self.recorder = recorder
        sessionResults = results
    }

    /// What every session of this server did so far, the open ones included.
    public var totals: SyncTotals { recorder.snapshot }

    /// Starts listening on `host`:`port` (0: any free port).
    public static func start(
        database: Database, host: String = "127.0.0.1", port: Int = 0, tls: TLSContext,
        options: SyncOptions = SyncOptions()
    ) async throws -> SyncServer {
        try await start(
            database: database, host: host, port: port, tls: tls,
            sessionOptions: NextSessionOptions(options))
    }

    /// Starts listening; each accepted session takes `sessionOptions` as they are when it starts
    /// (a `SyncNode` shares them with its links).
    static func start(
        database: Database, host: String, port: Int, tls: TLSContext,
        sessionOptions: NextSessionOptions
    ) async throws -> SyncServer {
        // What the server itself uses is read once: its log, how often it looks for other programs' commits,
        // when it collects garbage.
        let options = sessionOptions.current
        guard tls.configuration.role == .server else {
            throw SyncSessionError.internalFailure(
                "SyncServer needs a server TLS configuration, not a \(tls.configuration.role) one")
        }
        // Read once here so that a database that cannot be served fails to start; then again for
        // each connection (below), so that a migration while the server runs is announced.
        _ = try await SyncPipeline.loadSchema(database)
        let (results, continuation) = AsyncStream<Result<SyncSummary, SyncSessionError>>.makeStream()
        let sessions = SessionRegistry(results: continuation)
        let recorder = SyncTotalsRecorder()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let databaseQueue = DispatchQueue(label: "tether.sync.server.database")
        var logger = options.logger
        let collector = ScheduledGarbageCollector(
            database: database, schedule: options.garbageCollection,
            metrics: GarbageCollectionMetrics(factory: options.metricsFactory),
            logger: logger)
        // Its own queue: its check takes the writer to fold in other programs' writes, and must not hold up the
        // sessions' reads.
        // One for the whole server, however many sessions it holds. How far the sequence went also
        // tells the collector of large deletes, this process's and other programs'.
        let monitor = LocalChangeMonitor(
            database: database, queue: DispatchQueue(label: "tether.sync.server.changes"),
            eventLoop: group.next()
        ) { latest in
            sessions.localChangesCommitted(through: latest)
            collector.sequenceAdvanced(to: latest)
        }
        do {
            let channel = try await ServerBootstrap(group: group)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { channel in
                    let installed = channel.eventLoop.makePromise(of: Void.self)
                    DispatchQueueHolder.queue.async {
                        let schema = Result { () throws(SyncSessionError) in try LocalSchema.load(from: database) }
                        channel.eventLoop.execute {
                            installed.completeWith(
                                Result {
                                    let session = try SyncPipeline.install(
                                        on: channel, role: .server, database: database, schema: try schema.get(),
                                        tls: tls,
                                        options: sessionOptions.current, byeWhenCaughtUp: false, offersLive: true,
                                        totals: recorder, databaseQueue: databaseQueue)
                                    sessions.add(channel, session)
                                })
                        }
                    }
                    return installed.futureResult
                }
                .bind(host: host, port: port).get()
            guard let bound = channel.localAddress?.port else {
                try? await channel.close()
                throw SyncSessionError.transport("the server socket on \(host):\(port) has no local port")
            }
            monitor.start(pollInterval: options.changeCheckInterval)
            collector.start()
            logger[metadataKey: "tether.listen"] = "\(PeerAddress(host: host, port: bound))"
            logger.info("sync server listening", metadata: ["tether.instance": "\(database.instanceKey)"])
            return SyncServer(
                port: bound, group: group, channel: channel, sessions: sessions, results: results,
                recorder: recorder, monitor: monitor, collector: collector, logger: logger,
                sessionOptions: sessionOptions)
        } catch {
            continuation.finish()
            try? await group.shutdownGracefully()
            if let io = error as? IOError {
                let reason = io.errnoCode == EADDRINUSE ? "the address is already in use" : "\(io)"
                throw SyncSessionError.transport("cannot listen on \(host):\(port): \(reason)")
            }
            throw error
        }
    }

    /// The sessions accepted from now on take `options` (peer policies, interest, limits, timeouts,
    /// their log); the sessions open now keep theirs to their end. The server's own log, how
    /// often it looks for other programs' commits (`changeCheckInterval`) and when it collects
    /// garbage (`garbageCollection`) stay as started.
    ///
    /// ```swift
    /// var options = server.options
    /// options.peers[.name("north")] = PeerPolicy(scopes: ["orders": .filter("site IN ('north', 'south')")])
    /// server.replaceOptions(options)   // north's next session holds both sites' orders
    /// ```
    public func replaceOptions(_ options: SyncOptions) {
        sessionOptions.replace(with: options)
    }

    /// The options the next accepted session takes.
    public var options: SyncOptions { sessionOptions.current }

    /// Tells the live sessions (clients connected with `SyncClient.connect`) that this database
    /// may have new changes: each sends CHANGED to its client if the client lacks them and is not
    /// pulling. A commit through the server's `Database` does so by itself, at once, and so does
    /// another process's commit, noticed from the file system (`Database.observeExternalCommits`;
    /// within `SyncOptions.changeCheckInterval` where that cannot be done): this is for a caller
    /// that knows of a change before those do.
    public func notifyLocalChanges() {
        monitor.checkNow()
    }

    /// Stops listening, closes every connection and waits for their sessions' database work to
    /// end: the batch each was applying is committed or rolled back whole. Calling it again (or
    /// while it runs) waits for the same stop.
    public func stop() async throws {
        try await stopping.run { [self] in try await stopOnce() }
    }

    private func stopOnce() async throws {
        logger.info("sync server stopping", metadata: ["tether.open_sessions": "\(sessions.openCount)"])
        monitor.stop()
        await collector.stop()
        try? await channel.close()
        for drained in sessions.closeAll() { try? await drained.get() }
        sessions.results.finish()
        try await group.shutdownGracefully()
        logger.info("sync server stopped")
    }

    /// Returns once the listening socket has closed (by `stop()`, or by itself).
    func listeningEnded() async {
        await closed.wait()
    }

    /// Serves until the task is cancelled or its `ServiceGroup` shuts down gracefully, then
    /// stops as `stop()` does; returns at once if `stop()` was called. Throws if the listening
    /// socket closed by itself.
    ///
    /// ```swift
    /// let server = try await SyncServer.start(database: db, port: 7400, tls: tls)
    /// let group = ServiceGroup(services: [server], gracefulShutdownSignals: [.sigterm], logger: logger)
    /// try await group.run()
    /// ```
    public func run() async throws {
        await withTaskCancellationOrGracefulShutdownHandler {
            await listeningEnded()
        } onCancelOrGracefulShutdown: {
            // The stop closes the socket, which ends the wait above.
            Task { try? await self.stop() }
        }
        let stopRequested = stopping.wasRequested
        try await stop()
        if !stopRequested {
            logger.error("the sync server's socket closed by itself")
            throw SyncSessionError.transport("the sync server's listening socket closed")
        }
    }
}
