import BenchLZ4
import BenchSQLite
import Foundation
import Tether
import TetherSync
import TetherWire

/// Bytes on the wire per change, against the SQLite session extension's
/// patchset of the same changes, both LZ4-compressed. Sizes, not times:
/// nothing here is timed, and every run gives the same figures. `wire.*` is
/// what a node sends a peer that also announces `columnarBatches` and
/// `compactColumns` (batch format 4, Protocol/README.md §7.6); `wire.*.rows`
/// what it sends one that announces neither (formats 1 and 2).
enum WireBenchmarks {
    /// The changes each line measures: 100k, or the run's row count when smaller.
    static func changeCount(_ context: BenchmarkContext) -> Int { min(100_000, context.rowCount) }

    /// The two columns the update lines change, the same statement on both sides.
    static let update2SQL = #"UPDATE "record" SET "name" = "name" || '-v2', "count" = "count" + 1"#

    /// The session extension's patchset of the inserts into a plain table, LZ4-compressed whole.
    static let patchsetInsert = Benchmark(
        name: "patchset.insert", unit: "bytes/change", bestIs: .lower, comparison: nil
    ) { context in
        let records = Array(context.records.prefix(changeCount(context)))
        return try context.withFreshDatabasePath { path in
            let connection = try RawConnection(path: path)
            try connection.execute(RecordTable.createSQL)
            let patchset = try connection.recordingPatchset(of: RecordTable.name) {
                try insertWithCAPI(records, into: connection)
            }
            return Double(try lz4CompressedSize(patchset, logging: "insert")) / Double(records.count)
        }
    }

    /// Inserts into a synced table, extracted from 0 as a session sends them to a new peer.
    static let wireInsert = insert(name: "wire.insert", columnar: true, goal: 0.5)
    /// The same, to a peer that reads only the row formats.
    static let wireInsertRows = insert(name: "wire.insert.rows", columnar: false, goal: 1.0)

    private static func insert(name: String, columnar: Bool, goal: Double) -> Benchmark {
        Benchmark(
            name: name, unit: "bytes/change", bestIs: .lower,
            comparison: Comparison(baseline: "patchset.insert", goal: goal, better: .lower)
        ) { context in
            let records = Array(context.records.prefix(changeCount(context)))
            return try withSyncedRecords(records, context) { db in
                let bytes = try wireBytes(of: db, after: 0, expectedChanges: records.count, columnar: columnar)
                return Double(bytes) / Double(records.count)
            }
        }
    }

    /// A fresh synced table holding `records` (one bulk insert), handed to `body`.
    private static func withSyncedRecords<T>(
        _ records: [BenchmarkRecord], _ context: BenchmarkContext,
        _ body: (Database) throws -> T
    ) throws -> T {
        try context.withFreshDatabasePath { path in
            let db = try Database(path: path)
            defer { try? db.close() }
            try db.createTable(BenchmarkRecord.self)
            try db.enableSync(for: BenchmarkRecord.self)
            try db.insert(contentsOf: records)
            return try body(db)
        }
    }

    /// The session extension's patchset of a two-column update of every row of a plain table.
    static let patchsetUpdate2 = Benchmark(
        name: "patchset.update2", unit: "bytes/change", bestIs: .lower, comparison: nil
    ) { context in
        let records = Array(context.records.prefix(changeCount(context)))
        return try context.withFreshDatabasePath { path in
            let connection = try RawConnection(path: path)
            try connection.execute(RecordTable.createSQL)
            try insertWithCAPI(records, into: connection)
            let patchset = try connection.recordingPatchset(of: RecordTable.name) {
                try connection.execute(update2SQL)
            }
            return Double(try lz4CompressedSize(patchset, logging: "update2")) / Double(records.count)
        }
    }

    /// The same update on a synced table whose inserts a peer already has:
    /// only the update changes are extracted (after the inserts' last sequence).
    static let wireUpdate2 = update2(name: "wire.update2", columnar: true, goal: 0.6)
    /// The same, to a peer that reads only the row formats.
    static let wireUpdate2Rows = update2(name: "wire.update2.rows", columnar: false, goal: 1.0)

    private static func update2(name: String, columnar: Bool, goal: Double) -> Benchmark {
        Benchmark(
            name: name, unit: "bytes/change", bestIs: .lower,
            comparison: Comparison(baseline: "patchset.update2", goal: goal, better: .lower)
        ) { context in
            let records = Array(context.records.prefix(changeCount(context)))
            return try withSyncedRecords(records, context) { db in
                let peer = try caughtUpPeer(of: db)
                let insertsThrough = try db.lastSequence()
                try db.execute(update2SQL)
                let bytes = try wireBytes(
                    of: db, after: insertsThrough, to: peer, expectedChanges: records.count, columnar: columnar)
                return Double(bytes) / Double(records.count)
            }
        }
    }

