import Foundation
import Tether

/// An initial sync of ten times the run's rows (10M by default) between two processes, as
/// `sync.tls` syncs its rows: nothing either peer holds may grow with the size of the data, so
/// each side's peak memory stays under 64 MB and the rate stays at 0.9 × `sync.tls`'s of the
/// same run. The 10M-row source is built once a run (a couple of minutes), then each round
/// copies it and syncs: these lines run only when asked (`./Scripts/bench.sh sync.10m`), never
/// in the default run.
///
/// As for `sync.tls`, both peers are children of this process (`SyncPeerChild`), each reporting
/// its own peak resident memory (VmHWM); the three lines share one run a round.
enum LargeSyncBenchmarks {
    static let group = "sync.10m"
    /// How many times the run's rows the source holds.
    static let scale = 10

    static let sync10M = Benchmark(
        name: "sync.10m", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "sync.tls", goal: 0.9, better: .higher)
    ) { context in
        let run = try sharedRun(context, for: "sync.10m", oneTransaction: false)
        return Double(run.changes) / run.seconds
    }.runningOnlyWhenAsked(as: group)

    /// The sending peer's peak resident memory during that sync, in MiB. Goal: ≤ 64 MB
    /// (absolute, so no Comparison).
    static let rssSender = Benchmark(name: "sync.10m.rss.sender", unit: "MB", bestIs: .lower, comparison: nil) {
        context in
        try sharedRun(context, for: "sync.10m.rss.sender", oneTransaction: false).senderMaxRSSKiB / 1024
    }.runningOnlyWhenAsked(as: group)

    /// The receiving peer's peak resident memory during that sync, in MiB. Goal: ≤ 64 MB.
    static let rssReceiver = Benchmark(name: "sync.10m.rss.receiver", unit: "MB", bestIs: .lower, comparison: nil) {
        context in
        try sharedRun(context, for: "sync.10m.rss.receiver", oneTransaction: false).receiverMaxRSSKiB / 1024
    }.runningOnlyWhenAsked(as: group)

    /// The same rows written as ONE source transaction, received whole (`SyncOptions.wholeCatchUps`,
    /// as every line of a session: the default): the receiver stages the catch-up's batches on disk
    /// and applies them as they arrive in one transaction committed with the last (a reader sees
    /// none of them, then all). Goal: ≥ 0.8 × `sync.tls`'s rate,
    /// each side ≤ 64 MB.
    static let sync10MOneTransaction = Benchmark(
        name: "sync.10m.onetx", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "sync.tls", goal: 0.8, better: .higher)
    ) { context in
        let run = try sharedRun(context, for: "sync.10m.onetx", oneTransaction: true)
        return Double(run.changes) / run.seconds
    }.runningOnlyWhenAsked(as: group)

    /// The sending peer's peak resident memory during that sync, in MiB. Goal: ≤ 64 MB.
    static let oneTransactionRSSSender = Benchmark(
        name: "sync.10m.onetx.rss.sender", unit: "MB", bestIs: .lower, comparison: nil
    ) { context in
        try sharedRun(context, for: "sync.10m.onetx.rss.sender", oneTransaction: true).senderMaxRSSKiB / 1024
    }.runningOnlyWhenAsked(as: group)

    /// The receiving peer's peak resident memory during that sync, in MiB. Goal: ≤ 64 MB.
    static let oneTransactionRSSReceiver = Benchmark(
        name: "sync.10m.onetx.rss.receiver", unit: "MB", bestIs: .lower, comparison: nil
    ) { context in
        try sharedRun(context, for: "sync.10m.onetx.rss.receiver", oneTransaction: true).receiverMaxRSSKiB / 1024
    }.runningOnlyWhenAsked(as: group)

    /// One two-process sync a round for the three lines of a source: written a slice per
    /// transaction, or in one transaction (`oneTransaction`).
    private static func sharedRun(_ context: BenchmarkContext, for line: String, oneTransaction: Bool) throws
        -> NetworkSyncBenchmarks.SyncRun
    {
        let name = oneTransaction ? "sync.10m.onetx" : "sync.10m"
        return try context.sharedRun(named: "two-process-\(name)", for: line) {
            let rowCount = context.rowCount * scale
            let source = try context.largeSyncedSource(rowCount: rowCount, oneTransaction: oneTransaction)
            return try context.withFreshDatabasePath { sourcePath in
                try FileManager.default.copyItem(atPath: source.template, toPath: sourcePath)
                return try NetworkSyncBenchmarks.runTwoProcessSync(
                    context, from: sourcePath, rowCount: rowCount, line: name, memoryLog: ResidentMemoryLog()
                ) { targetPath in
                    try context.verifyStoredRecords(at: targetPath, expected: source.summary)
                }
            }
        }
    }
}

