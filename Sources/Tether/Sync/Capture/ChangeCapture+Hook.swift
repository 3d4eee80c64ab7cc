import CSQLite
import Foundation

/// A change seen by the pre-update hook, waiting for the end of its
/// statement to get its sequence number and versions.
enum CapturedChange {
    case inserted(SyncedTable, rowid: Int64)
    /// `oldRowid` differs from `rowid` when the statement changed the rowid (a local key).
    case updated(SyncedTable, rowid: Int64, oldRowid: Int64, changedColumns: [Int])
    /// Only the rowid changed (a local key): the row keeps its metadata.
    case moved(SyncedTable, from: Int64, to: Int64)
    /// The key and values are read before the row goes; its metadata is read at the flush.
    case deleted(SyncedTable, rowid: Int64, key: [DatabaseValue], values: [DatabaseValue])
}

extension ChangeCapture {
    @inline(__always)
    func capture(_ change: PreUpdateChange) {
        guard strcmp(change.databaseName, "main") == 0 else { return }
        let tableName = change.tableName
        guard
            let table = tables.list.first(where: {
                $0.cName.withUnsafeBufferPointer { $0.baseAddress.map { strcmp($0, tableName) == 0 } ?? false }
            })
        else {
            // A table WITHOUT ROWID is seen only through what its capture triggers queue.
            if hasTablesWithoutRowid, change.operation == SQLITE_INSERT, Self.isExternalChangesTable(tableName) {
                externalWrites.foldNeeded = true
            }
            return
        }
        if table.capturesExternalWrites, !capturesOwnWrites(to: table) {
            externalWrites.foldNeeded = true
            return
        }
        // While applying a remote batch, direct writes are the engine's own; only
        // cascades (depth > 0) are local consequences to capture.
        if writingPeerChanges && change.depth == 0 { return }
        switch change.operation {
        case SQLITE_INSERT:
            if table.hasCounters { noteCounterInsert(change, table) }
            pending.append(.inserted(table, rowid: change.newRowid))
        case SQLITE_DELETE:
            pending.append(deletedRow(change, table))
        case SQLITE_UPDATE:
            // The statement's own rows change only the columns it sets; cascades and triggers' may change any.
            var columns: StatementNote?
            if change.depth == 0, let running = runningUpdate, running.updatedTable == ObjectIdentifier(table) {
                columns = running
            }
            let keyChanged =
                (columns?.keyMayChange ?? true)
                && table.keyPositions.contains { !sameValue(change.oldValue($0), change.newValue($0)) }
            if keyChanged {
                pending.append(deletedRow(change, table))
                pending.append(.inserted(table, rowid: change.newRowid))
                return
            }
            let candidates = columns?.values ?? Array(table.valuePositions.indices)
            func isChanged(_ index: Int) -> Bool {
                !sameValue(change.oldValue(table.valuePositions[index]), change.newValue(table.valuePositions[index]))
            }
            // Usually every column set changed: the statement's list is shared, not copied.
            let changed = candidates.allSatisfy(isChanged) ? candidates : candidates.filter(isChanged)
            if changed.isEmpty {
                // UPDATE … SET x = x: nothing to sync, unless a local key moved the row.
                if change.oldRowid != change.newRowid {
                    pending.append(.moved(table, from: change.oldRowid, to: change.newRowid))
                }
                return
            }
            if table.hasCounters { noteCounterWrites(change, table, changed: changed) }
            if table.hasOrderedColumns { noteOrderedWrites(change, table, changed: changed) }
            pending.append(.updated(table, rowid: change.newRowid, oldRowid: change.oldRowid, changedColumns: changed))
        default:
            break
        }
    }

