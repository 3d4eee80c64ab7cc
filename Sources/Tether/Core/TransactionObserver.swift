import CSQLite

/// Listens to what a connection does — the statements it runs, the rows they change, and the
/// transactions they open and close — without the core knowing who listens or why (GRDB's
/// `TransactionObserver`, internal here). The sync engine's change capture is one observer;
/// observation features are others.
///
/// The order of events for a write statement:
///
///     statementWillExecute          (before its first step; in a transaction, or in the
///                                    implicit savepoint the connection opens in autocommit mode)
///     schemaWillChange              (a DDL statement: ALTER, CREATE, DROP)
///     rowWillChange …               (SQLite's pre-update hook, per row, cascades included)
///     statementDidExecute           (SQLITE_DONE, or reset after it changed rows)
///       or statementDidFail         (SQLite undid the statement's changes)
///     schemaDidChange               (after a DDL statement's statementDidExecute)
///     transactionWillCommit         (before COMMIT, or a RELEASE that may end the transaction)
///     transactionShouldCommit       (SQLite's commit hook: false turns the COMMIT into a rollback)
///     transactionDidCommit          (after COMMIT returned)
///
/// `transactionWillRollBack` comes before ROLLBACK and ROLLBACK TO, `transactionDidRollBack`
/// from SQLite's rollback hook (a failed statement may roll the transaction back by itself).
/// Whether a statement begins, commits or rolls back, or changes the schema, comes from SQLite's
/// authorizer when the statement is prepared, never from reading its text.
///
/// A bulk insert (`Connection.insertingInBulk`) is `bulkInsertWillBegin`, then for the observers
/// that take its rows as ranges one `rowsInserted` per run of consecutive rowids (its statements
/// unobserved by them), then `bulkInsertDidEnd`. `Connection.withoutCapture` hides its writes
/// from the observers that capture writes (`capturesWrites`), between `captureWillSuspend` and
/// `captureDidResume`.
protocol TransactionObserver: AnyObject {
    /// Whether the observer wants statement and row events now. The connection asks again when
    /// told `observersDidChange()`; while no observer wants them, statements step untouched.
    var observesStatements: Bool { get }
    /// Whether an observer writes in the transaction of the statements it observes: a write in
    /// autocommit mode then runs inside an implicit savepoint, committed when the statement ends.
    var writesInTransaction: Bool { get }
    /// Whether the observer records writes as changes of its own (the sync capture). Such an
    /// observer does not see the writes of `Connection.withoutCapture`, whose caller records them
    /// itself or derives them from what every peer has; it is told as such a scope begins and ends.
    var capturesWrites: Bool { get }

    func statementWillExecute(_ statement: Statement, _ connection: Connection) throws
    /// A read-only statement is about to run (before its first step).
    func statementWillRead(_ statement: Statement, _ connection: Connection) throws
    /// Called from SQLite's pre-update hook: it must not run SQL.
    func rowWillChange(_ change: PreUpdateChange)
    func statementDidExecute(_ statement: Statement, _ connection: Connection) throws
    func statementDidFail(_ statement: Statement, _ connection: Connection)
    func transactionWillCommit(_ connection: Connection) throws
    /// Called from SQLite's commit hook: it must not run SQL.
    func transactionShouldCommit() -> Bool
    func transactionDidCommit(_ connection: Connection)
    func transactionWillRollBack(_ connection: Connection)
    /// Called from SQLite's rollback hook: it must not run SQL.
    func transactionDidRollBack()
    /// A savepoint is about to open (SAVEPOINT `name`, lowercased): writes go in the enclosing
    /// transaction, if any.
    func savepointWillBegin(_ name: String, _ connection: Connection) throws
    /// A savepoint is about to be released (after `transactionWillCommit`, which RELEASE also gets).
    func savepointWillRelease(_ name: String)
    /// The changes since a savepoint are about to be undone (ROLLBACK TO `name`; after `transactionWillRollBack`).
    func savepointWillRollBack(_ name: String)

    /// A DDL statement (ALTER, CREATE, DROP, as the authorizer reported it) is about to run:
    /// after `statementWillExecute`, before its first step.
    func schemaWillChange(_ change: SchemaChange, _ connection: Connection) throws
    /// The DDL statement ran (after `statementDidExecute`).
    func schemaDidChange(_ change: SchemaChange, _ connection: Connection) throws

