import Foundation
import BenchSQLite
import Tether
import TetherSync

/// Sync over TLS on loopback: end-to-end throughput, each peer's peak memory,
/// and the latency of a live session.
///
/// sync.tls and the two sync.rss lines come from one measurement: the two
/// peers run as two child processes of this executable (see `SyncPeerChild`),
/// so that each one's peak resident memory is its own. A run's three values
/// are shared through `BenchmarkContext.sharedRun`: the first of those lines
/// measured in a round starts a run, the others of the round take its values.
enum NetworkSyncBenchmarks {
    /// Syncing the run's rows (1M by default) from a server A holding them
    /// (committed before the clock starts) to a client B with the empty synced
    /// table, with TLS 1.3 and LZ4: the client's `syncOnce`, timed in the
    /// client process from its start to its return (B has applied and
    /// committed everything, and the session closed with BYE). The server is
    /// listening before. B's content is checked afterwards.
    static let syncTLS = Benchmark(
        name: "sync.tls", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "c.insert_logged", goal: 0.6, better: .higher)
    ) { context in
        let run = try sharedSyncRun(context, for: "sync.tls")
        return Double(run.changes) / run.seconds
    }

    /// The sending peer's (server A's) peak resident memory during that sync,
    /// in MiB. Goal: ≤ 150 MB (absolute, so no Comparison).
    static let rssSender = Benchmark(name: "sync.rss.sender", unit: "MB", bestIs: .lower, comparison: nil) { context in
        try sharedSyncRun(context, for: "sync.rss.sender").senderMaxRSSKiB / 1024
    }

    /// The receiving peer's (client B's) peak resident memory during that sync,
    /// in MiB. Goal: ≤ 150 MB (absolute, so no Comparison).
    static let rssReceiver = Benchmark(name: "sync.rss.receiver", unit: "MB", bestIs: .lower, comparison: nil) {
        context in
        try sharedSyncRun(context, for: "sync.rss.receiver").receiverMaxRSSKiB / 1024
    }

    /// Commit-to-visibility latency of a live session, median. Goal for p99: ≤ 10 ms.
    static let latencyP50 = Benchmark(name: "latency.p50", unit: "ms", bestIs: .lower, comparison: nil) { context in
        try context.sharedRun(named: "latency", for: "latency.p50") { try measureLatency(context) }.p50
    }

    /// Commit-to-visibility latency of a live session, 99th percentile. Goal: ≤ 10 ms.
    static let latencyP99 = Benchmark(name: "latency.p99", unit: "ms", bestIs: .lower, comparison: nil) { context in
        try context.sharedRun(named: "latency", for: "latency.p99") { try measureLatency(context) }.p99
    }

    // MARK: Two-process sync

    struct SyncRun {
        var changes: Int
        var seconds: Double
        var senderMaxRSSKiB: Double
        var receiverMaxRSSKiB: Double
    }

    private static func sharedSyncRun(_ context: BenchmarkContext, for line: String) throws -> SyncRun {
        try context.sharedRun(named: "two-process-sync", for: line) { try runTwoProcessSync(context) }
    }

    /// Starts the server child on a copy of the synced source database, reads
    /// its port, runs the client child on a fresh database with the empty
    /// synced table, waits for both and reads what they report.
    private static func runTwoProcessSync(_ context: BenchmarkContext) throws -> SyncRun {
        try context.withSyncedSourceDatabase { sourcePath in
            try runTwoProcessSync(context, from: sourcePath, rowCount: context.rowCount, line: "sync.tls") {
                targetPath in
                try context.verifyStoredRecords(at: targetPath)
            }
        }
    }

    /// Syncs the synced source database at `sourcePath` (`rowCount` rows, served by a server
    /// child) to a fresh database (a client child), checks the target with `verify`, and logs
    /// what the children report under `line`'s name. With a `memoryLog`, each child's resident
    /// memory is sampled during the sync and logged (where memory grows with the data);
    /// `wholeCatchUps`: the client applies the catch-up whole (`SyncOptions.wholeCatchUps`, the
    /// default); false: batch by batch.
    static func runTwoProcessSync(
        _ context: BenchmarkContext, from sourcePath: String, rowCount: Int, line: String,
        memoryLog: ResidentMemoryLog? = nil, wholeCatchUps: Bool = true, verify: (String) throws -> Void
    ) throws -> SyncRun {
        try context.withFreshDatabasePath { targetPath in
            do {
                let target = try Database(path: targetPath)
                defer { try? target.close() }
                try target.createTable(BenchmarkRecord.self)
                try target.enableSync(for: BenchmarkRecord.self)
            }
            return try runTwoProcessSync(
                context, from: sourcePath, to: targetPath, changes: rowCount, line: line, memoryLog: memoryLog,
                wholeCatchUps: wholeCatchUps, verify: verify)
        }
    }

    /// The same into the database at `targetPath`, which exists with the synced tables (and may
    /// hold what an earlier sync brought): `changes` are expected to go.
    static func runTwoProcessSync(
        _ context: BenchmarkContext, from sourcePath: String, to targetPath: String, changes rowCount: Int,
        line: String, memoryLog: ResidentMemoryLog? = nil, wholeCatchUps: Bool = true,
        verify: (String) throws -> Void
    ) throws -> SyncRun {
        let pki = try context.syncPKI()
        let server = try ChildProcess(arguments: [SyncPeerChild.flag, "server", sourcePath, pki.directory])
        defer { server.terminateIfRunning() }
        let port = try server.readReport(key: "port")
        let client = try ChildProcess(
            arguments: [
                SyncPeerChild.flag, wholeCatchUps ? "client-whole" : "client", targetPath, pki.directory, port,
            ])
        defer { client.terminateIfRunning() }
        memoryLog?.start(["sender": server.processIdentifier, "receiver": client.processIdentifier])
        defer { memoryLog?.stop() }
        let clientReport = try client.finish()
        let serverReport = try server.finish()
        try verify(targetPath)

        let received = try clientReport.integer("received")
        let sent = try serverReport.integer("sent")
        guard received == rowCount, sent == rowCount else {
            throw BenchmarkFailure(
                description:
                    "the server sent \(sent) changes and the client received \(received), expected \(rowCount)")
        }
        // CPU time per change: what a busy host does not change, unlike the rate (which it does).
        let cpuPerChange = [serverReport, clientReport].map { report in
            (try? report.number("cpu")).map { formatNumber($0 / Double(max(1, received)) * 1e6) } ?? "?"
        }
        log(
            "  \(line): \(received) changes in \(clientReport["seconds"] ?? "?") s "
                + "(\(serverReport["received"] ?? "?") the other way), "
                + "\(clientReport["batches"] ?? "?") batches, "
                + "\(clientReport["frameBytes"] ?? "?") frame bytes received; CPU s sender "
                + "\(serverReport["cpu"] ?? "?"), "
                + "receiver \(clientReport["cpu"] ?? "?") (µs per change \(cpuPerChange[0]), "
                + "\(cpuPerChange[1])); peak RSS (VmHWM) sender \(serverReport["maxrss"] ?? "?") KiB, "
                + "receiver \(clientReport["maxrss"] ?? "?") KiB (ru_maxrss, which includes the parent's: "
                + "\(serverReport["ru_maxrss"] ?? "?"), \(clientReport["ru_maxrss"] ?? "?") KiB)")
        return SyncRun(
            changes: received, seconds: try clientReport.number("seconds"),
            senderMaxRSSKiB: try serverReport.number("maxrss"),
            receiverMaxRSSKiB: try clientReport.number("maxrss"))
    }

    /// Commit-to-visibility latency of a live session when the commit is another connection's
    /// (another program's: here a bare SQLite connection of this process) on a table synced with
    /// `capturingExternalWrites`: A learns of it from the file system. Median.
    static let externalLatencyP50 = Benchmark(
        name: "latency.external.p50", unit: "ms", bestIs: .lower, comparison: nil
    ) { context in
        try context.sharedRun(named: "latency.external", for: "latency.external.p50") {
            try measureLatency(context, externalWriter: true)
        }.p50
    }

    /// The same, 99th percentile. Goal: ≤ 2 ms (issue 38), as for the library's own commits.
    static let externalLatencyP99 = Benchmark(
        name: "latency.external.p99", unit: "ms", bestIs: .lower, comparison: nil
    ) { context in
        try context.sharedRun(named: "latency.external", for: "latency.external.p99") {
            try measureLatency(context, externalWriter: true)
        }.p99
    }

    // MARK: Live latency

    /// The number of commits whose latency is measured.
    static let latencyCommits = 10_000

    /// Serves an empty synced table A, connects a live client B, then commits
    /// one row at a time on A and waits for B's `onBatchApplied` to report it:
    /// the time from before the insert to that report is one sample. Both peers
    /// run in this process. The commit itself wakes A's sessions (the commit
    /// seam): no `notifyLocalChanges()`, which is for other programs' writes.
    ///
    /// `externalWriter`: the rows are inserted by a bare SQLite connection to A's file instead, into
    /// a table synced with `capturingExternalWrites`: A learns of each commit from the file system.
    private static func measureLatency(_ context: BenchmarkContext, externalWriter: Bool = false) throws
        -> (p50: Double, p99: Double)
    {
        let applied = AppliedChanges()
        var options = SyncOptions()
        options.onBatchApplied = { [applied] count in applied.add(count) }
        let line = externalWriter ? "latency.external" : "latency"
        return try withLiveSession(context, options: options, capturingExternalWrites: externalWriter) {
            source, target, _ in
            let arrived = { (index: Int) in try applied.wait(untilAtLeast: index, timeoutSeconds: 10) }
            let samples =
                try externalWriter
                ? sampleExternalLatencies(commits: latencyCommits, on: source.path, until: arrived)
                : sampleLatencies(commits: latencyCommits, on: source, until: arrived)
            let rows = try target.count(BenchmarkRecord.self)
            guard rows == latencyCommits else {
                throw BenchmarkFailure(
                    description: "B holds \(rows) rows after the live session, expected \(latencyCommits)")
            }
            let p50 = percentile(0.50, ofSorted: samples)
            let p99 = percentile(0.99, ofSorted: samples)
            log(
                "  \(line): \(latencyCommits) commits, min \(formatNumber(samples[0])) ms, p50 "
                    + "\(formatNumber(p50)) ms, "
                    + "p90 \(formatNumber(percentile(0.90, ofSorted: samples))) ms, p99 \(formatNumber(p99)) ms, "
                    + "p99.9 \(formatNumber(percentile(0.999, ofSorted: samples))) ms, max "
                    + "\(formatNumber(samples[samples.count - 1])) ms")
            return (p50, p99)
        }
    }

    /// Two fresh databases with the record table synced: A served on loopback, B connected to it
    /// by a live session with `options`. Runs `body(A, B, A's server)`, then stops both ends.
    static func withLiveSession<T>(
        _ context: BenchmarkContext, options: SyncOptions = SyncOptions(), capturingExternalWrites: Bool = false,
        _ body: (Database, Database, SyncServer) throws -> T
    ) throws -> T {
        let pki = try context.syncPKI()
        let serverTLS = try pki.serverContext()
        let clientTLS = try pki.clientContext()
        return try context.withFreshDatabasePath { sourcePath in
            try context.withFreshDatabasePath { targetPath in
                let source = try Database(path: sourcePath)
                defer { try? source.close() }
                let target = try Database(path: targetPath)
                defer { try? target.close() }
                for db in [source, target] {
                    try db.createTable(BenchmarkRecord.self)
                    try db.enableSync(for: BenchmarkRecord.self, capturingExternalWrites: capturingExternalWrites)
                }
                let server = try blockingAwait { try await SyncServer.start(database: source, tls: serverTLS) }
                let connection: SyncConnection
                do {
                    connection = try blockingAwait {
                        try await SyncClient.connect(
                            database: target, host: "127.0.0.1", port: server.port, tls: clientTLS, options: options)
                    }
                } catch {
                    try? blockingAwait { try await server.stop() }
                    throw error
                }
                let result = Result { try body(source, target, server) }
                let stopResult = Result<Void, any Error> {
                    _ = try blockingAwait { try await connection.stop() }
                    try blockingAwait { try await server.stop() }
                }
                let value = try result.get()
                try stopResult.get()
                return value
            }
        }
    }

    /// Inserts `commits` rows on `source`, one per commit (which wakes `server`'s sessions by
    /// itself); each sample is the time from before the insert until `arrived(index)` returns.
    /// Sorted, in milliseconds.
    static func sampleLatencies(
        commits: Int, on source: Database,
        until arrived: (Int) throws -> Void
    ) throws -> [Double] {
        var samples: [Double] = []
        samples.reserveCapacity(commits)
        for index in 1...commits {
            let record = BenchmarkRecord(
                id: Int64(index), name: "live-\(index)", count: Int64(index % 1000), value: Double(index) * 0.5)
            let milliseconds =
                try timed {
                    _ = try source.insert(record)
                    try arrived(index)
                }.seconds * 1000
            samples.append(milliseconds)
        }
        return samples.sorted()
    }

    /// Inserts `commits` rows into the record table of the database at `path` through a bare SQLite
    /// connection (another program's writes, as A sees them), one per commit; each sample is the
    /// time from before the insert until `arrived(index)` returns. Sorted, in milliseconds.
    static func sampleExternalLatencies(
        commits: Int, on path: String, until arrived: (Int) throws -> Void
    ) throws -> [Double] {
        let writer = try RawConnection(path: path)
        sqlite3_busy_timeout(writer.handle, 5_000)
        let insert = try writer.prepare(RecordTable.insertSQL)
        defer { sqlite3_finalize(insert) }
        var samples: [Double] = []
        samples.reserveCapacity(commits)
        for index in 1...commits {
            let name = "live-\(index)"
            let milliseconds =
                try timed {
                    sqlite3_reset(insert)
                    sqlite3_bind_int64(insert, 1, Int64(index))
                    sqlite3_bind_text(insert, 2, name, -1, bench_sqlite_transient())
                    sqlite3_bind_int64(insert, 3, Int64(index % 1000))
                    sqlite3_bind_double(insert, 4, Double(index) * 0.5)
                    let rc = sqlite3_step(insert)
                    guard rc == SQLITE_DONE else { throw writer.error(rc, doing: "inserting row \(index)") }
                    try arrived(index)
                }.seconds * 1000
            samples.append(milliseconds)
        }
        return samples.sorted()
    }

    /// The nearest-rank percentile `p` (0…1) of sorted, non-empty `values`.
    static func percentile(_ p: Double, ofSorted values: [Double]) -> Double {
        let rank = Int((p * Double(values.count)).rounded(.up))
        return values[min(values.count, max(1, rank)) - 1]
    }
}

