import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Tether
import TetherSync
import TetherWire

/// How a server holds up against its peers: what each connected peer costs the hub, what idle
/// peers cost, and the memory a hostile peer can make it hold.
enum LoadBenchmarks {
    /// Peers connected at once to the hub (live sessions, caught up).
    static let peerCount = Int(ProcessInfo.processInfo.environment["TETHER_BENCH_PEERS"] ?? "") ?? 400

    struct HubLoad {
        var peers: Int
        var kibPerPeer: Double
        var idleCPUPercent: Double
    }

    /// Peers a hub held (each a live session, caught up, all at once; clients in this process).
    static let peers = Benchmark(name: "load.peers", unit: "peers", bestIs: .higher, comparison: nil) { context in
        Double(try sharedHubLoad(context, for: "load.peers").peers)
    }

    /// The hub's resident memory per connected peer, in KB (a separate process, read from
    /// /proc/PID/status: VmRSS with the peers connected minus VmRSS before). Goal ≤ 150.
    static let hubKBPerPeer = Benchmark(name: "load.hub_kb_per_peer", unit: "KB", bestIs: .lower, comparison: nil) {
        context in
        try sharedHubLoad(context, for: "load.hub_kb_per_peer").kibPerPeer
    }

    /// The hub's CPU use, in % of one core, over 5 s with every peer connected and idle
    /// (heartbeats only): its utime + stime from /proc/PID/stat.
    static let idleCPU = Benchmark(name: "load.idle_cpu", unit: "% of a core", bestIs: .lower, comparison: nil) {
        context in
        try sharedHubLoad(context, for: "load.idle_cpu").idleCPUPercent
    }

    /// Sessions held idle for `load.idle_cpu_per_1000`.
    static let idlePeerCount = Int(ProcessInfo.processInfo.environment["TETHER_BENCH_IDLE_PEERS"] ?? "") ?? 1000
    /// How long they are held idle: more than two heartbeat intervals of a quiet session (300 s each,
    /// Protocol §8.5: the sessions are quiet by then, see `quietSettle`), so that every session's
    /// heartbeats fall in it.
    static let idleWindow: TimeInterval = 610
    /// How long after the last connection the measure starts: sessions go quiet 60 s after their
    /// last frame other than PING and PONG (the catch-up's), and are measured quiet.
    static let quietSettle: TimeInterval = 65

    /// What an idle hub costs per 1,000 sessions, in % of one core: `idlePeerCount` live sessions,
    /// caught up and quiet, nothing written, over `idleWindow` (utime + stime of the hub's process).
    /// Goal ≤ 0.2 (issue 38). `load.idle_cpu` reads 0 for its 400 peers because its 5-s window holds
    /// no heartbeat. About 11 minutes.
    static let idleCPUPer1000 = Benchmark(
        name: "load.idle_cpu_per_1000", unit: "% of a core", bestIs: .lower, comparison: nil
    ) { context in
        let load = try context.sharedRun(named: "hub-idle", for: "load.idle_cpu_per_1000") {
            try measureHubLoad(context, peers: idlePeerCount, settle: quietSettle, idleFor: idleWindow)
        }
        return load.idleCPUPercent / Double(max(1, load.peers)) * 1000
    }

    private static func sharedHubLoad(_ context: BenchmarkContext, for line: String) throws -> HubLoad {
        try context.sharedRun(named: "hub-load", for: line) {
            try measureHubLoad(context, peers: peerCount, settle: 2, idleFor: 5)
        }
    }

    /// Starts a hub child on an empty synced table, connects `count` live clients (each with an
    /// in-memory database of its own), and reads the hub's memory `settle` seconds later, then its CPU
    /// time over `idle` seconds while they idle.
    private static func measureHubLoad(
        _ context: BenchmarkContext, peers count: Int, settle: TimeInterval, idleFor idle: TimeInterval
    ) throws -> HubLoad {
        let pki = try context.syncPKI()
        let clientTLS = try pki.clientContext()
        return try context.withFreshDatabasePath { hubPath in
            do {
                let hub = try Database(path: hubPath)
                defer { try? hub.close() }
                try hub.createTable(BenchmarkRecord.self)
                try hub.enableSync(for: BenchmarkRecord.self)
            }
            let child = try ChildProcess(arguments: [SyncPeerChild.flag, "hub", hubPath, pki.directory])
            defer { child.terminateIfRunning() }
            guard let port = Int(try child.readReport(key: "port")) else {
                throw BenchmarkFailure(description: "the hub reported no port")
            }
            let pid = child.processIdentifier
            Thread.sleep(forTimeInterval: 1)
            let before = try residentKiB(of: pid)
            let connections = try blockingAwait { () async throws -> [SyncConnection] in
                var connections: [SyncConnection] = []
                for _ in 0..<count {
                    let db = try Database.inMemory()
                    try db.createTable(BenchmarkRecord.self)
                    try db.enableSync(for: BenchmarkRecord.self)
                    connections.append(
                        try await SyncClient.connect(database: db, host: "127.0.0.1", port: port, tls: clientTLS))
                }
                return connections
            }
            Thread.sleep(forTimeInterval: settle)
            let with = try residentKiB(of: pid)
            let cpuBefore = try cpuSeconds(of: pid)
            let start = Date()
            Thread.sleep(forTimeInterval: idle)
            let cpuShare = (try cpuSeconds(of: pid) - cpuBefore) / Date().timeIntervalSince(start)
            try blockingAwait {
                for connection in connections { _ = try? await connection.stop() }
            }
            Thread.sleep(forTimeInterval: 2)
            let after = try residentKiB(of: pid)
            log(
                "  load: hub RSS \(before) KiB idle, \(with) KiB with \(count) peers, \(after) KiB 2 s "
                    + "after they left; "
                    + "CPU \(String(format: "%.3f", cpuShare * 100)) % of a core while they idled \(Int(idle)) s")
            return HubLoad(
                peers: connections.count, kibPerPeer: Double(with - before) / Double(max(1, count)) * 1024 / 1000,
                idleCPUPercent: cpuShare * 100)
        }
    }

