import BenchSQLite

/// The baselines: the SQLite C API called directly, as a hand-written loop
/// would, on a connection configured like Tether's.
enum CAPIBenchmarks {
    static let insert = Benchmark.rowsPerSecond("c.insert") { context in
        let records = context.records
        return try context.withFreshDatabasePath { path in
            let seconds = try {
                let connection = try RawConnection(path: path)
                try connection.execute(RecordTable.createSQL)
                return try timed { try insertWithCAPI(records, into: connection) }.seconds
            }()
            try context.verifyStoredRecords(at: path)
            return Double(records.count) / seconds
        }
    }.countingInstructions()

    static let fetch = Benchmark.rowsPerSecond("c.fetch") { context in
        try context.withPopulatedDatabasePath { path in
            let connection = try RawConnection(path: path)
            let (fetched, seconds) = try timed { try fetchWithCAPI(from: connection) }
            try context.verifyFetched(fetched) { $0 }
            return Double(fetched.count) / seconds
        }
    }.countingInstructions()
}

/// Inserts `records` in one transaction: prepare once, then bind, step and
/// reset per row.
func insertWithCAPI(_ records: [BenchmarkRecord], into connection: RawConnection) throws {
    try connection.execute("BEGIN IMMEDIATE TRANSACTION")
    let statement = try connection.prepare(RecordTable.insertSQL)
    defer { sqlite3_finalize(statement) }
    let transient = bench_sqlite_transient()
    for record in records {
        sqlite3_bind_int64(statement, 1, record.id)
        // A native Swift string is contiguous, NUL-terminated UTF-8: its C
        // string costs nothing, and utf8.count is O(1).
        record.name.withCString { text in
            _ = sqlite3_bind_text(statement, 2, text, Int32(record.name.utf8.count), transient)
        }
        sqlite3_bind_int64(statement, 3, record.count)
        sqlite3_bind_double(statement, 4, record.value)
        let rc = sqlite3_step(statement)
        guard rc == SQLITE_DONE else {
            let error = connection.error(rc, doing: "inserting record \(record.id)")
            _ = sqlite3_exec(connection.handle, "ROLLBACK", nil, nil, nil)
            throw error
        }
        sqlite3_reset(statement)
    }
    try connection.execute("COMMIT TRANSACTION")
}

/// Fetches every row into `BenchmarkRecord`s, in one read transaction (as
/// Tether's `read` does).
func fetchWithCAPI(from connection: RawConnection) throws -> [BenchmarkRecord] {
    try connection.execute("BEGIN DEFERRED TRANSACTION")
    defer { _ = sqlite3_exec(connection.handle, "COMMIT", nil, nil, nil) }
    let statement = try connection.prepare(RecordTable.selectSQL)
    defer { sqlite3_finalize(statement) }
    // No reserveCapacity: like the ORMs, the loop does not know the row count.
    var records: [BenchmarkRecord] = []
    while true {
        let rc = sqlite3_step(statement)
        if rc == SQLITE_DONE { break }
        guard rc == SQLITE_ROW else { throw connection.error(rc, doing: "fetching records") }
        let name: String
        if let text = sqlite3_column_text(statement, 1) {
            name = String(
                decoding: UnsafeBufferPointer(start: text, count: Int(sqlite3_column_bytes(statement, 1))),
                as: UTF8.self)
        } else {
            name = ""
        }
        records.append(
            BenchmarkRecord(
                id: sqlite3_column_int64(statement, 0),
                name: name,
                count: sqlite3_column_int64(statement, 2),
                value: sqlite3_column_double(statement, 3)))
    }
    return records
}

/// Creates the table at `path` and fills it with `records` (the fetch
/// benchmarks' database), then checkpoints so that the file alone holds it all.
func populateWithCAPI(path: String, records: [BenchmarkRecord]) throws {
    let connection = try RawConnection(path: path)
    try connection.execute(RecordTable.createSQL)
    try insertWithCAPI(records, into: connection)
    try connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
}

/// Aggregates of the table at `path`, to check what an insert stored.
func summarizeWithCAPI(path: String) throws -> ContentSummary {
    let connection = try RawConnection(path: path)
    let statement = try connection.prepare(
        #"SELECT count(*), sum("id"), sum("count"), sum(length(CAST("name" AS BLOB))), total("value") FROM "record""#)
    defer { sqlite3_finalize(statement) }
    let rc = sqlite3_step(statement)
    guard rc == SQLITE_ROW else { throw connection.error(rc, doing: "summarizing the table") }
    return ContentSummary(
        rowCount: sqlite3_column_int64(statement, 0),
        idSum: sqlite3_column_int64(statement, 1),
        countSum: sqlite3_column_int64(statement, 2),
        nameBytes: sqlite3_column_int64(statement, 3),
        valueSum: sqlite3_column_double(statement, 4))
}

/// A bare SQLite connection, configured as Tether's `Database` configures its
/// writer: WAL, synchronous NORMAL, and SQLITE_OPEN_NOMUTEX (Tether and GRDB
/// both open connections without SQLite's per-call mutex).
final class RawConnection {
    let handle: OpaquePointer

    init(path: String) throws {
        var connection: OpaquePointer?
        let rc = sqlite3_open_v2(
            path, &connection, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nil)
        guard rc == SQLITE_OK, let connection else {
            let message = connection.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(rc))
            sqlite3_close_v2(connection)
            throw BenchmarkFailure(description: "cannot open \(path): \(message)")
        }
        handle = connection
        let journalMode = try firstText(of: "PRAGMA journal_mode = WAL")
        guard journalMode?.lowercased() == "wal" else {
            throw BenchmarkFailure(
                description: "cannot switch \(path) to WAL (journal_mode is \(journalMode ?? "unknown"))")
        }
        try execute("PRAGMA synchronous = NORMAL")
    }

    deinit { sqlite3_close_v2(handle) }

    func execute(_ sql: String) throws {
        let rc = sqlite3_exec(handle, sql, nil, nil, nil)
        guard rc == SQLITE_OK else { throw error(rc, doing: sql) }
    }

    /// The first column of the first row of `sql`, as text.
    func firstText(of sql: String) throws -> String? {
        let statement = try prepare(sql)
        defer { sqlite3_finalize(statement) }
        let rc = sqlite3_step(statement)
        guard rc == SQLITE_ROW || rc == SQLITE_DONE else { throw error(rc, doing: sql) }
        guard rc == SQLITE_ROW, let text = sqlite3_column_text(statement, 0) else { return nil }
        return String(cString: text)
    }

    func prepare(_ sql: String) throws -> OpaquePointer {
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard rc == SQLITE_OK, let statement else { throw error(rc, doing: sql) }
        return statement
    }

    func error(_ rc: Int32, doing activity: String) -> BenchmarkFailure {
        BenchmarkFailure(
            description: "SQLite error \(rc) (\(String(cString: sqlite3_errmsg(handle)))) while \(activity)")
    }
}
