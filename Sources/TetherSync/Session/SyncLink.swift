import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import ServiceLifecycle
import Tether

/// How a `SyncLink` waits before connecting again: exponential backoff with jitter.
public struct ReconnectPolicy: Sendable, Equatable {
    /// The wait after the first failure (and after a session that had caught up ends).
    public var initialDelay: Duration
    /// The longest wait between two attempts.
    public var maximumDelay: Duration
    /// Each failed attempt in a row multiplies the wait by this (at least 1).
    public var multiplier: Double
    /// Each wait is moved at random by up to this fraction of itself, either way (0…1),
    /// so that nodes restarted together do not knock on a peer's door in step.
    public var jitter: Double

    /// A policy; by default the waits go 0.2 s, 0.4 s, 0.8 s… up to 30 s, each moved by up to 20 %.
    public init(
        initialDelay: Duration = .milliseconds(200), maximumDelay: Duration = .seconds(30), multiplier: Double = 2,
        jitter: Double = 0.2
    ) {
        self.initialDelay = initialDelay
        self.maximumDelay = maximumDelay
        self.multiplier = multiplier
        self.jitter = jitter
    }

    /// The wait after `failures` failed attempts in a row (1: the first), before jitter.
    public func delay(afterFailures failures: Int) -> Duration {
        let base = initialDelay / .seconds(1)
        let ceiling = max(base, maximumDelay / .seconds(1))
        // pow overflows to infinity for long failure streaks, which the ceiling caps.
        let grown = base * pow(max(1, multiplier), Double(max(0, failures - 1)))
        return Self.rounded(seconds: min(ceiling, grown))
    }

    func jittered(_ delay: Duration) -> Duration {
        let spread = min(1, max(0, jitter))
        let factor = spread == 0 ? 1 : Double.random(in: (1 - spread)...(1 + spread))
        return Self.rounded(seconds: delay / .seconds(1) * factor)
    }

    /// Whole milliseconds: waits read back exactly as configured.
    private static func rounded(seconds: Double) -> Duration {
        .milliseconds(Int64((seconds * 1000).rounded()))
    }
}

/// What happened to a `SyncLink`'s connection.
public enum SyncLinkEvent: Sendable {
    /// Connected and caught up both ways with the peer (its instance key); live from now on.
    case connected(peer: InstanceKey)
    /// The session ended (`reason`: why it failed; nil after a graceful BYE from the peer)
    /// or the peer could not be reached; the link tries again after `retryingIn`.
    case disconnected(reason: (any Error & Sendable)?, retryingIn: Duration)
}

/// A peer kept in sync: `SyncClient.keepSyncing` connects, catches up, stays live, and when the
/// session ends for any reason (the peer restarts, the network fails, a timeout) connects again
/// after a backoff, until `stop()`. Nothing is lost across reconnections: each new session
/// resumes from the cursors the last one committed.
///
///     let link = SyncClient.keepSyncing(database: db, host: "10.0.0.2", port: 7400, tls: clientTLS)
///     Task { for await event in link.events { print(event) } }
///     …
///     await link.stop()
///
/// It is a swift-service-lifecycle `Service`: it can join a `ServiceGroup`, whose graceful
/// shutdown stops it (see `run()`).
public final class SyncLink: Service, Sendable {
    /// What happens to the connection, in order; finishes after `stop()`. The newest 64 are kept
    /// when nobody reads.
    public let events: AsyncStream<SyncLinkEvent>
    private let recorder = SyncTotalsRecorder()
    private let state = NIOLockedValueBox(State())
    private let loop: NIOLockedValueBox<Task<Void, Never>?> = NIOLockedValueBox(nil)

    private struct State {
        var stopped = false
        var current: SyncConnection?
        /// The connection being opened (catching up), closed by `stop()`.
        var opening: Channel?
    }

    private let logger: Logger

    fileprivate init(events: AsyncStream<SyncLinkEvent>, logger: Logger) {
        self.events = events
        self.logger = logger
    }

    /// What every session of this link did so far, the open one included.
    public var totals: SyncTotals { recorder.snapshot }

    /// Whether a session is open and caught up now.
    public var isConnected: Bool { state.withLockedValue { $0.current != nil } }

    /// Tells the open session (if any) that this database committed changes (see `SyncConnection.notifyLocalChanges`).
    public func notifyLocalChanges() {
        state.withLockedValue { $0.current }?.notifyLocalChanges()
    }

    /// Ends the open session gracefully (BYE; the batch being applied is committed first), stops
    /// reconnecting, and returns once the link's work is over.
    public func stop() async {
        let (current, opening) = state.withLockedValue { state -> (SyncConnection?, Channel?) in
            state.stopped = true
            return (state.current, state.opening)
        }
        // A catch-up in progress is cut (the batch being applied is committed or rolled back whole,
        // and the next session resumes from the cursor); a live session ends with BYE.
        opening?.close(promise: nil)
        _ = try? await current?.stop()
        let task = loop.withLockedValue { $0 }
        task?.cancel()
        await task?.value
    }

