import CSQLite
import Foundation

/// The kinds of SQLite transaction.
public enum TransactionKind: String, Sendable {
    /// Takes locks when first needed (reads first, then writes).
    case deferred = "DEFERRED"
    /// Takes the write lock at once, so the transaction never fails to upgrade.
    case immediate = "IMMEDIATE"
    /// Also keeps other connections from reading (rollback journal only).
    case exclusive = "EXCLUSIVE"
}

/// One SQLite connection. You get one inside `Database.read` and
/// `Database.write`; it must not escape that closure nor be used from another
/// thread meanwhile, which is why it is not `Sendable`.
///
/// ```swift
/// try db.write { conn in
///     try conn.execute("UPDATE player SET score = score + 1 WHERE id = ?", [1])
///     _ = try? conn.savepoint {   // if it throws, only its own work is undone
///         try conn.insert(Player(id: 2, name: "Barbara", score: 0))
///     }
/// }
/// ```
public final class Connection {
    /// nil once closed: every use after close throws `DatabaseError.closed`.
    private(set) var handle: OpaquePointer?
    /// The path of the database file this connection opened (`:memory:` for an in-memory database).
    public let path: String
    private var statementCache: [String: Statement] = [:]
    private let statementCacheLimit = 256
    /// What the layers above keep per connection (the ORM's statements per model, observation's
    /// broker), keyed by their type: the core holds them for the connection's life and knows
    /// nothing else of them.
    private var attachments: [ObjectIdentifier: AnyObject] = [:]
    /// The configuration of the database this connection belongs to.
    var configuration = Database.Configuration()
    private var savepointCounter = 0
    /// Who listens to this connection (see `TransactionObserver`).
    var observers: [TransactionObserver] = []
    /// Those that want statement and row events now: while there is none, statements step untouched.
    var activeObservers: [TransactionObserver] = []
    /// Bumped as `observersDidChange` recomputes `activeObservers`, so that a scope that set them
    /// aside knows whether to restore them or ask again.
    var observersVersion = 0
    /// What the last observed write changed, which SQLite's own count loses to the observers'
    /// writes after it (see `StatementOutcome.swift`); nil once an unobserved write ends.
    var changesOfObservedWrite: Int64?
    /// Set inside `withoutCapture`.
    var captureSuspension: CaptureSuspension?
    /// Set inside `insertingInBulk`.
    var bulkInsert: BulkInsertRun?
    /// Set by the authorizer while a statement is prepared.
    var preparedEffect = TransactionEffect.none
    /// The savepoint named by the statement being prepared (from the authorizer).
    var preparedSavepoint: String?
    /// What the statement being prepared does to the schema (from the authorizer).
    var preparedSchemaChange: SchemaChange?
    /// The table an UPDATE being prepared writes, and the columns it sets (its own SQL's, not its triggers').
    var preparedUpdate: UpdatedColumns?
    /// Whether the statement being prepared sets `PRAGMA foreign_keys` (from the authorizer).
    var preparedSetsForeignKeys = false
    /// Tables read by the statement being prepared, collected only while `readRegion(ofSQL:)` asks.
    var collectedReads: Set<String>?
    /// Tables read or written by the statement being prepared, collected only while `accessedTables(ofSQL:)` asks.
    var collectedAccesses: Set<TableAccess>?
    /// While query observation fetches: the tables read by every statement run (see `recordingReadTables`).
    var recordedReads: Set<String>?
    /// Every action the authorizer reports for the statement being prepared, collected only while
    /// `collectingAuthorizations` asks.
    var collectedActions: [AuthorizedAction]?

