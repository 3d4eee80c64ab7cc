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

/// Sync status of a row (see `RowMetadataLayout` for where it is stored).
public enum SyncStatus: Int, Sendable, Codable, CaseIterable, DatabaseValueConvertible {
    /// Nothing local waits to be acknowledged.
    case synced = 0
    /// Inserted locally, not yet acknowledged.
    case created = 1
    /// Updated locally, not yet acknowledged.
    case updated = 2
    /// Deleted locally, not yet acknowledged (the row is in the tombstone table).
    case deleted = 3
}

/// The engine captures changes as an observer of its writer connection.
extension SyncEngine: TransactionObserver {
    /// The capture costs something on every write: it listens only while some table is synced,
    /// or may become so as it is made (a standing rule).
    var observesStatements: Bool { !tableList.isEmpty || hasStandingRule }
    /// Metadata is written in the transaction of the change.
    var writesInTransaction: Bool { true }
    /// Its writes' metadata is what `withoutCapture` spares: the caller records them itself.
    var capturesWrites: Bool { true }

    func rowWillChange(_ change: PreUpdateChange) { capture(change) }

    /// This connection's writes to trigger-captured tables are captured by the hook: their
    /// triggers pause for the transaction (`ExternalWrites.swift`).
    func statementWillExecute(_ statement: Statement, _ connection: Connection) throws {
        if statement.update != nil {
            let note = self.note(on: statement)
            runningUpdate = note.updatedTable == nil ? nil : note
        } else {
            runningUpdate = nil
        }
        try closeUpdateRunBefore(statement, connection)
        if !externalWrites.ownWritesPaused, !ownWriteTriggerTables.isEmpty { try pauseTriggersForOwnWrites(connection) }
    }

    func statementWillRead(_ statement: Statement, _ connection: Connection) throws {
        try closeUpdateRunBefore(statement, connection)
    }

    /// A savepoint bounds what a ROLLBACK TO undoes: the run is written before it (see `didRollBack`).
    func savepointWillBegin(_ name: String, _ connection: Connection) throws {
        try closeUpdateRun(connection)
    }

    func statementDidExecute(_ statement: Statement, _ connection: Connection) throws {
        runningUpdate = nil
        try flushIfNeeded(connection)
    }

    /// SQLite undid the statement's changes: so are their captures.
    func statementDidFail(_ statement: Statement, _ connection: Connection) {
        runningUpdate = nil
        pending.removeAll()
    }

    /// The last writes of a transaction: the changes' metadata, then the clock.
    func transactionWillCommit(_ connection: Connection) throws {
        try flushIfNeeded(connection)
        try closeUpdateRun(connection)
        try clock.write(connection)
        // Last: a write before it (the clock's) would pause the triggers again.
        try resumeTriggersAfterOwnWrites(connection)
    }

    /// Every library path writes the clock and flushes before COMMIT; if not, committing would
    /// lose sync metadata: refuse rather than diverge.
    func transactionShouldCommit() -> Bool {
        // A pause committed would leave other programs' writes uncaptured for good.
        if !pending.isEmpty || updateRun != nil || clock.isDirty || externalWrites.ownWritesPausedInTransaction { return false }
        transactionVersion = nil
        clock.invalidate()
        noteCommittedSequences()
        return true
    }

    func transactionWillRollBack(_ connection: Connection) {
        didRollBack()
        // A ROLLBACK TO may undo the pause: the next write pauses again (a pause is idempotent).
        externalWrites.ownWritesPaused = false
    }

    func transactionDidRollBack() {
        didRollBack()
        externalWrites.ownWritesPaused = false
        externalWrites.ownWritesPausedInTransaction = false
    }

    /// A bulk insert into a synced table is logged as insert ranges (`InsertRanges.swift`); one
    /// into another table changes nothing the capture records.
    func bulkInsertWillBegin(into table: String, rowCount: Int, _ connection: Connection) throws -> BulkInsertObservation {
        guard let synced = tables[table] else { return .rowidRanges }
        // Only triggers see the rows of a table WITHOUT ROWID: row by row.
        guard !(synced.capturesExternalWrites && synced.isWithoutRowid), applying == nil else { return .eachRow }
        try closeUpdateRun(connection)
        if synced.capturesExternalWrites { try pauseTriggersForOwnWrites(connection) }
        try beginBulkInsert(into: synced, connection)
        return .rowidRanges
    }