    /// A bulk insert into `table` begins (`Connection.insertingInBulk`): the observer takes its
    /// rows either from the pre-update hook, one by one (`.eachRow`), or as runs of consecutive
    /// rowids (`.rowidRanges`), without seeing its statements.
    func bulkInsertWillBegin(into table: String, rowCount: Int, _ connection: Connection) throws
        -> BulkInsertObservation
    /// Rows of the bulk insert, for observers that asked for `.rowidRanges`: one call per run of
    /// consecutive rowids, never per row.
    func rowsInserted(into table: String, rowids: ClosedRange<Int64>, _ connection: Connection) throws
    /// The bulk insert is over (or failed: its transaction then undoes what it wrote).
    func bulkInsertDidEnd(_ connection: Connection)

    /// The outermost `Connection.withoutCapture` scope begins: told to observers that capture
    /// writes, which pause any other way they have of capturing (triggers).
    func captureWillSuspend(_ connection: Connection) throws
    /// The outermost `withoutCapture` scope ends.
    func captureDidResume(_ connection: Connection) throws
}

extension TransactionObserver {
    var capturesWrites: Bool { false }
    func statementWillExecute(_ statement: Statement, _ connection: Connection) throws {}
    func statementWillRead(_ statement: Statement, _ connection: Connection) throws {}
    func rowWillChange(_ change: PreUpdateChange) {}
    func statementDidExecute(_ statement: Statement, _ connection: Connection) throws {}
    func statementDidFail(_ statement: Statement, _ connection: Connection) {}
    func transactionWillCommit(_ connection: Connection) throws {}
    func transactionShouldCommit() -> Bool { true }
    func transactionDidCommit(_ connection: Connection) {}
    func transactionWillRollBack(_ connection: Connection) {}
    func transactionDidRollBack() {}
    func savepointWillBegin(_ name: String, _ connection: Connection) throws {}
    func savepointWillRelease(_ name: String) {}
    func savepointWillRollBack(_ name: String) {}
    func schemaWillChange(_ change: SchemaChange, _ connection: Connection) throws {}
    func schemaDidChange(_ change: SchemaChange, _ connection: Connection) throws {}
    func bulkInsertWillBegin(into table: String, rowCount: Int, _ connection: Connection) throws
        -> BulkInsertObservation
    { .eachRow }
    func rowsInserted(into table: String, rowids: ClosedRange<Int64>, _ connection: Connection) throws {}
    func bulkInsertDidEnd(_ connection: Connection) {}
    func captureWillSuspend(_ connection: Connection) throws {}
    func captureDidResume(_ connection: Connection) throws {}
}

/// How an observer takes the rows of a bulk insert (see `TransactionObserver.bulkInsertWillBegin`).
enum BulkInsertObservation {
    /// Row by row, from the pre-update hook, the statements observed as any other.
    case eachRow
    /// As runs of consecutive rowids (`rowsInserted`), the statements unobserved.
    case rowidRanges
}

/// What `Connection.withoutCapture` keeps from the observers that capture writes.
enum CaptureSuspension {
    /// Nothing: they see none of the scope's statements and rows.
    case everything
    /// They still see the rows that the scope's writes change in turn (foreign-key actions and
    /// triggers, depth > 0), and the statements: only the rows the caller writes itself are hidden.
    case exceptCascades
}

/// A DDL statement's effect on the schema, from SQLite's authorizer at preparation.
struct SchemaChange: Equatable {
    enum Kind { case alterTable, createTable, dropTable, other }
    let kind: Kind
    /// The table altered, created or dropped (nil for other DDL: indexes, views, triggers).
    let table: String?
}

/// A row about to change, as SQLite's pre-update hook reports it. Valid only during the call
/// it is passed to: `oldValue` / `newValue` read SQLite's unprotected values.
struct PreUpdateChange {
    let db: OpaquePointer
    /// SQLITE_INSERT, SQLITE_UPDATE or SQLITE_DELETE.
    let operation: Int32
    let databaseName: UnsafePointer<CChar>
    let tableName: UnsafePointer<CChar>
    let oldRowid: Int64
    let newRowid: Int64

    /// 0 for a change the statement makes itself, more for one a trigger or a foreign-key action makes.
    var depth: Int32 { sqlite3_preupdate_depth(db) }

    @inline(__always)
    func oldValue(_ column: Int32) -> OpaquePointer? {
        var value: OpaquePointer?
        sqlite3_preupdate_old(db, column, &value)
        return value
    }

