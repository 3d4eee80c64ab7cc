import Foundation
import NIOConcurrencyHelpers
import Tether
import TetherSync

/// The hidden child mode of this executable: one sync peer per process, so
/// that each peer's peak resident memory (which counts the whole process) is
/// its own. The parent (`NetworkSyncBenchmarks`) runs
///
///     TetherBenchmarks --sync-peer-child server DATABASE PKI-DIRECTORY [HOST]
///     TetherBenchmarks --sync-peer-child client DATABASE PKI-DIRECTORY PORT [HOST]
///
/// (HOST: where the server listens and the client connects; 127.0.0.1 when left out. The
/// `links.*` lines run the peers in two network namespaces, `LinkBenchmarks`.)
///
/// A child reports on stdout, one `key value` line each (the server its port
/// as soon as it listens, then the rest when its session ended); its logs and
/// errors go to stderr. It does nothing else: in particular it never builds the
/// benchmark's input records, which would count in its memory.
///
/// The live modes of the `links.latency.*` lines keep a session open and take commands on stdin:
///
///     TetherBenchmarks --sync-peer-child live-server DATABASE PKI-DIRECTORY HOST
///     TetherBenchmarks --sync-peer-child live-client DATABASE PKI-DIRECTORY PORT HOST
///
/// The live server reports its port, then for each line `commit INDEX` inserts one row through the
/// library (id INDEX) and reports `commit INDEX T`, T the CLOCK_MONOTONIC time in nanoseconds taken
/// before the insert. The live client connects (`SyncClient.connect`: caught up when it returns),
/// reports `live ready`, then `applied TOTAL T` from each `onBatchApplied` (TOTAL the changes
/// applied so far, T the same clock: one clock for every process of the machine, whatever its
/// network namespace). Either stops at `quit` or the end of its stdin and reports its totals.
enum SyncPeerChild {
    static let flag = "--sync-peer-child"

    static func run(_ arguments: [String]) -> Int32 {
        do {
            func port(_ text: String) throws -> Int {
                guard let port = Int(text) else { throw UsageError(description: "bad port \(text)") }
                return port
            }
            switch (arguments.first, arguments.count) {
            case ("server", 3), ("server", 4):
                try runServer(
                    databasePath: arguments[1], pki: SyncPKI(directory: arguments[2]),
                    host: arguments.count == 4 ? arguments[3] : "127.0.0.1")
            case ("hub", 3):
                try runHub(databasePath: arguments[1], pki: SyncPKI(directory: arguments[2]))
            case ("client", 4), ("client-whole", 4), ("client", 5), ("client-whole", 5):
                try runClient(
                    databasePath: arguments[1], pki: SyncPKI(directory: arguments[2]), port: port(arguments[3]),
                    host: arguments.count == 5 ? arguments[4] : "127.0.0.1",
                    wholeCatchUps: arguments.first == "client-whole")
            case ("live-server", 4):
                try runLiveServer(databasePath: arguments[1], pki: SyncPKI(directory: arguments[2]), host: arguments[3])
            case ("live-client", 5):
                try runLiveClient(
                    databasePath: arguments[1], pki: SyncPKI(directory: arguments[2]), port: port(arguments[3]),
                    host: arguments[4])
            default:
                throw UsageError(
                    description: """
                        usage: TetherBenchmarks \(flag) server DATABASE PKI [HOST] | hub DATABASE PKI | client \
                        DATABASE PKI PORT [HOST] | client-whole DATABASE PKI PORT [HOST] | live-server DATABASE PKI \
                        HOST | live-client DATABASE PKI PORT HOST
                        """)
            }
            return 0
        } catch {
            log("sync peer child \(arguments.first ?? "?"): error: \(error)")
            return 1
        }
    }

    /// Serves the database until its first session ends (the client's BYE),
    /// then stops and reports the changes sent and the peak RSS.
    private static func runServer(databasePath: String, pki: SyncPKI, host: String) throws {
        let db = try Database(path: databasePath)
        let tls = try pki.serverContext()
        let server = try blockingAwait { try await SyncServer.start(database: db, host: host, tls: tls) }
        report("port", "\(server.port)")
        let result = try blockingAwait { () async -> Result<SyncSummary, SyncSessionError>? in
            for await result in server.sessionResults { return result }
            return nil
        }
        try blockingAwait { try await server.stop() }
        try db.close()
        guard let result else { throw BenchmarkFailure(description: "the server stopped without a session") }
        let summary = try result.get()
        report("sent", "\(summary.changesSent)")
        report("received", "\(summary.changesReceived)")
        report("cpu", "\(cpuSeconds())")
        report("maxrss", "\(peakResidentKiB())")
        report("ru_maxrss", "\(inheritedMaxRSSKiB())")
    }

