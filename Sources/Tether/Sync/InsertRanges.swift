import CSQLite
import Foundation

/// Rows inserted in bulk by the ORM carry no sequence number or versions of
/// their own: one entry in `tether_insert_ranges` covers a run of consecutive
/// rowids, whose sequence numbers are consecutive too and whose columns all
/// have one version. That spares each row an entry in the sequence index and
/// a versions blob — the bulk of a synced insert's cost.
///
/// A row belongs to a range while it has no row of its own in its table's
/// `tether_rows_` table (`RowMetadataLayout`); its first change gives it one
/// (and the range no longer speaks for it). New ranges start above every
/// existing one, so ranges never overlap.
///
/// The rows of a range share its status: rows received from a peer are
/// synced; rows inserted here are created until acknowledged. Sending and
/// acknowledging go in sequence order, so two watermarks say which rows are
/// in flight (sequence at most `sentThrough`) and which are synced (at most
/// `acknowledgedThrough`).
///
/// A run of a range's rows updated together (the same columns, one after the other, in one
/// transaction: `UpdateRun`) becomes a range of its own, cut out of the one it was part of: its
/// rows keep `version` as their existence but hold the updated columns' versions (`updatedVersions`),
/// and were inserted at the sequence numbers they had before (`insertedFirstSequence`).
struct InsertRange {
    var firstRowid: Int64
    var lastRowid: Int64
    var firstSequence: Int64
    let version: LocalVersion
    /// The peer these rows were received from (nil for rows inserted here).
    var via: Int32? = nil
    /// `.created` for rows inserted here, `.synced` for rows received from a peer.
    var status: SyncStatus = .synced
    var sentThrough: Int64 = 0
    var acknowledgedThrough: Int64 = 0
    /// The versions of every row of the range when they are not all `version` (rows updated together).
    var updatedVersions: RowVersions? = nil
    /// The sequence number that inserted the first row, when not the range's own (rows updated
    /// since): those of the next rows follow it.
    var insertedFirstSequence: Int64? = nil

    var lastSequence: Int64 { firstSequence + (lastRowid - firstRowid) }
    func sequence(ofRowid rowid: Int64) -> Int64 { firstSequence + (rowid - firstRowid) }
    func rowid(ofSequence sequence: Int64) -> Int64 { firstRowid + (sequence - firstSequence) }
    /// The sequence number of the change that inserted the range's row `rowid`.
    func insertedSequence(ofRowid rowid: Int64) -> Int64 {
        (insertedFirstSequence ?? firstSequence) + (rowid - firstRowid)
    }
    /// The versions each row of the range holds.
    var rowVersions: RowVersions { updatedVersions ?? .uniform(version) }

    /// The sync state of the range's row `rowid`.
    func state(ofRowid rowid: Int64) -> (status: SyncStatus, inFlight: Bool) {
        let sequence = sequence(ofRowid: rowid)
        if status == .synced || sequence <= acknowledgedThrough { return (.synced, false) }
        return (status, sequence <= sentThrough)
    }

    // The same rules in SQL, for the range aliased `range` and the row `rowid`.

    static func sequenceSQL(range: String, rowid: String) -> String {
        "(\(range).first_seq + (\(rowid) - \(range).first_rowid))"
    }

    static func statusSQL(range: String, rowid: String) -> String {
        """
        (CASE WHEN \(range).status = 0 OR \(sequenceSQL(range: range, rowid: rowid)) <= \
        \(range).acknowledged_through THEN 0 ELSE \(range).status END)
        """
    }

    static func inFlightSQL(range: String, rowid: String) -> String {
        let sequence = sequenceSQL(range: range, rowid: rowid)
        return """
            (CASE WHEN \(range).status != 0 AND \(sequence) > \(range).acknowledged_through AND \(sequence) <= \
            \(range).sent_through THEN 1 ELSE 0 END)
            """
    }

    /// The status (or, with `status` false, the in-flight flag) the insert range of `table`
    /// covering `rowid` gives it: a scalar subquery, NULL outside every range.
    static func rowStatusSQL(table: String, rowid: String, status: Bool) -> String {
        let expression = status ? statusSQL(range: "tir", rowid: rowid) : inFlightSQL(range: "tir", rowid: rowid)
        return """
            (SELECT CASE WHEN \(rowid) > tir.last_rowid THEN NULL ELSE \(expression) END FROM tether_insert_ranges AS \
            tir WHERE tir.table_name = \(DatabaseValue.text(table).description) AND tir.first_rowid <= \(rowid) ORDER \
            BY tir.first_rowid DESC LIMIT 1)
            """
    }

