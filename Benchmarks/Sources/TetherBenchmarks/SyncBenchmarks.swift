import BenchSQLite
import Foundation
import Tether

/// The replication engine: capture cost on insert, and extract + apply
/// between two databases, against a C loop that logs every insert.
enum SyncBenchmarks {
    /// Inserting into a synced table (the changelog written in the same
    /// transaction) against the same insert into a plain table.
    static let syncedInsert = Benchmark(
        name: "synced.insert", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "orm.insert", goal: 0.8, better: .higher)
    ) { context in
        try insertRate(context, capturingExternalWrites: false)
    }.countingInstructions()

    /// `synced.insert` into a table synced with `capturingExternalWrites: true`: the library's own
    /// bulk insert must not pay for the triggers meant for other programs. Goal ≥ 0.5 × `orm.insert`.
    static let syncedInsertExternal = Benchmark(
        name: "synced.insert.external", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "orm.insert", goal: 0.5, better: .higher)
    ) { context in
        try insertRate(context, capturingExternalWrites: true)
    }.countingInstructions()

    /// `synced.insert` into a table holding as many tombstones as records are inserted (rows of
    /// lower keys, inserted and deleted first): an insert looks for its key among them. Goal ≥ 0.9
    /// × `synced.insert` (issue 35: it was a scan of every tombstone per insert).
    static let syncedInsertTombstones = Benchmark(
        name: "synced.insert.tombstones", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "synced.insert", goal: 0.9, better: .higher)
    ) { context in
        try insertRate(context, capturingExternalWrites: false, tombstones: context.records.count)
    }.countingInstructions()

    /// Bulk-inserting the records into a synced table (untimed: creating and syncing it, and
    /// leaving `tombstones` deleted rows of other keys in it).
    private static func insertRate(_ context: BenchmarkContext, capturingExternalWrites: Bool, tombstones: Int = 0)
        throws -> Double
    {
        let records = context.records
        return try context.withFreshDatabasePath { path in
            let seconds = try {
                let db = try Database(path: path)
                defer { try? db.close() }
                try db.createTable(BenchmarkRecord.self)
                try db.enableSync(for: BenchmarkRecord.self, capturingExternalWrites: capturingExternalWrites)
                if tombstones > 0 {
                    // Keys below the records', as in a table whose old rows were deleted: the records
                    // go above every existing row, as they do into an empty table.
                    let deleted = (1...tombstones).map {
                        BenchmarkRecord(id: -Int64($0), name: "gone-\($0)", count: 0, value: 0)
                    }
                    try db.insert(contentsOf: deleted.reversed())
                    try db.execute("DELETE FROM \(RecordTable.name) WHERE id < 0")
                }
                return try timed { try db.insert(contentsOf: records) }.seconds
            }()
            try context.verifyStoredRecords(at: path)
            return Double(records.count) / seconds
        }
    }

    /// `synced.update` on a table synced with `capturingExternalWrites: true`. Goal ≥ 0.5 × `orm.update`.
    static let syncedUpdateExternal = Benchmark(
        name: "synced.update.external", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "orm.update", goal: 0.5, better: .higher)
    ) { context in
        try TetherORMBenchmarks.updateRate(context, synced: true, capturingExternalWrites: true)
    }.countingInstructions(rows: TetherORMBenchmarks.updatedRowCount)

    /// `orm.update` on a synced table: the updates of consecutive bulk-inserted rows, one per
    /// statement in one transaction, are logged as a range of their own (`UpdateRuns.swift`).
    /// Goal ≥ 0.7 × `orm.update` (issue 24).
    static let syncedUpdate = Benchmark(
        name: "synced.update", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "orm.update", goal: 0.7, better: .higher)
    ) { context in
        try TetherORMBenchmarks.updateRate(context, synced: true)
    }.countingInstructions(rows: TetherORMBenchmarks.updatedRowCount)

    /// Increments through the ORM of a column that merges as a counter (issue 39): `orm.update`'s
    /// rows, each incremented ten times, one row per statement, all in one transaction (a million
    /// increments for 100,000 rows). Each records this site's contribution. Goal ≥ 0.6 × `orm.update`.
    static let syncedUpdateCounter = Benchmark(
        name: "synced.update.counter", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "orm.update", goal: 0.6, better: .higher)
    ) { context in
        let records = Array(context.records.prefix(TetherORMBenchmarks.updatedRowCount(context)))
        let rounds = 10
        return try context.withFreshDatabasePath { path in
            let db = try Database(path: path)
            defer { try? db.close() }
            try db.createTable(BenchmarkRecord.self)
            try db.enableSync(for: BenchmarkRecord.self, columnRules: ["count": .counter])
            try db.insert(contentsOf: records)
            let seconds = try timed {
                try db.write { conn in
                    for round in 1...rounds {
                        for var record in records {
                            record.count += Int64(round)
                            try conn.update(record, columns: ["count"])
                        }
                    }
                }
            }.seconds
            let sum = try db.fetchValue("SELECT sum(count) FROM \(RecordTable.name)", as: Int64.self) ?? 0
            let expected = records.reduce(Int64(0)) { $0 + $1.count + Int64(rounds) }
            guard sum == expected else {
                throw BenchmarkFailure(
                    description: "after the increments the counts sum to \(sum), expected \(expected)")
            }
            return Double(records.count * rounds) / seconds
        }
    }.countingInstructions(rows: { TetherORMBenchmarks.updatedRowCount($0) * 10 })

    /// The C reference for a logged insert: the row, and one changelog row
    /// by a second prepared statement, per record, in one transaction.
    static let cInsertLogged = Benchmark(name: "c.insert_logged", unit: "changes/s", bestIs: .higher, comparison: nil) {
        context in
        let records = context.records
        return try context.withFreshDatabasePath { path in
            let seconds = try {
                let connection = try RawConnection(path: path)
                try connection.execute(RecordTable.createSQL)
                try connection.execute(
                    """
                    CREATE TABLE changelog (seq INTEGER PRIMARY KEY, table_id INTEGER NOT NULL, row_id INTEGER \
                    NOT NULL)
                    """)
                return try timed { try insertLoggedWithCAPI(records, into: connection) }.seconds
            }()
            try context.verifyStoredRecords(at: path)
            return Double(records.count) / seconds
        }
    }.countingInstructions()

    /// Extracting every change of a synced database and applying it to
    /// another, batch by batch, each batch one transaction with its cursor.
    static let engineApply = Benchmark(
        name: "engine.apply", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "c.insert_logged", goal: 0.9, better: .higher)
    ) { context in
        try extractAndApply(context) { try $0.apply($1).applied }
    }.countingInstructions()

    /// The same catch-up received as a session receives it (`Database.receive`): every batch but
    /// the last staged on disk, then all applied with the last in one transaction — what a
    /// whole catch-up costs over `engine.apply`.
    static let engineReceive = Benchmark(
        name: "engine.receive", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "engine.apply", goal: 0.8, better: .higher)
    ) { context in
        try extractAndApply(context) { target, batch in
            switch try target.receive(batch) {
            case .staged: return 0
            case let .applied(report): return report.applied
            }
        }
    }.countingInstructions()

    /// Extracts every change of the synced source, 5,000 a batch, and hands each batch to `receive`
    /// on a fresh target (which returns how many changes it applied); the rate of the whole.
    private static func extractAndApply(
        _ context: BenchmarkContext, _ receive: (Database, ChangeBatch) throws -> Int
    ) throws -> Double {
        try context.withSyncedSourceDatabase { sourcePath in
            try context.withFreshDatabasePath { targetPath in
                let seconds = try {
                    let source = try Database(path: sourcePath)
                    let target = try Database(path: targetPath)
                    defer {
                        try? source.close()
                        try? target.close()
                    }
                    try target.createTable(BenchmarkRecord.self)
                    try target.enableSync(for: BenchmarkRecord.self)
                    return try timed {
                        var cursor: Int64 = 0
                        var applied = 0
                        while true {
                            let batch = try source.extractChanges(
                                for: target.instanceKey, after: cursor,
                                limits: BatchLimits(maximumChanges: 5_000), markInFlight: false)
                            applied += try receive(target, batch)
                            cursor = batch.through
                            if batch.isLast { break }
                        }
                        guard applied == context.rowCount else {
                            throw BenchmarkFailure(
                                description: "applied \(applied) changes, expected \(context.rowCount)")
                        }
                    }.seconds
                }()
                try context.verifyStoredRecords(at: targetPath)
                return Double(context.rowCount) / seconds
            }
        }
    }
}

