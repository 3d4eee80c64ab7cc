import CSQLite
import Foundation

/// The capture of local changes: an observer of the writer connection that gives every change to
/// a synced table its sequence number, versions and status, in the transaction that makes it.
///
/// It owns what lives for one statement or one transaction — the changes seen by the pre-update
/// hook and not yet stamped, the UPDATE running, a bulk insert, a run of updates, the
/// transaction's version, paused triggers, other programs' writes, the sequence numbers the last
/// commit gave — and leaves what outlives a transaction to the engine: identity, clock, sites,
/// the synced tables, the row metadata (`SyncEngine.stamp`). The apply tells it which writes are
/// a peer's (`whileWritingPeerChanges`); a migration tells it of column changes
/// (`ChangeCapture+Schema.swift`).
///
/// Used under the writer's lock. The state read per changed row is `@exclusivity(unchecked)`:
/// Swift's run-time check of each access cost hundreds of instructions per row, and no two
/// accesses can overlap under that lock.
final class ChangeCapture {
    /// The engine owns the capture and outlives it: it uninstalls the capture from the writer before
    /// it goes (`SyncAttachment.detach`, from `Database.close` and the database's deinit). Unsafe:
    /// a checked reference cost an atomic load per statement on the insert path.
    unowned(unsafe) let engine: SyncEngine
    /// The engine's synced tables (the same object), read by the hook for every row.
    let tables: SyncedTables

    /// Changes of the statement running, stamped when it ends (`flush`).
    @exclusivity(unchecked) var pending: [CapturedChange] = []
    /// The write statement running, when it is an UPDATE of a synced table: the columns it may change.
    @exclusivity(unchecked) var runningUpdate: StatementNote?
    /// The bulk insert into a synced table in progress, logged as insert ranges.
    var bulkInsert: BulkInsertCapture?
    /// Updates of consecutive rows of an insert range, not written yet (`UpdateRuns.swift`).
    @exclusivity(unchecked) var updateRun: UpdateRun?
    /// What the statement running wrote to counter columns, in the order of its changes, and how
    /// many of them the flush took (`CounterCapture.swift`).
    @exclusivity(unchecked) var counterWrites: [NotedCounterWrite] = []
    @exclusivity(unchecked) var counterWritesTaken = 0
    /// Updates of rows with counters, not stamped yet (`CounterUpdates.swift`).
    @exclusivity(unchecked) var counterUpdates = CounterUpdates()
    /// The statement running wrote what a merge rule refuses — a counter that is not a number, a
    /// `max`/`min` column made worse — the first such write: `flush` refuses its transaction with it.
    @exclusivity(unchecked) var refusal: SyncError?
    /// The version of the local changes of the transaction in progress (`localChangeVersion`).
    @exclusivity(unchecked) var transactionVersion: LocalVersion?
    /// Set while the apply writes a peer's changes: its direct writes are not local changes.
    @exclusivity(unchecked) private(set) var writingPeerChanges = false
    /// The tables whose capture triggers a `withoutCapture` scope paused.
    var triggersPaused: [SyncedTable] = []
    /// Other programs' writes to trigger-captured tables: when they were last looked for, and
    /// whether some wait for their metadata.
    @exclusivity(unchecked) var externalWrites = ExternalWriteTracking()
    /// Some synced table is WITHOUT ROWID: the hook never sees its rows, only what its triggers
    /// write to `tether_external_changes`.
    private(set) var hasTablesWithoutRowid = false
    /// The trigger-captured tables whose triggers pause while this connection writes (see
    /// `ExternalWrites.swift`): every one with a rowid, which the hook sees.
    private(set) var ownWriteTriggerTables: [SyncedTable] = []
    /// The last sequence number before this transaction's first change, and the numbers the
    /// last commit gave (`takeCommittedSequences`).
    var sequenceAtTransactionStart: Int64 = 0
    private var lastCommittedSequences: ClosedRange<Int64>?
    /// The version of the last commit's local changes (`takeCommittedVersion`).
    private var lastCommittedVersion: LocalVersion?

    init(engine: SyncEngine) {
        self.engine = engine
        tables = engine.syncedTables
    }

    /// The clock the capture numbers changes with: the engine's.
    var clock: HybridClock { engine.clock }

    func install(on connection: Connection) {
        connection.add(self)
    }

    func uninstall(from connection: Connection) {
        connection.remove(self)
    }

    /// The synced tables were loaded again: what the capture derives from them follows.
    func tablesDidLoad(_ connection: Connection) throws {
        hasTablesWithoutRowid = tables.list.contains(where: \.isWithoutRowid)
        ownWriteTriggerTables = tables.list.filter { $0.capturesExternalWrites && !$0.isWithoutRowid }
        try switchSchemaTriggersForOwnWrites(connection)
        connection.observersDidChange()
    }

    /// Runs `body` with its direct writes taken as a peer's, not as local changes: only what they
    /// change in turn (cascades, depth > 0) is captured. The apply's one way to say "these are mine".
    func whileWritingPeerChanges<T>(_ body: () throws -> T) rethrows -> T {
        let outer = writingPeerChanges
        writingPeerChanges = true
        defer { writingPeerChanges = outer }
        return try body()
    }

    /// The sequence numbers the last commit gave, once (observation's `takeCommittedSequences`).
    func takeCommittedSequences() -> ClosedRange<Int64>? {
        defer { lastCommittedSequences = nil }
        return lastCommittedSequences
    }

