// The channel pipeline every sync connection runs (TLS, frames, session), and the schema read off the event loop.

import Dispatch
import NIOCore
import Tether
import TetherWire

/// The channel pipeline of a sync connection: TLS, frames, session.
enum SyncPipeline {
    static func install(
        on channel: Channel, role: SyncSessionHandler.Role, database: Database, schema: LocalSchema,
        tls: TLSContext, options: SyncOptions, byeWhenCaughtUp: Bool, offersLive: Bool,
        progress: AsyncStream<SyncSessionProgress>.Continuation? = nil,
        totals: SyncTotalsRecorder? = nil,
        databaseQueue: DispatchQueue? = nil
    ) throws -> SyncSessionHandler {
        let bytes = FrameByteCounter()
        let metrics = SyncMetrics(factory: options.metricsFactory)
        let decoder = WireMessageDecoderHandler(limits: options.wireLimits, counter: bytes)
        let encoder = WireMessageEncoderHandler(limits: options.wireLimits, counter: bytes)
        let session = SyncSessionHandler(
            role: role, database: database, schema: schema, options: options, decoder: decoder, encoder: encoder,
            bytes: bytes, byeWhenCaughtUp: byeWhenCaughtUp, offersLive: offersLive, progress: progress, totals: totals,
            metrics: metrics, databaseQueue: databaseQueue, eventLoop: channel.eventLoop,
            remoteAddress: channel.remoteAddress.map(describe))
        do {
            try channel.pipeline.syncOperations.addHandlers([
                try TLSHandler(context: tls),
                HandshakeFailureCounter(metrics: metrics), decoder,
                encoder, session,
            ])
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
                do throws(SyncSessionError) {
                    continuation.resume(returning: .success(try LocalSchema.load(from: database)))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
        }
        return try result.get()
    }
}

enum DispatchQueueHolder {
    static let queue = DispatchQueue(label: "tether.sync.schema", attributes: .concurrent)
}