    /// The sequence number the insert range of `table` covering `rowid` gives it: a scalar
    /// subquery, NULL outside every range.
    static func rowSequenceSQL(table: String, rowid: String) -> String {
        """
        (SELECT CASE WHEN \(rowid) > tir.last_rowid THEN NULL ELSE \(sequenceSQL(range: "tir", rowid: rowid)) END FROM \
        tether_insert_ranges AS tir WHERE tir.table_name = \(DatabaseValue.text(table).description) AND \
        tir.first_rowid <= \(rowid) ORDER BY tir.first_rowid DESC LIMIT 1)
        """
    }

    static let columns = """
        first_rowid, last_rowid, first_seq, timestamp, site, via, status, sent_through, acknowledged_through, \
        versions, inserted_first_seq
        """

    /// A LEFT JOIN of the range of `table`, aliased `alias`, with the greatest first rowid at most
    /// `rowid` (an SQL expression), when `condition` holds: the one covering that rowid if it
    /// reaches it (a lookup in the primary key).
    static func joinReaching(_ alias: String, table: String, rowid: String, when condition: String) -> String {
        let name = DatabaseValue.text(table).description
        return """
            LEFT JOIN tether_insert_ranges AS \(alias) ON \(condition) AND \(alias).table_name = \(name) AND \
            \(alias).first_rowid = (SELECT max(first_rowid) FROM tether_insert_ranges WHERE table_name = \(name) \
            AND first_rowid <= \(rowid))
            """
    }

    /// `columns` of the range aliased `alias`.
    static func qualifiedColumns(_ alias: String) -> String {
        columns.split(separator: ",").map { "\(alias).\($0.trimmingCharacters(in: .whitespaces))" }.joined(
            separator: ", ")
    }

    /// The range of `table` (`columns`) with the greatest first rowid at most ?: the one covering
    /// that rowid, if it reaches it.
    static func selectContainingSQL(table: String) -> String {
        """
        SELECT \(columns) FROM tether_insert_ranges WHERE table_name = \(DatabaseValue.text(table).description) \
        AND first_rowid <= ? ORDER BY first_rowid DESC LIMIT 1
        """
    }
}

extension SyncEngine {
    static let insertRangesSchema = """
        CREATE TABLE IF NOT EXISTS tether_insert_ranges (table_name TEXT NOT NULL, first_rowid INTEGER NOT NULL, \
        last_rowid INTEGER NOT NULL, first_seq INTEGER NOT NULL, timestamp INTEGER NOT NULL, site INTEGER NOT NULL, \
        via INTEGER, status INTEGER NOT NULL DEFAULT 0, sent_through INTEGER NOT NULL DEFAULT 0, acknowledged_through \
        INTEGER NOT NULL DEFAULT 0, \(insertRangesUpdateColumns.map(\.definition).joined(separator: ", ")), PRIMARY \
        KEY (table_name, first_rowid)) STRICT, WITHOUT ROWID;
        """
    /// The columns of ranges of rows updated together (format 4), name and definition: NULL for the others.
    static let insertRangesUpdateColumns = [
        (name: "versions", definition: "versions BLOB"),
        (name: "inserted_first_seq", definition: "inserted_first_seq INTEGER"),
    ]

    /// The ranges of `table` inserted after `sequence` under `site` at a timestamp after `timestamp`
    /// take `newSite` (a rekey: the copy's own bulk inserts move to its new key).
    static func reassignInsertRanges(
        of table: String, from site: Int32, to newSite: Int32, after sequence: Int64,
        writtenAfter timestamp: HybridTimestamp, _ connection: Connection
    ) throws {
        try connection.execute(
            """
            UPDATE tether_insert_ranges SET site = ? WHERE table_name = ? AND site = ? AND timestamp > ?
                AND first_seq + (last_rowid - first_rowid) > ?
            """, [newSite, table, site, Int64(bitPattern: timestamp.rawValue), sequence])
    }

    /// `table`'s ranges go (it stops syncing, or its rows were given metadata of their own).
    static func forgetInsertRanges(of table: String, _ connection: Connection) throws {
        try connection.execute("DELETE FROM tether_insert_ranges WHERE table_name = ?", [table])
    }

    /// The ranges of `table` holding sequence numbers above `sequence`, in order.
    func insertRanges(of table: SyncedTable, after sequence: Int64, _ connection: Connection) throws -> [InsertRange] {
        try connection.fetchRows(
            """
            SELECT \(InsertRange.columns) FROM tether_insert_ranges
            WHERE table_name = ? AND first_seq + (last_rowid - first_rowid) > ? ORDER BY first_seq
            """, [table.name, sequence]
        ).map(insertRange)
    }

    /// The ranges of `table` whose first row's sequence number is at most `sequence`, by rowid.
    func insertRanges(of table: SyncedTable, startingAtOrBefore sequence: Int64, _ connection: Connection) throws
        -> [InsertRange]
    {
        try connection.fetchRows(
            """
            SELECT \(InsertRange.columns) FROM tether_insert_ranges
            WHERE table_name = ? AND first_seq <= ? ORDER BY first_rowid
            """, [table.name, sequence]
        ).map(insertRange)
    }