    /// Serves the database to every peer that connects until the parent terminates it; reports
    /// its port. The parent reads its memory and CPU time from /proc (`LoadBenchmarks`).
    private static func runHub(databasePath: String, pki: SyncPKI) throws {
        let db = try Database(path: databasePath)
        let tls = try pki.serverContext()
        let server = try blockingAwait { try await SyncServer.start(database: db, tls: tls) }
        report("port", "\(server.port)")
        try blockingAwait { for await _ in server.sessionResults {} }
    }

    /// Syncs once with the server, timed from the call to its return (B has
    /// applied and committed everything, BYE exchanged); the database is
    /// opened and the TLS context loaded before.
    /// Syncs once with the server at `host`:`port`; `wholeCatchUps`: its catch-up applied whole
    /// (`SyncOptions.wholeCatchUps`).
    private static func runClient(
        databasePath: String, pki: SyncPKI, port: Int, host: String, wholeCatchUps: Bool
    ) throws {
        let db = try Database(path: databasePath)
        let tls = try pki.clientContext()
        let options = {
            var options = SyncOptions()
            options.wholeCatchUps = wholeCatchUps
            return options
        }()
        let (summary, seconds) = try timed {
            try blockingAwait {
                try await SyncClient.syncOnce(database: db, host: host, port: port, tls: tls, options: options)
            }
        }
        try db.close()
        report("seconds", "\(seconds)")
        report("received", "\(summary.changesReceived)")
        report("batches", "\(summary.batchesReceived)")
        report("frameBytes", "\(summary.bytesReceived)")
        report("cpu", "\(cpuSeconds())")
        report("maxrss", "\(peakResidentKiB())")
        report("ru_maxrss", "\(inheritedMaxRSSKiB())")
    }

    /// Serves the database on `host` (any free port) and commits one row per `commit INDEX` line of
    /// stdin, until `quit` or the end of stdin (see the type's comment).
    private static func runLiveServer(databasePath: String, pki: SyncPKI, host: String) throws {
        let db = try Database(path: databasePath)
        let tls = try pki.serverContext()
        let server = try blockingAwait { try await SyncServer.start(database: db, host: host, tls: tls) }
        report("port", "\(server.port)")
        let outcome = Result<Void, any Error> {
            while let line = readLine(), line != "quit" {
                let words = line.split(separator: " ")
                guard words.count == 2, words[0] == "commit", let index = Int64(words[1]) else {
                    throw UsageError(description: "live server: unknown command \"\(line)\"")
                }
                let record = BenchmarkRecord(
                    id: index, name: "live-\(index)", count: index % 1000, value: Double(index) * 0.5)
                let start = monotonicNanoseconds()
                _ = try db.insert(record)
                report("commit", "\(index) \(start)")
            }
        }
        try blockingAwait { try await server.stop() }
        try db.close()
        try outcome.get()
        report("sent", "\(server.totals.changesSent)")
        report("cpu", "\(cpuSeconds())")
    }

    /// Connects a live session to the server at `host`:`port`, reports each applied batch with
    /// the time, until `quit` or the end of stdin (see the type's comment).
    private static func runLiveClient(databasePath: String, pki: SyncPKI, port: Int, host: String) throws {
        let db = try Database(path: databasePath)
        let tls = try pki.clientContext()
        let applied = NIOLockedValueBox(0)
        var options = SyncOptions()
        options.onBatchApplied = { count in
            guard count > 0 else { return }
            // Under the lock, so that the lines go out in the order of their totals.
            applied.withLockedValue { total in
                total += count
                report("applied", "\(total) \(monotonicNanoseconds())")
            }
        }
        let connection = try blockingAwait { [options] in
            try await SyncClient.connect(database: db, host: host, port: port, tls: tls, options: options)
        }
        report("live", "ready")
        while let line = readLine(), line != "quit" {}
        let summary = try blockingAwait { try await connection.stop() }
        try db.close()
        report("received", "\(summary.changesReceived)")
        report("frameBytes", "\(summary.bytesReceived)")
        report("cpu", "\(cpuSeconds())")
    }

