// The reader of the rows of insert ranges after the cursor (`InsertRanges.swift`): rows inserted
// in bulk, and the runs of them updated together (`UpdateRuns.swift`), which hold their columns'
// versions. A range's rows carry no metadata of their own: their sequence numbers follow their
// rowids, and the range's versions are theirs.

import CSQLite
import Foundation

extension Extraction {
    /// Reads the rows of `table`'s insert ranges after the cursor, range by range in sequence
    /// order: one more stream, with the same fetch limit and horizon as the change queries.
    mutating func readInsertRanges(of table: TableRead) throws {
        var stream = Stream(lastFetched: cursor)
        for range in try engine.insertRanges(of: table.table, after: cursor, reader) {
            guard try readRows(of: range, in: table, &stream) else { return }
            if end(stream) { return }
        }
    }

    /// Reads the rows of `range` after the cursor, up to the stream's limits: false when it
    /// reached the backfill's end (rows of a range go in sequence order: so are the next ranges').
    private mutating func readRows(of range: InsertRange, in table: TableRead, _ stream: inout Stream) throws -> Bool {
        let existence = try engine.version(range.version)
        // Rows updated together hold their columns' versions: sent, and read for echoes, as a live row's.
        let columnVersions =
            try range.updatedVersions.map { try engine.columnVersions($0, count: table.valueCount) } ?? []
        // The same for every row of the range.
        let rowsAreEchoes = echoes.isEcho(via: range.via, existence: existence, columnVersions: columnVersions)
        // None of them is sent: not read at all (a peer that sent this database a million rows
        // has them behind its cursor here, and pulls through them at once). A scoped peer's batch
        // reads them: a row's move in or out of scope may follow an echo.
        if rowsAreEchoes && scoped == nil { return true }
        let first = max(range.firstRowid, range.rowid(ofSequence: cursor + 1))
        let statement = try rangeStatement(of: table, from: first, through: range.lastRowid)
        statement.isBusy = true
        defer {
            statement.isBusy = false
            statement.reset()
        }
        var owned = try OwnedRowids(
            try self.statement(.selectRowidsWithMetadata, of: table.table), from: first, through: range.lastRowid)
        defer { owned.close() }
        // What a scoped peer holds of the range's rows, when not read by the range query itself.
        let members = try scoped?.members(of: table.index, from: first, through: range.lastRowid, connection)
        defer { members?.close() }
        let handle = statement.handle
        let rowidColumn = Int32(table.keyCount + table.valueCount)
        while stream.fetched < fetchLimit, stream.bytes < limits.maximumBytes, try statement.step() {
            let rowid = sqlite3_column_int64(handle, rowidColumn)
            if try owned.contains(rowid) { continue }
            let sequence = range.sequence(ofRowid: rowid)
            if sequence > backfillEnd { return false }
            stream.read(sequence)
            // The scoped range query's added columns follow the rowid.
            let place =
                table.scoped == nil
                ? nil
                : try ScopedExtraction.Place(rangeRow: rowid, handle, first: rowidColumn + 1, members: members)
            let omitted = heldColumns?.omitted(ofRangeRow: rowid, in: range, table) ?? []
            guard
                let row = admit(
                    sequence, of: table, isEcho: rowsAreEchoes, place: place, leavingOut: omitted, handle, &stream)
            else { continue }
            collect(
                RowChange(
                    table: table.index, key: row.key, isAlive: true, existence: existence, values: row.values,
                    versions: columnVersions, sequence: sequence, omitted: omitted), step: row.step, &stream)
        }
        return true
    }

    /// The query of `table`'s rows `first...last`, bound; for a table the scope names, the scoped
    /// one, which reads where each row stands.
    private func rangeStatement(of table: TableRead, from first: Int64, through last: Int64) throws -> Statement {
        guard let scopedTable = table.scoped, let scoped else {
            let statement = try statement(.selectRangeRows, of: table.table)
            try statement.bind([first, last])
            return statement
        }
        let statement = try connection.cachedStatement(scopedTable.range)
        try scoped.bind(
            statement, table: table.index,
            [":tether_first": .integer(first), ":tether_last": .integer(last)])
        return statement
    }
}

/// The rows of a range that have metadata of their own, which are no longer the range's: their
/// rowids, in order, merged with the range's rows as they are read (cheaper than a lookup per row).
struct OwnedRowids {
    private let statement: Statement
    private var next: Int64?

    /// `statement`: the table's `selectRowidsWithMetadata`.
    init(_ statement: Statement, from first: Int64, through last: Int64) throws {
        self.statement = statement
        try statement.bind([first, last])
        statement.isBusy = true
        do {
            try advance()
        } catch {
            close()
            throw error
        }
    }

    private mutating func advance() throws {
        next = try statement.step() ? sqlite3_column_int64(statement.handle, 0) : nil
    }

    /// Whether the row `rowid` has metadata of its own; rowids are asked in increasing order.
    mutating func contains(_ rowid: Int64) throws -> Bool {
        while let owned = next, owned < rowid { try advance() }
        return next == rowid
    }

    func close() {
        statement.isBusy = false
        statement.reset()
    }
}
