import Foundation
import GRDB
import Synchronization
import Tether
import TetherSync

/// Observation: what a listener costs a bulk insert, how fast a query observation follows
/// commits (against GRDB's ValueObservation), and how soon a peer's query observation sees a
/// commit made on the other side of a live session.
enum ObservationBenchmarks {
    /// `orm.insert` with a listener on the table: timed until the listener has been called for
    /// every row (the delivery after the commit counts). Goal: ≥ 0.9 × `orm.insert`.
    static let insert = Benchmark.rowsPerSecond(
        "observe.insert", comparedTo: Comparison(baseline: "orm.insert", goal: 0.9, better: .higher)
    ) { context in
        let records = context.records
        return try context.withFreshDatabasePath { path in
            let db = try Database(path: path)
            defer { try? db.close() }
            try db.createTable(BenchmarkRecord.self)
            let heard = Tally(target: records.count)
            let token = db.observe(.insert, of: BenchmarkRecord.self) { _ in heard.increment() }
            defer { token.cancel() }
            let seconds = try timed {
                try db.insert(contentsOf: records)
                try heard.waitForTarget(timeoutSeconds: 120)
            }.seconds
            return Double(records.count) / seconds
        }
    }

    /// Commits whose new value a query observation delivered, per second: one row inserted per
    /// commit, each followed by waiting for the observation of `count(*)` to yield it.
    static let queryCommits = 2_000

    static let query = Benchmark(name: "observe.query", unit: "commits/s", bestIs: .higher, comparison: nil) {
        context in
        try context.withFreshDatabasePath { path in
            let db = try Database(path: path)
            defer { try? db.close() }
            try db.createTable(BenchmarkRecord.self)
            let seen = Counter()
            let consumer = try seen.follow(
                db.observe { try $0.fetchValue("SELECT count(*) FROM record", as: Int.self) ?? 0 })
            defer { consumer.cancel() }
            let records = context.records.prefix(queryCommits)
            let seconds = try timed {
                for (index, record) in records.enumerated() {
                    _ = try db.insert(record)
                    try seen.wait(untilAtLeast: index + 1, timeoutSeconds: 10, what: "observed count")
                }
            }.seconds
            return Double(records.count) / seconds
        }
    }

    /// `observe.query` with GRDB's ValueObservation on a DatabasePool (values delivered on a queue).
    static let grdbQuery = Benchmark(
        name: "grdb.observe.query", unit: "commits/s", bestIs: .higher,
        comparison: Comparison(baseline: "observe.query", goal: 1.0, better: .lower)
    ) { context in
        try context.withFreshDatabasePath { path in
            let pool = try GRDBBenchmarks.openPool(path)
            defer { try? pool.close() }
            try pool.write { db in try db.execute(sql: RecordTable.createSQL) }
            let seen = Counter()
            let observation = ValueObservation.tracking { db in
                try Int.fetchOne(db, sql: "SELECT count(*) FROM record") ?? 0
            }
            let cancellable = observation.start(
                in: pool, scheduling: .async(onQueue: DispatchQueue(label: "grdb.observation")),
                onError: { _ in }, onChange: { seen.set($0) })
            defer { cancellable.cancel() }
            try seen.wait(untilAtLeast: 0, timeoutSeconds: 10, what: "the first value")
            let records = context.records.prefix(queryCommits)
            let seconds = try timed {
                for (index, record) in records.enumerated() {
                    try pool.write { db in
                        try db.execute(
                            sql: RecordTable.insertSQL, arguments: [record.id, record.name, record.count, record.value])
                    }
                    try seen.wait(untilAtLeast: index + 1, timeoutSeconds: 10, what: "observed count")
                }
            }.seconds
            return Double(records.count) / seconds
        }
    }

    /// Commit on A to the new value of a query observation on B, B connected to A by a live
    /// session on loopback, 99th percentile. Goal: ≤ 10 ms.
    static let latencyP99 = Benchmark(name: "observe.latency.p99", unit: "ms", bestIs: .lower, comparison: nil) {
        context in
        try measureLatency(context)
    }

    static let latencyCommits = 2_000

    private static func measureLatency(_ context: BenchmarkContext) throws -> Double {
        try NetworkSyncBenchmarks.withLiveSession(context) { source, target, _ in
            let seen = Counter()
            let consumer = try seen.follow(
                target.observe { try $0.fetchValue("SELECT max(id) FROM record", as: Int.self) ?? 0 })
            defer { consumer.cancel() }
            let samples = try NetworkSyncBenchmarks.sampleLatencies(commits: latencyCommits, on: source) { index in
                try seen.wait(untilAtLeast: index, timeoutSeconds: 10, what: "B's observed max(id)")
            }
            let p99 = NetworkSyncBenchmarks.percentile(0.99, ofSorted: samples)
            log(
                "  observe.latency: \(latencyCommits) commits, p50 "
                    + "\(formatNumber(NetworkSyncBenchmarks.percentile(0.5, ofSorted: samples))) ms, "
                    + "p99 \(formatNumber(p99)) ms, max \(formatNumber(samples[samples.count - 1])) ms")
            return p99
        }
    }
}

/// Listener calls counted with an atomic add (a listener as cheap as one can be), the waiter
/// woken once, when they reach the target.
final class Tally: @unchecked Sendable {
    private let count = Atomic<Int>(0)
    private let target: Int
    private let reached = DispatchSemaphore(value: 0)

    init(target: Int) { self.target = target }

    func increment() {
        if count.wrappingAdd(1, ordering: .relaxed).newValue == target { reached.signal() }
    }

    func waitForTarget(timeoutSeconds: Double) throws {
        guard reached.wait(timeout: .now() + timeoutSeconds) == .success else {
            throw BenchmarkFailure(
                description: "the listener was called \(count.load(ordering: .relaxed)) times, expected \(target)")
        }
    }
}

/// A number other threads raise and the benchmark waits on (a condition variable: no polling).
final class Counter: @unchecked Sendable {
    private let condition = NSCondition()
    private var value = -1

    func set(_ newValue: Int) {
        condition.lock()
        value = newValue
        condition.broadcast()
        condition.unlock()
    }

    /// Sets the counter to each value of `observation`, from a task; returns once the first arrived.
    func follow(_ observation: QueryObservation<Int>) throws -> Task<Void, any Error> {
        let consumer = Task { [self] in
            for try await value in observation { set(value) }
        }
        do {
            try wait(untilAtLeast: 0, timeoutSeconds: 10, what: "the first value")
        } catch {
            consumer.cancel()
            throw error
        }
        return consumer
    }

    func wait(untilAtLeast expected: Int, timeoutSeconds: Double, what: String) throws {
        let deadline = Date(timeIntervalSinceNow: timeoutSeconds)
        condition.lock()
        defer { condition.unlock() }
        while value < expected {
            guard condition.wait(until: deadline) || value >= expected else {
                throw BenchmarkFailure(
                    description: "\(what): \(value), still waiting for \(expected) after \(timeoutSeconds) s")
            }
        }
    }
}