    /// CLOCK_MONOTONIC, in nanoseconds: the same clock in every process of the machine.
    static func monotonicNanoseconds() -> Int {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return time.tv_sec * 1_000_000_000 + time.tv_nsec
    }

    /// User plus system CPU time of this process so far, in seconds: which peer is the bottleneck.
    private static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(
            usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }

    private static func report(_ key: String, _ value: String) {
        FileHandle.standardOutput.write(Data("\(key) \(value)\n".utf8))
    }

    /// The process's own peak resident set size, in KiB: VmHWM of
    /// /proc/self/status, the high-water mark of this process's address space.
    ///
    /// Not getrusage's ru_maxrss: Linux preserves it across execve (see
    /// getrusage(2)), so a child started by the benchmark process begins with
    /// the parent's peak (the parent holds the run's input records) and would
    /// report that. ru_maxrss is used only where /proc is missing.
    static func peakResidentKiB() -> Int {
        // Read to the end: /proc files have no size for String(contentsOfFile:) to go by.
        if let file = FileHandle(forReadingAtPath: "/proc/self/status"),
            case let status = String(decoding: file.readDataToEndOfFile(), as: UTF8.self),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
            let kib = Int(line.dropFirst("VmHWM:".count).split(whereSeparator: { $0.isWhitespace }).first ?? "")
        {
            return kib
        }
        return inheritedMaxRSSKiB()
    }

    /// getrusage's ru_maxrss, in KiB (for the log: it includes the parent's peak).
    static func inheritedMaxRSSKiB() -> Int {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return usage.ru_maxrss
    }
}

/// What a child reported: its `key value` lines.
struct ChildReport {
    var values: [String: String]

    subscript(key: String) -> String? { values[key] }

    func number(_ key: String) throws -> Double {
        guard let text = values[key], let value = Double(text) else {
            throw BenchmarkFailure(description: "the sync peer child did not report \(key) (report: \(values))")
        }
        return value
    }

    func integer(_ key: String) throws -> Int {
        guard let text = values[key], let value = Int(text) else {
            throw BenchmarkFailure(description: "the sync peer child did not report \(key) (report: \(values))")
        }
        return value
    }
}

/// This executable run again in child mode, its stdout read line by line.
final class ChildProcess {
    private let process = Process()
    private let output = Pipe()
    private var pending = Data()
    private var values: [String: String] = [:]
    private let role: String

    init(arguments: [String]) throws {
        role = arguments.dropFirst().first ?? "child"
        process.executableURL = Bundle.main.executableURL ?? URL(fileURLWithPath: CommandLine.arguments[0])
        process.arguments = arguments
        process.standardOutput = output
        // stderr is inherited: the child's logs go where the parent's go.
        try process.run()
    }

    /// Reads the child's output until it reported `key`.
    func readReport(key: String) throws -> String {
        while values[key] == nil {
            let data = output.fileHandleForReading.availableData
            guard !data.isEmpty else {
                throw BenchmarkFailure(description: "the \(role) child ended without reporting \(key)")
            }
            pending.append(data)
            parseLines()
        }
        return values[key] ?? ""
    }

    /// Reads the rest of the child's output and waits for it to exit successfully.
    func finish() throws -> ChildReport {
        pending.append(output.fileHandleForReading.readDataToEndOfFile())
        pending.append(UInt8(ascii: "\n"))
        parseLines()
        process.waitUntilExit()
        guard process.terminationReason == .exit, process.terminationStatus == 0 else {
            throw BenchmarkFailure(description: "the \(role) child failed (status \(process.terminationStatus))")
        }
        return ChildReport(values: values)
    }

    /// The child's process id (for /proc).
    var processIdentifier: Int32 { process.processIdentifier }

    func terminateIfRunning() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }

    private func parseLines() {
        while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
            let line = String(decoding: pending[pending.startIndex..<newline], as: UTF8.self)
            pending.removeSubrange(pending.startIndex...newline)
            let parts = line.split(separator: " ", maxSplits: 1)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
    }
}
