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
///     rowWillChange …               (SQLite's pre-update hook, per row, cascades included)
///     statementDidExecute           (SQLITE_DONE, or reset after it changed rows)
///       or statementDidFail         (SQLite undid the statement's changes)
///     transactionWillCommit         (before COMMIT, or a RELEASE that may end the transaction)
///     transactionShouldCommit       (SQLite's commit hook: false turns the COMMIT into a rollback)
///     transactionDidCommit          (after COMMIT returned)
///
/// `transactionWillRollBack` comes before ROLLBACK and ROLLBACK TO, `transactionDidRollBack`
/// from SQLite's rollback hook (a failed statement may roll the transaction back by itself).
/// Whether a statement begins, commits or rolls back comes from SQLite's authorizer when the
/// statement is prepared, never from reading its text.
protocol TransactionObserver: AnyObject {
    /// Whether the observer wants statement and row events now. The connection asks again when
    /// told `observersDidChange()`; while no observer wants them, statements step untouched.
    var observesStatements: Bool { get }
    /// Whether an observer writes in the transaction of the statements it observes: a write in
    /// autocommit mode then runs inside an implicit savepoint, committed when the statement ends.
    var writesInTransaction: Bool { get }
    /// Whether the observer wants the row events of writes whose caller records them itself
    /// (`Connection.withoutObservers`): the sync capture does not (it logs insert ranges);
    /// observation does, since it must report every committed change.
    var observesBulkWrites: Bool { get }

    func statementWillExecute(_ statement: Statement, _ connection: Connection) throws
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
    /// A savepoint is about to open (SAVEPOINT `name`, lowercased).
    func savepointWillBegin(_ name: String)
    /// A savepoint is about to be released (after `transactionWillCommit`, which RELEASE also gets).
    func savepointWillRelease(_ name: String)
    /// The changes since a savepoint are about to be undone (ROLLBACK TO `name`; after `transactionWillRollBack`).
    func savepointWillRollBack(_ name: String)
}

