// Reading a row's local state (live, tombstone or absent, with its metadata) and writing the
// merged state back: the apply's row I/O.

import CSQLite
import Foundation

/// The local state of a row: live in its table, dead in its tombstone table, or absent.
struct LocalRow {
    var rowid: Int64?  // nil when dead
    var values: [DatabaseValue]
    var versions: RowVersions
    var status: SyncStatus
    var inFlight: Bool
    /// For a row of an insert range, the sequence number it was inserted at (see `RowInsertion`).
    var insertedSequence: Int64? = nil
    var isAlive: Bool { rowid != nil }
    var isPending: Bool { status != .synced || inFlight }
}

extension SyncEngine {
    /// `change` with the columns it left out filled in from `local`, which must hold each of them
    /// at the version the change gives or a later one (then the merge keeps them as they are);
    /// and whether every one of them is at that very version here (the sender holds them).
    func completingPartial(_ change: RowChange, _ mapping: TableMapping, _ local: LocalRow) throws -> (RowChange, Bool)
    {
        var sameVersions = true
        var complete = change
        complete.omitted = []
        if complete.versions.isEmpty {
            complete.versions = Array(repeating: change.existence, count: change.values.count)
        }
        for (index, left) in change.omitted.enumerated() where left {
            let localIndex = mapping.localIndex.indices.contains(index) ? mapping.localIndex[index] : -1
            guard local.values.indices.contains(localIndex) else { continue }
            let held = try version(local.versions.column(localIndex))
            guard held >= change.version(index) else {
                throw SyncError.needsWholeRows(
                    """
                    column \(mapping.table.valueColumns[localIndex]) of a row of \(mapping.table.name) is older \
                    here than the value left out
                    """)
            }
            if held != change.version(index) { sameVersions = false }
            complete.values[index] = local.values[localIndex]
            complete.versions[index] = held
        }
        return (complete, sameVersions)
    }

    /// `givingSurrogate`: set on the second look, after a row WITHOUT ROWID was given its surrogate.
    func localRow(_ table: SyncedTable, _ key: [DatabaseValue], _ connection: Connection, givingSurrogate: Bool = false)
        throws -> LocalRow?
    {
        let valueCount = table.valueColumns.count
        let live = try table.statement(.selectLiveByKey, connection)
        try live.bind(StatementArguments(values: key))
        defer { live.reset() }
        if try live.step() {
            typealias Column = RowMetadataLayout.LiveByKey
            let handle = live.handle
            if table.isWithoutRowid && sqlite3_column_type(handle, Column.rowid) == SQLITE_NULL {
                // A row its triggers never saw (they were not there): it gets its surrogate now.
                live.reset()
                guard !givingSurrogate else {
                    throw SyncError.corruptMetadata(
                        "a row of \(table.name) cannot be given a surrogate key in \(table.layout.keysTable)")
                }
                try table.statement(.insertKeyByKey, connection).execute(StatementArguments(values: key))
                return try localRow(table, key, connection, givingSurrogate: true)
            }
            let rowid = sqlite3_column_int64(handle, Column.rowid)
            let values = (0..<valueCount).map { DatabaseValue(statement: handle, index: Column.value($0)) }
            let versionsColumn = Column.versions(valueCount: valueCount)
            if sqlite3_column_type(handle, versionsColumn) != SQLITE_NULL {
                return LocalRow(
                    rowid: rowid, values: values, versions: try versions(handle, versionsColumn, table),
                    status: try status(sqlite3_column_int64(handle, Column.status(valueCount: valueCount)), table),
                    inFlight: sqlite3_column_int64(handle, Column.inFlight(valueCount: valueCount)) != 0)
            }
            // A row of an insert range has no metadata of its own: the range's. A row with neither
            // was written before the table was synced (or by a program not captured): as a new row.
            guard let range = try insertRange(of: table, containing: rowid, connection) else {
                return LocalRow(
                    rowid: rowid, values: values, versions: .uniform(LocalVersion(timestamp: 0, site: sites.local)),
                    status: .created, inFlight: false)
            }
            let state = range.state(ofRowid: rowid)
            return LocalRow(
                rowid: rowid, values: values, versions: range.rowVersions, status: state.status,
                inFlight: state.inFlight,
                insertedSequence: range.insertedSequence(ofRowid: rowid))
        }
        guard table.mayHaveDeadRows else { return nil }
        let dead = try table.statement(.selectDeadByKey, connection)
        try dead.bind(StatementArguments(values: key))
        defer { dead.reset() }
        guard try dead.step() else { return nil }
        typealias Column = RowMetadataLayout.DeadByKey
        let handle = dead.handle
        return LocalRow(
            rowid: nil,
            values: (0..<valueCount).map { DatabaseValue(statement: handle, index: Column.value($0)) },
            versions: try versions(handle, Column.versions(valueCount: valueCount), table),
            status: try status(sqlite3_column_int64(handle, Column.status(valueCount: valueCount)), table),
            inFlight: sqlite3_column_int64(handle, Column.inFlight(valueCount: valueCount)) != 0)
    }

