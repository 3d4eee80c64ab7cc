import CSQLite
import Foundation

/// Where a live row's sync state is stored, and what it is.
enum StoredRowState {
    typealias State = (status: SyncStatus, inFlight: Bool, versions: RowVersions, insertedSequence: Int64?)
    /// In the row's own metadata (`tether_rows_T`).
    case own(State)
    /// In the insert range `rowid` belongs to.
    case inRange(InsertRange, rowid: Int64)

    var state: State {
        switch self {
        case let .own(state): return state
        case let .inRange(range, rowid):
            let state = range.state(ofRowid: rowid)
            return (state.status, state.inFlight, range.rowVersions, range.insertedSequence(ofRowid: rowid))
        }
    }
}

/// When a stamped row was inserted, as its metadata records it (`inserted_seq`): what observers
/// reading the changelog back report as an insert, whatever path inserted the row.
enum RowInsertion {
    /// By the change being stamped.
    case now
    /// Before it: at this sequence number, for a row without metadata of its own yet (a row of an
    /// insert range); nil when not known. Metadata the row has keeps what it says.
    case earlier(Int64?)
}

extension SyncEngine {
    /// A live row's sync state: its own metadata, or its insert range's; nil for a row that
    /// has neither (written before the table was synced, or by a program not captured).
    func rowState(_ table: SyncedTable, rowid: Int64, _ connection: Connection) throws -> StoredRowState.State? {
        try storedState(table, rowid: rowid, connection)?.state
    }

    /// Where a live row's sync state is stored, and what it is; nil for a row that has neither
    /// metadata nor a range.
    func storedState(_ table: SyncedTable, rowid: Int64, _ connection: Connection) throws -> StoredRowState? {
        let statement = try table.statement(.selectRowMetadata, connection)
        try statement.bind([rowid])
        defer { statement.reset() }
        if try statement.step() {
            let handle = statement.handle
            guard let status = SyncStatus(rawValue: Int(sqlite3_column_int64(handle, 0))),
                let bytes = sqlite3_column_blob(handle, 2),
                let versions = RowVersions(
                    encoded: UnsafeRawBufferPointer(start: bytes, count: Int(sqlite3_column_bytes(handle, 2))))
            else {
                throw SyncError.corruptMetadata(
                    "row \(rowid) of \(table.name) has damaged metadata in \(table.layout.rowsTable)")
            }
            let inserted = sqlite3_column_type(handle, 3) == SQLITE_NULL ? nil : sqlite3_column_int64(handle, 3)
            return .own((status, sqlite3_column_int64(handle, 1) != 0, versions, inserted))
        }
        guard let range = try insertRange(of: table, containing: rowid, connection) else { return nil }
        return .inRange(range, rowid: rowid)
    }

    /// Gives a live row a new sequence number (or `sequence`, taken already), its status and its versions.
    /// `via`: the peer the row's state was received from; nil for a change made here.
    /// `inserted`: whether this change inserts the row, or when it was. `counters`: the row's
    /// counter states, written with the rest (nil: they stay as they are).
    func stamp(
        _ table: SyncedTable, rowid: Int64, status: SyncStatus, versions: [UInt8], via peer: Int32? = nil,
        inserted: RowInsertion,
        sequence taken: Int64? = nil, counters: RowCounters? = nil, _ connection: Connection
    ) throws {
        let sequence = taken ?? clock.nextSequence()
        let query: SyncedTable.Query = counters == nil ? .upsertRowMetadata : .upsertRowMetadataWithCounters
        try table.statement(query, connection).run { binder in
            try binder.bind(rowid)
            try binder.bind(sequence)
            try binder.bind(Int64(status.rawValue))
            try binder.bind(blob: versions)
            try binder.bind(peer.map { DatabaseValue.integer(Int64($0)) } ?? .null)
            switch inserted {
            case .now: try binder.bind(sequence)
            case let .earlier(insertedSequence):
                try binder.bind(insertedSequence.map { DatabaseValue.integer($0) } ?? .null)
            }
            if let counters { try binder.bind(counters) }
        }
    }

    /// A row inserted locally: its tombstone, if the key had one, goes (the
    /// insert is newer than anything seen here), and it is a new local change.
    func stampInserted(_ table: SyncedTable, rowid: Int64, versions: [UInt8], _ connection: Connection) throws {
        try removeTombstone(table, rowid: rowid, connection)
        try stamp(table, rowid: rowid, status: .created, versions: versions, inserted: .now, connection)
        // Metadata kept by a REPLACE over the rowid: a new row's counters hold their plain values.
        if table.hasCounters { try writeRowCounters(RowCounters(), table, rowid: rowid, connection) }
    }

    func removeTombstone(_ table: SyncedTable, rowid: Int64, _ connection: Connection) throws {
        guard table.mayHaveDeadRows else { return }
        try table.statement(.deleteDeadForRowid, connection).execute([rowid])
    }

    /// The status after a local update: a synced row becomes updated; a
    /// created (or already updated) row stays as it is.
    static func statusAfterUpdate(_ old: SyncStatus) -> SyncStatus {
        old == .synced || old == .deleted ? .updated : old
    }
}
