import Foundation
import Tether

extension BenchmarkRecord {
    static let tableName = RecordTable.name
}

/// `BenchmarkRecord` as a model without `@Model`: Tether reads and binds it
/// through its `Codable` conformance (the `orm.*.codable` lines).
struct CodableBenchmarkRecord: Model, Equatable {
    var id: Int64
    var name: String
    var count: Int64
    var value: Double
    static let tableName = RecordTable.name

    init(_ record: BenchmarkRecord) {
        (id, name, count, value) = (record.id, record.name, record.count, record.value)
    }
    var plain: BenchmarkRecord { BenchmarkRecord(id: id, name: name, count: count, value: value) }
}

/// Tether's ORM, through its public API only. `Database`'s defaults are the
/// configuration every contender copies (WAL, synchronous NORMAL).
enum TetherORMBenchmarks {
    static let insert = Benchmark.rowsPerSecond(
        "orm.insert", comparedTo: Comparison(baseline: "c.insert", goal: 0.85, better: .higher, instructionGoal: 1.1)
    ) { context in
        try insertRate(context.records, context)
    }.countingInstructions()

    static let fetch = Benchmark.rowsPerSecond(
        "orm.fetch", comparedTo: Comparison(baseline: "c.fetch", goal: 0.8, better: .higher, instructionGoal: 1.1)
    ) { context in
        try fetchRate(BenchmarkRecord.self, context) { $0 }
    }.countingInstructions()

    static let insertCodable = Benchmark.rowsPerSecond("orm.insert.codable") { context in
        try insertRate(context.records.map(CodableBenchmarkRecord.init), context)
    }.countingInstructions()

    static let fetchCodable = Benchmark.rowsPerSecond("orm.fetch.codable") { context in
        try fetchRate(CodableBenchmarkRecord.self, context, as: \.plain)
    }.countingInstructions()

    /// Updating one column of each of 100,000 rows, one row per statement, in one transaction.
    static let update = Benchmark.rowsPerSecond("orm.update") { context in
        try updateRate(context, synced: false)
    }.countingInstructions(rows: updatedRowCount)

    /// The rows `orm.update` and `synced.update` update: the first 100,000 of the run's.
    static func updatedRowCount(_ context: BenchmarkContext) -> Int {
        min(100_000, context.rowCount)
    }

    /// `orm.update`'s body: the rows are inserted in bulk (untimed), then each has its `count`
    /// updated through `update(_:columns:)`. With `synced`, the table is synced first, so that
    /// each update is a change the engine records.
    static func updateRate(_ context: BenchmarkContext, synced: Bool, capturingExternalWrites: Bool = false) throws
        -> Double
    {
        let records = Array(context.records.prefix(updatedRowCount(context)))
        return try context.withFreshDatabasePath { path in
            let db = try Database(path: path)
            defer { try? db.close() }
            try db.createTable(BenchmarkRecord.self)
            if synced { try db.enableSync(for: BenchmarkRecord.self, capturingExternalWrites: capturingExternalWrites) }
            try db.insert(contentsOf: records)
            let seconds = try timed {
                try db.write { conn in
                    for var record in records {
                        record.count += 1
                        try conn.update(record, columns: ["count"])
                    }
                }
            }.seconds
            let sum = try db.fetchValue("SELECT sum(count) FROM \(RecordTable.name)", as: Int64.self) ?? 0
            let expected = records.reduce(Int64(0)) { $0 + $1.count + 1 }
            guard sum == expected else {
                throw BenchmarkFailure(description: "after the updates the counts sum to \(sum), expected \(expected)")
            }
            return Double(records.count) / seconds
        }
    }

    /// Rows per second of inserting `records` into a fresh table, in one transaction.
    private static func insertRate<M: Model>(_ records: [M], _ context: BenchmarkContext) throws -> Double {
        try context.withFreshDatabasePath { path in
            let seconds = try {
                let db = try Database(path: path)
                defer { try? db.close() }
                try db.createTable(M.self)
                return try timed { try db.insert(contentsOf: records) }.seconds
            }()
            try context.verifyStoredRecords(at: path)
            return Double(records.count) / seconds
        }
    }

    /// Rows per second of fetching every row of the populated table as `M`.
    private static func fetchRate<M: Model>(
        _ type: M.Type, _ context: BenchmarkContext,
        as plain: (M) -> BenchmarkRecord
    ) throws -> Double {
        try context.withPopulatedDatabasePath { path in
            let db = try Database(path: path)
            defer { try? db.close() }
            // Opens the reader connection, as the C baseline opens its
            // connection, before the clock starts; and derives the model's
            // schema, which a process does once (a probe of its Codable shape:
            // 8M instructions, which a 50,000-row instruction count would
            // otherwise spread over the rows).
            _ = try db.fetchFirst(Query<M>())
            let (fetched, seconds) = try timed { try db.read { try $0.fetchAll(M.self) } }
            try context.verifyFetched(fetched, as: plain)
            return Double(fetched.count) / seconds
        }
    }
}

/// Fails when Tether's `createTable` no longer makes the table the C and GRDB
/// benchmarks create from `RecordTable.createSQL`: the comparison would no
/// longer be like for like.
func checkTetherTableDefinition(_ context: BenchmarkContext) throws {
    try context.withFreshDatabasePath { path in
        let db = try Database(path: path)
        defer { try? db.close() }
        try db.createTable(BenchmarkRecord.self)
        let made = try db.fetchValue(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [RecordTable.name], as: String.self)
        guard let made, normalizedSQL(made) == normalizedSQL(RecordTable.createSQL) else {
            throw BenchmarkFailure(
                description: """
                    Tether's createTable made a table unlike RecordTable.createSQL; update it to keep the benchmarks \
                    comparable.
                    Tether: \(made ?? "no table")
                    RecordTable.createSQL: \(RecordTable.createSQL)
                    """)
        }
    }
}

/// SQL with runs of whitespace collapsed and IF NOT EXISTS dropped, for comparing definitions.
private func normalizedSQL(_ sql: String) -> String {
    sql.replacingOccurrences(of: "IF NOT EXISTS ", with: "")
        .split(whereSeparator: { $0.isWhitespace })
        .joined(separator: " ")
}
