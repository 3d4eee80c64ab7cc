// The reader of the rows with metadata of their own after the cursor: live rows (`tether_rows_`)
// and tombstones, one query each, in sequence order.

import CSQLite
import Foundation

extension Extraction {
    private typealias Column = RowMetadataLayout.Changes

    /// Reads the live rows (`alive`) or the tombstones of `table` with sequence numbers after the
    /// cursor, up to the fetch limit and the byte budget.
    mutating func readChangedRows(of table: TableRead, alive: Bool) throws {
        let statement = try changesStatement(of: table, alive: alive)
        statement.isBusy = true
        defer {
            statement.isBusy = false
            statement.reset()
        }
        let handle = statement.handle
        let base = Int32(table.keyCount + table.valueCount)
        var stream = Stream(lastFetched: cursor)
        while stream.bytes < limits.maximumBytes, try statement.step() {
            let sequence = sqlite3_column_int64(handle, Column.sequence(base))
            // Rows go in sequence order: past the backfill's end, so are the rest.
            if sequence > backfillEnd { return }
            stream.read(sequence)
            try readChangedRow(sequence, of: table, alive: alive, handle, &stream)
        }
        end(stream)
    }

    /// The change query of `table`'s live rows or tombstones, bound to the cursor and the fetch
    /// limit; for a table the scope names, the scoped one, which reads where each row stands.
    private func changesStatement(of table: TableRead, alive: Bool) throws -> Statement {
        guard let scopedTable = table.scoped, let scoped else {
            let statement = try statement(alive ? .selectLiveChanges : .selectDeadChanges, of: table.table)
            // A scoped peer's batch reads echoes too: a row's move in or out of scope may follow one.
            let echoSite: Int64? = echoes.leavesOut && scoped == nil ? echoes.peerSite.map(Int64.init) : nil
            try statement.bind([cursor, fetchLimit, echoSite])
            return statement
        }
        let statement = try connection.cachedStatement(alive ? scopedTable.live : scopedTable.dead)
        try scoped.bind(
            statement, table: table.index,
            [":tether_after": .integer(cursor), ":tether_limit": .integer(Int64(fetchLimit))])
        return statement
    }

    /// Collects the current row of `handle`, of sequence number `sequence`.
    private mutating func readChangedRow(
        _ sequence: Int64, of table: TableRead, alive: Bool, _ handle: OpaquePointer,
        _ stream: inout Stream
    ) throws {
        let base = Int32(table.keyCount + table.valueCount)
        guard let bytes = sqlite3_column_blob(handle, Column.versions(base)),
            let versions = RowVersions(
                encoded: UnsafeRawBufferPointer(
                    start: bytes, count: Int(sqlite3_column_bytes(handle, Column.versions(base)))))
        else {
            throw SyncError.corruptMetadata(
                "row of \(table.table.name) with sequence \(sequence) has damaged versions in its sync metadata")
        }
        let existence = try engine.version(versions.existence)
        let columnVersions = versions.columns == nil ? [] : try engine.columnVersions(versions, count: table.valueCount)
        let via =
            sqlite3_column_type(handle, Column.via(base)) == SQLITE_NULL
            ? nil
            : Int32(truncatingIfNeeded: sqlite3_column_int64(handle, Column.via(base)))
        // The scoped queries' added columns follow the metadata's (the rowid, for live rows).
        let place =
            table.scoped == nil
            ? nil
            : ScopedExtraction.Place(
                changedRow: handle, first: base + (alive ? 5 : 4), isAlive: alive,
                rowid: alive ? sqlite3_column_int64(handle, Column.rowid(base)) : 0)
        let isEcho = echoes.isEcho(
            via: via, existence: existence, columnVersions: columnVersions,
            byOrigins: !(alive && table.table.hasCounters))
        var omitted: [Bool] = []
        if alive, heldColumns != nil {
            let rowid = sqlite3_column_int64(handle, Column.rowid(base))
            // Partial rows are never sent to a scoped peer: its query has no insert column.
            let inserted =
                sqlite3_column_type(handle, Column.insertedSequence(base)) == SQLITE_NULL
                ? nil : sqlite3_column_int64(handle, Column.insertedSequence(base))
            omitted = try heldColumns?.omitted(ofRow: rowid, versions: versions, insertedAt: inserted, table) ?? []
        }
        guard let row = admit(sequence, of: table, isEcho: isEcho, place: place, leavingOut: omitted, handle, &stream)
        else { return }
        collect(
            RowChange(
                table: table.index, key: row.key, isAlive: alive, existence: existence, values: row.values,
                versions: columnVersions, sequence: sequence, omitted: omitted), step: row.step, &stream)
    }
}