extension BenchmarkContext {
    /// A synced database of `rowCount` records (`BenchmarkRecord.makeInputs`'s, made a slice at a
    /// time so that this process never holds them all), inserted a slice per transaction or all
    /// in one (`oneTransaction`), built once per run, and the summary of its content. Copies
    /// take a new instance key when opened (see `withSyncedSourceDatabase`).
    func largeSyncedSource(rowCount: Int, oneTransaction: Bool = false) throws
        -> (template: String, summary: ContentSummary)
    {
        var summary = ContentSummary(rowCount: 0, idSum: 0, countSum: 0, nameBytes: 0, valueSum: 0)
        let name = "synced-source-\(rowCount)\(oneTransaction ? "-onetx" : "")"
        let template = try syncedTemplate(named: name, of: BenchmarkRecord.self, rows: rowCount) { db in
            func insertSlices(_ target: some DatabaseContext) throws {
                let slice = 250_000
                for start in stride(from: 0, to: rowCount, by: slice) {
                    let records = BenchmarkRecord.makeInputs(at: start..<min(rowCount, start + slice))
                    try target.insert(contentsOf: records)
                    summary.add(records)
                }
            }
            if oneTransaction { try db.write { try insertSlices($0) } } else { try insertSlices(db) }
        }
        // Built now or by an earlier round: the summary is kept beside the template.
        let kept = cachedValue(named: "\(name)-summary") { summary }
        return (template, kept)
    }
}

/// Samples the resident memory (VmRSS) of some processes once a second while a measurement
/// runs, and logs each one's samples when it ends: whether memory grows with the data synced
/// (a peak reached early and held) or with time; and what grew between the first and the last
/// sample: the heap and other private memory (RssAnon), mapped files (RssFile: the program's
/// code), or shared memory (RssShmem: SQLite's WAL index).
final class ResidentMemoryLog: @unchecked Sendable {
    private static let fields = ["VmRSS", "RssAnon", "RssFile", "RssShmem"]
    private let condition = NSCondition()
    private var running = false
    private var finished = false
    private var samples: [String: [[String: Int]]] = [:]  // guarded by condition

    /// Starts sampling the processes of `processes` (a name for the log: its process id).
    func start(_ processes: [String: Int32]) {
        condition.lock()
        running = true
        condition.unlock()
        let thread = Thread { [self] in
            condition.lock()
            defer {
                finished = true
                condition.broadcast()
                condition.unlock()
            }
            while running {
                for (name, pid) in processes {
                    guard var sample = Self.memoryKiB(of: pid) else { continue }
                    sample.merge(Self.anonymousMemoryKiB(of: pid)) { $1 }
                    samples[name, default: []].append(sample)
                }
                _ = condition.wait(until: Date(timeIntervalSinceNow: 1))
            }
        }
        thread.start()
    }

    /// Stops sampling and logs the samples, in MiB, two lines per process.
    func stop() {
        condition.lock()
        guard running else {
            condition.unlock()
            return
        }
        running = false
        condition.broadcast()
        while !finished { condition.wait() }
        let taken = samples
        condition.unlock()
        for (name, values) in taken.sorted(by: { $0.key < $1.key }) {
            log(
                "  resident memory of the \(name) by second (MB): "
                    + values.map { String(($0["VmRSS"] ?? 0) / 1024) }.joined(separator: " "))
            // From the second sample: the first may be taken before the session began.
            if values.count > 2, let first = values.dropFirst().first, let last = values.last {
                log(
                    "    from second 1 to the end, KiB: "
                        + (Self.fields + Self.anonymousParts).map { "\($0) \(first[$0] ?? 0) -> \(last[$0] ?? 0)" }
                        .joined(separator: ", "))
            }
        }
    }

    /// Where the private memory is, from /proc/PID/smaps, in KiB: glibc's main heap, its other
    /// arenas (made for other threads: anonymous mappings at a multiple of their 64 MiB size, the
    /// arenaCount of them), and the rest (thread stacks, large blocks mapped on their own).
    private static let anonymousParts = ["heap", "arenas", "arenaCount", "otherAnonymous"]

    static func anonymousMemoryKiB(of pid: Int32) -> [String: Int] {
        guard let file = FileHandle(forReadingAtPath: "/proc/\(pid)/smaps") else { return [:] }
        defer { try? file.close() }
        var parts: [String: Int] = [:]
        var category: String?
        for line in String(decoding: file.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n") {
            let fields = line.split(whereSeparator: { $0.isWhitespace })
            if let range = fields.first, range.contains("-"), fields.count >= 5,
                let start = UInt64(range.split(separator: "-")[0], radix: 16)
            {
                // A mapping: its path is the sixth field (none for anonymous memory).
                let path = fields.count > 5 ? String(fields[5]) : ""
                if path == "[heap]" {
                    category = "heap"
                } else if path.isEmpty {
                    let isArena = start % (64 << 20) == 0
                    category = isArena ? "arenas" : "otherAnonymous"
                    if isArena { parts["arenaCount", default: 0] += 1 }
                } else {
                    category = nil
                }
            } else if let category, fields.first == "Rss:", fields.count >= 2, let kib = Int(fields[1]) {
                parts[category, default: 0] += kib
            }
        }
        return parts
    }

    /// VmRSS and its parts from /proc/PID/status, in KiB; nil once the process is gone.
    static func memoryKiB(of pid: Int32) -> [String: Int]? {
        guard let file = FileHandle(forReadingAtPath: "/proc/\(pid)/status") else { return nil }
        defer { try? file.close() }
        let status = String(decoding: file.readDataToEndOfFile(), as: UTF8.self)
        var sample: [String: Int] = [:]
        for line in status.split(separator: "\n") {
            let parts = line.split(whereSeparator: { $0 == ":" || $0.isWhitespace })
            if parts.count >= 2, fields.contains(String(parts[0])), let kib = Int(parts[1]) {
                sample[String(parts[0])] = kib
            }
        }
        return sample["VmRSS"] == nil ? nil : sample
    }
}