extension TransactionObserver {
    func statementWillExecute(_ statement: Statement, _ connection: Connection) throws {}
    func rowWillChange(_ change: PreUpdateChange) {}
    func statementDidExecute(_ statement: Statement, _ connection: Connection) throws {}
    func statementDidFail(_ statement: Statement, _ connection: Connection) {}
    func transactionWillCommit(_ connection: Connection) throws {}
    func transactionShouldCommit() -> Bool { true }
    func transactionDidCommit(_ connection: Connection) {}
    func transactionWillRollBack(_ connection: Connection) {}
    func transactionDidRollBack() {}
    var observesBulkWrites: Bool { true }
    func savepointWillBegin(_ name: String) {}
    func savepointWillRelease(_ name: String) {}
    func savepointWillRollBack(_ name: String) {}
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

private func authorizer(_ context: UnsafeMutableRawPointer?, _ action: Int32, _ first: UnsafePointer<CChar>?,
                        _ second: UnsafePointer<CChar>?, _ database: UnsafePointer<CChar>?, _ trigger: UnsafePointer<CChar>?) -> Int32 {
    if action == SQLITE_READ, let context, let first {
        // Only while `readRegion(ofSQL:)` asks: what a query reads, for query observation.
        let connection = Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue()
        if connection.collectedReads != nil { connection.collectedReads?.insert(String(cString: first)) }
        return SQLITE_OK
    }
    guard let context, action == SQLITE_TRANSACTION || action == SQLITE_SAVEPOINT, let first else { return SQLITE_OK }
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

private func preUpdateHook(_ context: UnsafeMutableRawPointer?, _ db: OpaquePointer?, _ operation: Int32,
                           _ databaseName: UnsafePointer<CChar>?, _ tableName: UnsafePointer<CChar>?,
                           _ oldRowid: Int64, _ newRowid: Int64) {
    guard let context, let db, let tableName, let databaseName else { return }
    let change = PreUpdateChange(db: db, operation: operation, databaseName: databaseName, tableName: tableName,
                                 oldRowid: oldRowid, newRowid: newRowid)
    for observer in Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue().activeObservers {
        observer.rowWillChange(change)
    }
}

private func commitHook(_ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let context else { return 0 }
    for observer in Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue().observers where !observer.transactionShouldCommit() {
        return 1
    }
    return 0
}

private func rollbackHook(_ context: UnsafeMutableRawPointer?) {
    guard let context else { return }
    for observer in Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue().observers { observer.transactionDidRollBack() }
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

    /// The observer of type `T`, if one is added.
    func observer<T: TransactionObserver>(of type: T.Type) -> T? {
        for observer in observers { if let match = observer as? T { return match } }
        return nil
    }

    /// Asks the observers again whether they want statement and row events: the hooks cost
    /// something on every write, so they are in place only while someone listens.
    func observersDidChange() {
        activeObservers = observers.filter(\.observesStatements)
        guard let handle else { return }
        let context = Unmanaged.passUnretained(self).toOpaque()
        sqlite3_commit_hook(handle, observers.isEmpty ? nil : commitHook, observers.isEmpty ? nil : context)
        sqlite3_rollback_hook(handle, observers.isEmpty ? nil : rollbackHook, observers.isEmpty ? nil : context)
        installPreUpdateHook(!activeObservers.isEmpty)
    }

    private func installPreUpdateHook(_ installed: Bool) {
        guard let handle else { return }
        sqlite3_preupdate_hook(handle, installed ? preUpdateHook : nil, installed ? Unmanaged.passUnretained(self).toOpaque() : nil)
    }

    /// Runs `body` unobserved by the observers that record such writes otherwise (the sync
    /// capture): its statements step untouched by them and its row changes reach them not.
    /// For writes that change nothing but the rows they write, which the caller records itself
    /// (a bulk insert logged as insert ranges). Observers of `observesBulkWrites` still see them,
    /// unless `keepingBulkObservers` is false: the caller then hands its rows to them too (a bulk
    /// insert that observation records by rowid).
    func withoutObservers<T>(keepingBulkObservers: Bool = true, _ body: () throws -> T) rethrows -> T {
        guard !activeObservers.isEmpty else { return try body() }
        let observing = activeObservers
        // Most often none stays (no observation): no array is made per call (the apply fast path calls it per row).
        activeObservers = keepingBulkObservers && observing.contains(where: \.observesBulkWrites) ? observing.filter(\.observesBulkWrites) : []
        installPreUpdateHook(!activeObservers.isEmpty)
        defer {
            activeObservers = observing
            installPreUpdateHook(true)
        }
        return try body()
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
                    for observer in activeObservers { observer.savepointWillBegin(name) }
                }
            case .none:
                if sqlite3_stmt_readonly(handle) == 0 {
                    if let db = self.handle, sqlite3_get_autocommit(db) != 0, activeObservers.contains(where: \.writesInTransaction) {
                        try executeUnobserved("SAVEPOINT tether_autocommit")
                        statement.ownsAutocommitSavepoint = true
                    }
                    statement.isObservedWrite = true
                    do {
                        for observer in activeObservers { try observer.statementWillExecute(statement, self) }
                    } catch {
                        abandonObservedWrite(statement)
                        throw error
                    }
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
        if statement.isObservedWrite {
            statement.isObservedWrite = false
            for observer in activeObservers { try observer.statementDidExecute(statement, self) }
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
        if statement.isObservedWrite {
            statement.isObservedWrite = false
            for observer in activeObservers { observer.statementDidFail(statement, self) }
        }
        guard statement.ownsAutocommitSavepoint else { return }
        statement.ownsAutocommitSavepoint = false
        try? executeUnobserved("ROLLBACK TO tether_autocommit")
        try? executeUnobserved("RELEASE tether_autocommit")
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
