import Foundation
import Tether

/// Collecting tombstones (issue 35): a synced table holding as many tombstones as the run has rows
/// (the records inserted, then deleted; built once a run, copied each round), collected by one run
/// of `collectGarbage` with the default options, to completion. The database knows no peer, so
/// the horizon is its last sequence number and every tombstone goes, as when every peer has
/// acknowledged them. gc.rate and gc.step_max come from one collection a round (`sharedRun`).
enum GarbageCollectionBenchmarks {
    /// Tombstones collected per second, from the call to its return.
    static let rate = Benchmark(name: "gc.rate", unit: "tombstones/s", bestIs: .higher, comparison: nil) { context in
        let run = try sharedCollection(context, for: "gc.rate")
        return Double(run.removed) / run.seconds
    }.countingInstructions()

    /// The collection's longest write transaction (`GarbageCollectionReport.longestStep`, default
    /// `tombstonesPerStep`), in ms: the longest a writer waits for it.
    static let longestStep = Benchmark(name: "gc.step_max", unit: "ms", bestIs: .lower, comparison: nil) { context in
        try sharedCollection(context, for: "gc.step_max").longestStepMilliseconds
    }

    struct Collection {
        var removed: Int
        var seconds: Double
        var longestStepMilliseconds: Double
    }

    private static func sharedCollection(_ context: BenchmarkContext, for line: String) throws -> Collection {
        try context.sharedRun(named: "gc", for: line) { try collect(context) }
    }

    private static func collect(_ context: BenchmarkContext) throws -> Collection {
        let rows = context.rowCount
        let template = try context.syncedTemplate(named: "tombstones", of: BenchmarkRecord.self, rows: rows) { db in
            try db.insert(contentsOf: context.records)
            try db.execute("DELETE FROM \(RecordTable.name)")
        }
        return try context.withFreshDatabasePath { path in
            try FileManager.default.copyItem(atPath: template, toPath: path)
            let db = try Database(path: path)
            defer { try? db.close() }
            let (report, seconds) = try timed { try db.collectGarbage(Database.GarbageCollectionOptions()) }
            guard report.isComplete, report.tombstonesRemoved == rows, report.tombstonesKept == 0 else {
                throw BenchmarkFailure(
                    description: "collected \(report.tombstonesRemoved) of \(rows) tombstones "
                        + "(\(report.tombstonesKept) kept, complete: \(report.isComplete))")
            }
            let step = report.longestStep.components
            return Collection(
                removed: report.tombstonesRemoved, seconds: seconds,
                longestStepMilliseconds: Double(step.seconds) * 1_000 + Double(step.attoseconds) / 1e15)
        }
    }
}
