import Dispatch
import Logging
import NIOCore
import NIOConcurrencyHelpers
import NIOPosix
import ServiceLifecycle
import Tether
import TetherWire

/// The channel pipeline of a sync connection: TLS, frames, session.
enum SyncPipeline {
    static func install(on channel: Channel, role: SyncSessionHandler.Role, database: Database, schema: LocalSchema, tls: TLSContext,
                        options: SyncOptions, byeWhenCaughtUp: Bool, offersLive: Bool,
                        progress: AsyncStream<SyncSessionProgress>.Continuation? = nil,
                        totals: SyncTotalsRecorder? = nil, databaseQueue: DispatchQueue? = nil) throws -> SyncSessionHandler {
        let bytes = FrameByteCounter()
        let metrics = SyncMetrics(factory: options.metricsFactory)
        let decoder = WireMessageDecoderHandler(limits: options.wireLimits, counter: bytes)
        let encoder = WireMessageEncoderHandler(limits: options.wireLimits, counter: bytes)
        let session = SyncSessionHandler(role: role, database: database, schema: schema, options: options, decoder: decoder,
                                         encoder: encoder, bytes: bytes, byeWhenCaughtUp: byeWhenCaughtUp, offersLive: offersLive,
                                         progress: progress, totals: totals, metrics: metrics, databaseQueue: databaseQueue,
                                         eventLoop: channel.eventLoop, remoteAddress: channel.remoteAddress.map(describe))
        do {
            try channel.pipeline.syncOperations.addHandlers([try TLSHandler(context: tls), HandshakeFailureCounter(metrics: metrics), decoder,
                                                                encoder, session])
        } catch {
            session.abandon(error)
            throw error
        }
        return session
    }

    /// `10.0.0.2:7400` (`[::1]:7400`), for the log.
    static func describe(_ address: SocketAddress) -> String {
        guard let ip = address.ipAddress, let port = address.port else { return "\(address)" }
        return PeerAddress(host: ip, port: port).description
    }

    /// Reads the schema off the caller's thread (never on an event loop).
    static func loadSchema(_ database: Database) async throws(SyncSessionError) -> LocalSchema {
        let result: Result<LocalSchema, SyncSessionError> = await withCheckedContinuation { continuation in
            DispatchQueueHolder.queue.async {
                do throws(SyncSessionError) { continuation.resume(returning: .success(try LocalSchema.load(from: database))) } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
        }
        return try result.get()
    }
}

private enum DispatchQueueHolder {
    static let queue = DispatchQueue(label: "tether.sync.schema", attributes: .concurrent)
}

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

