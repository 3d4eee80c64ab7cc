import CSQLite

/// The columns an UPDATE sets, as SQLite's authorizer tells when it is prepared: no other column
/// of the row can change (but for the rowid, an alias of a key column it sets).
struct UpdatedColumns {
    let table: String
    var columns: Set<String>
}

/// A table a statement reads or writes, as SQLite's authorizer tells when it is prepared.
struct TableAccess: Hashable {
    let table: String
    /// The trigger or view whose code accesses it; nil for the statement's own SQL.
    let trigger: String?
}

/// A prepared statement. Obtained from a `Connection`, valid while it is open.
///
/// Statements are reused through the connection's cache: preparing SQL is the
/// expensive part of running it, and an ORM runs the same few statements over
/// and over.
public final class Statement {
    let handle: OpaquePointer
    /// The SQL the statement was prepared from.
    public let sql: String
    unowned let connection: Connection
    /// Set while a caller steps through rows, so that a nested use of the same
    /// SQL gets a fresh statement instead of resetting this one under it.
    var isBusy = false

    /// Whether the statement begins, commits or rolls back a transaction (or savepoint), as
    /// SQLite's authorizer said when it was prepared.
    let transactionEffect: TransactionEffect
    /// The savepoint a SAVEPOINT, RELEASE or ROLLBACK TO names (lowercased), from the authorizer.
    let savepointName: String?
    /// What the statement does to the schema (DDL), as SQLite's authorizer said when it was prepared.
    let schemaChange: SchemaChange?
    /// The tables the statement reads, once query observation asked (`Connection.readRegion`).
    var readTables: Set<String>?
    /// For an UPDATE (or an upsert's DO UPDATE): the table and the columns it sets, from the authorizer.
    let update: UpdatedColumns?
    /// What an observer derived from the statement, kept with it (the sync capture's columns to compare).
    var observerNote: AnyObject?

    init(
        connection: Connection, sql: String, handle: OpaquePointer, transactionEffect: TransactionEffect,
        savepointName: String? = nil,
        schemaChange: SchemaChange? = nil, update: UpdatedColumns? = nil
    ) {
        self.update = update
        self.connection = connection
        self.sql = sql
        self.handle = handle
        self.transactionEffect = transactionEffect
        self.savepointName = savepointName
        self.schemaChange = schemaChange
    }

    deinit {
        sqlite3_finalize(handle)
        runBytes.deallocate()
    }

    /// How many parameters (`?`, `:name`…) the SQL has: the arguments it must be given.
    public var parameterCount: Int { Int(sqlite3_bind_parameter_count(handle)) }
    /// How many columns a row of its result has; 0 for a statement that returns no rows.
    public var columnCount: Int { Int(sqlite3_column_count(handle)) }
    /// Whether the statement leaves the database unchanged, as SQLite judges it
    /// (`sqlite3_stmt_readonly`).
    public var isReadOnly: Bool { sqlite3_stmt_readonly(handle) != 0 }

    /// The result's column names. SQLite re-prepares a statement after a schema
    /// change (ALTER TABLE), which can change its columns: the names are
    /// cached per preparation, never across one.
    public var columnNames: [String] {
        let preparation = sqlite3_stmt_status(handle, SQLITE_STMTSTATUS_REPREPARE, 0)
        if let cached = cachedColumnNames, cached.preparation == preparation { return cached.names }
        let names = (0..<Int32(columnCount)).map { String(cString: sqlite3_column_name(handle, $0)) }
        cachedColumnNames = (preparation, names)
        return names
    }
    private var cachedColumnNames: (preparation: Int32, names: [String])?