    func rowsInserted(into table: String, rowids: ClosedRange<Int64>, _ connection: Connection) throws {
        try logBulkInserted(rowids, into: table, connection)
    }

    func bulkInsertDidEnd(_ connection: Connection) { bulkInsert = nil }

    /// Before a synced table's columns change (an ALTER TABLE, from the authorizer): writes by
    /// other programs are folded while their masks match, and the capture triggers, which name
    /// the columns, go.
    func schemaWillChange(_ change: SchemaChange, _ connection: Connection) throws {
        guard change.kind == .alterTable, let table = change.table, tables[table] != nil else { return }
        try flushIfNeeded(connection)
        try closeUpdateRun(connection)
        try prepareForSchemaChange(connection)
        try dropCaptureTriggers(of: table, connection)
    }

    /// After it: the synced columns follow the table's (new columns become synced; a synced
    /// column gone without `Migration.dropColumn` is an error), the triggers are made again.
    func schemaDidChange(_ change: SchemaChange, _ connection: Connection) throws {
        // A trigger made or dropped (by CREATE or DROP TRIGGER, or with its table) may turn the
        // writer's triggers back on, or let them go off.
        try switchSchemaTriggersForOwnWrites(connection)
        if change.kind == .createTable, let table = change.table {
            return try followStandingRule(madeTable: table, connection)
        }
        guard change.kind == .alterTable, let table = change.table, tables[table] != nil else { return }
        try followColumnChanges(of: table, connection)
    }

    /// The engine's own writes to trigger-captured tables carry their metadata: the triggers
    /// pause while the scope lasts (the pause is a row of the transaction: it lives in it only).
    ///
    /// Except, while a peer's changes are applied, those of tables WITHOUT ROWID: their triggers
    /// alone can capture what the engine's writes change in turn (a foreign key's cascade), as the
    /// hook does for other tables. What they record of the engine's own writes is folded at the
    /// end of each statement, before the engine writes the row's metadata over it.
    func captureWillSuspend(_ connection: Connection) throws {
        try closeUpdateRun(connection)
        // Tables paused for this connection's writes stay so (and are resumed at the commit).
        let triggered = tableList.filter { $0.capturesExternalWrites && !(applying != nil && $0.isWithoutRowid) && !capturesOwnWrites(to: $0) }
        guard !triggered.isEmpty else { return }
        for table in triggered { try connection.execute(table.layout.pauseTriggers) }
        triggersPaused = triggered
    }

    func captureDidResume(_ connection: Connection) throws {
        let paused = triggersPaused
        triggersPaused = []
        for table in paused { try connection.execute(table.layout.resumeTriggers) }
    }
}

extension SyncEngine {
    func install(on connection: Connection) {
        connection.add(self)
        connection.add(expiry)
    }

    func uninstall(from connection: Connection) {
        connection.remove(expiry)
        connection.remove(self)
        for table in tableList { table.releaseStatements() }
    }

    /// Starts or stops listening as tables become synced or not.
    func updateCaptureHook(_ connection: Connection) {
        connection.observersDidChange()
    }

    func didRollBack() {
        pending.removeAll()
        // Savepoints and commits write the run: all of it is after what a rollback returns to.
        updateRun = nil
        transactionVersion = nil
        sequenceAtTransactionStart = clock.lastSequence
        // The rolled-back transaction's clock write is gone with it; the numbers
        // it used stay used in memory (skipping them is harmless). Left set, the
        // flag made the next COMMIT write the clock, which fails in a read-only
        // transaction (the reads of an in-memory database).
        clock.discardUnwritten()
        sites.noteRollback()
    }

    // MARK: The hook

