// The client side of sync: `syncOnce`, `startSync` and `connect`, and the session they open.

import Dispatch
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Tether

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
    public static func syncOnce(
        database: Database, host: String, port: Int, tls: TLSContext,
        options: SyncOptions = SyncOptions()
    ) async throws -> SyncSummary {
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
    public static func startSync(
        database: Database, host: String, port: Int, tls: TLSContext,
        options: SyncOptions = SyncOptions()
    ) async throws -> SyncRun {
        let (progress, continuation) = AsyncStream.makeStream(
            of: SyncSessionProgress.self, bufferingPolicy: .bufferingNewest(SyncSessionProgress.bufferedSnapshots))
        let client: OpenedSession
        do {
            client = try await openSession(
                "syncOnce", database: database, host: host, port: port, tls: tls,
                options: options, byeWhenCaughtUp: true, offersLive: false,
                progress: continuation)
        } catch {
            continuation.finish()
            throw error
        }
        return SyncRun(client: client, progress: progress)
    }

    /// A client session being opened: its channel, and what its handler will report.
    struct OpenedSession: Sendable {
        let group: MultiThreadedEventLoopGroup
        let channel: Channel
        let finished: EventLoopFuture<SyncSummary>
        let drained: EventLoopFuture<Void>
        let caughtUp: EventLoopFuture<InstanceKey>
        let handler: EventLoopFuture<NIOLoopBound<SyncSessionHandler>>
    }

    /// Connects a client session to the server (the part `syncOnce` and
    /// `connect` share). On failure nothing is left running.
    fileprivate static func openSession(
        _ caller: String, database: Database, host: String, port: Int, tls: TLSContext,
        options: SyncOptions, byeWhenCaughtUp: Bool, offersLive: Bool,
        progress: AsyncStream<SyncSessionProgress>.Continuation?,
        totals: SyncTotalsRecorder? = nil,
        opened: (@Sendable (Channel) -> Void)? = nil
    ) async throws -> OpenedSession {
        guard tls.configuration.role == .client else {
            throw SyncSessionError.internalFailure(
                "\(caller) needs a client TLS configuration, not a \(tls.configuration.role) one")
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
                        let session = try SyncPipeline.install(
                            on: channel, role: .client, database: database, schema: schema, tls: tls,
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
            return OpenedSession(
                group: group, channel: channel, finished: finished.futureResult,
                drained: drained.futureResult, caughtUp: caughtUp.futureResult,
                handler: handler.futureResult)
        } catch {
            // The session's last work runs on the event loop: wait for it before shutting the loop down.
            try? await drained.futureResult.get()
            try? await group.shutdownGracefully()
            throw error
        }
    }
}

extension SyncClient {
    /// Connects to a sync server, catches up both ways, and returns the open session, which stays
    /// open until `stop()`, a BYE from the server, or a failure (see `result()`). With `livePush`
    /// negotiated (§8.4), each side announces its new changes with CHANGED and the other pulls them;
    /// with a server that does not offer it, the session stays open but nothing more is pulled.
    /// Throws like `syncOnce` if the catch-up fails.
    public static func connect(
        database: Database, host: String, port: Int, tls: TLSContext,
        options: SyncOptions = SyncOptions()
    ) async throws -> SyncConnection {
        try await connect(database: database, host: host, port: port, tls: tls, options: options, totals: nil)
    }

    /// `opened` receives the connection's channel as soon as it exists, so that the caller can
    /// close it during the catch-up.
    static func connect(
        database: Database, host: String, port: Int, tls: TLSContext, options: SyncOptions,
        totals: SyncTotalsRecorder?,
        opened: (@Sendable (Channel) -> Void)? = nil
    ) async throws -> SyncConnection {
        let (progress, continuation) = AsyncStream.makeStream(
            of: SyncSessionProgress.self, bufferingPolicy: .bufferingNewest(SyncSessionProgress.bufferedSnapshots))
        let client: OpenedSession
        do {
            client = try await openSession(
                "connect", database: database, host: host, port: port, tls: tls,
                options: options, byeWhenCaughtUp: false, offersLive: true,
                progress: continuation, totals: totals, opened: opened)
        } catch {
            continuation.finish()
            throw error
        }
        do {
            // This process's commits, and other programs', reach the session from the start, not
            // only once caught up: a catch-up may wait long (the peer's batches deferred for its
            // clock) while this side's changes flow (see `LocalChangeMonitor`).
            let session = try await client.handler.get()
            let commits = LocalChangeMonitor(
                database: database,
                queue: DispatchQueue(label: "tether.sync.client.changes"),
                eventLoop: client.channel.eventLoop
            ) { latest in
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
            return SyncConnection(
                peer: peer, group: client.group, channel: client.channel, session: session,
                finished: client.finished, drained: client.drained, progress: progress,
                monitor: commits)
        } catch {
            try? await client.group.shutdownGracefully()
            throw error
        }
    }
}
