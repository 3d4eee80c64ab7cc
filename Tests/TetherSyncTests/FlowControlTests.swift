import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import Tether
import TetherSync
import TetherWire

/// A peer that completes the handshake (mirroring the server's HELLO under another instance key),
/// then stops reading: whatever the server sends piles up unread.
private final class NonReadingPeer: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    private let instanceKey: InstanceKey
    private let handshook: EventLoopPromise<Void>
    private var decoder = FrameDecoder()

    init(instanceKey: InstanceKey, handshook: EventLoopPromise<Void>) {
        self.instanceKey = instanceKey
        self.handshook = handshook
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        decoder.append(buffer.readBytes(length: buffer.readableBytes) ?? [])
        while case var .hello(hello)? = try? decoder.nextMessage() {
            hello.instanceKey = instanceKey
            hello.capabilities = []
            guard let bytes = try? FrameEncoder(compression: false).encode(.hello(hello)) else { return }
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: bytes)), promise: nil)
            try? context.channel.syncOptions?.setOption(ChannelOptions.autoRead, value: false)
            handshook.succeed(())
        }
    }
}

@Suite("Sync sessions: flow control")
struct FlowControlTests {
    @Test(
        """
        a peer that sends PULLs and never reads gets no more batches once the server's send buffer is full, and \
        is timed out
        """)
    func nonReadingPeerIsBounded() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try Database.inMemory()
        try server.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
        try server.enableSync(table: "t")
        // 24 MiB that LZ4 cannot shrink: random bytes.
        try server.execute(
            """
            WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n WHERE id < 24000)
            INSERT INTO t (id, body) SELECT id, randomblob(1024) FROM n
            """)
        let options = SyncOptions(idleTimeout: .milliseconds(1500))
        let syncServer = try await SyncServer.start(
            database: server, host: "127.0.0.1", port: 0, tls: try pki.serverContext(), options: options)
        let ended = NIOLockedValueBox<Result<SyncSummary, SyncSessionError>?>(nil)
        let watcher = Task {
            var results = syncServer.sessionResults.makeAsyncIterator()
            let result = await results.next()
            ended.withLockedValue { $0 = result }
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        var batchesAnswered = 0
        do {
            let loop = group.next()
            let handshook = loop.makePromise(of: Void.self)
            let impostor = try Database.inMemory().instanceKey
            let tls = try pki.clientContext()
            let channel = try await ClientBootstrap(group: loop)
                .channelOption(ChannelOptions.socketOption(.so_rcvbuf), value: 64 << 10)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandlers([
                            try TLSHandler(context: tls),
                            NonReadingPeer(instanceKey: impostor, handshook: handshook),
                        ])
                    }
                }
                .connect(host: "127.0.0.1", port: syncServer.port).get()
            try await handshook.futureResult.get()
            // One PULL at a time, each sent once the server has answered the previous one (as far
            // as the server knows: the batch left its session), which is what a requester may do.
            let encoder = FrameEncoder(compression: false)
            var sent = 0
            pulling: for _ in 1...24 {
                let pull = Pull(
                    after: 0, resumingResync: false, maxChanges: 10_000, maxBytes: 1 << 20, wholeRows: false)
                do {
                    try await channel.writeAndFlush(ByteBuffer(bytes: try encoder.encode(.pull(pull))))
                } catch  where !channel.isActive {
                    break pulling  // the server already gave up on this peer and closed (a slow machine)
                }
                // Wait for the answer, or for the server to give up on this peer.
                let deadline = ContinuousClock.now + .seconds(5)
                while syncServer.totals.changesSent == sent {
                    if ended.withLockedValue({ $0 }) != nil || ContinuousClock.now > deadline { break pulling }
                    try await Task.sleep(for: .milliseconds(5))
                }
                sent = syncServer.totals.changesSent
                batchesAnswered += 1
            }
            do {
                try await channel.close()
            } catch ChannelError.alreadyClosed {
                // The server timed the peer out and closed first: what the test waits for.
            }
            try await group.shutdownGracefully()
        } catch {
            try? await group.shutdownGracefully()
            try? await syncServer.stop()
            throw error
        }
        await watcher.value
        try await syncServer.stop()
        let result = ended.withLockedValue { $0 }
        // 24 PULLs would have buffered 24 MiB; the kernel's socket buffers hold a few of them,
        // the session at most one more.
        #expect(batchesAnswered < 12, "the server answered \(batchesAnswered) PULLs of a peer that read nothing")
        guard case .failure(.timeout)? = result else {
            Issue.record("the session did not end with a timeout: \(String(describing: result))")
            return
        }
    }
}