    func status(_ stored: Int64, _ table: SyncedTable) throws -> SyncStatus {
        guard let status = SyncStatus(rawValue: Int(stored)) else {
            throw SyncError.corruptMetadata("a row of \(table.name) has the unknown sync status \(stored)")
        }
        return status
    }

    func versions(_ handle: OpaquePointer, _ column: Int32, _ table: SyncedTable) throws -> RowVersions {
        guard let bytes = sqlite3_column_blob(handle, column),
            let versions = RowVersions(
                encoded: UnsafeRawBufferPointer(start: bytes, count: Int(sqlite3_column_bytes(handle, column))))
        else {
            throw SyncError.corruptMetadata("a row of \(table.name) has damaged versions in its sync metadata")
        }
        return versions
    }

    /// Inserts a row that is new here; false when the key is taken (or any
    /// other constraint fails): the full path then settles it. On a simple
    /// table this is INSERT OR FAIL without the capture hook (an insert there
    /// cannot cascade), the cheapest write SQLite has.
    func insertIfAbsent(
        _ change: borrowing RowChange, _ mapping: TableMapping, from peer: InstanceKey, _ connection: Connection
    ) throws -> Bool {
        let table = mapping.table
        guard mapping.localIndex.count == table.valueColumns.count else { return false }
        let inOrder = mapping.isInOrder
        if insertsIntoRange(change, mapping) {
            // Every column at the row's version: the row can join an insert range.
            return try connection.withoutCapture {
                try insertIntoRange(
                    key: change.key, values: change.values, existence: change.existence, table, from: peer, connection)
            }
        }
        let statement = try table.statement(.insertNewLive, connection)
        // The common case of a first sync: columns in the same order, every
        // one at the row's version. Bind straight from the change.
        let state =
            inOrder && change.versions.isEmpty
            ? MergedState(
                isAlive: true, values: change.values, versions: .uniform(try localVersion(change.existence, connection))
            )
            : try remoteState(change, mapping, connection)
        do {
            let key = change.key
            let insert = { try self.insertLive(statement, key: key, values: state.values, connection) }
            if table.insertsChangeNothingElse {
                try connection.withoutCapture(.everything, insert)
            } else {
                try insert()
            }
        } catch let error as DatabaseError where error.isConstraintViolation {
            return false
        }
        try writeMetadata(
            table, rowid: try insertedRowid(table, key: change.key, connection), state: state, status: .synced,
            via: try sites.id(of: peer, connection), inserted: .now, connection)
        return true
    }

    /// Inserts a new row whose columns are all at its `existence` version, to join an insert range
    /// (`insertIfAbsent`'s cheapest case), capture suspended by the caller; false when its key is
    /// taken. Given the change's parts, not the change: a run of a first sync's rows copies none.
    func insertIntoRange(
        key: [DatabaseValue], values: [DatabaseValue], existence: Version, _ table: SyncedTable, from peer: InstanceKey,
        _ connection: Connection
    ) throws -> Bool {
        let version = try localVersion(existence, connection)
        do {
            try table.statement(.insertNewLive, connection).run { binder in
                try binder.bind(key)
                try binder.bind(values)
            }
        } catch let error as DatabaseError where error.isConstraintViolation {
            return false
        }
        try logAppliedInsert(
            rowid: connection.lastInsertedRowID, version: version, via: try sites.id(of: peer, connection), in: table,
            connection)
        return true
    }

    /// Whether `insertIfAbsent` inserts `change` into an insert range (its cheapest case): every
    /// column at the row's version, in the local order, onto a table whose inserts change nothing else.
    func insertsIntoRange(_ change: borrowing RowChange, _ mapping: TableMapping) -> Bool {
        mapping.table.insertsChangeNothingElse && mapping.isInOrder && change.versions.isEmpty
    }

    /// Whether `change` is a new row for `insertIfAbsent`'s insert range if its key is free here:
    /// alive and whole, of a table that holds no tombstone (one could have the key), nor counters
    /// (a change may carry their states, merged one by one). Reads fields only: a call here (the
    /// check of a change's counter states was one) makes the caller copy the change it borrows from
    /// the batch, four arrays retained per row (`engine.apply`: +320 instructions a row).
    func joinsInsertRange(_ change: borrowing RowChange, _ mapping: TableMapping) -> Bool {
        change.isAlive && !change.isEvicted && !change.isPartial && !mapping.table.mayHaveDeadRows
            && !mapping.table.hasCounters && insertsIntoRange(change, mapping)
    }

