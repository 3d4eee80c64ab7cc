import Foundation
import Tether
import TetherSync

/// What an idle node costs: a node with a live link and nothing to do should sleep.
enum IdleBenchmarks {
    /// How long the node idles while its CPU time is measured.
    static let idleSeconds = Double(ProcessInfo.processInfo.environment["TETHER_BENCH_IDLE_SECONDS"] ?? "") ?? 10

    /// The CPU use of a sync node (what `tether serve` runs: a `SyncNode` on a file database)
    /// with one live link to a hub, both caught up, over 10 s with nothing written, in % of a
    /// core. The node and the hub are processes of their own (`IdleNodeChild`); the node's CPU
    /// time (all its threads, ended ones included) is read by the node itself with getrusage,
    /// to the microsecond (/proc/PID/stat counts in 10 ms ticks, too coarse for 10 s: 0.1 %).
    /// Goal: ≤ 0.05 % of a core (absolute, so no Comparison).
    static let nodeCPU = Benchmark(name: "idle.node_cpu", unit: "% of a core", bestIs: .lower, comparison: nil) {
        context in
        let pki = try context.syncPKI()
        return try context.withFreshDatabasePath { hubPath in
            try context.withFreshDatabasePath { nodePath in
                for path in [hubPath, nodePath] {
                    let db = try Database(path: path)
                    defer { try? db.close() }
                    try db.createTable(BenchmarkRecord.self)
                    try db.enableSync(for: BenchmarkRecord.self)
                }
                let hub = try InteractiveChild(arguments: [IdleNodeChild.flag, hubPath, pki.directory])
                defer { hub.finish() }
                let hubPort = try hub.read(key: "port")
                let node = try InteractiveChild(arguments: [IdleNodeChild.flag, nodePath, pki.directory, hubPort])
                defer { node.finish() }
                _ = try node.read(key: "linked")
                // The catch-up wrote to both files: the looks that follow writes end within 1.2 s.
                Thread.sleep(forTimeInterval: 2)
                let nodeBefore = try node.cpuSeconds()
                let hubBefore = try hub.cpuSeconds()
                let start = Date()
                Thread.sleep(forTimeInterval: idleSeconds)
                let nodeUsed = try node.cpuSeconds() - nodeBefore
                let hubUsed = try hub.cpuSeconds() - hubBefore
                let elapsed = Date().timeIntervalSince(start)
                log(
                    "  idle: over \(String(format: "%.1f", elapsed)) s, the node used "
                        + "\(String(format: "%.2f", nodeUsed * 1000)) ms of CPU "
                        + "(\(String(format: "%.4f", nodeUsed / elapsed * 100)) % of a core), the hub "
                        + "\(String(format: "%.2f", hubUsed * 1000)) ms "
                        + "(\(String(format: "%.4f", hubUsed / elapsed * 100)) %)")
                return nodeUsed / elapsed * 100
            }
        }
    }
}

/// The hidden child mode of this executable for `idle.node_cpu`: one sync node on a file
/// database, as `tether serve` runs it,
///
///     TetherBenchmarks --idle-node-child DATABASE PKI-DIRECTORY [HUB-PORT]
///
/// It reports `port PORT` once it listens and, with a hub, `linked 1` once its link to it is
/// caught up; then for each `cpu` line read on stdin it answers `cpu SECONDS` (its user plus
/// system time so far, from getrusage); it stops at the end of stdin.
enum IdleNodeChild {
    static let flag = "--idle-node-child"

    static func run(_ arguments: [String]) -> Int32 {
        do {
            guard arguments.count == 2 || arguments.count == 3 else {
                throw UsageError(description: "usage: TetherBenchmarks \(flag) DATABASE PKI [HUB-PORT]")
            }
            let pki = SyncPKI(directory: arguments[1])
            let peers = try arguments.dropFirst(2).map { text -> PeerAddress in
                guard let port = Int(text) else { throw UsageError(description: "bad port \(text)") }
                return PeerAddress(host: "127.0.0.1", port: port)
            }
            let db = try Database(path: arguments[0])
            let serverTLS = try pki.serverContext()
            let clientTLS = try pki.clientContext()
            let node = try blockingAwait {
                try await SyncNode.start(
                    database: db, host: "127.0.0.1", port: 0, serverTLS: serverTLS, clientTLS: clientTLS, peers: peers)
            }
            report("port", "\(node.port)")
            let events = Task {
                for await event in node.events {
                    switch event {
                    case .link(_, .connected): report("linked", "1")
                    case let .link(_, .disconnected(reason, _)):
                        log("idle node: link down: \(reason.map { "\($0)" } ?? "BYE")")
                    case let .acceptedSessionEnded(.failure(error)): log("idle node: a session failed: \(error)")
                    case .acceptedSessionEnded(.success): break
                    }
                }
            }
            while let line = readLine() {
                if line == "cpu" { report("cpu", "\(cpuSeconds())") }
            }
            try blockingAwait { try await node.stop() }
            events.cancel()
            try db.close()
            return 0
        } catch {
            log("idle node child: error: \(error)")
            return 1
        }
    }

    /// User plus system CPU time of this process so far (every thread, ended ones included), in seconds.
    private static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(
            usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }

    private static func report(_ key: String, _ value: String) {
        FileHandle.standardOutput.write(Data("\(key) \(value)\n".utf8))
    }
}

/// This executable run again as an `IdleNodeChild`: questions on its stdin, answers on its stdout.
final class InteractiveChild {
    private let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private var pending = Data()
    private var values: [String: [String]] = [:]

    init(arguments: [String]) throws {
        process.executableURL = Bundle.main.executableURL ?? URL(fileURLWithPath: CommandLine.arguments[0])
        process.arguments = arguments
        process.standardInput = input
        process.standardOutput = output
        try process.run()
    }

    /// The next value reported under `key` (values are taken in order).
    func read(key: String) throws -> String {
        while values[key, default: []].isEmpty {
            let data = output.fileHandleForReading.availableData
            guard !data.isEmpty else {
                throw BenchmarkFailure(description: "the idle node child ended without reporting \(key)")
            }
            pending.append(data)
            while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
                pending.removeSubrange(pending.startIndex...newline)
                let parts = line.split(separator: " ", maxSplits: 1)
                if parts.count == 2 { values[String(parts[0]), default: []].append(String(parts[1])) }
            }
        }
        return values[key, default: []].removeFirst()
    }

    /// The child's CPU time so far, in seconds.
    func cpuSeconds() throws -> Double {
        input.fileHandleForWriting.write(Data("cpu\n".utf8))
        let text = try read(key: "cpu")
        guard let seconds = Double(text) else {
            throw BenchmarkFailure(description: "the idle node child reported CPU time \(text)")
        }
        return seconds
    }

    /// Ends its stdin (it stops) and waits for it; terminates it if it does not stop within 10 s.
    func finish() {
        try? input.fileHandleForWriting.close()
        let deadline = Date(timeIntervalSinceNow: 10)
        while process.isRunning, Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
    }
}