    @inline(__always)
    func capture(_ change: PreUpdateChange) {
        guard strcmp(change.databaseName, "main") == 0 else { return }
        let tableName = change.tableName
        guard let table = tableList.first(where: { $0.cName.withUnsafeBufferPointer { $0.baseAddress.map { strcmp($0, tableName) == 0 } ?? false } }) else {
            // A table WITHOUT ROWID is seen only through what its capture triggers queue.
            if hasTablesWithoutRowid, change.operation == SQLITE_INSERT, Self.isExternalChangesTable(tableName) { externalWrites.foldNeeded = true }
            return
        }
        if table.capturesExternalWrites, !capturesOwnWrites(to: table) {
            externalWrites.foldNeeded = true
            return
        }
        // While applying a remote batch, direct writes are the engine's own; only
        // cascades (depth > 0) are local consequences to capture.
        if applying != nil && change.depth == 0 { return }
        switch change.operation {
        case SQLITE_INSERT:
            pending.append(.inserted(table, rowid: change.newRowid))
        case SQLITE_DELETE:
            pending.append(deletedRow(change, table))
        case SQLITE_UPDATE:
            // The statement's own rows change only the columns it sets; cascades and triggers' may change any.
            var columns: StatementNote?
            if change.depth == 0, let running = runningUpdate, running.updatedTable == ObjectIdentifier(table) { columns = running }
            let keyChanged = (columns?.keyMayChange ?? true) && table.keyPositions.contains { !sameValue(change.oldValue($0), change.newValue($0)) }
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
                if change.oldRowid != change.newRowid { pending.append(.moved(table, from: change.oldRowid, to: change.newRowid)) }
                return
            }
            pending.append(.updated(table, rowid: change.newRowid, oldRowid: change.oldRowid, changedColumns: changed))
        default:
            break
        }
    }

    /// What the capture needs to know of `statement`: worked out once per statement (and set of
    /// synced tables), kept with it.
    func note(on statement: Statement) -> StatementNote {
        if let known = statement.observerNote as? StatementNote, known.generation == generation { return known }
        let note: StatementNote
        if let update = statement.update, let table = tables[update.table] {
            // SET rowid = … (the authorizer names it ROWID) may move any key: every column is compared.
            let setsRowid = update.columns.contains { $0.caseInsensitiveCompare("rowid") == .orderedSame }
            note = StatementNote(generation: generation, updatedTable: ObjectIdentifier(table),
                                 values: table.valueColumns.indices.filter { setsRowid || update.columns.contains(table.valueColumns[$0]) },
                                 keyMayChange: setsRowid || table.keyColumns.contains { update.columns.contains($0) })
        } else {
            note = StatementNote(generation: generation, updatedTable: nil, values: [], keyMayChange: true)
        }
        statement.observerNote = note
        return note
    }

    private func deletedRow(_ change: PreUpdateChange, _ table: SyncedTable) -> CapturedChange {
        .deleted(table, rowid: change.oldRowid, key: table.keyPositions.map { DatabaseValue(sqliteValue: change.oldValue($0)) },
                 values: table.valuePositions.map { DatabaseValue(sqliteValue: change.oldValue($0)) })
    }

    // MARK: Flush

    /// `flush` when a statement captured changes or a trigger recorded some.
    @inline(__always)
    func flushIfNeeded(_ connection: Connection) throws {
        if !pending.isEmpty || externalWrites.foldNeeded { try flush(connection) }
    }

    /// Gives the changes of the statement that just finished their sequence
    /// numbers, versions and status, in the same transaction.
    func flush(_ connection: Connection) throws {
        if externalWrites.foldNeeded {
            try closeUpdateRun(connection)
            try foldExternalChanges(connection)
        }
        guard !pending.isEmpty else { return }
        // Taken whole (its buffer handed back below): a copy would allocate per statement.
        var changes: [CapturedChange] = []
        swap(&changes, &pending)
        defer {
            if pending.isEmpty {
                changes.removeAll(keepingCapacity: true)
                swap(&changes, &pending)
            }
        }
        try prepareClock(connection)
        let version = localChangeVersion()
        for change in changes {
            if case let .updated(table, rowid, oldRowid, changedColumns) = change, rowid == oldRowid,
               try extendUpdateRun(table, rowid: rowid, changedColumns: changedColumns, version: version, connection) {
                continue
            }
            try closeUpdateRun(connection)
            switch change {
            case let .inserted(table, rowid):
                try stampInserted(table, rowid: rowid, versions: RowVersions.uniform(version).encoded(), connection)
            case let .updated(table, rowid, oldRowid, changedColumns):
                let stored = try storedState(table, rowid: oldRowid, connection)
                if rowid == oldRowid, applying == nil, case let .inRange(range, _)? = stored {
                    openUpdateRun(table, range: range, rowid: rowid, changedColumns: changedColumns, version: version)
                    continue
                }
                let before = stored?.state
                var versions = before?.versions ?? .uniform(version)
                for column in changedColumns { versions.setColumn(column, to: version, columnCount: table.valueColumns.count) }
                if oldRowid != rowid { try table.statement(.deleteRowMetadata, connection).execute([oldRowid]) }
                try stamp(table, rowid: rowid, status: Self.statusAfterUpdate(before?.status ?? .created), versions: versions.encoded(),
                          inserted: .earlier(before?.insertedSequence), connection)
            case let .moved(table, from, to):
                try table.statement(.moveRowMetadata, connection).execute([to, from])
            case let .deleted(table, rowid, key, values):
                try bury(table, rowid: rowid, key: key, values: values, at: version, connection)
            }
        }
    }

    /// A live row deleted locally: its key and values go to its tombstone with a deletion
    /// version, its own metadata goes.
    func bury(_ table: SyncedTable, rowid: Int64, key: [DatabaseValue], values: [DatabaseValue], at version: LocalVersion,
              _ connection: Connection) throws {
        var versions = try rowState(table, rowid: rowid, connection)?.versions ?? .uniform(version)
        versions.markDeleted(at: version, columnCount: table.valueColumns.count)
        try table.statement(.upsertDead, connection)
            .execute(StatementArguments(values: key + values + [.integer(clock.nextSequence()), .integer(Int64(SyncStatus.deleted.rawValue)),
                                                                .integer(0), .blob(Data(versions.encoded())), .null]))
        try table.statement(.deleteRowMetadata, connection).execute([rowid])
        table.mayHaveDeadRows = true
    }
}

