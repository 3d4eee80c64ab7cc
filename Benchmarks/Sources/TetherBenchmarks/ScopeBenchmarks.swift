import Foundation
import Tether

/// A record of one of ten sites: what a hub serving ten site nodes holds (partial replication,
/// issue 23). Each site node's scope is its own site's rows, a tenth of the table.
@Model
struct SitedRecord: Codable, Equatable, Sendable {
    var id: Int64
    var site: String
    var name: String
    var count: Int64
    var value: Double

    static let tableName = "sited_record"
    static let siteCount = 10

    static func makeInputs(count: Int) -> [SitedRecord] {
        (0..<count).map { index in
            let number = index + 1
            return SitedRecord(id: Int64(number), site: siteName(number % siteCount), name: "name-\(number)", count: Int64(number % 1000),
                               value: Double(number) * 0.25)
        }
    }

    static func siteName(_ index: Int) -> String { "site-\(index)" }
}

/// Extraction for a scoped peer against the same extraction unscoped, over the same changes.
enum ScopeBenchmarks {
    /// The peer both lines extract for (membership is recorded under its key).
    private static let peer = InstanceKey(hex: "5c09e5c09e5c09e5c09e5c09e5c09e5c")

    /// A site node's scope: its own site's rows.
    static func siteScope(_ index: Int) -> SyncScope {
        SyncScope(["sited_record": .filter("site = :peer_name")], parameters: ["peer_name": .text(SitedRecord.siteName(index))])
    }

    /// Extracting every change of the sited database (`rowCount` rows, ten sites) for a peer
    /// holding everything, batch by batch as `engine.apply` extracts: the extract half of
    /// `engine.apply`, the rate `scope.extract` is compared with.
    static let engineExtract = Benchmark(name: "engine.extract", unit: "changes/s", bestIs: .higher, comparison: nil) { context in
        try extractionRate(context, scope: nil)
    }

    /// The same changes extracted for a peer whose scope holds one site (a tenth of the rows): the
    /// scope is decided for every change, and the rows it holds are recorded. Per change of the
    /// log, as `engine.extract`.
    static let scopeExtract = Benchmark(
        name: "scope.extract", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "engine.extract", goal: 0.8, better: .higher)
    ) { context in
        try extractionRate(context, scope: siteScope(3))
    }

    private static func extractionRate(_ context: BenchmarkContext, scope: SyncScope?) throws -> Double {
        guard let peer else { throw BenchmarkFailure(description: "the benchmark peer's key is not 32 hex characters") }
        return try context.withSitedSourceDatabase { path in
            let db = try Database(path: path)
            defer { try? db.close() }
            var extracted = 0
            var batches = 0
            let seconds = try timed {
                var cursor: Int64 = 0
                while true {
                    let batch = try db.extractChanges(for: peer, after: cursor, limits: BatchLimits(maximumChanges: 5_000),
                                                      markInFlight: false, scope: scope)
                    extracted += batch.changes.count
                    batches += 1
                    cursor = batch.through
                    if batch.isLast { break }
                }
            }.seconds
            let expected = scope == nil ? context.rowCount : context.rowCount / SitedRecord.siteCount
            guard extracted == expected else {
                throw BenchmarkFailure(description: "extracted \(extracted) changes in \(batches) batches, expected \(expected)")
            }
            return Double(context.rowCount) / seconds
        }
    }
}

extension BenchmarkContext {
    /// Runs `body` with a fresh copy of a synced database holding `rowCount` sited records
    /// (built once per run, bulk-inserted as `withSyncedSourceDatabase`'s records are).
    func withSitedSourceDatabase<T>(_ body: (String) throws -> T) throws -> T {
        let template = try cachedTemplate(named: "sited-source") { path in
            log("building the sited source database (\(rowCount) rows)")
            let building = path + ".building"
            let db = try Database(path: building)
            defer { try? db.close(); try? FileManager.default.removeItem(atPath: building) }
            try db.createTable(SitedRecord.self)
            try db.enableSync(for: SitedRecord.self)
            try db.insert(contentsOf: SitedRecord.makeInputs(count: rowCount))
            // A copy of the backup takes a new instance key when opened, as engine.apply's source does.
            try db.backup(to: path)
        }
        return try withFreshDatabasePath { path in
            try FileManager.default.copyItem(atPath: template, toPath: path)
            return try body(path)
        }
    }
}