    /// What the capture needs to know of `statement`: worked out once per statement (and set of
    /// synced tables), kept with it.
    func note(on statement: Statement) -> StatementNote {
        if let known = statement.observerNote as? StatementNote, known.generation == tables.generation { return known }
        let note: StatementNote
        if let update = statement.update, let table = tables.byName[update.table] {
            // SET rowid = … (the authorizer names it ROWID) may move any key: every column is compared.
            let setsRowid = update.columns.contains { $0.caseInsensitiveCompare("rowid") == .orderedSame }
            note = StatementNote(
                generation: tables.generation, updatedTable: ObjectIdentifier(table),
                values: table.valueColumns.indices.filter {
                    setsRowid || update.columns.contains(table.valueColumns[$0])
                },
                keyMayChange: setsRowid || table.keyColumns.contains { update.columns.contains($0) })
        } else {
            note = StatementNote(generation: tables.generation, updatedTable: nil, values: [], keyMayChange: true)
        }
        statement.observerNote = note
        return note
    }

    private func deletedRow(_ change: PreUpdateChange, _ table: SyncedTable) -> CapturedChange {
        .deleted(
            table, rowid: change.oldRowid,
            key: table.keyPositions.map { DatabaseValue(sqliteValue: change.oldValue($0)) },
            values: table.valuePositions.map { DatabaseValue(sqliteValue: change.oldValue($0)) })
    }
}

/// What the capture works out of a statement once (per set of synced tables), kept with it.
final class StatementNote {
    /// `SyncedTables.generation` when worked out: the synced tables' layout it holds for.
    let generation: Int
    /// The synced table the statement UPDATEs, if any; only the columns it sets can change
    /// (`values`: indices of value columns; `keyMayChange`: it sets a column of the sync key).
    /// An identity, not a reference: a table's own statements hold notes, and the table holds them.
    let updatedTable: ObjectIdentifier?
    let values: [Int]
    let keyMayChange: Bool
    /// Whether the statement reads or writes Tether's tables, asked only while an update run is open.
    var touchesSyncMetadata: Bool?

    init(generation: Int, updatedTable: ObjectIdentifier?, values: [Int], keyMayChange: Bool) {
        self.generation = generation
        self.updatedTable = updatedTable
        self.values = values
        self.keyMayChange = keyMayChange
    }
}

extension DatabaseValue {
    /// Copies an unprotected sqlite3_value (from the pre-update hook).
    init(sqliteValue value: OpaquePointer?) {
        switch sqlite3_value_type(value) {
        case SQLITE_INTEGER: self = .integer(sqlite3_value_int64(value))
        case SQLITE_FLOAT: self = .real(sqlite3_value_double(value))
        case SQLITE_TEXT:
            let count = Int(sqlite3_value_bytes(value))
            self = .text(
                sqlite3_value_text(value).map {
                    String(decoding: UnsafeBufferPointer(start: $0, count: count), as: UTF8.self)
                } ?? "")
        case SQLITE_BLOB:
            let count = Int(sqlite3_value_bytes(value))
            self = .blob(sqlite3_value_blob(value).map { Data(bytes: $0, count: count) } ?? Data())
        default: self = .null
        }
    }
}

/// Whether two sqlite3_values hold the same value of the same storage class.
@inline(__always)
func sameValue(_ a: OpaquePointer?, _ b: OpaquePointer?) -> Bool {
    let type = sqlite3_value_type(a)
    guard type == sqlite3_value_type(b) else { return false }
    switch type {
    case SQLITE_NULL: return true
    case SQLITE_INTEGER: return sqlite3_value_int64(a) == sqlite3_value_int64(b)
    case SQLITE_FLOAT: return sqlite3_value_double(a).bitPattern == sqlite3_value_double(b).bitPattern
    default:
        let pointerA = type == SQLITE_TEXT ? UnsafeRawPointer(sqlite3_value_text(a)) : sqlite3_value_blob(a)
        let countA = sqlite3_value_bytes(a)
        let pointerB = type == SQLITE_TEXT ? UnsafeRawPointer(sqlite3_value_text(b)) : sqlite3_value_blob(b)
        guard countA == sqlite3_value_bytes(b) else { return false }
        guard countA > 0 else { return true }
        guard let pointerA, let pointerB else { return pointerA == pointerB }
        return memcmp(pointerA, pointerB, Int(countA)) == 0
    }
}
