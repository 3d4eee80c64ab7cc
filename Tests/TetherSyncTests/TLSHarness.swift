import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TetherSync
import TetherTestSupport

/// Certificate and key files written for a test.
struct CredentialFiles {
    var certificate: String
    var key: String
    var fingerprint: String
}

extension TemporaryDirectory {
    /// Writes `credentials` as `<name>.crt` and `<name>.key`.
    func write(_ credentials: CertificateAndKey, as name: String) throws -> CredentialFiles {
        let files = CredentialFiles(
            certificate: file(name + ".crt"), key: file(name + ".key"),
            fingerprint: try CertificateAuthority.fingerprint(certificatePEM: credentials.certificatePEM))
        try CertificateAuthority.write(credentials, certificatePath: files.certificate, privateKeyPath: files.key)
        return files
    }
}

/// One day, in seconds.
let day: TimeInterval = 86_400

/// A CA and, signed by it, a server and a client certificate, in a temporary directory.
struct TestPKI {
    let directory: TemporaryDirectory
    let ca: CertificateAndKey
    let caFile: String
    let server: CredentialFiles
    let client: CredentialFiles

    init() throws {
        directory = try TemporaryDirectory()
        ca = try CertificateAuthority.create(commonName: "Tether Test CA", validity: 30 * day)
        caFile = try directory.write(ca, as: "ca").certificate
        server = try directory.write(
            try CertificateAuthority.issue(commonName: "node-server", signedBy: ca, validity: 30 * day), as: "server")
        client = try directory.write(
            try CertificateAuthority.issue(commonName: "node-client", signedBy: ca, validity: 30 * day), as: "client")
    }

    /// Another certificate signed by the CA, written as `<file>.crt` and `<file>.key`.
    func issue(commonName: String, as file: String) throws -> CredentialFiles {
        try directory.write(
            try CertificateAuthority.issue(commonName: commonName, signedBy: ca, validity: 30 * day), as: file)
    }

    func serverContext(pins: Set<String> = []) throws -> TLSContext {
        try TLSContext(
            configuration: .server(
                certificateChainFile: server.certificate, privateKeyFile: server.key, trustedCAFile: caFile,
                pinnedPeerFingerprints: pins))
    }

    func clientContext(
        _ credentials: CredentialFiles? = nil, trusting caFile: String? = nil, pins: Set<String> = [],
        expectedServerName: String? = nil
    ) throws -> TLSContext {
        let files = credentials ?? client
        return try TLSContext(
            configuration: .client(
                certificateChainFile: files.certificate, privateKeyFile: files.key,
                trustedCAFile: caFile ?? self.caFile,
                pinnedPeerFingerprints: pins, expectedServerName: expectedServerName))
    }
}

struct TestTimeout: Error, CustomStringConvertible {
    var what: String
    var description: String { "timed out waiting for \(what)" }
}

/// Awaits `future`, failing after `seconds`: a safety net against a hung test, not a wait for time.
func awaitResult<T: Sendable>(_ future: EventLoopFuture<T>, _ what: String, seconds: Int64 = 15) async throws -> T {
    let promise = future.eventLoop.makePromise(of: T.self)
    future.cascade(to: promise)
    let timeout = future.eventLoop.scheduleTask(in: .seconds(seconds)) { promise.fail(TestTimeout(what: what)) }
    defer { timeout.cancel() }
    return try await promise.futureResult.get()
}

/// What happened on one connection, as seen by the handler after the TLS handler.
final class ConnectionLog: Sendable {
    struct Record {
        var received: [UInt8] = []
        var handshake: TLSHandshakeCompleted?
        var errors: [any Error] = []
        var closeNotifyReceived = false
        var inactive = false
    }

    private let record = NIOLockedValueBox(Record())
    private let expectedBytes: Int
    let handshakeCompleted: EventLoopPromise<TLSHandshakeCompleted>
    let receivedExpected: EventLoopPromise<[UInt8]>
    let closed: EventLoopPromise<Void>

    init(eventLoop: EventLoop, expectedBytes: Int = 0) {
        self.expectedBytes = expectedBytes
        handshakeCompleted = eventLoop.makePromise()
        receivedExpected = eventLoop.makePromise()
        closed = eventLoop.makePromise()
    }

    var snapshot: Record { record.withLockedValue { $0 } }
    var received: [UInt8] { snapshot.received }
    var handshake: TLSHandshakeCompleted? { snapshot.handshake }
    var tlsErrors: [TLSError] { snapshot.errors.compactMap { $0 as? TLSError } }
    var otherErrors: [any Error] { snapshot.errors.filter { !($0 is TLSError) } }

    fileprivate func append(_ bytes: [UInt8]) {
        let total = record.withLockedValue { record in
            record.received += bytes
            return record.received
        }
        if expectedBytes > 0, total.count >= expectedBytes { receivedExpected.succeed(total) }
    }