    @inline(__always)
    func newValue(_ column: Int32) -> OpaquePointer? {
        var value: OpaquePointer?
        sqlite3_preupdate_new(db, column, &value)
        return value
    }
}

/// What a statement does to transactions, as SQLite's authorizer reports it at preparation
/// (SQLITE_TRANSACTION and SQLITE_SAVEPOINT actions).
enum TransactionEffect {
    case none
    case begins
    /// COMMIT, END, or RELEASE (which ends the transaction when it releases the outermost savepoint).
    case commits
    /// ROLLBACK, or ROLLBACK TO a savepoint.
    case rollsBack
}

// SQLite's hooks are C functions: the context is the connection, which removes them before it goes.

private func authorizer(
    _ context: UnsafeMutableRawPointer?, _ action: Int32, _ first: UnsafePointer<CChar>?,
    _ second: UnsafePointer<CChar>?, _ database: UnsafePointer<CChar>?, _ trigger: UnsafePointer<CChar>?
) -> Int32 {
    // Every action, only while `collectingAuthorizations` asks (a peer's filter being judged).
    if let context, case let connection = Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue(),
        connection.collectedActions != nil
    {
        let reported = AuthorizedAction(
            code: action, first: first.map { String(cString: $0) }, second: second.map { String(cString: $0) })
        connection.collectedActions?.append(reported)
    }
    if action == SQLITE_READ || action == SQLITE_INSERT || action == SQLITE_UPDATE || action == SQLITE_DELETE,
        let context, let first
    {
        // The tables read or written, only while `readTables(ofSQL:)` or `accessedTables(ofSQL:)`
        // asks; the columns an UPDATE sets, always.
        let connection = Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue()
        if action == SQLITE_UPDATE, trigger == nil, let second {
            let table = String(cString: first)
            // One table per UPDATE; an upsert's DO UPDATE names its own.
            if connection.preparedUpdate?.table == table {
                connection.preparedUpdate?.columns.insert(String(cString: second))
            } else if connection.preparedUpdate == nil {
                connection.preparedUpdate = UpdatedColumns(table: table, columns: [String(cString: second)])
            }
        }
        if action == SQLITE_READ, connection.collectedReads != nil {
            connection.collectedReads?.insert(String(cString: first))
        }
        if connection.collectedAccesses != nil {
            connection.collectedAccesses?.insert(
                TableAccess(table: String(cString: first), trigger: trigger.map { String(cString: $0) }))
        }
        return SQLITE_OK
    }
    guard let context else { return SQLITE_OK }
    if let kind = schemaChangeKind(action) {
        let connection = Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue()
        // The statement's first DDL action names it (CREATE TABLE also writes sqlite_master).
        guard connection.preparedSchemaChange == nil else { return SQLITE_OK }
        // ALTER TABLE names the database first, the table second; CREATE and DROP TABLE the table first.
        let table = kind == .alterTable ? second : (kind == .other ? nil : first)
        connection.preparedSchemaChange = SchemaChange(kind: kind, table: table.map { String(cString: $0) })
        return SQLITE_OK
    }
    if action == SQLITE_PRAGMA, second != nil, let first, sqlite3_stricmp(first, "foreign_keys") == 0 {
        Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue().preparedSetsForeignKeys = true
        return SQLITE_OK
    }
    guard action == SQLITE_TRANSACTION || action == SQLITE_SAVEPOINT, let first else { return SQLITE_OK }
    let connection = Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue()
    if action == SQLITE_SAVEPOINT, let second { connection.preparedSavepoint = String(cString: second).lowercased() }
    switch String(cString: first) {
    case "BEGIN": connection.preparedEffect = .begins
    case "COMMIT", "RELEASE": connection.preparedEffect = .commits
    case "ROLLBACK": connection.preparedEffect = .rollsBack
    default: break
    }
    return SQLITE_OK
}

/// The schema change an authorizer action makes, nil for an action that is not DDL.
private func schemaChangeKind(_ action: Int32) -> SchemaChange.Kind? {
    switch action {
    case SQLITE_ALTER_TABLE: return .alterTable
    case SQLITE_CREATE_TABLE, SQLITE_CREATE_TEMP_TABLE: return .createTable
    case SQLITE_DROP_TABLE, SQLITE_DROP_TEMP_TABLE: return .dropTable
    case SQLITE_CREATE_INDEX, SQLITE_CREATE_TEMP_INDEX, SQLITE_CREATE_TRIGGER, SQLITE_CREATE_TEMP_TRIGGER,
        SQLITE_CREATE_VIEW,
        SQLITE_CREATE_TEMP_VIEW, SQLITE_CREATE_VTABLE, SQLITE_DROP_INDEX, SQLITE_DROP_TEMP_INDEX, SQLITE_DROP_TRIGGER,
        SQLITE_DROP_TEMP_TRIGGER, SQLITE_DROP_VIEW, SQLITE_DROP_TEMP_VIEW, SQLITE_DROP_VTABLE:
        return .other
    default: return nil
    }
}

