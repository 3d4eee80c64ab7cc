import NIOConcurrencyHelpers
import ServiceLifecycle
import Tether

/// A peer a `SyncNode` connects to.
public struct PeerAddress: Sendable, Hashable, CustomStringConvertible {
    /// The peer's host name or IP address.
    public var host: String
    /// The port its sync server listens on.
    public var port: Int

    /// The peer at `host`:`port`.
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `HOST:PORT` (`[v6]:PORT` for IPv6); nil if it is not that. Port 0 (any free port,
    /// for a listening address) only with `allowsAnyPort`.
    public init?(_ text: String, allowsAnyPort: Bool = false) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
            ((allowsAnyPort ? 0 : 1)...65535).contains(port)
        else {
            return nil
        }
        var host = String(text[..<colon])
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { return nil }
        self.host = host
        self.port = port
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

/// What happened on a `SyncNode`, for its log.
public enum SyncNodeEvent: Sendable {
    /// A session with a peer that connected to this node ended: its summary, or why it failed.
    case acceptedSessionEnded(Result<SyncSummary, SyncSessionError>)
    /// A link to a listed peer connected (and caught up) or went down.
    case link(PeerAddress, SyncLinkEvent)
}

/// A replication node: serves its database to the peers that connect to it, keeps a link to
/// each listed peer (reconnecting when one goes away), and relays changes between all of them
/// (a mesh): whatever arrives from one peer is announced at once to the others. The
/// `tether serve` command is this.
///
///     let node = try await SyncNode.start(database: db, host: "0.0.0.0", port: 7400, serverTLS: serverTLS,
///                                         clientTLS: clientTLS, peers: [PeerAddress("10.0.0.3:7400")!])
///     for await event in node.events { print(event) }   // until stop()
///
/// It is a swift-service-lifecycle `Service`: started, it can join a `ServiceGroup`, whose
/// graceful shutdown stops it (see `run()`).
public final class SyncNode: Service, Sendable {
    /// The port this node listens on.
    public var port: Int { server.port }
    /// The node's log, in order; finishes after `stop()`. The newest 256 are kept when nobody reads.
    public let events: AsyncStream<SyncNodeEvent>
    private let server: SyncServer
    /// The options each session starts with, the server's and the links': one replacement reaches both.
    private let sessionOptions: NextSessionOptions
    private let links: NIOLockedValueBox<[(PeerAddress, SyncLink)]>
    private let forwarding: NIOLockedValueBox<[Task<Void, Never>]>
    private let continuation: AsyncStream<SyncNodeEvent>.Continuation
    /// The one stop, which every call of `stop()` (and the end of `run()`) awaits.
    private let stopping = SharedStop()

    private init(
        server: SyncServer, sessionOptions: NextSessionOptions, events: AsyncStream<SyncNodeEvent>,
        continuation: AsyncStream<SyncNodeEvent>.Continuation
    ) {
        self.server = server
        self.sessionOptions = sessionOptions
        self.events = events
        self.continuation = continuation
        links = NIOLockedValueBox([])
        forwarding = NIOLockedValueBox([])
    }

    /// Starts listening on `host`:`port` (0: any free port) and connecting to `peers`.
    /// Throws if it cannot listen (the port is in use, …); peers that cannot be reached are
    /// retried with `reconnect`'s backoff and reported on `events`, never thrown.
    public static func start(
        database: Database, host: String, port: Int, serverTLS: TLSContext, clientTLS: TLSContext,
        peers: [PeerAddress] = [], options: SyncOptions = SyncOptions(),
        reconnect: ReconnectPolicy = ReconnectPolicy()
    ) async throws -> SyncNode {
        // What arrives from one peer is relayed to the others by the commit of its batch, which
        // wakes every live session of this database (`LocalChangeMonitor`): nothing to call here.
        let sessionOptions = NextSessionOptions(options)
        let server = try await SyncServer.start(
            database: database, host: host, port: port, tls: serverTLS, sessionOptions: sessionOptions)
        let (events, continuation) = AsyncStream.makeStream(
            of: SyncNodeEvent.self, bufferingPolicy: .bufferingNewest(256))
        let node = SyncNode(server: server, sessionOptions: sessionOptions, events: events, continuation: continuation)
        var tasks = [
            Task { for await result in server.sessionResults { continuation.yield(.acceptedSessionEnded(result)) } }
        ]
        var started: [(PeerAddress, SyncLink)] = []
        for peer in peers {
            let link = SyncClient.keepSyncing(
                database: database, host: peer.host, port: peer.port, tls: clientTLS,
                sessionOptions: sessionOptions, reconnect: reconnect)
            started.append((peer, link))
            tasks.append(Task { for await event in link.events { continuation.yield(.link(peer, event)) } })
        }
        node.links.withLockedValue { $0 = started }
        node.forwarding.withLockedValue { $0 = tasks }
        return node
    }

    /// The sessions that start from now on — accepted ones, and each link's next connection — take
    /// `options` (peer policies, interest, limits, timeouts, their log); the sessions open now keep
    /// theirs to their end. The listening address, the TLS contexts, the peers listed, how often
    /// the server looks for other programs' commits and when it collects garbage stay as started
    /// (a node collects as its server does: `SyncOptions.garbageCollection`). `tether serve` calls it on
    /// SIGHUP with the policies and interest of its configuration file read again.
    public func replaceOptions(_ options: SyncOptions) {
        sessionOptions.replace(with: options)
    }

    /// The options the next session takes.
    public var options: SyncOptions { sessionOptions.current }

    /// Tells every session that this database committed changes (see `SyncServer.notifyLocalChanges`).
    /// Not needed for commits through this `Database` (changes received from a peer included),
    /// nor, where inotify is available, for other programs' commits: both wake the sessions by
    /// themselves.
    public func notifyLocalChanges() {
        server.notifyLocalChanges()
        for (_, link) in links.withLockedValue({ $0 }) { link.notifyLocalChanges() }
    }

    /// The listed peers and whether each is connected now.
    public var peerStates: [(peer: PeerAddress, connected: Bool)] {
        links.withLockedValue { $0 }.map { ($0.0, $0.1.isConnected) }
    }

    /// What every session of this node did so far, accepted and outgoing.
    public var totals: SyncTotals {
        var totals = server.totals
        for (_, link) in links.withLockedValue({ $0 }) { totals.merge(link.totals) }
        return totals
    }

    /// Stops: closes the links gracefully (BYE), stops listening and closes the accepted
    /// sessions; every batch being applied is committed or rolled back whole before it returns.
    /// Calling it again (or while it runs) waits for the same stop.
    public func stop() async throws {
        try await stopping.run { [self] in try await stopOnce() }
    }

    private func stopOnce() async throws {
        for (_, link) in links.withLockedValue({ $0 }) { await link.stop() }
        try await server.stop()
        for task in forwarding.withLockedValue({ $0 }) { await task.value }
        continuation.finish()
    }

    /// Runs until the task is cancelled or its `ServiceGroup` shuts down gracefully, then stops
    /// as `stop()` does; returns at once if `stop()` was called. Throws if the listening socket
    /// closed by itself (after stopping the rest).
    public func run() async throws {
        let server = self.server
        await withTaskCancellationOrGracefulShutdownHandler {
            // The listening socket closes by this node's stop (links first, then the server), or by itself.
            await server.listeningEnded()
        } onCancelOrGracefulShutdown: {
            Task { try? await self.stop() }
        }
        let stopRequested = stopping.wasRequested
        try await stop()
        if !stopRequested { throw SyncSessionError.transport("the sync server's listening socket closed") }
    }
}
