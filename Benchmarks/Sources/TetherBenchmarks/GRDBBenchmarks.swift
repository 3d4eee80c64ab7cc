import GRDB

/// `BenchmarkRecord` as GRDB's documentation writes a record: Codable, and
/// GRDB derives the columns from the coding keys.
struct GRDBCodableRecord: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = RecordTable.name
    var id: Int64
    var name: String
    var count: Int64
    var value: Double
}

/// `BenchmarkRecord` written for GRDB's fastest fetch: a FetchableRecord
/// whose init(row:) reads the columns by index.
struct GRDBHandWrittenRecord: FetchableRecord, TableRecord {
    static let databaseTableName = RecordTable.name
    // Selected in this order, so that init(row:) can read by index.
    static var databaseSelection: [any SQLSelectable] {
        [Column("id"), Column("name"), Column("count"), Column("value")]
    }
    var id: Int64
    var name: String
    var count: Int64
    var value: Double

    init(row: Row) throws {
        id = try row.decode(atIndex: 0)
        name = try row.decode(atIndex: 1)
        count = try row.decode(atIndex: 2)
        value = try row.decode(atIndex: 3)
    }
}

extension GRDBCodableRecord {
    init(_ record: BenchmarkRecord) {
        self.init(id: record.id, name: record.name, count: record.count, value: record.value)
    }
    var plain: BenchmarkRecord { BenchmarkRecord(id: id, name: name, count: count, value: value) }
}

extension GRDBHandWrittenRecord {
    var plain: BenchmarkRecord { BenchmarkRecord(id: id, name: name, count: count, value: value) }
}

/// GRDB 7, for comparison. A `DatabasePool` is GRDB's match for Tether's
/// `Database` (one writer, concurrent readers, WAL); it sets journal_mode WAL
/// and synchronous NORMAL by itself, as Tether does.
enum GRDBBenchmarks {
    static let insertCodable = Benchmark.rowsPerSecond(
        "grdb.insert.codable", comparedTo: Comparison(baseline: "orm.insert", goal: 1.0, better: .lower)
    ) { context in
        let records = context.inputs(as: GRDBCodableRecord.self, GRDBCodableRecord.init)
        return try measureInsert(context, rowCount: records.count) { db in
            for record in records { try record.insert(db) }
        }
    }

    // GRDB's fastest insert is a cached statement given each row's values with
    // setUncheckedArguments, the form of GRDB's own "optimized insert"
    // performance test. Measured here (callgrind, 50,000 rows, instructions
    // in the insert loop): this form 584M; `execute(arguments:)` on the same
    // statement 627M; a record with a hand-written encode(to:) and
    // `record.insert(db)` 2,217M; the Codable record 2,502M.
    static let insertFastest = Benchmark.rowsPerSecond(
        "grdb.insert.fastest", comparedTo: Comparison(baseline: "orm.insert", goal: 1.0, better: .lower)
    ) { context in
        let records = context.records
        return try measureInsert(context, rowCount: records.count) { db in
            let statement = try db.cachedStatement(sql: RecordTable.insertSQL)
            for record in records {
                // Unchecked: the statement has exactly these four parameters.
                statement.setUncheckedArguments([record.id, record.name, record.count, record.value])
                try statement.execute()
            }
        }
    }

    static let fetchCodable = Benchmark.rowsPerSecond(
        "grdb.fetch.codable", comparedTo: Comparison(baseline: "orm.fetch", goal: 1.0, better: .lower)
    ) { context in
        try measureFetch(context) { db in
            try GRDBCodableRecord.fetchAll(db)
        } as: {
            $0.plain
        }
    }

    static let fetchFastest = Benchmark.rowsPerSecond(
        "grdb.fetch.fastest", comparedTo: Comparison(baseline: "orm.fetch", goal: 1.0, better: .lower)
    ) { context in
        try measureFetch(context) { db in
            try GRDBHandWrittenRecord.fetchAll(db)
        } as: {
            $0.plain
        }
    }

    /// Times `insertAll` inside one `write` (one transaction) on a fresh pool.
    private static func measureInsert(
        _ context: BenchmarkContext, rowCount: Int,
        _ insertAll: (GRDB.Database) throws -> Void
    ) throws -> Double {
        try context.withFreshDatabasePath { path in
            let seconds = try {
                let pool = try openPool(path)
                defer { try? pool.close() }
                try pool.write { db in try db.execute(sql: RecordTable.createSQL) }
                return try timed { try pool.write(insertAll) }.seconds
            }()
            try context.verifyStoredRecords(at: path)
            return Double(rowCount) / seconds
        }
    }

    /// Times `fetchAll` inside one `read` on a pool over a populated copy.
    private static func measureFetch<Fetched>(
        _ context: BenchmarkContext,
        _ fetchAll: (GRDB.Database) throws -> [Fetched],
        as plain: (Fetched) -> BenchmarkRecord
    ) throws -> Double {
        try context.withPopulatedDatabasePath { path in
            let pool = try openPool(path)
            defer { try? pool.close() }
            // Opens a reader connection before the clock starts, as the
            // other contenders do.
            try pool.read { _ in }
            let (fetched, seconds) = try timed { try pool.read(fetchAll) }
            try context.verifyFetched(fetched, as: plain)
            return Double(fetched.count) / seconds
        }
    }

    /// A pool on `path`, checked to run as Tether's `Database` does.
    static func openPool(_ path: String) throws -> DatabasePool {
        let pool = try DatabasePool(path: path)
        let (journalMode, synchronous) = try pool.writeWithoutTransaction { db in
            (try String.fetchOne(db, sql: "PRAGMA journal_mode"), try Int.fetchOne(db, sql: "PRAGMA synchronous"))
        }
        // PRAGMA synchronous reads 1 for NORMAL.
        guard journalMode?.lowercased() == "wal", synchronous == 1 else {
            throw BenchmarkFailure(
                description: """
                    GRDB opened \(path) with journal_mode \(journalMode ?? "?") and synchronous \
                    \(synchronous.map(String.init) ?? "?"), not WAL and NORMAL
                    """)
        }
        return pool
    }
}