    /// VmRSS of process `pid`, in KiB.
    private static func residentKiB(of pid: Int32) throws -> Int {
        guard let file = FileHandle(forReadingAtPath: "/proc/\(pid)/status"),
            case let status = String(decoding: file.readDataToEndOfFile(), as: UTF8.self),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
            let kib = Int(line.dropFirst("VmRSS:".count).split(whereSeparator: { $0.isWhitespace }).first ?? "")
        else {
            throw BenchmarkFailure(description: "cannot read the memory of process \(pid)")
        }
        return kib
    }

    /// User plus system CPU time of process `pid` so far, in seconds (/proc/PID/stat fields 14 and 15).
    private static func cpuSeconds(of pid: Int32) throws -> Double {
        guard let file = FileHandle(forReadingAtPath: "/proc/\(pid)/stat"),
            case let stat = String(decoding: file.readDataToEndOfFile(), as: UTF8.self),
            let close = stat.lastIndex(of: ")")
        else {
            throw BenchmarkFailure(description: "cannot read the CPU time of process \(pid)")
        }
        // After the command name (in parentheses, which may hold spaces): field 3 onwards.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else {
            throw BenchmarkFailure(description: "cannot parse /proc/\(pid)/stat")
        }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// Growth of the server's resident memory, in MiB, while a peer that completed the handshake
    /// sends PULLs one at a time (each once the server answered the previous) and reads nothing,
    /// over 32 MiB of incompressible rows. Without flow control every PULL queued a batch (1 MiB
    /// each here); with it, the session stops reading once its send buffer is full. Goal ≤ 16 MB
    /// (absolute, so no Comparison). Server and peer run in this process; the peer's own memory
    /// is a few KiB (it reads nothing).
    static let rssNonReading = Benchmark(name: "session.rss_nonreading", unit: "MB", bestIs: .lower, comparison: nil) {
        context in
        let pki = try context.syncPKI()
        let serverTLS = try pki.serverContext()
        let clientTLS = try pki.clientContext()
        return try context.withFreshDatabasePath { path in
            let database = try Database(path: path)
            defer { try? database.close() }
            try database.execute("CREATE TABLE blobs (id INTEGER PRIMARY KEY, body BLOB)")
            try database.enableSync(table: "blobs")
            try database.execute(
                """
                WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n WHERE id < 32768)
                INSERT INTO blobs (id, body) SELECT id, randomblob(1024) FROM n
                """)
            let peerKey = try Database.inMemory().instanceKey
            let options = SyncOptions(idleTimeout: .seconds(2))
            let server = try blockingAwait {
                try await SyncServer.start(database: database, tls: serverTLS, options: options)
            }
            defer { try? blockingAwait { try await server.stop() } }
            let baseline = currentRSSKiB()
            let peakBox = NIOLockedValueBox(baseline)
            let answered = try blockingAwait {
                try await pullWithoutReading(port: server.port, tls: clientTLS, as: peerKey, pulls: 32, server: server)
                {
                    let now = currentRSSKiB()
                    peakBox.withLockedValue { $0 = max($0, now) }
                }
            }
            let peak = peakBox.withLockedValue { $0 }
            log(
                """
                  session.rss_nonreading: the server answered \(answered) of 32 PULLs; RSS \(baseline) KiB \
                before, \(peak) KiB at most
                """)
            return Double(max(0, peak - baseline)) / 1024
        }
    }

    /// Connects a peer that stops reading after the handshake and sends up to `pulls` PULLs of
    /// 1 MiB, each once the server's totals show the previous one answered (or the server gave
    /// up on the peer); returns how many were answered. `sample` runs while it waits.
    private static func pullWithoutReading(
        port: Int, tls: TLSContext, as key: InstanceKey, pulls: Int, server: SyncServer,
        sample: @escaping @Sendable () -> Void
    ) async throws -> Int {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        do {
            let handshook = group.next().makePromise(of: Void.self)
            let channel = try await ClientBootstrap(group: group)
                .channelOption(ChannelOptions.socketOption(.so_rcvbuf), value: 64 << 10)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandlers([
                            try TLSHandler(context: tls),
                            NonReadingPeer(instanceKey: key, handshook: handshook),
                        ])
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
                let pull = Pull(
                    after: 0, resumingResync: false, maxChanges: 10_000, maxBytes: 1 << 20, wholeRows: false)
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
