// A row's counter states as stored in its metadata (`tether_rows_T.counters`), read and written.

import CSQLite
import Foundation

/// The counter states of one row's counter columns that hold contributions, by column name (a
/// name, not an index: a dropped column shifts the indices). A counter column absent here holds its
/// plain value: the base, at the column's version, without contributions.
///
///     count (2 bytes LE), then count × (name length (2 bytes LE), name (UTF-8),
///                                       state length (4 bytes LE), `CounterState.encoded()`)
///
/// then, when this site's contribution to a column has earlier values kept, their histories
/// (`ContributionHistory`, format 7: a library of format 6 would take them for damage).
struct RowCounters: Equatable {
    var states: ColumnKeyed<CounterState> = [:]
    /// The earlier values of this site's contributions, by column name (only columns with a state).
    var own: ColumnKeyed<ContributionHistory> = [:]

    var isEmpty: Bool { states.isEmpty }

    func encoded() -> [UInt8] {
        var size = 2
        for (name, state) in states { size += 6 + name.utf8.count + state.encodedCount }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(size)
        func uint(_ value: Int, _ size: Int) {
            for index in 0..<size { bytes.append(UInt8(truncatingIfNeeded: value >> (8 * index))) }
        }
        uint(states.count, 2)
        // In ascending order of name, as `states` keeps them.
        for (name, state) in states {
            uint(name.utf8.count, 2)
            bytes.append(contentsOf: name.utf8)
            uint(state.encodedCount, 4)
            state.encode(into: &bytes)
        }
        if !own.isEmpty {
            let histories = own.filter { states[$0.key] != nil }
            ContributionHistory.appendTrailer(histories.map { ($0.key, $0.value) }, to: &bytes)
        }
        return bytes
    }

    /// nil when the bytes are not a stored state (damaged metadata).
    init?(encoded bytes: UnsafeRawBufferPointer) {
        var offset = 0
        func uint(_ size: Int) -> Int? {
            guard bytes.count - offset >= size else { return nil }
            defer { offset += size }
            return (0..<size).reduce(0) { $0 | Int(bytes[offset + $1]) << (8 * $1) }
        }
        guard let count = uint(2) else { return nil }
        for _ in 0..<count {
            guard let nameLength = uint(2), bytes.count - offset >= nameLength else { return nil }
            let name = String(
                decoding: UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + nameLength]), as: UTF8.self)
            offset += nameLength
            guard let stateLength = uint(4), bytes.count - offset >= stateLength,
                let state = try? CounterState(
                    decoding: UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + stateLength]))
            else { return nil }
            offset += stateLength
            states[name] = state
        }
        guard offset != bytes.count else { return }
        guard let histories = ContributionHistory.decodeTrailer(bytes, from: offset) else { return nil }
        own = ColumnKeyed(histories)
    }

    init?(encoded data: Data) {
        guard let counters = data.withUnsafeBytes({ RowCounters(encoded: $0) }) else { return nil }
        self = counters
    }

    init(states: ColumnKeyed<CounterState> = [:]) { self.states = states }
}

extension StatementBinder {
    /// Binds a row's counter states as stored: NULL when none holds a contribution.
    mutating func bind(_ counters: RowCounters) throws {
        if counters.isEmpty { try bind(DatabaseValue.null) } else { try bind(blob: counters.encoded()) }
    }
}

extension SyncEngine {
    /// The counter states stored for the live row `rowid` (none: every counter holds its plain value).
    func rowCounters(_ table: SyncedTable, rowid: Int64, _ connection: Connection) throws -> RowCounters {
        let statement = try table.statement(.selectCounters, connection)
        try statement.bind([rowid])
        defer { statement.reset() }
        guard try statement.step() else { return RowCounters() }
        return try rowCounters(statement.handle, column: 0, table)
    }

    /// The counter states in column `column` of the current row of `handle`.
    func rowCounters(_ handle: OpaquePointer, column: Int32, _ table: SyncedTable) throws -> RowCounters {
        guard sqlite3_column_type(handle, column) != SQLITE_NULL else { return RowCounters() }
        let count = Int(sqlite3_column_bytes(handle, column))
        guard
            let counters = RowCounters(
                encoded: UnsafeRawBufferPointer(start: sqlite3_column_blob(handle, column), count: count))
        else {
            throw SyncError.corruptMetadata("a row of \(table.name) has damaged counter states in its sync metadata")
        }
        return counters
    }

    /// Stores `counters` for the live row `rowid`, whose metadata row exists.
    func writeRowCounters(_ counters: RowCounters, _ table: SyncedTable, rowid: Int64, _ connection: Connection) throws
    {
        try table.statement(.updateCounters, connection).run { binder in
            try binder.bind(counters)
            try binder.bind(rowid)
        }
    }

    /// Column `index`'s counter state in `counters`, or its plain value at `version` as one.
    func counterState(
        _ counters: RowCounters, _ table: SyncedTable, column index: Int, value: DatabaseValue,
        version: LocalVersion, _ connection: Connection
    ) throws -> CounterState {
        if let state = counters.states[table.valueColumns[index]] { return state }
        return CounterState(base: value, baseVersion: try self.version(version))
    }
}