    /// The frame bytes a session sends a peer whose cursor is `cursor`: the
    /// changes extracted batch by batch with a session's default PULL limits,
    /// each batch one BATCH frame encoded as the session's encoder does once
    /// LZ4 is negotiated (default wire limits: bodies of 512 bytes or more
    /// compressed when that makes them smaller), and `columnarBatches` and `compactColumns` too when `columnar`.
    static func wireBytes(
        of db: Database, after cursor: Int64, to peer: InstanceKey = .random(), expectedChanges: Int, columnar: Bool
    ) throws -> Int {
        let options = SyncOptions()
        let encoder = FrameEncoder(
            limits: options.wireLimits, compression: true, columnarBatches: columnar, compactColumns: columnar)
        let uncompressed = FrameEncoder(
            limits: options.wireLimits, compression: false, columnarBatches: columnar, compactColumns: columnar)
        var rawBytes = 0
        var frames = 0
        var cursor = cursor
        var bytes = 0
        var changes = 0
        var encodeSeconds = 0.0, decodeSeconds = 0.0
        while true {
            // markInFlight only flags the rows sent; the batch is the same either way. Partial rows
            // allowed, as in a session (a PULL without wholeRows).
            let batch = try db.extractChanges(
                for: peer, after: cursor, limits: options.batchLimits, markInFlight: false,
                allowingPartialRows: true)
            let (frame, encoding) = try timed { try encoder.encode(.batch(batch)) }
            // The receiver's side too (what a session's decoder does once both announced the format), checked.
            let (decoded, decoding) = try timed { try FrameDecoder.decode(frame: frame, limits: options.wireLimits) }
            guard decoded == .batch(batch) else {
                throw BenchmarkFailure(description: "a BATCH frame decodes to another batch")
            }
            encodeSeconds += encoding
            decodeSeconds += decoding
            bytes += frame.count
            rawBytes += try uncompressed.encode(.batch(batch)).count
            frames += 1
            changes += batch.changes.count
            cursor = batch.through
            if batch.isLast { break }
        }
        guard changes == expectedChanges else {
            throw BenchmarkFailure(description: "extracted \(changes) changes, expected \(expectedChanges)")
        }
        log(
            "  \(changes) changes in \(frames) BATCH frames "
                + "(\(columnar ? "columnar, format 4" : "rows, formats 1-2")): "
                + "\(bytes) bytes with LZ4, \(rawBytes) without; "
                + "encoded in \(Int(encodeSeconds * 1e9) / changes) ns/change, decoded in "
                + "\(Int(decodeSeconds * 1e9) / changes) ns/change")
        return bytes
    }
}

/// A new peer that received every change of `db` in one catch-up, as a session sends them: a
/// peer whose next pull starts at a complete point (partial rows can go to it).
func caughtUpPeer(of db: Database) throws -> InstanceKey {
    let peer = InstanceKey.random()
    var cursor: Int64 = 0
    while true {
        let batch = try db.extractChanges(
            for: peer, after: cursor, limits: SyncOptions().batchLimits, markInFlight: false)
        cursor = batch.through
        if batch.isLast { return peer }
    }
}

/// The size of `bytes` compressed whole by LZ4_compress_default.
func lz4CompressedSize(_ bytes: [UInt8], logging name: String) throws -> Int {
    guard bytes.count <= Int(LZ4_MAX_INPUT_SIZE) else {
        throw BenchmarkFailure(description: "\(bytes.count) bytes are too many for one LZ4 block")
    }
    let bound = Int(LZ4_compressBound(Int32(bytes.count)))
    var output = [CChar](repeating: 0, count: max(1, bound))
    let written = bytes.withUnsafeBytes { source in
        output.withUnsafeMutableBufferPointer { destination in
            LZ4_compress_default(
                source.baseAddress?.assumingMemoryBound(to: CChar.self), destination.baseAddress,
                Int32(bytes.count), Int32(bound))
        }
    }
    guard written > 0 else {
        throw BenchmarkFailure(description: "LZ4_compress_default failed on \(bytes.count) bytes")
    }
    log("  \(name) patchset: \(bytes.count) bytes, \(written) with LZ4")
    return Int(written)
}

extension RawConnection {
    /// Runs `body` with a session (sqlite3session) attached to `table`, and
    /// returns the patchset of what it changed.
    func recordingPatchset(of table: String, _ body: () throws -> Void) throws -> [UInt8] {
        var session: OpaquePointer?
        var rc = sqlite3session_create(handle, "main", &session)
        guard rc == SQLITE_OK, let session else { throw error(rc, doing: "creating a session") }
        defer { sqlite3session_delete(session) }
        rc = sqlite3session_attach(session, table)
        guard rc == SQLITE_OK else { throw error(rc, doing: "attaching the session to \(table)") }
        try body()
        var size: Int32 = 0
        var buffer: UnsafeMutableRawPointer?
        rc = sqlite3session_patchset(session, &size, &buffer)
        guard rc == SQLITE_OK else { throw error(rc, doing: "making the patchset") }
        defer { sqlite3_free(buffer) }
        guard let buffer, size > 0 else { return [] }
        return Array(UnsafeRawBufferPointer(start: buffer, count: Int(size)))
    }
}
