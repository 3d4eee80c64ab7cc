import CSQLite
import Foundation

/// Rows inserted in bulk by the ORM carry no sequence number or versions of
/// their own: one entry in `tether_insert_ranges` covers a run of consecutive
/// rowids, whose sequence numbers are consecutive too and whose columns all
/// have one version. That spares each row an entry in the sequence index and
/// a versions blob — the bulk of a synced insert's cost.
///
/// A row belongs to a range while its `tether_seq` is NULL; its first change
/// gives it its own metadata (and the range no longer speaks for it). New
/// ranges start above every existing one, so ranges never overlap.
struct InsertRange {
    let firstRowid: Int64
    var lastRowid: Int64
    let firstSequence: Int64
    let version: LocalVersion
    /// The peer these rows were received from (nil for rows inserted here).
    var via: Int32? = nil

    var lastSequence: Int64 { firstSequence + (lastRowid - firstRowid) }
    func sequence(ofRowid rowid: Int64) -> Int64 { firstSequence + (rowid - firstRowid) }
    func rowid(ofSequence sequence: Int64) -> Int64 { firstRowid + (sequence - firstSequence) }
}

extension SyncEngine {
    /// The ranges of `table` holding sequence numbers above `sequence`, in order.
    func insertRanges(of table: SyncedTable, after sequence: Int64, _ connection: Connection) throws -> [InsertRange] {
        try connection.fetchRows("""
            SELECT first_rowid, last_rowid, first_seq, timestamp, site, via FROM tether_insert_ranges
            WHERE table_name = ? AND first_seq + (last_rowid - first_rowid) > ? ORDER BY first_seq
            """, [table.name, sequence]).map(insertRange)
    }

    /// The ranges of `table` whose first row's sequence number is at most `sequence`, by rowid.
    func insertRanges(of table: SyncedTable, startingAtOrBefore sequence: Int64, _ connection: Connection) throws -> [InsertRange] {
        try connection.fetchRows("""
            SELECT first_rowid, last_rowid, first_seq, timestamp, site, via FROM tether_insert_ranges
            WHERE table_name = ? AND first_seq <= ? ORDER BY first_rowid
            """, [table.name, sequence]).map(insertRange)
    }

    /// The range covering `rowid`, if any.
    func insertRange(of table: SyncedTable, containing rowid: Int64, _ connection: Connection) throws -> InsertRange? {
        if let open = openRange, open.table === table, rowid >= open.range.firstRowid, rowid <= open.range.lastRowid {
            return open.range
        }
        guard let row = try connection.fetchRow("""
            SELECT first_rowid, last_rowid, first_seq, timestamp, site, via FROM tether_insert_ranges
            WHERE table_name = ? AND first_rowid <= ? ORDER BY first_rowid DESC LIMIT 1
            """, [table.name, rowid]) else { return nil }
        let range = try insertRange(row)
        return rowid <= range.lastRowid ? range : nil
    }

    /// The versions a row of a range has (all its columns at the range's version).
    func rangeVersions(of table: SyncedTable, rowid: Int64, _ connection: Connection) throws -> RowVersions? {
        try insertRange(of: table, containing: rowid, connection).map { .uniform($0.version) }
    }

    /// Where new ranges of `table` may start: above every existing one.
    func rangeFloor(of table: SyncedTable, _ connection: Connection) throws -> Int64 {
        try connection.fetchValue("SELECT max(last_rowid) FROM tether_insert_ranges WHERE table_name = ?", [table.name], as: Int64.self) ?? 0
    }

    func record(_ range: InsertRange, of table: SyncedTable, _ connection: Connection) throws {
        try connection.execute("""
            INSERT INTO tether_insert_ranges (table_name, first_rowid, last_rowid, first_seq, timestamp, site, via) VALUES (?, ?, ?, ?, ?, ?, ?)
            """, [table.name, range.firstRowid, range.lastRowid, range.firstSequence, Int64(bitPattern: range.version.timestamp), range.version.site, range.via])
    }

    private func insertRange(_ row: Row) throws -> InsertRange {
        InsertRange(firstRowid: try row.get(0, as: Int64.self), lastRowid: try row.get(1, as: Int64.self),
                    firstSequence: try row.get(2, as: Int64.self),
                    version: LocalVersion(timestamp: UInt64(bitPattern: try row.get(3, as: Int64.self)), site: try row.get(4, as: Int32.self)),
                    via: Int32.fromDatabaseValue(row[5]))
    }

    /// Writes the range an apply was filling.
    func closeOpenRange(_ connection: Connection) throws {
        guard let open = openRange else { return }
        openRange = nil
        try record(open.range, of: open.table, connection)
    }

    /// Gives a row an apply has just inserted (its metadata left NULL) its
    /// sequence number: in the open insert range when it follows it, in a new
    /// range when above the existing ones, or as its own metadata otherwise.
    func logAppliedInsert(rowid: Int64, version: LocalVersion, via peer: Int32, in table: SyncedTable, _ connection: Connection) throws {
        if var open = openRange, open.table === table, rowid == open.range.lastRowid + 1, open.range.version == version, open.range.via == peer,
           lastSequence + 1 == open.range.sequence(ofRowid: rowid) {
            _ = nextSequence()
            open.range.lastRowid = rowid
            openRange = open
            rangeFloors[ObjectIdentifier(table)] = rowid
            return
        }
        try closeOpenRange(connection)
        let floor = try rangeFloors[ObjectIdentifier(table)] ?? rangeFloor(of: table, connection)
        if rowid > floor {
            openRange = (table, InsertRange(firstRowid: rowid, lastRowid: rowid, firstSequence: nextSequence(), version: version, via: peer))
            rangeFloors[ObjectIdentifier(table)] = rowid
        } else {
            rangeFloors[ObjectIdentifier(table)] = floor
            try stamp(table, rowid: rowid, status: .synced, versions: RowVersions.uniform(version).encoded(), via: peer, connection)
        }
    }

    /// An SQL condition on `table`'s rows (aliased `alias`) that holds for rows
    /// of a range whose sequence number is at most `sequence` (one `?`).
    func rangeRowCondition(_ table: SyncedTable, alias: String) -> String {
        """
        (\(alias).tether_seq IS NULL AND EXISTS (SELECT 1 FROM tether_insert_ranges r WHERE r.table_name = \(DatabaseValue.text(table.name).description)
          AND \(alias).rowid BETWEEN r.first_rowid AND r.last_rowid AND r.first_seq + (\(alias).rowid - r.first_rowid) <= ?))
        """
    }

    /// Forgets ranges no row belongs to any more (every row changed or deleted since).
    func pruneInsertRanges(_ connection: Connection) throws {
        for table in tableList {
            try connection.execute("""
                DELETE FROM tether_insert_ranges WHERE table_name = ? AND NOT EXISTS (
                  SELECT 1 FROM \(table.quotedName) t WHERE t.rowid BETWEEN first_rowid AND last_rowid AND t.tether_seq IS NULL)
                """, [table.name])
        }
    }
}
