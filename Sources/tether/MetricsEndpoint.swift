import Dispatch
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import Prometheus

/// The HTTP endpoint of `tether serve --metrics HOST:PORT`, on an event loop of its own:
///
/// - `GET /metrics`: the Prometheus text of `registry`, after `beforeScrape` (run off the event
///   loop, one scrape at a time) brought the gauges computed at scrape time up to date;
/// - `GET /health`: 200 while the node is serving, 503 once it is stopping (`stopServing()`).
///
/// Anything else gets 404 (another path) or 405 (another method).
final class MetricsEndpoint: Sendable {
    /// The port it listens on (the one chosen by the system when started with port 0).
    let port: Int
    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let serving: NIOLockedValueBox<Bool>

    private init(port: Int, group: MultiThreadedEventLoopGroup, channel: Channel, serving: NIOLockedValueBox<Bool>) {
        self.port = port
        self.group = group
        self.channel = channel
        self.serving = serving
    }

    /// Starts listening on `host`:`port` (0: any free port); `/health` answers 200 from now on.
    /// Throws `CLIError` (69) when it cannot listen.
    static func start(
        host: String, port: Int, registry: PrometheusCollectorRegistry,
        beforeScrape: @escaping @Sendable () -> Void
    ) async throws -> MetricsEndpoint {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let serving = NIOLockedValueBox(true)
        let routes = MetricsRoutes(
            registry: registry, serving: serving, beforeScrape: beforeScrape,
            scrapes: DispatchQueue(label: "tether.serve.metrics"))
        do {
            let channel = try await ServerBootstrap(group: group)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                        try channel.pipeline.syncOperations.addHandler(MetricsHTTPHandler(routes: routes))
                    }
                }
                .bind(host: host, port: port).get()
            guard let bound = channel.localAddress?.port else {
                try? await channel.close()
                throw CLIError(.unavailable, "the metrics socket on \(host):\(port) has no local port")
            }
            return MetricsEndpoint(port: bound, group: group, channel: channel, serving: serving)
        } catch {
            try? await group.shutdownGracefully()
            if let cliError = error as? CLIError { throw cliError }
            let reason = (error as? IOError)?.errnoCode == EADDRINUSE ? "the address is already in use" : "\(error)"
            throw CLIError(.unavailable, "cannot serve metrics on \(host):\(port): \(reason)")
        }
    }

    /// From now on `/health` answers 503: the node is stopping.
    func stopServing() {
        serving.withLockedValue { $0 = false }
    }

    /// Stops listening and closes the connections.
    func stop() async {
        stopServing()
        try? await channel.close()
        try? await group.shutdownGracefully()
    }
}

/// What the endpoint's connections share.
private struct MetricsRoutes: Sendable {
    let registry: PrometheusCollectorRegistry
    let serving: NIOLockedValueBox<Bool>
    let beforeScrape: @Sendable () -> Void
    /// Scrapes run here, one at a time: `beforeScrape` reads the database.
    let scrapes: DispatchQueue
}

/// One HTTP connection: answers each request once its end has arrived (the HTTP server pipeline
/// holds pipelined requests until the previous response is written).
private final class MetricsHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let routes: MetricsRoutes
    private var request: HTTPRequestHead?

    init(routes: MetricsRoutes) { self.routes = routes }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case let .head(head):
            request = head
        case .body:
            break
        case .end:
            guard let head = request else { return }
            request = nil
            respond(to: head, context: context)
        }
    }

    private func respond(to head: HTTPRequestHead, context: ChannelHandlerContext) {
        let path =
            head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init)
            ?? head.uri
        guard path == "/metrics" || path == "/health" else {
            return send(.notFound, "not found: \(path) (try /metrics or /health)\n", to: head, context: context)
        }
        guard head.method == .GET || head.method == .HEAD else {
            return send(.methodNotAllowed, "\(head.method) is not allowed: use GET\n", to: head, context: context)
        }
        if path == "/health" {
            let serving = routes.serving.withLockedValue { $0 }
            return send(
                serving ? .ok : .serviceUnavailable, serving ? "serving\n" : "stopping\n", to: head, context: context)
        }
        let promise = context.eventLoop.makePromise(of: [UInt8].self)
        let routes = self.routes
        routes.scrapes.async {
            routes.beforeScrape()
            promise.succeed(routes.registry.emitToBuffer())
        }
        promise.futureResult.assumeIsolated().whenSuccess { [self] text in
            send(.ok, text, contentType: "text/plain; version=0.0.4; charset=utf-8", to: head, context: context)
        }
    }

    private func send(
        _ status: HTTPResponseStatus, _ text: String, to head: HTTPRequestHead, context: ChannelHandlerContext
    ) {
        send(status, Array(text.utf8), contentType: "text/plain; charset=utf-8", to: head, context: context)
    }

    private func send(
        _ status: HTTPResponseStatus, _ body: [UInt8], contentType: String, to head: HTTPRequestHead,
        context: ChannelHandlerContext
    ) {
        guard context.channel.isActive else { return }
        var headers = HTTPHeaders([("Content-Type", contentType), ("Content-Length", "\(body.count)")])
        if !head.isKeepAlive { headers.add(name: "Connection", value: "close") }
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))),
            promise: nil)
        if head.method != .HEAD {
            context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: body)))), promise: nil)
        }
        let sent = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        if !head.isKeepAlive {
            sent.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
        }
    }
}