private func preUpdateHook(
    _ context: UnsafeMutableRawPointer?, _ db: OpaquePointer?, _ operation: Int32,
    _ databaseName: UnsafePointer<CChar>?, _ tableName: UnsafePointer<CChar>?,
    _ oldRowid: Int64, _ newRowid: Int64
) {
    guard let context, let db, let tableName, let databaseName else { return }
    let change = PreUpdateChange(
        db: db, operation: operation, databaseName: databaseName, tableName: tableName,
        oldRowid: oldRowid, newRowid: newRowid)
    let connection = Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue()
    // Inside `withoutCapture(.exceptCascades)`, the capture sees only the rows the caller's writes change in turn.
    if connection.captureSuspension == .exceptCascades && change.depth == 0 {
        for observer in connection.activeObservers where !observer.capturesWrites { observer.rowWillChange(change) }
        return
    }
    for observer in connection.activeObservers {
        observer.rowWillChange(change)
    }
}

private func commitHook(_ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let context else { return 0 }
    for observer in Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue().observers
    where !observer.transactionShouldCommit() {
        return 1
    }
    return 0
}

private func rollbackHook(_ context: UnsafeMutableRawPointer?) {
    guard let context else { return }
    for observer in Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue().observers {
        observer.transactionDidRollBack()
    }
}