/// Inserts `records` and one changelog row each, in one transaction.
func insertLoggedWithCAPI(_ records: [BenchmarkRecord], into connection: RawConnection) throws {
    try connection.execute("BEGIN IMMEDIATE TRANSACTION")
    let statement = try connection.prepare(RecordTable.insertSQL)
    defer { sqlite3_finalize(statement) }
    let log = try connection.prepare("INSERT INTO changelog (seq, table_id, row_id) VALUES (?, 1, ?)")
    defer { sqlite3_finalize(log) }
    let transient = bench_sqlite_transient()
    for (index, record) in records.enumerated() {
        sqlite3_bind_int64(statement, 1, record.id)
        record.name.withCString { text in
            _ = sqlite3_bind_text(statement, 2, text, Int32(record.name.utf8.count), transient)
        }
        sqlite3_bind_int64(statement, 3, record.count)
        sqlite3_bind_double(statement, 4, record.value)
        var rc = sqlite3_step(statement)
        if rc == SQLITE_DONE {
            sqlite3_bind_int64(log, 1, Int64(index + 1))
            sqlite3_bind_int64(log, 2, record.id)
            rc = sqlite3_step(log)
        }
        guard rc == SQLITE_DONE else {
            let error = connection.error(rc, doing: "inserting record \(record.id)")
            _ = sqlite3_exec(connection.handle, "ROLLBACK", nil, nil, nil)
            throw error
        }
        sqlite3_reset(statement)
        sqlite3_reset(log)
    }
    try connection.execute("COMMIT TRANSACTION")
}

extension BenchmarkContext {
    /// The template of a synced database of `M` named `name` (built once per run: a table of `M`,
    /// synced, filled by `fill`). It is written as a backup, so each copy is a database of its
    /// own: it takes a new instance key when opened (a plain file copy would refuse to sync as a copy).
    func syncedTemplate<M: Model>(named name: String, of type: M.Type, rows: Int, _ fill: (Database) throws -> Void)
        throws -> String
    {
        try cachedTemplate(named: name) { path in
            log("building the \(name) database (\(rows) rows)")
            let building = path + ".building"
            let db = try Database(path: building)
            defer { try? db.close(); try? FileManager.default.removeItem(atPath: building) }
            try db.createTable(M.self)
            try db.enableSync(for: M.self)
            try fill(db)
            try db.backup(to: path)
        }
    }

    /// Runs `body` with a fresh copy of a synced database holding `records`
    /// (built once: the inserts are not what engine.apply measures).
    func withSyncedSourceDatabase<T>(_ body: (String) throws -> T) throws -> T {
        let template = try syncedTemplate(named: "synced-source", of: BenchmarkRecord.self, rows: rowCount) { db in
            try db.insert(contentsOf: records)
        }
        return try withFreshDatabasePath { path in
            try FileManager.default.copyItem(atPath: template, toPath: path)
            return try body(path)
        }
    }
}