    private init(port: Int, group: MultiThreadedEventLoopGroup, channel: Channel, sessions: SessionRegistry,
                 results: AsyncStream<Result<SyncSummary, SyncSessionError>>, recorder: SyncTotalsRecorder, monitor: LocalChangeMonitor,
                 collector: ScheduledGarbageCollector, logger: Logger, sessionOptions: NextSessionOptions) {
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

    /// The open connections and their sessions' end, so `stop` can close them and wait for their database work.
    final class SessionRegistry: Sendable {
        private struct State {
            var next = 0
            var open: [Int: (channel: Channel, drained: EventLoopFuture<Void>, session: NIOLoopBound<SyncSessionHandler>)] = [:]
        }
        private let state = NIOLockedValueBox(State())
        let results: AsyncStream<Result<SyncSummary, SyncSessionError>>.Continuation

        init(results: AsyncStream<Result<SyncSummary, SyncSessionError>>.Continuation) { self.results = results }

        func add(_ channel: Channel, _ session: SyncSessionHandler) {
            let id = state.withLockedValue { state in
                defer { state.next += 1 }
                state.open[state.next] = (channel, session.drained.futureResult, NIOLoopBound(session, eventLoop: channel.eventLoop))
                return state.next
            }
            let results = self.results
            session.finished.futureResult.whenComplete { result in
                results.yield(result.mapError { $0 as? SyncSessionError ?? .internalFailure("\($0)") })
            }
            session.drained.futureResult.whenComplete { [state] _ in
                _ = state.withLockedValue { $0.open.removeValue(forKey: id) }
                MemoryRelease.afterSessionEnded()
            }
        }

        /// The connections open now.
        var openCount: Int { state.withLockedValue { $0.open.count } }

        func closeAll() -> [EventLoopFuture<Void>] {
            let open = state.withLockedValue { Array($0.open.values) }
            for (channel, _, _) in open { channel.close(promise: nil) }
            return open.map(\.drained)
        }

        /// Tells every open session that this database's changes go through `latest`.
        func localChangesCommitted(through latest: Int64) {
            let open = state.withLockedValue { Array($0.open.values) }
            for (channel, _, session) in open {
                // The monitor wakes on the server's one event loop: most sessions are on it already.
                if channel.eventLoop.inEventLoop {
                    session.value.localChangesCommitted(through: latest)
                } else {
                    channel.eventLoop.execute { session.value.localChangesCommitted(through: latest) }
                }
            }
        }
    }

    /// Starts listening on `host`:`port` (0: any free port).
    public static func start(database: Database, host: String = "127.0.0.1", port: Int = 0, tls: TLSContext,
                             options: SyncOptions = SyncOptions()) async throws -> SyncServer {
        try await start(database: database, host: host, port: port, tls: tls, sessionOptions: NextSessionOptions(options))
    }

    /// Starts listening; each accepted session takes `sessionOptions` as they are when it starts
    /// (a `SyncNode` shares them with its links).
    static func start(database: Database, host: String, port: Int, tls: TLSContext,
                      sessionOptions: NextSessionOptions) async throws -> SyncServer {
        // What the server itself uses is read once: its log, how often it looks for other programs' commits, when it collects garbage.
        let options = sessionOptions.current
        guard tls.configuration.role == .server else {
            throw SyncSessionError.internalFailure("SyncServer needs a server TLS configuration, not a \(tls.configuration.role) one")
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
        let collector = ScheduledGarbageCollector(database: database, schedule: options.garbageCollection,
                                                  metrics: GarbageCollectionMetrics(factory: options.metricsFactory), logger: logger)
        // Its own queue: its check takes the writer to fold in other programs' writes, and must not hold up the sessions' reads.
        // One for the whole server, however many sessions it holds. How far the sequence went also
        // tells the collector of large deletes, this process's and other programs'.
        let monitor = LocalChangeMonitor(database: database, queue: DispatchQueue(label: "tether.sync.server.changes"),
                                         eventLoop: group.next()) { latest in
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
                            installed.completeWith(Result {
                                let session = try SyncPipeline.install(on: channel, role: .server, database: database, schema: try schema.get(),
                                                                       tls: tls, options: sessionOptions.current, byeWhenCaughtUp: false, offersLive: true,
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
            return SyncServer(port: bound, group: group, channel: channel, sessions: sessions, results: results, recorder: recorder,
                              monitor: monitor, collector: collector, logger: logger, sessionOptions: sessionOptions)
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

/// The client side of sync: one session that catches up and ends (`syncOnce`, `startSync`),
/// or a link kept open that reconnects by itself (`keepSyncing`).
///
/// ```swift
/// let tls = try TLSContext(configuration: .client(
///     certificateChainFile: "north.pem", privateKeyFile: "north.key", trustedCAFile: "ca.pem"))
/// let summary = try await SyncClient.syncOnce(database: db, host: "10.0.0.2", port: 7400, tls: tls)
///
/// let link = SyncClient.keepSyncing(database: db, host: "10.0.0.2", port: 7400, tls: tls)
/// // … later
/// await link.stop()
/// ```
public enum SyncClient {
    /// Connects to a sync server, catches up both ways (the server's changes
    /// applied here, this database's applied there and acknowledged), says BYE
    /// and closes. Throws `SyncSessionError` (schema mismatch, a peer's ERROR,
    /// a connection lost midway, …) or the connection's error.
    ///
    ///     let summary = try await SyncClient.syncOnce(database: db, host: "10.0.0.2", port: 7400, tls: clientTLS)
    ///     print("sent \(summary.changesSent), received \(summary.changesReceived)")
    public static func syncOnce(database: Database, host: String, port: Int, tls: TLSContext,
                                options: SyncOptions = SyncOptions()) async throws -> SyncSummary {
        try await startSync(database: database, host: host, port: port, tls: tls, options: options).summary()
    }

    /// Connects like `syncOnce` and returns as soon as the connection is open, with the
    /// session's progress to follow:
    ///
    ///     let run = try await SyncClient.startSync(database: db, host: "10.0.0.2", port: 7400, tls: clientTLS)
    ///     for await step in run.progress {
    ///         print("\(step.done.changesReceived) of \(step.changesExpectedToReceive ?? 0) received")
    ///     }
    ///     let summary = try await run.summary()
    public static func startSync(database: Database, host: String, port: Int, tls: TLSContext,
                                 options: SyncOptions = SyncOptions()) async throws -> SyncRun {
        let (progress, continuation) = AsyncStream.makeStream(of: SyncSessionProgress.self, bufferingPolicy: .bufferingNewest(SyncSessionProgress.bufferedSnapshots))
        let client: OpenedSession
        do {
            client = try await openSession("syncOnce", database: database, host: host, port: port, tls: tls, options: options,
                                           byeWhenCaughtUp: true, offersLive: false, progress: continuation)
        } catch {
            continuation.finish()
            throw error
        }
        return SyncRun(client: client, progress: progress)
    }

    /// A client session being opened: its channel, and what its handler will report.
    fileprivate struct OpenedSession: Sendable {
        let group: MultiThreadedEventLoopGroup
        let channel: Channel
        let finished: EventLoopFuture<SyncSummary>
        let drained: EventLoopFuture<Void>
        let caughtUp: EventLoopFuture<InstanceKey>
        let handler: EventLoopFuture<NIOLoopBound<SyncSessionHandler>>
    }

    /// Connects a client session to the server (the part `syncOnce` and
    /// `connect` share). On failure nothing is left running.
    fileprivate static func openSession(_ caller: String, database: Database, host: String, port: Int, tls: TLSContext,
                                        options: SyncOptions, byeWhenCaughtUp: Bool, offersLive: Bool,
                                        progress: AsyncStream<SyncSessionProgress>.Continuation?,
                                        totals: SyncTotalsRecorder? = nil,
                                        opened: (@Sendable (Channel) -> Void)? = nil) async throws -> OpenedSession {
        guard tls.configuration.role == .client else {
            throw SyncSessionError.internalFailure("\(caller) needs a client TLS configuration, not a \(tls.configuration.role) one")
        }
        let schema = try await SyncPipeline.loadSchema(database)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let loop = group.next()
        let finished = loop.makePromise(of: SyncSummary.self)
        let drained = loop.makePromise(of: Void.self)
        let caughtUp = loop.makePromise(of: InstanceKey.self)
        let handler = loop.makePromise(of: NIOLoopBound<SyncSessionHandler>.self)
        let installed = NIOLockedValueBox(false)
        do {
            let channel = try await ClientBootstrap(group: loop)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let session = try SyncPipeline.install(on: channel, role: .client, database: database, schema: schema, tls: tls,
                                                               options: options, byeWhenCaughtUp: byeWhenCaughtUp, offersLive: offersLive,
                                                               progress: progress, totals: totals)
                        session.finished.futureResult.cascade(to: finished)
                        session.drained.futureResult.cascade(to: drained)
                        session.caughtUp.futureResult.cascade(to: caughtUp)
                        handler.succeed(NIOLoopBound(session, eventLoop: channel.eventLoop))
                        installed.withLockedValue { $0 = true }
                        opened?(channel)
                    }
                }
                .connect(host: host, port: port)
                .flatMapErrorThrowing { error in
                    // A session installed on the channel completes the promises itself as the channel closes.
                    if !installed.withLockedValue({ $0 }) {
                        finished.fail(error)
                        drained.succeed(())
                        caughtUp.fail(error)
                        handler.fail(error)
                    }
                    throw error
                }
                .get()
            return OpenedSession(group: group, channel: channel, finished: finished.futureResult, drained: drained.futureResult,
                                 caughtUp: caughtUp.futureResult, handler: handler.futureResult)
        } catch {
            // The session's last work runs on the event loop: wait for it before shutting the loop down.
            try? await drained.futureResult.get()
            try? await group.shutdownGracefully()
            throw error
        }
    }
}

/// A `syncOnce` in progress (`SyncClient.startSync`): its progress, and its end.
public final class SyncRun: Sendable {
    /// Snapshots of the session's progress, the newest 64 kept when the reader is slower; finishes when the session ends.
    public let progress: AsyncStream<SyncSessionProgress>
    private let client: SyncClient.OpenedSession

    fileprivate init(client: SyncClient.OpenedSession, progress: AsyncStream<SyncSessionProgress>) {
        self.client = client
        self.progress = progress
    }

    /// Waits for the end of the session and returns its summary, or throws why it failed.
    public func summary() async throws -> SyncSummary {
        let summary: SyncSummary
        do {
            summary = try await client.finished.get()
        } catch {
            try? await client.channel.close()
            try? await client.drained.get()
            try? await client.group.shutdownGracefully()
            throw error
        }
        try? await client.drained.get()
        try await client.group.shutdownGracefully()
        return summary
    }

    /// Closes the connection now (as a network failure would): the batch being applied is
    /// committed or rolled back whole; `summary()` then throws `connectionClosed`.
    public func cancel() {
        client.channel.close(promise: nil)
    }
}

/// A long-lived sync session (§8.4): caught up both ways when `SyncClient.connect` returns,
/// then kept open, each side pulling the other's changes when told of them by CHANGED.
public final class SyncConnection: Sendable {
    /// The server's instance key.
    public let peer: InstanceKey
    /// Snapshots of the session's progress, the newest 64 kept when the reader is slower; finishes when the session ends.
    public let progress: AsyncStream<SyncSessionProgress>
    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let session: NIOLoopBound<SyncSessionHandler>
    private let finished: EventLoopFuture<SyncSummary>
    private let drained: EventLoopFuture<Void>
    /// Tells the session of this database's new changes (tests count its checks).
    let monitor: LocalChangeMonitor

    fileprivate init(peer: InstanceKey, group: MultiThreadedEventLoopGroup, channel: Channel, session: NIOLoopBound<SyncSessionHandler>,
                     finished: EventLoopFuture<SyncSummary>, drained: EventLoopFuture<Void>, progress: AsyncStream<SyncSessionProgress>,
                     monitor: LocalChangeMonitor) {
        self.monitor = monitor
        self.peer = peer
        self.progress = progress
        self.group = group
        self.channel = channel
        self.session = session
        self.finished = finished
        self.drained = drained
    }

    /// Tells the session that this database may have new changes: it sends CHANGED to the server
    /// if the server lacks them and is not pulling. A commit through the same `Database` does so
    /// by itself, at once, and another process's commit soon after (see `SyncServer.notifyLocalChanges`).
    public func notifyLocalChanges() {
        let session = self.session
        channel.eventLoop.execute { session.value.checkLocalChanges() }
    }

    /// Completes when the session ends: its summary after a graceful BYE (from either side), or why it failed.
    public func result() async throws -> SyncSummary {
        try await finished.get()
    }

    /// Says BYE, waits for the server's BYE and the end of the session's database work, and closes.
    /// Returns the session's summary; throws why the session failed if it had already failed.
    public func stop() async throws -> SyncSummary {
        let session = self.session
        channel.eventLoop.execute { session.value.sayBye() }
        let result: Result<SyncSummary, any Error>
        do { result = .success(try await finished.get()) } catch { result = .failure(error) }
        channel.close(promise: nil)
        try? await drained.get()
        try? await group.shutdownGracefully()
        return try result.get()
    }
}

extension SyncClient {
    /// Connects to a sync server, catches up both ways, and returns the open session, which stays
    /// open until `stop()`, a BYE from the server, or a failure (see `result()`). With `livePush`
    /// negotiated (§8.4), each side announces its new changes with CHANGED and the other pulls them;
    /// with a server that does not offer it, the session stays open but nothing more is pulled.
    /// Throws like `syncOnce` if the catch-up fails.
    public static func connect(database: Database, host: String, port: Int, tls: TLSContext,
                               options: SyncOptions = SyncOptions()) async throws -> SyncConnection {
        try await connect(database: database, host: host, port: port, tls: tls, options: options, totals: nil)
    }

    /// `opened` receives the connection's channel as soon as it exists, so that the caller can
    /// close it during the catch-up.
    static func connect(database: Database, host: String, port: Int, tls: TLSContext, options: SyncOptions,
                        totals: SyncTotalsRecorder?, opened: (@Sendable (Channel) -> Void)? = nil) async throws -> SyncConnection {
        let (progress, continuation) = AsyncStream.makeStream(of: SyncSessionProgress.self, bufferingPolicy: .bufferingNewest(SyncSessionProgress.bufferedSnapshots))
        let client: OpenedSession
        do {
            client = try await openSession("connect", database: database, host: host, port: port, tls: tls, options: options,
                                           byeWhenCaughtUp: false, offersLive: true, progress: continuation, totals: totals,
                                           opened: opened)
        } catch {
            continuation.finish()
            throw error
        }
        do {
            // This process's commits, and other programs', reach the session from the start, not
            // only once caught up: a catch-up may wait long (the peer's batches deferred for its
            // clock) while this side's changes flow (see `LocalChangeMonitor`).
            let session = try await client.handler.get()
            let commits = LocalChangeMonitor(database: database, queue: DispatchQueue(label: "tether.sync.client.changes"),
                                             eventLoop: client.channel.eventLoop) { latest in
                session.value.localChangesCommitted(through: latest)
            }
            commits.start(pollInterval: options.changeCheckInterval)
            client.drained.whenComplete { _ in commits.stop() }
            let peer: InstanceKey
            do {
                peer = try await client.caughtUp.get()
            } catch {
                client.channel.close(promise: nil)
                try? await client.drained.get()
                // The session's own reason (an ERROR, a timeout) rather than "closed during catch-up".
                _ = try await client.finished.get()
                throw error
            }
            return SyncConnection(peer: peer, group: client.group, channel: client.channel, session: session, finished: client.finished,
                                  drained: client.drained, progress: progress, monitor: commits)
        } catch {
            try? await client.group.shutdownGracefully()
            throw error
        }
    }
}