    init(path: String, flags: Int32) throws {
        self.path = path
        var db: OpaquePointer?
        let rc = sqlite3_open_v2(path, &db, flags | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(rc))
            sqlite3_close_v2(db)
            throw DatabaseError(extendedCode: rc, message: "cannot open \(path): \(message)")
        }
        handle = db
        sqlite3_extended_result_codes(db, 1)
        installAuthorizer()
        installChangesFunction()
    }

    deinit { close() }

    /// Closes the connection; later uses throw. Idempotent.
    func close() {
        removeAllObservers()
        statementCache.removeAll()
        attachments.removeAll()
        if let handle { sqlite3_close_v2(handle) }
        handle = nil
    }

    /// The object of type `T` a layer above attached to this connection, if any.
    @inline(__always)
    func attachment<T: AnyObject>(_ type: T.Type) -> T? {
        attachments[ObjectIdentifier(T.self)] as? T
    }

    /// Attaches `object` under its type (nil: detaches what was).
    func setAttachment<T: AnyObject>(_ object: T?, as type: T.Type) {
        attachments[ObjectIdentifier(T.self)] = object
    }

    @inline(__always)
    func liveHandle(sql: String? = nil) throws -> OpaquePointer {
        guard let handle else { throw DatabaseError.closed(sql: sql) }
        return handle
    }

    /// The connection's last error as a `DatabaseError`.
    func error(_ rc: Int32, sql: String?) -> DatabaseError {
        guard let handle else { return DatabaseError.closed(sql: sql) }
        let extended = sqlite3_extended_errcode(handle)
        // The connection's code may be stale when SQLite reported the failure
        // only through the return value (for example SQLITE_MISUSE).
        let code = (extended & 0xff) == (rc & 0xff) ? extended : rc
        return DatabaseError(extendedCode: code, message: String(cString: sqlite3_errmsg(handle)), sql: sql)
    }

    // MARK: Statements

    /// A prepared statement from the cache (prepared on first use).
    public func cachedStatement(_ sql: String) throws -> Statement {
        if let statement = statementCache[sql], !statement.isBusy {
            if recordedReads != nil { try recordReads(of: statement) }
            return statement
        }
        let statement = try prepare(sql)
        if statementCache[sql] == nil {
            if statementCache.count >= statementCacheLimit { statementCache.removeAll(keepingCapacity: true) }
            statementCache[sql] = statement
        }
        return statement
    }

    /// Before a prepare: what the authorizer tells of the statement is collected afresh.
    private func forgetPreparedFacts() {
        preparedEffect = .none
        preparedSavepoint = nil
        preparedSchemaChange = nil
        preparedUpdate = nil
        preparedSetsForeignKeys = false
    }

    /// The statement just prepared, with what the authorizer told of it.
    private func preparedStatement(sql: String, handle: OpaquePointer) -> Statement {
        Statement(
            connection: self, sql: sql, handle: handle, transactionEffect: preparedEffect,
            savepointName: preparedSavepoint,
            schemaChange: preparedSchemaChange, update: preparedUpdate)
    }

    /// Whether this connection's statements run the triggers of the database's schema (TEMP
    /// triggers always run). A change makes SQLite prepare every statement again at its next step.
    func enableSchemaTriggers(_ enabled: Bool) throws {
        let db = try liveHandle(sql: "sqlite3_db_config(SQLITE_DBCONFIG_ENABLE_TRIGGER)")
        let rc = tether_sqlite_enable_triggers(db, enabled ? 1 : 0)
        guard rc == SQLITE_OK else { throw error(rc, sql: "sqlite3_db_config(SQLITE_DBCONFIG_ENABLE_TRIGGER)") }
    }

    /// Prepares exactly one statement; SQL after the first statement is an error
    /// rather than being silently ignored.
    public func prepare(_ sql: String) throws -> Statement {
        let db = try liveHandle(sql: sql)
        var statement: OpaquePointer?
        var trailing = ""
        forgetPreparedFacts()
        let rc = sql.withCString { start -> Int32 in
            var tail: UnsafePointer<CChar>?
            let rc = sqlite3_prepare_v3(db, start, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, &tail)
            if rc == SQLITE_OK, let tail { trailing = String(cString: tail) }
            return rc
        }
        guard rc == SQLITE_OK else { throw error(rc, sql: sql) }
        guard let statement else {
            throw DatabaseError(extendedCode: SQLITE_MISUSE, message: "no SQL statement to run", sql: sql)
        }
        guard Self.isBlank(trailing) else {
            sqlite3_finalize(statement)
            throw DatabaseError(
                extendedCode: SQLITE_MISUSE,
                message: "only one statement can be prepared; unexpected text after it: \(trailing.prefix(60))",
                sql: sql)
        }
        // SQLite ignores this PRAGMA inside a transaction, without a word: said here instead
        // (`Database.execute` runs its SQL in one).
        guard !preparedSetsForeignKeys || sqlite3_get_autocommit(db) != 0 else {
            sqlite3_finalize(statement)
            throw DatabaseError(
                extendedCode: SQLITE_MISUSE,
                message: """
                    PRAGMA foreign_keys does nothing inside a transaction: run it outside one \
                    (Database.writeWithoutTransaction, or before BEGIN)
                    """,
                sql: sql)
        }
        let prepared = preparedStatement(sql: sql, handle: statement)
        if recordedReads != nil { try recordReads(of: prepared) }
        return prepared
    }

    private static func isBlank(_ sql: String) -> Bool {
        // Whitespace, semicolons and comments only.
        var rest = Substring(sql)
        while let first = rest.first {
            if first.isWhitespace || first == ";" { rest = rest.dropFirst(); continue }
            if rest.hasPrefix("--") { rest = rest.drop(while: { $0 != "\n" }); continue }
            if rest.hasPrefix("/*") {
                guard let end = rest.range(of: "*/") else { return true }
                rest = rest[end.upperBound...]
                continue
            }
            return false
        }
        return true
    }

    // MARK: Raw SQL

    /// Runs SQL. With arguments, `sql` must be one statement; without, it may be
    /// several separated by semicolons (a script), run in order.
    public func execute(_ sql: String, _ arguments: StatementArguments = StatementArguments()) throws {
        if arguments.isEmpty && !Self.isSingleStatement(sql) {
            try executeScript(sql)
            return
        }
        let statement = try cachedStatement(sql)
        try statement.execute(arguments)
    }

    private static func isSingleStatement(_ sql: String) -> Bool {
        guard let semicolon = sql.firstIndex(of: ";") else { return true }
        return isBlank(String(sql[sql.index(after: semicolon)...]))
    }

    /// Runs every statement of `sql` in order. Wrap it in a transaction to make
    /// it all-or-nothing (`Database.write` does).
    public func executeScript(_ sql: String) throws {
        let db = try liveHandle(sql: sql)
        try sql.withCString { start in
            var next: UnsafePointer<CChar>? = start
            while let current = next, current.pointee != 0 {
                var handle: OpaquePointer?
                var tail: UnsafePointer<CChar>?
                forgetPreparedFacts()
                let rc = sqlite3_prepare_v2(db, current, -1, &handle, &tail)
                // On a failed prepare the tail points where parsing stopped, not at
                // the statement's end: report the text up to the next semicolon.
                guard rc == SQLITE_OK else {
                    let rest = String(cString: current)
                    let statement =
                        rest.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first.map(
                            String.init) ?? rest
                    throw error(rc, sql: statement.trimmingCharacters(in: .whitespacesAndNewlines))
                }
                let text =
                    (tail.map {
                        String(
                            decoding: UnsafeRawBufferPointer(start: current, count: current.distance(to: $0)),
                            as: UTF8.self)
                    }
                    ?? String(cString: current)).trimmingCharacters(in: .whitespacesAndNewlines)
                next = tail
                guard let handle else { continue }  // comment or whitespace
                try preparedStatement(sql: text, handle: handle).execute()
            }
        }
    }

    /// All rows of a query, copied out.
    public func fetchRows(_ sql: String, _ arguments: StatementArguments = StatementArguments()) throws -> [Row] {
        let statement = try cachedStatement(sql)
        try statement.bind(arguments)
        statement.isBusy = true
        defer { statement.isBusy = false; statement.reset() }
        var rows: [Row] = []
        while try statement.step() { rows.append(Row(statement: statement)) }
        return rows
    }

    /// The first row of a query, or nil.
    public func fetchRow(_ sql: String, _ arguments: StatementArguments = StatementArguments()) throws -> Row? {
        let statement = try cachedStatement(sql)
        try statement.bind(arguments)
        defer { statement.reset() }
        return try statement.step() ? Row(statement: statement) : nil
    }

    /// The first column of the first row, or nil when there is no row or it is NULL.
    public func fetchValue<V: DatabaseValueConvertible>(
        _ sql: String, _ arguments: StatementArguments = StatementArguments(), as type: V.Type = V.self
    ) throws -> V? {
        let statement = try cachedStatement(sql)
        try statement.bind(arguments)
        defer { statement.reset() }
        guard try statement.step() else { return nil }
        let value = DatabaseValue(statement: statement.handle, index: 0)
        if value.isNull { return nil }
        guard let converted = V.fromDatabaseValue(value) else {
            throw StatementError.typeMismatch(
                column: statement.columnNames.first ?? "0", expected: "\(V.self)", found: value.storageName, sql: sql)
        }
        return converted
    }

    /// The rowid of the last row inserted on this connection.
    public var lastInsertedRowID: Int64 { handle.map { sqlite3_last_insert_rowid($0) } ?? 0 }
    /// Rows changed by the last INSERT, UPDATE or DELETE (its own: not the observers' writes after it).
    public var changes: Int { Int(changesOfObservedWrite ?? handle.map { sqlite3_changes64($0) } ?? 0) }
    /// True inside BEGIN … COMMIT.
    public var isInTransaction: Bool { handle.map { sqlite3_get_autocommit($0) == 0 } ?? false }

    // MARK: Transactions

    /// Runs `body` in a transaction: committed when it returns, rolled back when
    /// it throws. Inside another transaction it becomes a savepoint, so
    /// transactions nest.
    @discardableResult
    public func transaction<T>(_ kind: TransactionKind = .deferred, _ body: () throws -> T) throws -> T {
        if isInTransaction { return try savepoint(body) }
        try execute("BEGIN \(kind.rawValue) TRANSACTION")
        let result: T
        do {
            result = try body()
        } catch {
            rollbackQuietly()
            throw error
        }
        do {
            try execute("COMMIT TRANSACTION")
        } catch {
            // A failed COMMIT (a deferred constraint, a busy lock) leaves the
            // transaction open; roll it back so the database is unchanged.
            rollbackQuietly()
            throw error
        }
        return result
    }

    /// Runs `body` inside a savepoint: released when it returns, rolled back to
    /// when it throws. Outside a transaction it behaves like a deferred one.
    @discardableResult
    public func savepoint<T>(_ body: () throws -> T) throws -> T {
        savepointCounter += 1
        let name = "tether_savepoint_\(savepointCounter)"
        defer { savepointCounter -= 1 }
        try execute("SAVEPOINT \(name)")
        let result: T
        do {
            result = try body()
        } catch {
            try? execute("ROLLBACK TO SAVEPOINT \(name)")
            try? execute("RELEASE SAVEPOINT \(name)")
            throw error
        }
        do {
            try execute("RELEASE SAVEPOINT \(name)")
        } catch {
            try? execute("ROLLBACK TO SAVEPOINT \(name)")
            try? execute("RELEASE SAVEPOINT \(name)")
            throw error
        }
        return result
    }

    private func rollbackQuietly() {
        // SQLite may already have rolled back (on some I/O and busy errors).
        if isInTransaction { try? execute("ROLLBACK TRANSACTION") }
    }
}

