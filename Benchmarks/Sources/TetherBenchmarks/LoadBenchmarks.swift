import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Tether
import TetherSync
import TetherWire

/// How a server holds up against its peers: memory a hostile peer can make it hold.
enum LoadBenchmarks {
    /// Growth of the server's resident memory, in MiB, while a peer that completed the handshake
    /// sends PULLs one at a time (each once the server answered the previous) and reads nothing,
    /// over 32 MiB of incompressible rows. Without flow control every PULL queued a batch (1 MiB
    /// each here); with it, the session stops reading once its send buffer is full. Goal ≤ 16 MB
    /// (absolute, so no Comparison). Server and peer run in this process; the peer's own memory
    /// is a few KiB (it reads nothing).
    static let rssNonReading = Benchmark(name: "session.rss_nonreading", unit: "MB", bestIs: .lower, comparison: nil) { context in
        let pki = try context.syncPKI()
        let serverTLS = try pki.serverContext()
        let clientTLS = try pki.clientContext()
        return try context.withFreshDatabasePath { path in
            let database = try Database(path: path)
            defer { try? database.close() }
            try database.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, body BLOB)")
            try database.enableSync(table: "blobs")
            try database.execute("""
                WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n WHERE id < 32768)
                INSERT INTO blobs (id, body) SELECT id, randomblob(1024) FROM n
                """)
            let peerKey = try Database.inMemory().instanceKey
            let options = SyncOptions(idleTimeout: .seconds(2))
            let server = try blockingAwait { try await SyncServer.start(database: database, tls: serverTLS, options: options) }
            defer { try? blockingAwait { try await server.stop() } }
            let baseline = currentRSSKiB()
            let peakBox = NIOLockedValueBox(baseline)
            let answered = try blockingAwait {
                try await pullWithoutReading(port: server.port, tls: clientTLS, as: peerKey, pulls: 32, server: server) {
                    let now = currentRSSKiB()
                    peakBox.withLockedValue { $0 = max($0, now) }
                }
            }
            let peak = peakBox.withLockedValue { $0 }
            log("  session.rss_nonreading: the server answered \(answered) of 32 PULLs; RSS \(baseline) KiB before, \(peak) KiB at most")
            return Double(max(0, peak - baseline)) / 1024
        }
    }

    /// Connects a peer that stops reading after the handshake and sends up to `pulls` PULLs of
    /// 1 MiB, each once the server's totals show the previous one answered (or the server gave
    /// up on the peer); returns how many were answered. `sample` runs while it waits.
    private static func pullWithoutReading(port: Int, tls: TLSContext, as key: InstanceKey, pulls: Int, server: SyncServer,
                                           sample: @escaping @Sendable () -> Void) async throws -> Int {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        do {
            let handshook = group.next().makePromise(of: Void.self)
            let channel = try await ClientBootstrap(group: group)
                .channelOption(ChannelOptions.socketOption(.so_rcvbuf), value: 64 << 10)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandlers([try TLSHandler(context: tls),
                                                                         NonReadingPeer(instanceKey: key, handshook: handshook)])
                    }
                }
                .connect(host: "127.0.0.1", port: port).get()
            try await handshook.futureResult.get()
            var results = server.sessionResults.makeAsyncIterator()
            let ended = NIOLockedValueBox(false)
            let watcher = Task {
                _ = await results.next()
                ended.withLockedValue { $0 = true }
            }
            let encoder = FrameEncoder(compression: false)
            var answered = 0
            var sent = server.totals.changesSent
            pulling: for _ in 0..<pulls {
                let pull = Pull(after: 0, resumingResync: false, maxChanges: 10_000, maxBytes: 1 << 20, wholeRows: false)
                try await channel.writeAndFlush(ByteBuffer(bytes: try encoder.encode(.pull(pull))))
                while server.totals.changesSent == sent {
                    sample()
                    if ended.withLockedValue({ $0 }) { break pulling }
                    try await Task.sleep(for: .milliseconds(5))
                }
                sent = server.totals.changesSent
                answered += 1
            }
            // Until the server gives up on the peer (its idle timeout), sampling all along.
            while !ended.withLockedValue({ $0 }) {
                sample()
                try await Task.sleep(for: .milliseconds(20))
            }
            await watcher.value
            try? await channel.close()
            try await group.shutdownGracefully()
            return answered
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// This process's resident memory now, in KiB (/proc/self/statm).
    static func currentRSSKiB() -> Int {
        guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int(fields[1]) else { return 0 }
        return pages * Int(sysconf(Int32(_SC_PAGESIZE))) / 1024
    }
}

/// A peer that completes the handshake (mirroring the server's HELLO under its own instance key,
/// without capabilities) and then reads nothing more. The same peer as FlowControlTests' (the
/// benchmark package cannot see test code, and Tether ships no test-support product).
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