    /// The rowid of the live row just inserted with `key`: for a table WITHOUT ROWID, the
    /// surrogate its insert trigger gave it.
    func insertedRowid(_ table: SyncedTable, key: [DatabaseValue], _ connection: Connection) throws -> Int64 {
        guard table.isWithoutRowid else { return connection.lastInsertedRowID }
        let statement = try table.statement(.selectRowidByKey, connection)
        try statement.bind(StatementArguments(values: key))
        defer { statement.reset() }
        guard try statement.step(), sqlite3_column_type(statement.handle, 0) != SQLITE_NULL else {
            throw SyncError.corruptMetadata(
                """
                a row inserted into \(table.name) has no surrogate key in \(table.layout.keysTable): are its \
                triggers gone?
                """)
        }
        return sqlite3_column_int64(statement.handle, 0)
    }

    /// Runs an INSERT of a live row's key and values.
    func insertLive(_ statement: Statement, key: [DatabaseValue], values: [DatabaseValue], _ connection: Connection)
        throws
    {
        try statement.run { binder in
            try binder.bind(key)
            try binder.bind(values)
        }
    }

    /// Writes a live row's metadata: a new sequence number, its status and versions.
    func writeMetadata(
        _ table: SyncedTable, rowid: Int64, state: MergedState, status: SyncStatus, via: Int32?, inserted: RowInsertion,
        _ connection: Connection
    ) throws {
        try stamp(
            table, rowid: rowid, status: status, versions: state.versions.encoded(), via: via, inserted: inserted,
            connection)
    }

    /// Writes a tombstone: key, values and metadata.
    func writeDead(
        _ table: SyncedTable, key: [DatabaseValue], state: MergedState, status: SyncStatus, via: Int32?,
        _ connection: Connection
    ) throws {
        try table.statement(.upsertDead, connection).run { binder in
            try binder.bind(key)
            try binder.bind(state.values)
            try binder.bind(clock.nextSequence())
            try binder.bind(Int64(status.rawValue))
            try binder.bind(Int64(0))
            try binder.bind(blob: state.versions.encoded())
            try binder.bind(via.map { DatabaseValue.integer(Int64($0)) } ?? .null)
        }
        table.mayHaveDeadRows = true
    }

    /// Whether a merged row is exactly the row the peer sent (every column and
    /// the existence at the peer's versions): then the peer has it, and it is
    /// not sent back there.
    func isExactly(_ change: RowChange, _ mapping: TableMapping, _ state: MergedState, _ connection: Connection) throws
        -> Bool
    {
        guard state.isAlive == change.isAlive,
            state.versions.existence == (try localVersion(change.existence, connection))
        else { return false }
        // A column the peer lacks counts when the row holds a value other than its default: the
        // peer's default stands in for it. Taken for the peer's own row, it would never go back
        // there, and the peer, once it has the column, backfills only rows up to its cursor (§8.3).
        for index in mapping.columnsThePeerLacks where state.values[index] != mapping.table.valueDefaults[index] {
            return false
        }
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated()
        where state.versions.column(localIndex) != (try localVersion(change.version(remoteIndex), connection)) {
            return false
        }
        return true
    }

    /// `remoteHoldsIt`: false when the change was completed with values newer than the peer's,
    /// so that the row is not taken for the peer's own state (which `tether_via` records, to send
    /// nothing back to it).
    func write(
        _ change: RowChange, _ mapping: TableMapping, _ local: LocalRow?, merged state: MergedState,
        status: SyncStatus, from peer: InstanceKey, remoteHoldsIt: Bool = true, _ connection: Connection
    ) throws -> ChangeOutcome {
        let table = mapping.table
        let via =
            try remoteHoldsIt && isExactly(change, mapping, state, connection) ? sites.id(of: peer, connection) : nil
        do {
            switch (state.isAlive, local?.rowid) {
            case let (true, rowid?):
                if !table.valueColumns.isEmpty {
                    try table.statement(.updateLive, connection).run { binder in
                        try binder.bind(state.values)
                        try binder.bind(rowid)
                    }
                }
                try writeMetadata(
                    table, rowid: rowid, state: state, status: status, via: via,
                    inserted: .earlier(local?.insertedSequence), connection)
            case (true, nil):
                try insertLive(
                    table.statement(.insertLive, connection), key: change.key, values: state.values, connection)
                try writeMetadata(
                    table, rowid: try insertedRowid(table, key: change.key, connection), state: state, status: status,
                    via: via,
                    inserted: .now, connection)
                if local != nil {
                    try table.statement(.deleteDeadByKey, connection).execute(StatementArguments(values: change.key))
                }
            case let (false, rowid?):
                try table.statement(.deleteLiveByRowid, connection).execute([rowid])
                try table.statement(.deleteRowMetadata, connection).execute([rowid])
                try writeDead(table, key: change.key, state: state, status: status, via: via, connection)
            case (false, nil):
                try writeDead(table, key: change.key, state: state, status: status, via: via, connection)
            }
        } catch let error as DatabaseError where error.isConstraintViolation {
            if error.kind == .uniqueViolation, state.isAlive,
                let outcome = try settleUniqueRace(
                    error, change, mapping, state, status: status, from: peer, remoteHoldsIt: remoteHoldsIt, connection)
            {
                return outcome
            }
            return .keptAside(error.message)
        }
        return .applied
    }
}