extension Connection {
    /// Whether an INSERT into `table` can change nothing but its own row: the table has no
    /// trigger, and no ON CONFLICT clause in its definition (which would turn a failing insert
    /// into a replace, deleting other rows, or into an ignore). Such inserts may run as INSERT OR
    /// FAIL and be recorded by rowid alone.
    func insertsChangeNothingElse(into table: String) throws -> Bool {
        let definition = try tableDefinition(table) ?? ""
        // Tether's own triggers (`tether_…`) on a table with a rowid capture other programs' writes
        // and pause for this connection's; on a table WITHOUT ROWID they keep its surrogate keys too.
        let hasRowid =
            try fetchValue("SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", [table], as: Int.self)
            == 0
        let hasTriggers =
            try fetchValue(
                #"""
                SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ? AND (name NOT \#
                LIKE 'tether\_%' ESCAPE '\' OR NOT ?))
                """#,
                [table, hasRowid], as: Bool.self) ?? true
        return !hasTriggers && definition.range(of: "ON CONFLICT", options: .caseInsensitive) == nil
    }

    /// Whether the main database has a table named `name` (not a view).
    func tableExists(_ name: String) throws -> Bool {
        try fetchValue(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?)", [name], as: Bool.self)
            ?? false
    }

    /// The CREATE TABLE statement of `table` as SQLite keeps it; nil for no such table.
    func tableDefinition(_ table: String) throws -> String? {
        try fetchValue("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [table], as: String.self)
    }

    /// The user's tables, by name: neither Tether's own (`tether_…`) nor SQLite's (`sqlite_…`).
    func userTableNames() throws -> [String] {
        try fetchRows(
            #"""
            SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'tether\_%' ESCAPE '\' AND \#
            name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name
            """#
        )
        .map { try $0.get(0, as: String.self) }
    }
}

extension Connection {
    /// Copies this connection's main database into `destination`'s with SQLite's online backup
    /// API, in one step: the copy is the snapshot of one read transaction, consistent while other
    /// connections (other processes) keep writing.
    func copyDatabase(into destination: Connection) throws {
        let source = try liveHandle()
        let target = try destination.liveHandle()
        guard let backup = sqlite3_backup_init(target, "main", source, "main") else {
            throw destination.error(sqlite3_errcode(target), sql: nil)
        }
        let stepped = sqlite3_backup_step(backup, -1)
        let finished = sqlite3_backup_finish(backup)
        guard stepped == SQLITE_DONE else {
            throw DatabaseError(
                extendedCode: stepped,
                message: "the backup of \(path) stopped: \(String(cString: sqlite3_errstr(stepped)))")
        }
        guard finished == SQLITE_OK else { throw destination.error(finished, sql: nil) }
    }
}