    /// The range of `table` with the latest first sequence number at most `sequence`, if any: read
    /// in SQL, as a table can hold a range per row (rows received with rowids apart).
    func latestInsertRange(of table: SyncedTable, startingAtOrBefore sequence: Int64, _ connection: Connection) throws
        -> InsertRange?
    {
        try connection.fetchRow(
            """
            SELECT \(InsertRange.columns) FROM tether_insert_ranges
            WHERE table_name = ? AND first_seq <= ? ORDER BY first_seq DESC LIMIT 1
            """, [table.name, sequence]
        ).map(insertRange)
    }

    /// The range covering `rowid`, if any.
    func insertRange(of table: SyncedTable, containing rowid: Int64, _ connection: Connection) throws -> InsertRange? {
        if let open = openAppliedRange(of: table, containing: rowid) { return open }
        if let reached = reachedRange(of: table, containing: rowid) { return reached }
        // Once per first change of a bulk-inserted row: a statement of the table's, read in place.
        let statement = try table.statement(.selectRangeContaining, connection)
        let handle = statement.handle
        sqlite3_bind_int64(handle, 1, rowid)
        defer { statement.reset() }
        guard try statement.step(), let range = try insertRange(read: handle, at: 0, containing: rowid) else {
            return nil
        }
        rememberReachedRange(range, of: table)
        return range
    }

    /// The range whose `InsertRange.columns` the current row of `handle` holds from column `base`,
    /// when it covers `rowid` (nil also for NULLs: no range).
    func insertRange(read handle: OpaquePointer, at base: Int32, containing rowid: Int64) throws -> InsertRange? {
        guard sqlite3_column_type(handle, base) != SQLITE_NULL else { return nil }
        let lastRowid = sqlite3_column_int64(handle, base + 1)
        guard rowid <= lastRowid else { return nil }
        return InsertRange(
            firstRowid: sqlite3_column_int64(handle, base), lastRowid: lastRowid,
            firstSequence: sqlite3_column_int64(handle, base + 2),
            version: LocalVersion(
                timestamp: UInt64(bitPattern: sqlite3_column_int64(handle, base + 3)),
                site: Int32(truncatingIfNeeded: sqlite3_column_int64(handle, base + 4))),
            via: sqlite3_column_type(handle, base + 5) == SQLITE_NULL
                ? nil : Int32(truncatingIfNeeded: sqlite3_column_int64(handle, base + 5)),
            status: SyncStatus(rawValue: Int(sqlite3_column_int64(handle, base + 6))) ?? .created,
            sentThrough: sqlite3_column_int64(handle, base + 7),
            acknowledgedThrough: sqlite3_column_int64(handle, base + 8),
            updatedVersions: try Self.updatedVersions(handle, base + 9),
            insertedFirstSequence: sqlite3_column_type(handle, base + 10) == SQLITE_NULL
                ? nil : sqlite3_column_int64(handle, base + 10))
    }

    /// The `versions` of a range read at `column`: nil when NULL (the range's rows hold its version).
    private static func updatedVersions(_ handle: OpaquePointer, _ column: Int32) throws -> RowVersions? {
        guard sqlite3_column_type(handle, column) != SQLITE_NULL else { return nil }
        return try decodedRangeVersions(
            UnsafeRawBufferPointer(
                start: sqlite3_column_blob(handle, column),
                count: Int(sqlite3_column_bytes(handle, column))))
    }

    /// The stored `versions` of a range of updated rows; an error for a damaged blob.
    private static func decodedRangeVersions(_ bytes: UnsafeRawBufferPointer) throws -> RowVersions {
        guard let versions = RowVersions(encoded: bytes) else {
            throw SyncError.corruptMetadata("an insert range has damaged versions in tether_insert_ranges")
        }
        return versions
    }

    /// Where new ranges of `table` may start: above every existing one.
    func rangeFloor(of table: SyncedTable, _ connection: Connection) throws -> Int64 {
        // Ranges never overlap: the last by first rowid ends highest (a search of the key, not a scan).
        try connection.fetchValue(
            "SELECT last_rowid FROM tether_insert_ranges WHERE table_name = ? ORDER BY first_rowid DESC LIMIT 1",
            [table.name], as: Int64.self) ?? 0
    }

    func record(_ range: InsertRange, of table: SyncedTable, _ connection: Connection) throws {
        forgetReachedRange()
        try connection.execute(
            """
            INSERT INTO tether_insert_ranges (table_name, \(InsertRange.columns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, \
            ?, ?, ?, ?)
            """,
            [
                table.name, range.firstRowid, range.lastRowid, range.firstSequence,
                Int64(bitPattern: range.version.timestamp),
                range.version.site, range.via, Int64(range.status.rawValue), range.sentThrough,
                range.acknowledgedThrough,
                range.updatedVersions.map { Data($0.encoded()) }, range.insertedFirstSequence,
            ])
    }

