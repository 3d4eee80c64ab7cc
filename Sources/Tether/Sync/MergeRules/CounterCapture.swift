// A local write to a counter column becomes this site's contribution: the difference it made.

import CSQLite
import Foundation

/// A row of a synced table, for the counter writes of the statement running and the transaction.
struct SyncedRowKey: Hashable {
    let table: ObjectIdentifier
    let rowid: Int64

    init(_ table: SyncedTable, rowid: Int64) {
        self.table = ObjectIdentifier(table)
        self.rowid = rowid
    }

    /// One word hashed, not two: tables are few, their rows many.
    func hash(into hasher: inout Hasher) {
        hasher.combine(rowid &+ Int64(Int(bitPattern: UInt(bitPattern: table))) &* 31)
    }
}

/// What the statement running wrote to one counter column (an index of the value columns) of
/// one row, noted by the hook in the order of its changes (`ChangeCapture.pending`): the flush
/// takes them in that order, so that noting one hashes and allocates nothing.
struct NotedCounterWrite {
    let row: SyncedRowKey
    let column: Int
    var write: CounterWrite
}

/// What a statement wrote to one counter column of one row: the value before its first write,
/// and the sum of the differences its writes made. Numbers only: a write of anything else is
/// refused as it is noted.
struct CounterWrite {
    var before: CounterNumber
    var difference: CounterNumber
}

extension CounterNumber {
    /// The number an unprotected sqlite3_value (from the pre-update hook) holds; nil for a TEXT or a BLOB.
    init?(sqliteValue value: OpaquePointer?) {
        switch sqlite3_value_type(value) {
        case SQLITE_INTEGER: self = .integer(sqlite3_value_int64(value))
        case SQLITE_FLOAT: self = .real(sqlite3_value_double(value))
        case SQLITE_NULL: self = .null
        default: return nil
        }
    }
}

extension ChangeCapture {
    /// Notes the differences an UPDATE makes to `table`'s counter columns among `changed`; a
    /// value that is not a number refuses the statement (`refusal`).
    func noteCounterWrites(_ change: PreUpdateChange, _ table: SyncedTable, changed: [Int]) {
        let row = SyncedRowKey(table, rowid: change.newRowid)
        for index in changed where table.columnRules[index] == .counter {
            let position = table.valuePositions[index]
            guard let old = CounterNumber(sqliteValue: change.oldValue(position)) else {
                refuse(Self.notANumber(table, column: index, DatabaseValue(sqliteValue: change.oldValue(position))))
                continue
            }
            guard let new = CounterNumber(sqliteValue: change.newValue(position)) else {
                refuse(Self.notANumber(table, column: index, DatabaseValue(sqliteValue: change.newValue(position))))
                continue
            }
            counterWrites.append(
                NotedCounterWrite(row: row, column: index, write: CounterWrite(before: old, difference: new - old)))
        }
    }

    /// Refuses a row inserted with a counter that is not a number (its transaction could not
    /// commit: the row's change would have no metadata).
    func noteCounterInsert(_ change: PreUpdateChange, _ table: SyncedTable) {
        for index in table.counterColumns {
            let value = change.newValue(table.valuePositions[index])
            guard CounterNumber(sqliteValue: value) == nil else { continue }
            refuse(Self.notANumber(table, column: index, DatabaseValue(sqliteValue: value)))
        }
    }

    /// Hands `body` the writes noted for the change of `table`'s row `rowid` being stamped: the
    /// next ones noted, when they are that row's.
    func takeCounterWrites(
        _ table: SyncedTable, rowid: Int64, _ body: (_ column: Int, CounterWrite) throws -> Void
    ) rethrows {
        let row = SyncedRowKey(table, rowid: rowid)
        while counterWritesTaken < counterWrites.count, counterWrites[counterWritesTaken].row == row {
            let noted = counterWrites[counterWritesTaken]
            counterWritesTaken += 1
            try body(noted.column, noted.write)
        }
    }

    /// Forgets the writes noted (the statement's changes are stamped, or undone).
    func forgetCounterWrites() {
        guard !counterWrites.isEmpty else { return }
        counterWrites.empty()
        counterWritesTaken = 0
    }

    /// Adds the writes noted for the update of `table`'s row `rowid`, stamped already and not
    /// deferred (a cascade of a peer's change, a row whose rowid moved), to this site's
    /// contributions. `carried`: the row's counter states before its rowid moved.
    func recordCounterWrites(
        _ table: SyncedTable, rowid: Int64, carrying carried: RowCounters?, before: RowVersions?,
        version: LocalVersion, _ connection: Connection
    ) throws {
        var writes: [ColumnCounterWrite] = []
        takeCounterWrites(table, rowid: rowid) { writes.append(($0, $1)) }
        for (column, write) in writes { try checkCounterWrite(write, table, column: column) }
        if let carried, !carried.isEmpty { try engine.writeRowCounters(carried, table, rowid: rowid, connection) }
        guard !writes.isEmpty else { return }
        try addContributions(writes, table, rowid: rowid, before: before, version: version, connection)
    }

    static func notANumber(_ table: SyncedTable, column index: Int, _ value: DatabaseValue?) -> SyncError {
        .invalidValue(
            """
            column \(table.valueColumns[index]) of \(table.name) is a counter: it holds numbers (or NULL), not \
            \(value?.description ?? "NULL")
            """)
    }