    /// The version the last commit gave its local changes, once (nil: it made none).
    func takeCommittedVersion() -> LocalVersion? {
        defer { lastCommittedVersion = nil }
        return lastCommittedVersion
    }

    /// Called from the commit hook: the numbers this transaction gave.
    private func noteCommittedSequences() {
        let last = clock.lastSequence
        lastCommittedSequences = last > sequenceAtTransactionStart ? (sequenceAtTransactionStart + 1)...last : nil
        sequenceAtTransactionStart = last
    }

    /// Refuses the statement running with `error`, unless it is refused already.
    func refuse(_ error: SyncError) {
        if refusal == nil { refusal = error }
    }

    private func didRollBack() {
        pending.removeAll()
        forgetCounterWrites()
        refusal = nil
        // Savepoints and commits write the run and the counter updates: all of them are after
        // what a rollback returns to.
        updateRun = nil
        counterUpdates.removeAll()
        transactionVersion = nil
        sequenceAtTransactionStart = clock.lastSequence
        engine.transactionDidRollBack()
    }
}

extension ChangeCapture: TransactionObserver {
    /// The capture costs something on every write: it listens only while some table is synced,
    /// or may become so as it is made (a standing rule).
    var observesStatements: Bool { !tables.list.isEmpty || tables.hasStandingRule }
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
        try closeDeferredMetadataBefore(statement, connection)
        if !externalWrites.ownWritesPaused, !ownWriteTriggerTables.isEmpty { try pauseTriggersForOwnWrites(connection) }
    }

    func statementWillRead(_ statement: Statement, _ connection: Connection) throws {
        try closeDeferredMetadataBefore(statement, connection)
    }

    /// A savepoint bounds what a ROLLBACK TO undoes: what waits in memory is written before it (see `didRollBack`).
    func savepointWillBegin(_ name: String, _ connection: Connection) throws {
        try closeDeferredMetadata(connection)
    }

    func statementDidExecute(_ statement: Statement, _ connection: Connection) throws {
        runningUpdate = nil
        try flushIfNeeded(connection)
    }

    /// SQLite undid the statement's changes: so are their captures.
    func statementDidFail(_ statement: Statement, _ connection: Connection) {
        runningUpdate = nil
        pending.removeAll()
        forgetCounterWrites()
        refusal = nil
    }

    /// The last writes of a transaction: the changes' metadata, then the clock.
    func transactionWillCommit(_ connection: Connection) throws {
        try flushIfNeeded(connection)
        try closeDeferredMetadata(connection)
        try clock.write(connection)
        // Last: a write before it (the clock's) would pause the triggers again.
        try resumeTriggersAfterOwnWrites(connection)
    }

    /// Every library path writes the clock and flushes before COMMIT; if not, committing would
    /// lose sync metadata: refuse rather than diverge.
    func transactionShouldCommit() -> Bool {
        // A pause committed would leave other programs' writes uncaptured for good.
        if !pending.isEmpty || hasDeferredMetadata || clock.isDirty || externalWrites.ownWritesPausedInTransaction {
            return false
        }
        lastCommittedVersion = transactionVersion
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

    /// A bulk insert into a synced table is logged as insert ranges (`BulkInserts.swift`); one
    /// into another table changes nothing the capture records.
    func bulkInsertWillBegin(into table: String, rowCount: Int, _ connection: Connection) throws
        -> BulkInsertObservation
    {
        guard let synced = tables.byName[table] else { return .rowidRanges }
        // Only triggers see the rows of a table WITHOUT ROWID: row by row.
        guard !(synced.capturesExternalWrites && synced.isWithoutRowid), !writingPeerChanges else { return .eachRow }
        try closeDeferredMetadata(connection)
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
        guard change.kind == .alterTable, let table = change.table, tables.byName[table] != nil else { return }
        try flushIfNeeded(connection)
        try closeDeferredMetadata(connection)
        try columnsWillChange(of: table, connection)
    }

    /// After it: the synced columns follow the table's (new columns become synced; a synced
    /// column gone without `Migration.dropColumn` is an error), the triggers are made again.
    func schemaDidChange(_ change: SchemaChange, _ connection: Connection) throws {
        // A trigger made or dropped (by CREATE or DROP TRIGGER, or with its table) may turn the
        // writer's triggers back on, or let them go off.
        try switchSchemaTriggersForOwnWrites(connection)
        if change.kind == .createTable, let table = change.table {
            return try engine.followStandingRule(madeTable: table, connection)
        }
        guard change.kind == .alterTable, let table = change.table, tables.byName[table] != nil else { return }
        try columnsDidChange(of: table, connection)
    }

    /// The engine's own writes to trigger-captured tables carry their metadata: the triggers
    /// pause while the scope lasts (the pause is a row of the transaction: it lives in it only).
    ///
    /// Except, while a peer's changes are applied, those of tables WITHOUT ROWID: their triggers
    /// alone can capture what the engine's writes change in turn (a foreign key's cascade), as the
    /// hook does for other tables. What they record of the engine's own writes is folded at the
    /// end of each statement, before the engine writes the row's metadata over it.
    func captureWillSuspend(_ connection: Connection) throws {
        try closeDeferredMetadata(connection)
        // Tables paused for this connection's writes stay so (and are resumed at the commit).
        let triggered = tables.list.filter {
            $0.capturesExternalWrites && !(writingPeerChanges && $0.isWithoutRowid) && !capturesOwnWrites(to: $0)
        }
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