    /// Replaces `range` with `pieces`, the same rows cut apart (`UpdateRun`): pieces a failed
    /// attempt wrote already go too, so that it can be repeated.
    func replace(_ range: InsertRange, with pieces: [InsertRange], of table: SyncedTable, _ connection: Connection)
        throws
    {
        forgetReachedRange()
        try connection.execute(
            "DELETE FROM tether_insert_ranges WHERE table_name = ? AND first_rowid BETWEEN ? AND ?",
            [table.name, range.firstRowid, range.lastRowid])
        for piece in pieces { try record(piece, of: table, connection) }
    }

    /// Rewrites the versions of `table`'s ranges of updated rows holding sequence numbers above
    /// `sequence` (a column dropped, a rekey).
    func rewriteRangeVersions(
        of table: SyncedTable, after sequence: Int64 = 0, _ connection: Connection,
        _ rewrite: (RowVersions) -> RowVersions
    ) throws {
        forgetReachedRange()
        for row in try connection.fetchRows(
            """
            SELECT first_rowid, versions FROM tether_insert_ranges
            WHERE table_name = ? AND versions IS NOT NULL AND first_seq + (last_rowid - first_rowid) > ?
            """, [table.name, sequence])
        {
            let versions = try row.get(1, as: Data.self).withUnsafeBytes(Self.decodedRangeVersions)
            let rewritten = rewrite(versions)
            guard rewritten != versions else { continue }
            try connection.execute(
                "UPDATE tether_insert_ranges SET versions = ? WHERE table_name = ? AND first_rowid = ?",
                [Data(rewritten.encoded()), table.name, row[0]])
        }
    }

    /// The rows of `table`'s ranges in (after, through] that are created here become in flight.
    func markRangesInFlight(of table: SyncedTable, after: Int64, through: Int64, _ connection: Connection) throws {
        forgetReachedRange()
        try connection.execute(
            """
            UPDATE tether_insert_ranges SET sent_through = max(sent_through, min(?2, first_seq + (last_rowid - \
            first_rowid)))
            WHERE table_name = ?1 AND status != 0 AND first_seq <= ?2 AND first_seq + (last_rowid - first_rowid) > ?3
            """, [table.name, through, after])
    }

    /// The in-flight rows of `table`'s ranges through `sequence` become synced.
    func acknowledgeRanges(of table: SyncedTable, through sequence: Int64, _ connection: Connection) throws {
        forgetReachedRange()
        try connection.execute(
            """
            UPDATE tether_insert_ranges SET acknowledged_through = max(acknowledged_through, min(?2, sent_through))
            WHERE table_name = ?1 AND status != 0 AND sent_through > acknowledged_through
            """, [table.name, sequence])
    }

    /// Whether an acknowledgement through `sequence` would move some range's acknowledgement
    /// (`acknowledgeRanges`): a range sent beyond what was acknowledged of it.
    static func insertRangesAwaitAcknowledgement(through sequence: Int64, _ connection: Connection) throws -> Bool {
        try connection.fetchValue(
            """
            SELECT EXISTS (SELECT 1 FROM tether_insert_ranges WHERE status != 0 \
            AND sent_through > acknowledged_through AND ? > acknowledged_through)
            """, [sequence], as: Bool.self) ?? true
    }

    private func insertRange(_ row: Row) throws -> InsertRange {
        InsertRange(
            firstRowid: try row.get(0, as: Int64.self), lastRowid: try row.get(1, as: Int64.self),
            firstSequence: try row.get(2, as: Int64.self),
            version: LocalVersion(
                timestamp: UInt64(bitPattern: try row.get(3, as: Int64.self)), site: try row.get(4, as: Int32.self)),
            via: Int32.fromDatabaseValue(row[5]),
            status: SyncStatus(rawValue: try row.get(6, as: Int.self)) ?? .created,
            sentThrough: try row.get(7, as: Int64.self), acknowledgedThrough: try row.get(8, as: Int64.self),
            updatedVersions: try Data.fromDatabaseValue(row[9]).map { data in
                try data.withUnsafeBytes(Self.decodedRangeVersions)
            },
            insertedFirstSequence: Int64.fromDatabaseValue(row[10]))
    }

    /// Forgets ranges no row belongs to any more (every row changed or deleted since).
    func pruneInsertRanges(_ connection: Connection) throws {
        forgetReachedRange()
        for table in tableList {
            try connection.execute(table.layout.pruneInsertRanges, [table.name])
        }
    }
}