/// The changes B's session reports applied, which the latency loop waits on
/// (a condition variable: no polling, no sleeping).
final class AppliedChanges: @unchecked Sendable {
    private let condition = NSCondition()
    private var total = 0

    /// Called on B's event loop after each batch is applied and committed.
    func add(_ count: Int) {
        guard count > 0 else { return }
        condition.lock()
        total += count
        condition.broadcast()
        condition.unlock()
    }

    func wait(untilAtLeast expected: Int, timeoutSeconds: Double) throws {
        let deadline = Date(timeIntervalSinceNow: timeoutSeconds)
        condition.lock()
        defer { condition.unlock() }
        while total < expected {
            guard condition.wait(until: deadline) || total >= expected else {
                throw BenchmarkFailure(
                    description:
                        "B applied \(total) changes, still waiting for change \(expected) after \(timeoutSeconds) s")
            }
        }
    }
}

// MARK: Certificates

/// A CA and the server and client certificates it signs, written once per run.
struct SyncPKI {
    let directory: String

    var caFile: String { directory + "/ca.crt" }

    func serverContext() throws -> TLSContext {
        try TLSContext(
            configuration: .server(
                certificateChainFile: directory + "/server.crt", privateKeyFile: directory + "/server.key",
                trustedCAFile: caFile))
    }