    /// The same for what other programs wrote, which the capture triggers queued in
    /// `tether_external_counter_writes` (folded with the row's other changes).
    func foldCounterWrites(
        _ table: SyncedTable, rowid: Int64, before: RowVersions?, version: LocalVersion, _ connection: Connection
    ) throws {
        let arguments: StatementArguments = [table.name, rowid]
        let queued = try connection.fetchRows(
            """
            SELECT column_name, before, difference FROM tether_external_counter_writes WHERE table_name = ? AND \
            row_id = ? ORDER BY id
            """, arguments)
        guard !queued.isEmpty else { return }
        try connection.execute(
            "DELETE FROM tether_external_counter_writes WHERE table_name = ? AND row_id = ?", arguments)
        var writes: [Int: CounterWrite] = [:]
        for row in queued {
            guard let index = table.valueColumns.firstIndex(of: try row.get(0, as: String.self)),
                table.columnRules[index] == .counter
            else { continue }
            guard let before = CounterNumber(row[1]) else { throw Self.notANumber(table, column: index, row[1]) }
            guard let difference = CounterNumber(row[2]) else { throw Self.notANumber(table, column: index, row[2]) }
            var write = writes[index] ?? CounterWrite(before: before, difference: .integer(0))
            write.difference = write.difference + difference
            writes[index] = write
        }
        let byColumn = writes.sorted { $0.key < $1.key }.map { (column: $0.key, write: $0.value) }
        for (column, write) in byColumn { try checkCounterWrite(write, table, column: column) }
        try addContributions(byColumn, table, rowid: rowid, before: before, version: version, connection)
    }

    /// Refuses a change of `table`'s counter `index` on a copy not rekeyed yet.
    func checkCounterWrite(_ write: CounterWrite, _ table: SyncedTable, column index: Int) throws {
        if engine.copyDetection != nil, write.difference != .integer(0) { try refuseOnACopy(table, column: index) }
    }

    /// Refuses a counter's change on a copy not rekeyed yet: the contribution would sit under the
    /// original's key as a running total, and the rekey, which moves versions, could not tell the
    /// copy's part of it from the original's (the original's peers would count one and lose the other).
    private func refuseOnACopy(_ table: SyncedTable, column index: Int) throws {
        guard let detection = engine.copyDetection else { return }
        let reason = """
            \(detection.reason); column \(table.valueColumns[index]) of \(table.name) is a counter, which it cannot \
            change before its rekey (its contribution could not be told from the original's)
            """
        switch detection.kind {
        case .copied: throw SyncError.copiedDatabase(instanceKey: engine.instanceKey, reason: reason)
        case .restored: throw SyncError.historyDiverged(instanceKey: engine.instanceKey, reason: reason)
        }
    }

    /// Adds `writes` (checked by `checkCounterWrite`) to this site's contributions on `table`'s
    /// row `rowid`, its metadata stamped already. `before`: the row's versions before the writes
    /// (nil: it had none, a row older than its table's sync). The contributions are its last
    /// write: once they are written, nothing of it is left to repeat.
    func addContributions(
        _ writes: [ColumnCounterWrite], _ table: SyncedTable, rowid: Int64, before: RowVersions?,
        version: LocalVersion, _ connection: Connection
    ) throws {
        let stored = try engine.rowCounters(table, rowid: rowid, connection)
        guard
            let (counters, later) = try contributed(
                writes, table, to: stored, before: before, version: version, connection)
        else { return }
        if !later.isEmpty, var versions = try engine.rowState(table, rowid: rowid, connection)?.versions {
            for (index, newest) in later {
                versions.setColumn(index, to: newest, columnCount: table.valueColumns.count)
            }
            try connection.execute(
                table.layout.updateVersions,
                StatementArguments(values: [.blob(Data(versions.encoded())), .integer(rowid)]))
        }
        try engine.writeRowCounters(counters, table, rowid: rowid, connection)
    }

    /// A row's counter states `stored` with `writes` added to this site's contributions, and the
    /// columns whose version moves to a later contribution's; nil for a row inserted in this
    /// transaction (its value is its base: contributions start after it).
    func contributed(
        _ writes: [ColumnCounterWrite], _ table: SyncedTable, to stored: RowCounters, before: RowVersions?,
        version: LocalVersion, _ connection: Connection
    ) throws -> (RowCounters, later: [(Int, LocalVersion)])? {
        if before?.existence == version { return nil }
        var counters = stored
        let timestamp = HybridTimestamp(rawValue: version.timestamp)
        // A contribution keeps its latest timestamp: other programs' writes folded in this
        // transaction may have a later one than its own (`foldExternalChanges`).
        var later: [(Int, LocalVersion)] = []
        for (index, write) in writes {
            let name = table.valueColumns[index]
            var state = try engine.counterState(
                counters, table, column: index, value: write.before.value,
                version: before?.column(index) ?? LocalVersion(timestamp: 0, site: engine.sites.local), connection)
            let previous = state.contributions.first { $0.site == engine.instanceKey }
            state.add(write.difference.value, by: engine.instanceKey, at: timestamp)
            counters.states[name] = state.contributions.isEmpty ? nil : state
            if let previous, previous.timestamp < timestamp {
                // An earlier transaction's value: a restore point may fall after it (ContributionHistory).
                let value = ContributionHistory.Value(previous)
                var history =
                    counters.own[name] ?? ContributionHistory(current: value, keptSince: engine.counterHistoryKeptSince)
                history.record(value, floor: try engine.contributionHistoryFloor(connection))
                counters.own[name] = history
            }
            if state.newestVersion.timestamp > timestamp {
                later.append((index, try engine.localVersion(state.newestVersion, connection)))
            }
        }
        return (counters, later)
    }
}

/// A write to the counter column `column` (an index of the value columns).
typealias ColumnCounterWrite = (column: Int, write: CounterWrite)
