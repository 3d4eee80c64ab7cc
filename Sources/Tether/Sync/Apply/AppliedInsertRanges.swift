import Foundation

/// Rows a peer's batch inserts are logged as insert ranges, as a bulk insert's are
/// (`Capture/BulkInserts.swift`): the range being filled stays in the apply's context
/// (`ApplyContext.openRange`) until a row does not follow it.
extension SyncEngine {
    /// Fewer rows than this, inserted together by a batch, are given metadata of their own
    /// rather than a range.
    static let smallestAppliedRange: Int64 = 32

    /// Writes the range an apply was filling.
    func closeOpenRange(_ connection: Connection) throws {
        guard let open = applying?.openRange else { return }
        applying?.openRange = nil
        let range = open.range
        let rows = range.lastRowid - range.firstRowid + 1
        if rows < Self.smallestAppliedRange {
            // A few rows (a live session's commit): metadata of their own costs about the same, and a
            // range per commit would pile up in `tether_insert_ranges`, which applies and
            // acknowledgements read whole.
            let versions = range.rowVersions.encoded()
            for offset in 0..<rows {
                try stamp(
                    open.table, rowid: range.firstRowid + offset, status: range.status, versions: versions,
                    via: range.via, inserted: .now, sequence: range.firstSequence + offset, connection)
            }
            return
        }
        // The range's rows are the table's highest applied rowids: recorded here once, not per row.
        applying?.rangeFloors[ObjectIdentifier(open.table)] = range.lastRowid
        try record(range, of: open.table, connection)
    }

    /// Gives a row an apply has just inserted (its metadata left NULL) its
    /// sequence number: in the open insert range when it follows it, in a new
    /// range when above the existing ones, or as its own metadata otherwise.
    func logAppliedInsert(
        rowid: Int64, version: LocalVersion, via peer: Int32, in table: SyncedTable, _ connection: Connection
    ) throws {
        guard applying != nil else { throw SyncError.corruptMetadata("an applied insert was logged outside an apply") }
        let tableID = ObjectIdentifier(table)
        // Read and mutated in place (never copied out: a range holds references): this runs once per
        // row of a first sync.
        if applying?.openRange?.table === table, let lastRowid = applying?.openRange?.range.lastRowid,
            rowid == lastRowid + 1,
            applying?.openRange?.range.version == version, applying?.openRange?.range.via == peer,
            clock.lastSequence + 1 == applying?.openRange?.range.sequence(ofRowid: rowid)
        {
            _ = clock.nextSequence()
            applying?.openRange?.range.lastRowid = rowid
            return
        }
        try closeOpenRange(connection)
        let floor = try applying?.rangeFloors[tableID] ?? rangeFloor(of: table, connection)
        if rowid > floor {
            applying?.openRange = (
                table,
                InsertRange(
                    firstRowid: rowid, lastRowid: rowid, firstSequence: clock.nextSequence(), version: version,
                    via: peer)
            )
        } else {
            applying?.rangeFloors[tableID] = floor
            try stamp(
                table, rowid: rowid, status: .synced, versions: RowVersions.uniform(version).encoded(), via: peer,
                inserted: .now, connection)
        }
    }
}