/// What the capture works out of a statement once (per set of synced tables), kept with it.
final class StatementNote {
    /// `SyncEngine.generation` when worked out: the synced tables' layout it holds for.
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
                  let versions = RowVersions(encoded: UnsafeRawBufferPointer(start: bytes, count: Int(sqlite3_column_bytes(handle, 2)))) else {
                throw SyncError.corruptMetadata("row \(rowid) of \(table.name) has damaged metadata in \(table.layout.rowsTable)")
            }
            let inserted = sqlite3_column_type(handle, 3) == SQLITE_NULL ? nil : sqlite3_column_int64(handle, 3)
            return .own((status, sqlite3_column_int64(handle, 1) != 0, versions, inserted))
        }
        guard let range = try insertRange(of: table, containing: rowid, connection) else { return nil }
        return .inRange(range, rowid: rowid)
    }

    /// Gives a live row a new sequence number (or `sequence`, taken already), its status and its versions.
    /// `via`: the peer the row's state was received from; nil for a change made here.
    /// `inserted`: whether this change inserts the row, or when it was.
    func stamp(_ table: SyncedTable, rowid: Int64, status: SyncStatus, versions: [UInt8], via peer: Int32? = nil, inserted: RowInsertion,
               sequence taken: Int64? = nil, _ connection: Connection) throws {
        let sequence = taken ?? clock.nextSequence()
        try table.statement(.upsertRowMetadata, connection).run { binder in
            try binder.bind(rowid)
            try binder.bind(sequence)
            try binder.bind(Int64(status.rawValue))
            try binder.bind(blob: versions)
            try binder.bind(peer.map { DatabaseValue.integer(Int64($0)) } ?? .null)
            switch inserted {
            case .now: try binder.bind(sequence)
            case let .earlier(insertedSequence): try binder.bind(insertedSequence.map { DatabaseValue.integer($0) } ?? .null)
            }
        }
    }

    /// A row inserted locally: its tombstone, if the key had one, goes (the
    /// insert is newer than anything seen here), and it is a new local change.
    func stampInserted(_ table: SyncedTable, rowid: Int64, versions: [UInt8], _ connection: Connection) throws {
        try removeTombstone(table, rowid: rowid, connection)
        try stamp(table, rowid: rowid, status: .created, versions: versions, inserted: .now, connection)
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

extension DatabaseValue {
    /// Copies an unprotected sqlite3_value (from the pre-update hook).
    init(sqliteValue value: OpaquePointer?) {
        switch sqlite3_value_type(value) {
        case SQLITE_INTEGER: self = .integer(sqlite3_value_int64(value))
        case SQLITE_FLOAT: self = .real(sqlite3_value_double(value))
        case SQLITE_TEXT:
            let count = Int(sqlite3_value_bytes(value))
            self = .text(sqlite3_value_text(value).map { String(decoding: UnsafeBufferPointer(start: $0, count: count), as: UTF8.self) } ?? "")
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