    fileprivate func update(_ change: (inout Record) -> Void) {
        record.withLockedValue { change(&$0) }
    }
}

/// Records everything into a `ConnectionLog`; optionally echoes what it reads.
final class Recorder: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let log: ConnectionLog
    let echo: Bool

    init(log: ConnectionLog, echo: Bool) {
        self.log = log
        self.echo = echo
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        log.append(Array(buffer.readableBytesView))
        if echo { context.writeAndFlush(wrapOutboundOut(buffer), promise: nil) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let completed = event as? TLSHandshakeCompleted {
            log.update { $0.handshake = completed }
            log.handshakeCompleted.succeed(completed)
        } else if event is TLSCloseNotifyReceived {
            log.update { $0.closeNotifyReceived = true }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        log.update { $0.errors.append(error) }
        log.handshakeCompleted.fail(error)
        if !(error is TLSError) { context.close(promise: nil) }
    }

    func channelInactive(context: ChannelHandlerContext) {
        log.update { $0.inactive = true }
        log.handshakeCompleted.fail(ChannelError.ioOnClosedChannel)
        log.receivedExpected.fail(ChannelError.ioOnClosedChannel)
        log.closed.succeed(())
        context.fireChannelInactive()
    }
}

/// A TLS echo (or silent) server on 127.0.0.1, port 0, with its own event loop group.
final class TestServer: Sendable {
    let group: MultiThreadedEventLoopGroup
    let channel: Channel
    let port: Int
    private let connections: NIOLockedValueBox<[ConnectionLog]>
    private let first: EventLoopPromise<ConnectionLog>

    private init(
        group: MultiThreadedEventLoopGroup, channel: Channel, port: Int,
        connections: NIOLockedValueBox<[ConnectionLog]>, first: EventLoopPromise<ConnectionLog>
    ) {
        self.group = group
        self.channel = channel
        self.port = port
        self.connections = connections
        self.first = first
    }

    /// Generous: the whole suite runs at once on two cores, and a test's client side can wait
    /// seconds for a thread before it sends its first bytes. Tests of the timeout pass their own.
    static let defaultHandshakeTimeout = TimeAmount.seconds(60)

    static func start(
        context tls: TLSContext, echo: Bool = true, handshakeTimeout: TimeAmount = TestServer.defaultHandshakeTimeout
    ) async throws -> TestServer {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let connections = NIOLockedValueBox<[ConnectionLog]>([])
        let first = group.next().makePromise(of: ConnectionLog.self)
        do {
            let channel = try await ServerBootstrap(group: group)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let log = ConnectionLog(eventLoop: channel.eventLoop)
                        connections.withLockedValue { $0.append(log) }
                        first.succeed(log)
                        let handler = try TLSHandler(context: tls, handshakeTimeout: handshakeTimeout)
                        try channel.pipeline.syncOperations.addHandlers([handler, Recorder(log: log, echo: echo)])
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
            guard let port = channel.localAddress?.port else { throw TestTimeout(what: "a bound port") }
            return TestServer(group: group, channel: channel, port: port, connections: connections, first: first)
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// The first accepted connection's log.
    func firstConnection() async throws -> ConnectionLog {
        try await awaitResult(first.futureResult, "the server to accept a connection")
    }

    /// Connects a TLS client whose pipeline is TLSHandler, then a Recorder.
    func connect(
        _ tls: TLSContext, expectedBytes: Int = 0
    ) async throws -> (channel: Channel, log: ConnectionLog) {
        let loop = group.next()
        let log = ConnectionLog(eventLoop: loop, expectedBytes: expectedBytes)
        let channel = try await ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let handler = try TLSHandler(context: tls)
                    try channel.pipeline.syncOperations.addHandlers([handler, Recorder(log: log, echo: false)])
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        return (channel, log)
    }

    /// Connects a client that speaks no TLS: a Recorder alone.
    func connectPlaintext() async throws -> (channel: Channel, log: ConnectionLog) {
        let loop = group.next()
        let log = ConnectionLog(eventLoop: loop)
        let channel = try await ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(Recorder(log: log, echo: false))
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        return (channel, log)
    }

    func shutdown() async throws {
        try? await channel.close()
        try await group.shutdownGracefully()
    }
}

/// Runs `body` with a started server, and always shuts the server's event loop group down.
func withServer<T>(
    _ tls: TLSContext, echo: Bool = true, handshakeTimeout: TimeAmount = TestServer.defaultHandshakeTimeout,
    _ body: (TestServer) async throws -> T
) async throws -> T {
    let server = try await TestServer.start(context: tls, echo: echo, handshakeTimeout: handshakeTimeout)
    do {
        let result = try await body(server)
        try await server.shutdown()
        return result
    } catch {
        try? await server.shutdown()
        throw error
    }
}

extension Channel {
    func send(_ bytes: [UInt8]) -> EventLoopFuture<Void> {
        writeAndFlush(ByteBuffer(bytes: bytes))
    }
}