    /// Keeps the link until the task is cancelled or its `ServiceGroup` shuts down gracefully,
    /// then stops it as `stop()` does (BYE; the batch being applied is committed first); returns
    /// once the link's work is over, at once if `stop()` was called.
    ///
    /// ```swift
    /// let link = SyncClient.keepSyncing(database: db, host: "10.0.0.2", port: 7400, tls: clientTLS)
    /// let group = ServiceGroup(services: [link], gracefulShutdownSignals: [.sigterm], logger: logger)
    /// try await group.run()
    /// ```
    public func run() async throws {
        let task = loop.withLockedValue { $0 }
        await withTaskCancellationOrGracefulShutdownHandler {
            // The loop ends only once the link is stopped.
            await task?.value
        } onCancelOrGracefulShutdown: {
            Task { await self.stop() }
        }
        await stop()
    }

    /// Remembers the channel of the connection being opened; closes it at once if the link stopped.
    fileprivate func opening(_ channel: Channel) {
        let stopped = state.withLockedValue { state -> Bool in
            if !state.stopped { state.opening = channel }
            return state.stopped
        }
        if stopped { channel.close(promise: nil) }
    }

    fileprivate func run(
        connect:
            @escaping @Sendable (SyncTotalsRecorder, _ opened: @escaping @Sendable (Channel) -> Void) async throws ->
            SyncConnection,
        policy: ReconnectPolicy,
        events continuation: AsyncStream<SyncLinkEvent>.Continuation
    ) {
        let task = Task { [self] in
            var failures = 0
            while !isStopped {
                var reason: (any Error & Sendable)?
                do {
                    let connection = try await connect(recorder) { [self] channel in opening(channel) }
                    let stoppedMeanwhile = state.withLockedValue { state -> Bool in
                        state.opening = nil
                        if !state.stopped { state.current = connection }
                        return state.stopped
                    }
                    if stoppedMeanwhile {
                        _ = try? await connection.stop()
                        break
                    }
                    failures = 0
                    logger.debug(
                        "link connected and caught up",
                        metadata: [SyncLogMetadataKey.peerInstanceKey: "\(connection.peer)"])
                    continuation.yield(.connected(peer: connection.peer))
                    do { _ = try await connection.result() } catch { reason = error }
                    state.withLockedValue { $0.current = nil }
                } catch {
                    state.withLockedValue { $0.opening = nil }
                    reason = error
                }
                if isStopped { break }
                failures += 1
                let wait = policy.jittered(policy.delay(afterFailures: failures))
                logger.log(
                    level: reason == nil ? .info : .warning, "link down, connecting again later",
                    metadata: [
                        SyncLogMetadataKey.reason: "\(reason.map { "\($0)" } ?? "the peer said BYE")",
                        "tether.retry_in": "\(wait)",
                        "tether.failures": "\(failures)",
                    ])
                continuation.yield(.disconnected(reason: reason, retryingIn: wait))
                do { try await Task.sleep(for: wait) } catch { break }
            }
            continuation.finish()
        }
        loop.withLockedValue { $0 = task }
    }

    private var isStopped: Bool { state.withLockedValue { $0.stopped } }
}

extension SyncClient {
    /// Keeps this database in sync with a server until `stop()`: connects (as `connect` does),
    /// and connects again with backoff whenever the session ends or the server cannot be reached.
    /// Failures are reported on `events`, never thrown: a peer that is down now may be up later.
    public static func keepSyncing(
        database: Database, host: String, port: Int, tls: TLSContext,
        options: SyncOptions = SyncOptions(), reconnect: ReconnectPolicy = ReconnectPolicy()
    ) -> SyncLink {
        keepSyncing(
            database: database, host: host, port: port, tls: tls, sessionOptions: NextSessionOptions(options),
            reconnect: reconnect)
    }

    /// Keeps syncing as above; each connection's session takes `sessionOptions` as they are when
    /// it starts (a `SyncNode` shares them with its server).
    static func keepSyncing(
        database: Database, host: String, port: Int, tls: TLSContext, sessionOptions: NextSessionOptions,
        reconnect: ReconnectPolicy
    ) -> SyncLink {
        let (events, continuation) = AsyncStream.makeStream(
            of: SyncLinkEvent.self, bufferingPolicy: .bufferingNewest(64))
        let address: Logger.MetadataValue = "\(PeerAddress(host: host, port: port))"
        var logger = sessionOptions.current.logger
        logger[metadataKey: SyncLogMetadataKey.link] = address
        let link = SyncLink(events: events, logger: logger)
        link.run(
            connect: { recorder, opened in
                var options = sessionOptions.current
                options.logger[metadataKey: SyncLogMetadataKey.link] = address
                return try await connect(
                    database: database, host: host, port: port, tls: tls, options: options, totals: recorder,
                    opened: opened)
            }, policy: reconnect, events: continuation)
        return link
    }
}
