// Local updates of rows with counters, stamped once per row and transaction: a row incremented ten
// times in a transaction gets one sequence number and one contribution, not ten of each.

import CSQLite
import Foundation

/// The updates of rows of tables with counters made in the transaction running and not stamped
/// yet, one entry per row: the columns changed, and what was written to its counters.
///
/// Like an update run (`UpdateRuns.swift`) they wait in memory and are written
/// (`ChangeCapture.closeCounterUpdates`) before anything else reads or writes the sync metadata —
/// another kind of change, a statement touching Tether's tables, a savepoint, a bulk insert, a
/// schema change — and at the latest before COMMIT, in the same transaction. Every update of the
/// transaction has its version, so stamping a row once for all of them records the same state.
struct CounterUpdates {
    struct Row {
        let table: SyncedTable
        let rowid: Int64
        /// Indices of the value columns the updates changed, in the order first changed.
        var changedColumns: [Int]
        /// What they wrote to counter columns, one entry per column (usually one: searched, not
        /// hashed): the value before the first, the sum of their differences.
        var writes: [ColumnCounterWrite]
    }

    /// In the order of their first update, which their sequence numbers follow.
    private(set) var rows: [Row] = []
    private var positions: [SyncedRowKey: Int] = [:]
    /// The entry the last update went to: a loop over the same rows again goes to the next one.
    private var lastPosition = -1
    /// The transaction's version, which every update waiting has.
    private(set) var version: LocalVersion?

    var isEmpty: Bool { rows.isEmpty }

    /// Adds a statement's update of `rowid` (`changedColumns`): the position of the row's entry.
    mutating func add(_ table: SyncedTable, rowid: Int64, changedColumns: [Int], version: LocalVersion) -> Int {
        self.version = version
        let position: Int
        let next = lastPosition + 1 < rows.count ? lastPosition + 1 : 0
        if next < rows.count, rows[next].rowid == rowid, rows[next].table === table {
            position = next
        } else {
            let key = SyncedRowKey(table, rowid: rowid)
            guard let known = positions[key] else {
                positions[key] = rows.count
                rows.append(Row(table: table, rowid: rowid, changedColumns: changedColumns, writes: []))
                lastPosition = rows.count - 1
                return lastPosition
            }
            position = known
        }
        lastPosition = position
        // Usually the same columns again: nothing to add, nothing allocated.
        for column in changedColumns where !rows[position].changedColumns.contains(column) {
            rows[position].changedColumns.append(column)
        }
        return position
    }

    /// Adds what the statement wrote to counter `column` to the entry at `position`.
    mutating func add(_ write: CounterWrite, column: Int, at position: Int) {
        for index in rows[position].writes.indices where rows[position].writes[index].column == column {
            rows[position].writes[index].write.follow(with: write)
            return
        }
        rows[position].writes.append((column, write))
    }

    /// Takes the rows waiting, leaving none.
    mutating func take() -> (rows: [Row], version: LocalVersion?) {
        defer { removeAll() }
        return (rows, version)
    }

    /// Puts back `rows` taken and not written (there are none waiting).
    mutating func putBack(_ rows: ArraySlice<Row>, version: LocalVersion) {
        for row in rows {
            positions[SyncedRowKey(row.table, rowid: row.rowid)] = self.rows.count
            self.rows.append(row)
        }
        self.version = version
    }

    mutating func removeAll() {
        rows.removeAll(keepingCapacity: true)
        positions.removeAll(keepingCapacity: true)
        lastPosition = -1
        version = nil
    }
}

extension CounterWrite {
    /// This write, then `later`: the value before this one, the differences of both.
    mutating func follow(with later: CounterWrite) {
        difference = difference + later.difference
    }
}

extension ChangeCapture {
    /// Holds a statement's update of `rowid`, a row of a table with counters, for
    /// `closeCounterUpdates`; a write to a counter that cannot be made is refused now, with the
    /// statement.
    func deferCounterUpdate(
        _ table: SyncedTable, rowid: Int64, changedColumns: [Int], version: LocalVersion
    ) throws {
        let position = counterUpdates.add(table, rowid: rowid, changedColumns: changedColumns, version: version)
        try takeCounterWrites(table, rowid: rowid) { column, write in
            try checkCounterWrite(write, table, column: column)
            counterUpdates.add(write, column: column, at: position)
        }
    }

    /// Stamps the rows whose updates wait, each once, and adds their counters' differences to
    /// this site's contributions, in one write per row. A write that fails (a full disk) leaves
    /// the rows from its own on to write again — none is added twice — and until then the
    /// transaction cannot commit (`transactionShouldCommit`).
    func closeCounterUpdates(_ connection: Connection) throws {
        guard !counterUpdates.isEmpty else { return }
        let (rows, taken) = counterUpdates.take()
        guard let version = taken else { return }
        var written = 0
        var ranges = RangeRowsWithoutMetadata()
        do {
            for row in rows {
                let table = row.table
                let stored = try ranges.storedState(table, rowid: row.rowid, engine, connection)
                let before = stored?.state
                var versions = before?.versions ?? .uniform(version)
                for column in row.changedColumns {
                    versions.setColumn(column, to: version, columnCount: table.valueColumns.count)
                }
                var counters: RowCounters?
                if !row.writes.isEmpty {
                    // Only a row with metadata of its own can hold counter states.
                    let held: RowCounters
                    if case .own = stored {
                        held = try engine.rowCounters(table, rowid: row.rowid, connection)
                    } else {
                        held = RowCounters()
                    }
                    if let (contributed, later) = try contributed(
                        row.writes, table, to: held, before: before?.versions, version: version, connection)
                    {
                        counters = contributed
                        for (column, newest) in later {
                            versions.setColumn(column, to: newest, columnCount: table.valueColumns.count)
                        }
                    }
                }
                // One write per row, its last: once it is written, nothing of the row is left to repeat.
                try engine.stamp(
                    table, rowid: row.rowid, status: SyncEngine.statusAfterUpdate(before?.status ?? .created),
                    versions: versions.encoded(), inserted: .earlier(before?.insertedSequence), counters: counters,
                    connection)
                written += 1
            }
        } catch {
            counterUpdates.putBack(rows[written...], version: version)
            throw error
        }
    }
}

/// The stored state of rows looked up in ascending order, most of them in one insert range without
/// metadata of their own (a loop of updates over bulk-inserted rows): the range and the next rowid
/// in it with metadata are read once, not two queries a row.
private struct RangeRowsWithoutMetadata {
    private var table: SyncedTable?
    private var range: InsertRange?
    /// Rows after this one and before `nextOwned` have no metadata of their own.
    private var after: Int64 = 0
    private var nextOwned: Int64 = 0

    /// `SyncEngine.storedState`; rows are stamped as they are looked up, each once, so a row
    /// stamped after the look ahead is never looked up again.
    mutating func storedState(
        _ table: SyncedTable, rowid: Int64, _ engine: SyncEngine, _ connection: Connection
    ) throws -> StoredRowState? {
        if self.table === table, let range, after < rowid, rowid < nextOwned, rowid <= range.lastRowid {
            return .inRange(range, rowid: rowid)
        }
        let stored = try engine.storedState(table, rowid: rowid, connection)
        guard case let .inRange(range, _)? = stored else { return stored }
        let owned = try table.statement(.selectRowidsWithMetadata, connection)
        try owned.bind([rowid + 1, range.lastRowid])
        defer { owned.reset() }
        nextOwned = try owned.step() ? sqlite3_column_int64(owned.handle, 0) : range.lastRowid + 1
        self.table = table
        self.range = range
        after = rowid
        return stored
    }
}