    /// Clears previous bindings, then binds `arguments`, checking that they
    /// match the statement's parameters exactly.
    public func bind(_ arguments: StatementArguments) throws {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        let count = Int32(parameterCount)
        if !arguments.named.isEmpty {
            guard arguments.positional.isEmpty else {
                throw StatementError.invalidArgument("cannot mix positional and named arguments — in: \(sql)")
            }
            var bound = Set<Int32>()
            for (name, value) in arguments.named {
                let index = parameterIndex(named: name)
                guard index > 0 else {
                    throw StatementError.invalidArgument("no parameter named \(name) — in: \(sql)")
                }
                try check(value.bind(to: handle, at: index))
                bound.insert(index)
            }
            for index in 1...max(count, 1) where index <= count && !bound.contains(index) {
                let name = sqlite3_bind_parameter_name(handle, index).map { String(cString: $0) } ?? "?\(index)"
                throw StatementError.invalidArgument("missing value for parameter \(name) — in: \(sql)")
            }
        } else {
            guard arguments.positional.count == Int(count) else {
                throw StatementError.invalidArgument(
                    """
                    the statement has \(count) parameter(s) but \(arguments.positional.count) argument(s) were \
                    given — in: \(sql)
                    """)
            }
            for (offset, value) in arguments.positional.enumerated() {
                try check(value.bind(to: handle, at: Int32(offset + 1)))
            }
        }
    }

    private func parameterIndex(named name: String) -> Int32 {
        if let first = name.first, first == ":" || first == "@" || first == "$" {
            return sqlite3_bind_parameter_index(handle, name)
        }
        for prefix in [":", "@", "$"] {
            let index = sqlite3_bind_parameter_index(handle, prefix + name)
            if index > 0 { return index }
        }
        return 0
    }

    /// Advances to the next row; false when done. Errors carry this statement's SQL.
    @inline(__always)
    public func step() throws -> Bool {
        if !connection.activeObservers.isEmpty { return try connection.stepObserved(self) }
        let rc = sqlite3_step(handle)
        if rc == SQLITE_ROW { return true }
        if rc == SQLITE_DONE {
            if connection.changesOfObservedWrite != nil, sqlite3_stmt_readonly(handle) == 0 {
                connection.changesOfObservedWrite = nil
            }
            return false
        }
        throw stepError(rc)
    }

    /// Set while this statement runs inside the savepoint that stands in for
    /// its autocommit transaction (so that what observers write commits with it).
    var ownsAutocommitSavepoint = false
    /// Set from the first step of a write that observers saw start until they see it end.
    var isObservedWrite = false

    func stepError(_ rc: Int32) -> DatabaseError {
        // The connection's error is the precise one (extended code and message);
        // resetting makes the statement reusable.
        let error = connection.error(rc, sql: sql)
        sqlite3_reset(handle)
        return error
    }

    /// Runs the statement to completion with `arguments`.
    public func execute(_ arguments: StatementArguments = StatementArguments()) throws {
        try bind(arguments)
        defer { reset() }
        while try step() {}
    }

    /// Binds parameters in order through `bind`, then runs the statement to
    /// completion: for hot paths that bind values from several places
    /// without building an argument array.
    func run(_ bind: (inout StatementBinder) throws -> Void) throws {
        sqlite3_reset(handle)
        var binder = StatementBinder(statement: self, bytes: runBytes.startingRun(handle))
        try bind(&binder)
        if binder.bytes.lackedRoom { runBytes.recordRun(binder.bytes) }
        guard binder.next - 1 == Int32(parameterCount) else {
            throw StatementError.invalidArgument(
                "the statement has \(parameterCount) parameter(s) but \(binder.next - 1) were bound — in: \(sql)")
        }
        defer { reset() }
        while try step() {}
    }

    /// Makes the statement ready to run again from its first row, keeping its bindings. A write
    /// reset before its last row (an INSERT … RETURNING read once) still changed rows: it ends as
    /// if run to the end, observers told.
    public func reset() {
        // A write abandoned before SQLITE_DONE (INSERT … RETURNING read once) still changed rows.
        if ownsAutocommitSavepoint || isObservedWrite {
            connection.finishAbandonedStatement(self)
        }
        sqlite3_reset(handle)
    }

