import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Tether
import TetherSync
import TetherWire

/// What a scripted peer does with each message the server sends it: the messages it answers
/// with, and whether it then closes the connection.
struct ScriptedReply {
    var messages: [WireMessage] = []
    /// Raw bytes sent after the messages (maybe hostile: a frame cut short, a bad length…).
    var raw: [UInt8] = []
    var close = false
    /// Once the messages are sent, read nothing more, but send a PING at this interval: a peer
    /// that keeps the connection busy without reading what it is sent.
    var stopReadingAndPingEvery: TimeAmount?

    static let nothing = ScriptedReply()
    static func send(_ messages: WireMessage...) -> ScriptedReply { ScriptedReply(messages: messages) }
    static let close = ScriptedReply(close: true)
}

/// A peer written from the protocol alone, holding a valid certificate: it answers the server's
/// HELLO with its own (the server's schema and capabilities, but `pullsAhead`, under `instanceKey`; nothing at all
/// without one), sends `scope` when version 3 is negotiated, then lets `script` answer every
/// message the server sends — what a compromised or buggy node could send. It records everything
/// the server sent.
private final class ScriptedPeerHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let instanceKey: InstanceKey?
    private let capabilities: Capabilities?
    private let scope: ScopeAnnouncement?
    private let script: (WireMessage) throws -> ScriptedReply
    private let received: NIOLockedValueBox<[WireMessage]>
    private let closed: EventLoopPromise<Void>
    private var decoder = FrameDecoder()

    init(
        instanceKey: InstanceKey?, capabilities: Capabilities?, scope: ScopeAnnouncement?,
        script: @escaping (WireMessage) throws -> ScriptedReply,
        received: NIOLockedValueBox<[WireMessage]>, closed: EventLoopPromise<Void>
    ) {
        self.instanceKey = instanceKey
        self.capabilities = capabilities
        self.scope = scope
        self.script = script
        self.received = received
        self.closed = closed
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        decoder.append(buffer.readBytes(length: buffer.readableBytes) ?? [])
        do {
            while let message = try decoder.nextMessage() {
                received.withLockedValue { $0.append(message) }
                var reply = try script(message)
                if case var .hello(hello) = message, let instanceKey {
                    hello.instanceKey = instanceKey
                    // Its scripts answer one PULL at a time: it does not take follow-on PULLs (§8.3).
                    hello.capabilities.remove(.pullsAhead)
                    if let capabilities { hello.capabilities = capabilities }
                    var opening: [WireMessage] = [.hello(hello)]
                    if let scope, hello.capabilities.contains(.version3) { opening.append(.scope(scope)) }
                    reply.messages = opening + reply.messages
                }
                for outgoing in reply.messages {
                    context.write(
                        wrapOutboundOut(ByteBuffer(bytes: try FrameEncoder(compression: false).encode(outgoing))),
                        promise: nil)
                }
                if !reply.raw.isEmpty { context.write(wrapOutboundOut(ByteBuffer(bytes: reply.raw)), promise: nil) }
                context.flush()
                if reply.close { context.close(promise: nil) }
                if let interval = reply.stopReadingAndPingEvery {
                    context.channel.setOption(ChannelOptions.autoRead, value: false).whenComplete { _ in }
                    let nonce = NIOLockedValueBox<UInt64>(1_000)
                    let channel = context.channel
                    channel.eventLoop.scheduleRepeatedTask(initialDelay: interval, delay: interval) { task in
                        guard channel.isActive else { return task.cancel() }
                        let next = nonce.withLockedValue {
                            $0 += 1; return $0
                        }
                        if let frame = try? FrameEncoder(compression: false).encode(.ping(next)) {
                            channel.writeAndFlush(ByteBuffer(bytes: frame), promise: nil)
                        }
                    }
                }
            }
        } catch {
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        closed.succeed(())
        context.fireChannelInactive()
    }
}

/// Connects a scripted peer presenting `credentials` (the PKI's client certificate if nil) to the
/// server on `port` and returns what the server sent before the connection closed (the server's
/// close, or the script's).
func scriptedExchange(
    port: Int, pki: TestPKI, as credentials: CredentialFiles?, instanceKey: InstanceKey?,
    capabilities: Capabilities? = nil,
    scope: ScopeAnnouncement? = ScopeAnnouncement(interest: [:], scoped: []),
    script: @escaping @Sendable (WireMessage) throws -> ScriptedReply
) async throws -> [WireMessage] {
    let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    do {
        let loop = group.next()
        let received = NIOLockedValueBox<[WireMessage]>([])
        let closed = loop.makePromise(of: Void.self)
        let tls = try pki.clientContext(credentials)
        _ = try await ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        try TLSHandler(context: tls),
                        ScriptedPeerHandler(
                            instanceKey: instanceKey, capabilities: capabilities, scope: scope, script: script,
                            received: received, closed: closed),
                    ])
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        try await awaitResult(closed.futureResult, "the connection to close", seconds: 60)
        try await group.shutdownGracefully()
        return received.withLockedValue { $0 }
    } catch {
        try? await group.shutdownGracefully()
        throw error
    }
}

extension Array where Element == WireMessage {
    /// The ERROR the server ended with, if it did.
    var finalError: (code: WireErrorCode, message: String)? {
        guard case let .error(code, message) = last else { return nil }
        return (code, message)
    }

    /// The batches the server sent.
    var batches: [ChangeBatch] {
        compactMap { if case let .batch(batch) = $0 { batch } else { nil } }
    }
}