extension Connection {
    /// Installs the authorizer that tells each prepared statement's `TransactionEffect`.
    func installAuthorizer() {
        guard let handle else { return }
        sqlite3_set_authorizer(handle, authorizer, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Adds an observer of this connection's statements, rows and transactions.
    func add(_ observer: TransactionObserver) {
        observers.append(observer)
        observersDidChange()
    }

    func remove(_ observer: TransactionObserver) {
        observers.removeAll { $0 === observer }
        observersDidChange()
    }

    /// Asks the observers again whether they want statement and row events: the hooks cost
    /// something on every write, so they are in place only while someone listens.
    func observersDidChange() {
        observersVersion &+= 1
        let suspendsCapture = captureSuspension == .everything
        activeObservers = observers.filter { $0.observesStatements && !(suspendsCapture && $0.capturesWrites) }
        guard let handle else { return }
        let context = Unmanaged.passUnretained(self).toOpaque()
        sqlite3_commit_hook(handle, observers.isEmpty ? nil : commitHook, observers.isEmpty ? nil : context)
        sqlite3_rollback_hook(handle, observers.isEmpty ? nil : rollbackHook, observers.isEmpty ? nil : context)
        installPreUpdateHook(!activeObservers.isEmpty)
    }

    private func installPreUpdateHook(_ installed: Bool) {
        guard let handle else { return }
        sqlite3_preupdate_hook(
            handle, installed ? preUpdateHook : nil, installed ? Unmanaged.passUnretained(self).toOpaque() : nil)
    }

    /// Runs `body` with the writes it makes hidden from the observers that capture writes (the
    /// sync capture), for writes the caller records itself (an apply's rows, which carry their
    /// metadata) or that need no recording (a migration's DDL, values every peer derives alike).
    /// Other observers (observation) still see everything. Scopes nest: the outer one governs,
    /// except that `.everything` inside `.exceptCascades` hides the cascades too.
    ///
    /// The one way to suspend capture: observers hear of it (`captureWillSuspend`) and pause
    /// their other means (triggers) for the outermost scope.
    func withoutCapture<T>(_ suspension: CaptureSuspension = .everything, _ body: () throws -> T) throws -> T {
        let outer = captureSuspension
        if outer == .everything || (outer == .exceptCascades && suspension == .exceptCascades) { return try body() }
        if outer == nil {
            for observer in observers where observer.capturesWrites { try observer.captureWillSuspend(self) }
        }
        captureSuspension = suspension
        let observing = activeObservers
        let version = observersVersion
        if suspension == .everything {
            // Most often no observer stays (no observation): no array is made per call (an
            // apply's fast path calls this per row).
            activeObservers =
                observing.contains(where: { !$0.capturesWrites }) ? observing.filter { !$0.capturesWrites } : []
            installPreUpdateHook(!activeObservers.isEmpty)
        }
        func resume() {
            captureSuspension = outer
            // Observers that came or went meanwhile (a table synced inside) are asked again.
            if observersVersion != version {
                observersDidChange()
            } else if suspension == .everything {
                activeObservers = observing
                installPreUpdateHook(!observing.isEmpty)
            }
        }
        let result: T
        do {
            result = try body()
        } catch {
            resume()
            if outer == nil {
                for observer in observers where observer.capturesWrites { try? observer.captureDidResume(self) }
            }
            throw error
        }
        resume()
        if outer == nil {
            for observer in observers where observer.capturesWrites { try observer.captureDidResume(self) }
        }
        return result
    }

    // MARK: Bulk inserts

    /// Runs `body`, which inserts rows into `table` one statement at a time and, when it is told
    /// the rows are recorded (its argument), calls `noteBulkInsertedRow()` after each: unrecorded
    /// (nobody observes), the loop pays nothing per row. The inserts must change nothing but the rows they
    /// insert (the table has no triggers, the statement no conflict clause that deletes), and run
    /// in a transaction. Observers that take such rows as rowid ranges do not see the statements:
    /// they get one `rowsInserted` per run of consecutive rowids — what lets a bulk insert run
    /// at the speed of an unobserved one.
    func insertingInBulk<T>(into table: String, rowCount: Int, _ body: (_ recordsRows: Bool) throws -> T) throws -> T {
        guard !activeObservers.isEmpty, bulkInsert == nil, isInTransaction else { return try body(false) }
        let observing = activeObservers
        let version = observersVersion
        var byRanges: [TransactionObserver] = []
        var byRows: [TransactionObserver] = []
        defer { for observer in observing { observer.bulkInsertDidEnd(self) } }
        for observer in observing {
            switch try observer.bulkInsertWillBegin(into: table, rowCount: rowCount, self) {
            case .rowidRanges: byRanges.append(observer)
            case .eachRow: byRows.append(observer)
            }
        }
        guard !byRanges.isEmpty else { return try body(false) }
        activeObservers = byRows
        installPreUpdateHook(!byRows.isEmpty)
        bulkInsert = BulkInsertRun(table: table, observers: byRanges)
        defer {
            bulkInsert = nil
            if observersVersion != version {
                observersDidChange()
            } else {
                activeObservers = observing
                installPreUpdateHook(true)
            }
        }
        let result = try body(true)
        if let open = bulkInsert?.open { try reportInserted(open) }
        return result
    }

    /// After each insert of `insertingInBulk`'s body: extends the run of consecutive rowids, or
    /// reports it and starts another. Nothing (one check) outside a bulk insert.
    @inline(__always)
    func noteBulkInsertedRow() throws {
        guard bulkInsert != nil, let handle else { return }
        let rowid = sqlite3_last_insert_rowid(handle)
        if let open = bulkInsert?.open, open.upperBound &+ 1 == rowid {
            bulkInsert?.open = open.lowerBound...rowid
            return
        }
        if let open = bulkInsert?.open { try reportInserted(open) }
        bulkInsert?.open = rowid...rowid
    }

    private func reportInserted(_ rowids: ClosedRange<Int64>) throws {
        guard let run = bulkInsert else { return }
        for observer in run.observers { try observer.rowsInserted(into: run.table, rowids: rowids, self) }
    }

    func removeAllObservers() {
        observers.removeAll()
        observersDidChange()
        if let handle { sqlite3_set_authorizer(handle, nil, nil) }
    }

    // MARK: Stepping an observed statement

    /// `Statement.step` while some observer wants statement events.
    func stepObserved(_ statement: Statement) throws -> Bool {
        let handle = statement.handle
        if sqlite3_stmt_busy(handle) == 0 {
            switch statement.transactionEffect {
            case .commits:
                for observer in activeObservers { try observer.transactionWillCommit(self) }
                if let name = statement.savepointName {
                    for observer in activeObservers { observer.savepointWillRelease(name) }
                }
            case .rollsBack:
                for observer in activeObservers { observer.transactionWillRollBack(self) }
                if let name = statement.savepointName {
                    for observer in activeObservers { observer.savepointWillRollBack(name) }
                }
            case .begins:
                if let name = statement.savepointName {
                    for observer in activeObservers { try observer.savepointWillBegin(name, self) }
                }
            case .none:
                if sqlite3_stmt_readonly(handle) == 0 {
                    if let db = self.handle, sqlite3_get_autocommit(db) != 0,
                        activeObservers.contains(where: \.writesInTransaction)
                    {
                        try executeUnobserved("SAVEPOINT tether_autocommit")
                        statement.ownsAutocommitSavepoint = true
                    }
                    statement.isObservedWrite = true
                    do {
                        for observer in activeObservers { try observer.statementWillExecute(statement, self) }
                        if let change = statement.schemaChange {
                            for observer in activeObservers { try observer.schemaWillChange(change, self) }
                        }
                    } catch {
                        abandonObservedWrite(statement)
                        throw error
                    }
                } else {
                    for observer in activeObservers { try observer.statementWillRead(statement, self) }
                }
            }
        }
        let rc = sqlite3_step(handle)
        if rc == SQLITE_ROW { return true }
        if rc == SQLITE_DONE {
            do {
                try completeObservedStatement(statement)
            } catch {
                abandonObservedWrite(statement)
                throw error
            }
            return false
        }
        let failure = statement.stepError(rc)
        abandonObservedWrite(statement)
        throw failure
    }

    /// A statement is over: observers see a write end, the savepoint standing in for its
    /// autocommit transaction commits, and a COMMIT that ended the transaction is reported.
    private func completeObservedStatement(_ statement: Statement) throws {
        let outcome = statement.isObservedWrite ? statementOutcome() : nil
        defer { restore(outcome) }
        if statement.isObservedWrite {
            statement.isObservedWrite = false
            for observer in activeObservers { try observer.statementDidExecute(statement, self) }
            if let change = statement.schemaChange {
                for observer in activeObservers { try observer.schemaDidChange(change, self) }
            }
        }
        if statement.ownsAutocommitSavepoint {
            statement.ownsAutocommitSavepoint = false
            for observer in activeObservers { try observer.transactionWillCommit(self) }
            try executeUnobserved("RELEASE tether_autocommit")
            for observer in activeObservers { observer.transactionDidCommit(self) }
        } else if statement.transactionEffect == .commits, !isInTransaction {
            for observer in activeObservers { observer.transactionDidCommit(self) }
        }
    }

    /// A write failed (SQLite undid its changes) or its observers refused it: they forget what
    /// it did, and the implicit savepoint, if any, is rolled back.
    private func abandonObservedWrite(_ statement: Statement) {
        // SQLite counts no change for a statement it undid.
        changesOfObservedWrite = nil
        if statement.isObservedWrite {
            statement.isObservedWrite = false
            for observer in activeObservers { observer.statementDidFail(statement, self) }
        }
        guard statement.ownsAutocommitSavepoint else { return }
        statement.ownsAutocommitSavepoint = false
        try? executeUnobserved("ROLLBACK TO tether_autocommit")
        try? executeUnobserved("RELEASE tether_autocommit")
    }

    /// Runs `statement` to completion without telling observers: an observer's own bookkeeping,
    /// written from one of its callbacks (the rows it changes still reach the pre-update hook).
    func executeUnobserved(_ statement: Statement) throws {
        let handle = statement.handle
        defer { sqlite3_reset(handle) }
        while true {
            let rc = sqlite3_step(handle)
            if rc == SQLITE_DONE { return }
            if rc != SQLITE_ROW { throw statement.stepError(rc) }
        }
    }

    /// Runs the connection's own savepoint statements, which observers must not see as the
    /// application's (their commit is reported once, by the statement they stand in for).
    private func executeUnobserved(_ sql: String) throws {
        let db = try liveHandle(sql: sql)
        let rc = sqlite3_exec(db, sql, nil, nil, nil)
        guard rc == SQLITE_OK else { throw error(rc, sql: sql) }
    }

    /// A write reset before SQLITE_DONE (INSERT … RETURNING read once) still changed rows:
    /// it ends as if done (or, if its observers refuse, is undone).
    func finishAbandonedStatement(_ statement: Statement) {
        do {
            try completeObservedStatement(statement)
        } catch {
            abandonObservedWrite(statement)
        }
    }
}

/// The bulk insert in progress (`Connection.insertingInBulk`): who takes its rows as ranges,
/// and the run of consecutive rowids not yet reported.
struct BulkInsertRun {
    let table: String
    let observers: [TransactionObserver]
    var open: ClosedRange<Int64>?
}