    func clientContext() throws -> TLSContext {
        try TLSContext(
            configuration: .client(
                certificateChainFile: directory + "/client.crt", privateKeyFile: directory + "/client.key",
                trustedCAFile: caFile))
    }

    static func create(in directory: String) throws -> SyncPKI {
        let validity: TimeInterval = 86_400
        let ca = try CertificateAuthority.create(commonName: "Tether Bench CA", validity: validity)
        try CertificateAuthority.write(
            ca, certificatePath: directory + "/ca.crt", privateKeyPath: directory + "/ca.key")
        for name in ["server", "client"] {
            let credentials = try CertificateAuthority.issue(
                commonName: "bench-\(name)", signedBy: ca, validity: validity)
            try CertificateAuthority.write(
                credentials, certificatePath: directory + "/\(name).crt", privateKeyPath: directory + "/\(name).key")
        }
        return SyncPKI(directory: directory)
    }
}

extension BenchmarkContext {
    func syncPKI() throws -> SyncPKI {
        try cachedValue(named: "sync-pki") {
            try SyncPKI.create(in: try runSubdirectory(named: "pki").path)
        }
    }
}

// MARK: Bridging to async

/// Runs `body` on the global executor and blocks the calling synchronous
/// thread (never one of the executor's) until it finishes.
func blockingAwait<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
    let box = ResultBox<T>()
    let done = DispatchSemaphore(value: 0)
    Task {
        let result: Result<T, any Error>
        do { result = .success(try await body()) } catch { result = .failure(error) }
        box.set(result)
        done.signal()
    }
    done.wait()
    return try box.get()
}

private final class ResultBox<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var result: Result<T, any Error>?

    func set(_ result: Result<T, any Error>) {
        lock.lock()
        self.result = result
        lock.unlock()
    }

    func get() throws -> T {
        lock.lock()
        defer { lock.unlock() }
        guard let result else { throw BenchmarkFailure(description: "an async operation ended without a result") }
        return try result.get()
    }
}
