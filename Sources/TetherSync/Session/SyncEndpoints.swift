import Dispatch
import NIOCore
import NIOConcurrencyHelpers
import NIOPosix
import Tether
import TetherWire

/// The channel pipeline of a sync connection: TLS, frames, session.
enum SyncPipeline {
    static func install(on channel: Channel, role: SyncSessionHandler.Role, database: Database, schema: LocalSchema, tls: TLSContext,
                        options: SyncOptions, byeWhenCaughtUp: Bool) throws -> SyncSessionHandler {
        let decoder = WireMessageDecoderHandler(limits: options.wireLimits)
        let encoder = WireMessageEncoderHandler(limits: options.wireLimits)
        let session = SyncSessionHandler(role: role, database: database, schema: schema, options: options, decoder: decoder,
                                         encoder: encoder, byeWhenCaughtUp: byeWhenCaughtUp, eventLoop: channel.eventLoop)
        do {
            try channel.pipeline.syncOperations.addHandlers([try TLSHandler(context: tls), decoder, encoder, session])
        } catch {
            session.abandon(error)
            throw error
        }
        return session
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
/// The synced schema announced in HELLO is read when the server starts.
public final class SyncServer: Sendable {
    /// The port it listens on (the one chosen by the system when started with port 0).
    public let port: Int
    /// How each session ended, in the order they ended: its summary after a
    /// graceful BYE, or why it failed. Finishes when the server stops.
    public let sessionResults: AsyncStream<Result<SyncSummary, SyncSessionError>>
    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let sessions: SessionRegistry

    private init(port: Int, group: MultiThreadedEventLoopGroup, channel: Channel, sessions: SessionRegistry,
                 results: AsyncStream<Result<SyncSummary, SyncSessionError>>) {
        self.port = port
        self.group = group
        self.channel = channel
        self.sessions = sessions
        sessionResults = results
    }

    /// The open connections and their sessions' end, so `stop` can close them and wait for their database work.
    final class SessionRegistry: Sendable {
        private struct State {
            var next = 0
            var open: [Int: (channel: Channel, drained: EventLoopFuture<Void>)] = [:]
        }
        private let state = NIOLockedValueBox(State())
        let results: AsyncStream<Result<SyncSummary, SyncSessionError>>.Continuation

        init(results: AsyncStream<Result<SyncSummary, SyncSessionError>>.Continuation) { self.results = results }

        func add(_ channel: Channel, _ session: SyncSessionHandler) {
            let id = state.withLockedValue { state in
                defer { state.next += 1 }
                state.open[state.next] = (channel, session.drained.futureResult)
                return state.next
            }
            let results = self.results
            session.finished.futureResult.whenComplete { result in
                results.yield(result.mapError { $0 as? SyncSessionError ?? .internalFailure("\($0)") })
            }
            session.drained.futureResult.whenComplete { [state] _ in
                _ = state.withLockedValue { $0.open.removeValue(forKey: id) }
            }
        }

        func closeAll() -> [EventLoopFuture<Void>] {
            let open = state.withLockedValue { Array($0.open.values) }
            for (channel, _) in open { channel.close(promise: nil) }
            return open.map(\.drained)
        }
    }

    /// Starts listening on `host`:`port` (0: any free port).
    public static func start(database: Database, host: String = "127.0.0.1", port: Int = 0, tls: TLSContext,
                             options: SyncOptions = SyncOptions()) async throws -> SyncServer {
        guard tls.configuration.role == .server else {
            throw SyncSessionError.internalFailure("SyncServer needs a server TLS configuration, not a \(tls.configuration.role) one")
        }
        let schema = try await SyncPipeline.loadSchema(database)
        let (results, continuation) = AsyncStream<Result<SyncSummary, SyncSessionError>>.makeStream()
        let sessions = SessionRegistry(results: continuation)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        do {
            let channel = try await ServerBootstrap(group: group)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let session = try SyncPipeline.install(on: channel, role: .server, database: database, schema: schema,
                                                               tls: tls, options: options, byeWhenCaughtUp: false)
                        sessions.add(channel, session)
                    }
                }
                .bind(host: host, port: port).get()
            guard let bound = channel.localAddress?.port else {
                try? await channel.close()
                throw SyncSessionError.transport("the server socket on \(host):\(port) has no local port")
            }
            return SyncServer(port: bound, group: group, channel: channel, sessions: sessions, results: results)
        } catch {
            continuation.finish()
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// Stops listening, closes every connection and waits for their sessions' database work to end.
    public func stop() async throws {
        try? await channel.close()
        for drained in sessions.closeAll() { try? await drained.get() }
        sessions.results.finish()
        try await group.shutdownGracefully()
    }
}

/// The client side of sync.
public enum SyncClient {
    /// Connects to a sync server, catches up both ways (the server's changes
    /// applied here, this database's applied there and acknowledged), says BYE
    /// and closes. Throws `SyncSessionError` (schema mismatch, a peer's ERROR,
    /// a connection lost midway, …) or the connection's error.
    public static func syncOnce(database: Database, host: String, port: Int, tls: TLSContext,
                                options: SyncOptions = SyncOptions()) async throws -> SyncSummary {
        guard tls.configuration.role == .client else {
            throw SyncSessionError.internalFailure("syncOnce needs a client TLS configuration, not a \(tls.configuration.role) one")
        }
        let schema = try await SyncPipeline.loadSchema(database)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        do {
            let loop = group.next()
            let finished = loop.makePromise(of: SyncSummary.self)
            let drained = loop.makePromise(of: Void.self)
            let channel = try await ClientBootstrap(group: loop)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let session = try SyncPipeline.install(on: channel, role: .client, database: database, schema: schema, tls: tls,
                                                               options: options, byeWhenCaughtUp: true)
                        session.finished.futureResult.cascade(to: finished)
                        session.drained.futureResult.cascade(to: drained)
                    }
                }
                .connect(host: host, port: port)
                .flatMapErrorThrowing { error in
                    finished.fail(error)
                    drained.succeed(())
                    throw error
                }
                .get()
            let summary: SyncSummary
            do {
                summary = try await finished.futureResult.get()
            } catch {
                try? await channel.close()
                try? await drained.futureResult.get()
                throw error
            }
            try? await drained.futureResult.get()
            try await group.shutdownGracefully()
            return summary
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }
}
