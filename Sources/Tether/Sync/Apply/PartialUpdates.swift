import CSQLite

/// A partial change (the columns a peer changed, the others left out as held here) to a row
/// that is here and not pending, every column it carries newer there: what a scattered update
/// sends. Its row is not read, nor written whole: only its sync state is read, only the columns
/// carried are updated (one statement per set of columns), then its metadata. Anything else
/// (a pending row, a column as new here, a constraint failing) goes the general way, which
/// comes to the same result for these.
extension SyncEngine {
    func applyPartialInPlace(
        _ change: borrowing RowChange, _ mapping: TableMapping, from peer: InstanceKey, _ connection: Connection
    ) throws -> ChangeOutcome? {
        let table = mapping.table
        // Columns in the local order: the carried values bind in the order of the change.
        // A `max`/`min` column compares values: the general merge.
        guard change.isAlive, !table.isWithoutRowid, mapping.isInOrder, !table.hasOrderedColumns,
            table.valueColumns.count <= SyncedTable.PartialColumns.bitWidth,
            let (rowid, held) = try heldState(table, key: change.key, connection), held.status == .synced,
            !held.inFlight, try localVersion(change.existence, connection) == held.versions.existence
        else { return nil }
        let count = table.valueColumns.count
        var versions = held.versions
        if versions.columns == nil { versions.columns = Array(repeating: versions.existence, count: count) }
        var carried: SyncedTable.PartialColumns = 0
        var toLocal = LocalVersionLookup(self, connection)
        for index in 0..<count {
            let remote = try toLocal(change.version(index))
            let local = versions.column(index)
            if change.omitted[index] {
                // Held here at another version: completed with a newer value, or refused (`completingPartial`).
                guard local == remote else { return nil }
            } else {
                // As new here or newer: the general merge (equal versions may still take the value).
                guard try isLater(remote, than: local) else { return nil }
                versions.setColumn(index, to: remote, columnCount: count)
                carried |= 1 << index
            }
        }
        // Nothing carried (the peer's columns this database lacks): nothing to update.
        guard carried != 0 else { return nil }
        versions.normalize()
        do {
            try table.partialUpdate(carried, connection).run { binder in
                for index in 0..<count where carried & (1 << index) != 0 { try binder.bind(change.values[index]) }
                try binder.bind(rowid)
            }
        } catch let error as DatabaseError where error.isConstraintViolation {
            return nil
        }
        // No such row (`heldState` does not read the table whose key is its rowid): nothing was written.
        guard connection.changes == 1 else { return nil }
        // Every column at the peer's version: the row is the peer's state.
        try stamp(
            table, rowid: rowid, status: .synced, versions: versions.encoded(),
            via: try sites.id(of: peer, connection),
            inserted: .earlier(held.insertedSequence), connection)
        return .applied
    }

    /// The rowid and sync state of the row with `key` (of a table with a rowid): its own metadata
    /// or its insert range's, as `storedState` reads them by rowid; nil for no such row, or one
    /// with neither. Of a table whose key is its rowid, the row itself is not read (one lookup
    /// fewer per change): the update that follows finds whether it is there; and its range comes
    /// from the apply's last one when that holds it (rows updated together: one range a batch).
    private func heldState(_ table: SyncedTable, key: [DatabaseValue], _ connection: Connection) throws
        -> (rowid: Int64, state: StoredRowState.State)?
    {
        if table.keyIsRowid {
            // A key of another type (a peer's text for an integer key) goes the general way, which
            // compares it as the table does.
            guard key.count == 1, case let .integer(rowid) = key[0] else { return nil }
            return try storedState(table, rowid: rowid, connection).map { (rowid, $0.state) }
        }
        // Otherwise the rowid from the key, its metadata and its range in one statement.
        let statement = try table.statement(.selectStateByKey, connection)
        try statement.bind(StatementArguments(values: key))
        defer { statement.reset() }
        guard try statement.step() else { return nil }
        let handle = statement.handle
        let rowid = sqlite3_column_int64(handle, 0)
        if sqlite3_column_type(handle, 3) != SQLITE_NULL {
            let own: StoredRowState.State = (
                try status(sqlite3_column_int64(handle, 1), table), sqlite3_column_int64(handle, 2) != 0,
                try versions(handle, 3, table), nil
            )
            return (rowid, own)
        }
        guard
            let range = try openAppliedRange(of: table, containing: rowid)
                ?? insertRange(read: handle, at: 4, containing: rowid)
        else { return nil }
        return (rowid, StoredRowState.inRange(range, rowid: rowid).state)
    }
}