    @inline(__always)
    func check(_ rc: Int32) throws {
        if rc != SQLITE_OK { throw connection.error(rc, sql: sql) }
    }

    /// Where `run` copies the text and blob values it binds (see `RunBytes`).
    private var runBytes = RunBytes()
}

/// The bytes of the text and blob values one `run` binds, copied here for SQLite to read in
/// place (SQLITE_STATIC) instead of into an allocation of its own per value (SQLITE_TRANSIENT:
/// a malloc, a copy and a free per text of every row an apply inserts). The bytes stay until the
/// next `run` rewrites them, and that run binds every parameter before it steps; other binds
/// clear the bindings first. A run whose bytes do not fit binds the rest as SQLITE_TRANSIENT and
/// leaves the room for the next.
struct RunBytes {
    private var base: UnsafeMutableRawPointer?
    private var capacity = 0
    private var used = 0
    /// What the run would have needed.
    private var wanted = 0

    /// The room for a run, grown first (once what pointed into it is unbound) if the last run lacked it.
    /// The binder works on the copy returned (a value of its own: no exclusive access to check per value).
    mutating func startingRun(_ statement: OpaquePointer) -> RunBytes {
        if wanted > capacity {
            sqlite3_clear_bindings(statement)
            base?.deallocate()
            capacity = max(wanted, 256)
            base = UnsafeMutableRawPointer.allocate(byteCount: capacity, alignment: 1)
        }
        var run = self
        run.used = 0
        run.wanted = 0
        return run
    }

    /// Whether the run bound some bytes for SQLite to copy, for want of room here.
    var lackedRoom: Bool { wanted > capacity }

    /// Keeps what `run` would have needed, for the next run to grow to.
    mutating func recordRun(_ run: RunBytes) {
        wanted = run.wanted
    }

    /// Binds `bytes` as text (or a blob) at parameter `index`, in place when they fit.
    mutating func bind(_ bytes: UnsafeRawBufferPointer, asText: Bool, to statement: OpaquePointer, at index: Int32)
        -> Int32
    {
        wanted += bytes.count
        guard let base, used + bytes.count <= capacity else {
            return asText
                ? bindText(statement, index, bytes, tether_sqlite_transient())
                : bindBlob(statement, index, bytes, tether_sqlite_transient())
        }
        let copy = UnsafeRawBufferPointer(start: base + used, count: bytes.count)
        if let source = bytes.baseAddress { (base + used).copyMemory(from: source, byteCount: bytes.count) }
        used += bytes.count
        return asText
            ? bindText(statement, index, copy, tether_sqlite_static())
            : bindBlob(statement, index, copy, tether_sqlite_static())
    }

    /// Frees the room, once the statement is finalized.
    func deallocate() { base?.deallocate() }
}

/// Binds a statement's parameters one after the other.
struct StatementBinder {
    let statement: Statement
    /// The run's room for text and blob bytes.
    var bytes: RunBytes
    var next: Int32 = 1

    @inline(__always)
    mutating func bind(_ value: DatabaseValue) throws {
        let rc: Int32
        switch value {
        case var .text(text):
            rc = text.withUTF8 { bytes.bind(UnsafeRawBufferPointer($0), asText: true, to: statement.handle, at: next) }
        case let .blob(data):
            rc = data.withUnsafeBytes { bytes.bind($0, asText: false, to: statement.handle, at: next) }
        default: rc = value.bindValue(to: statement.handle, at: next)
        }
        try statement.check(rc)
        next += 1
    }

    mutating func bind(_ values: [DatabaseValue]) throws {
        for value in values { try bind(value) }
    }

    @inline(__always)
    mutating func bind(_ value: Int64) throws {
        try statement.check(sqlite3_bind_int64(statement.handle, next, value))
        next += 1
    }

    mutating func bind(blob: [UInt8]) throws {
        try statement.check(blob.withUnsafeBytes { bytes.bind($0, asText: false, to: statement.handle, at: next) })
        next += 1
    }
}
