/// A committed change of one row of `M`'s table, with the row as `M` (SundeedQLite's listeners,
/// which hand the saved object to the callback).
///
/// The model is read on the writer inside the commit, after the transaction's last write and
/// before its COMMIT, so it is the row as that commit left it: a later commit, even one made
/// before the listener runs, does not show through.
///
/// - insert, update: the row as committed. A row changed several times in one transaction comes
///   once per change, each time with its committed state.
/// - delete, evict: the row as it was just before it was deleted, decoded from the values SQLite
///   hands to its pre-update hook (nested models stored in other tables are read as they are at
///   the commit).
///
/// Some changes have no row to carry, and typed listeners do not get them (key listeners,
/// `observe(_:in:key:_:)`, still do): an insert or update of a row that the same transaction
/// then deleted (its delete carries the row), and deletes by other processes, which are read back
/// from the changelog after the row is gone. A row that cannot be read as `M` any more (a column
/// dropped, a value of the wrong type written with raw SQL) is reported as a `ModelEventFailure`
/// to the listener's `onFailure`.
///
/// ```swift
/// let token = try db.observe(.insert, .update, of: Employee.self) { event in
///     print(event.kind, event.model.name, event.origin)   // update Ada local
/// }
/// ```
public struct ModelEvent<M: Model>: Sendable {
    /// The change itself: kind, table, key, origin (the same value key listeners get).
    public let event: DatabaseEvent
    /// The row as the commit left it (insert, update), or as it was just before it was removed
    /// (delete, evict).
    public let model: M

    /// What happened to the row: insert, update, delete or evict.
    public var kind: DatabaseEvent.Kind { event.kind }
    /// The row's primary key.
    public var key: PrimaryKey { event.key }
    /// Where the change came from: this process, a peer, a sync file, another process.
    public var origin: ChangeOrigin { event.origin }
}

/// A committed change whose row a typed listener could not read as its model (see
/// `ModelEvent`): the listener's `onFailure` gets it instead of a `ModelEvent`.
public struct ModelEventFailure: Error, Sendable, CustomStringConvertible {
    /// The change whose row could not be read.
    public let event: DatabaseEvent
    /// The model type the listener wanted.
    public let model: String
    /// Why the row could not be read (a `ModelError`, a `DatabaseError`).
    public let underlying: any Error

    public var description: String {
        "the row \(event.key.values.map(\.description).joined(separator: ", ")) of \(event.table) "
            + "(\(event.kind.rawValue)) "
            + "could not be read as \(model): \(underlying)"
    }
}

// MARK: - Listening to models

extension Database {
    /// Calls `listener` with the model of each committed insert, update, delete or eviction of
    /// `M`'s table (those of `kinds`, every change when none is given; with `key`, of that row
    /// only), read in the commit's own snapshot (see `ModelEvent` for what each kind carries).
    ///
    /// It hears every origin key listeners hear (the ORM, raw SQL, a peer's batch, a sync file,
    /// other processes' writes to synced tables read back from the changelog), once, after the
    /// commit, on the database's listener queue in commit order. Other processes' changes are
    /// read back by polling (`Configuration.observationPollInterval`): their rows are read then,
    /// as they are when read, so a row another process changed twice between two polls comes
    /// once, as it is after the second change.
    ///
    /// While a typed listener exists, each commit of its table reads the changed rows on the
    /// writer before COMMIT, and a write outside a transaction runs in a savepoint so that there
    /// is a moment before its commit; without one, writes pay nothing.
    ///
    /// ```swift
    /// let token = try db.observe(.insert, .update, of: Employee.self) { event in
    ///     print(event.model.name)
    /// }
    /// ```
    ///
    /// - Parameters:
    ///   - kinds: any of `.insert`, `.update`, `.delete`, `.evict` (not `.fetch`).
    ///   - type: the model whose table is observed.
    ///   - key: only this row's changes.
    ///   - onFailure: told of a change whose row could not be read as `M`.
    ///   - listener: called with each change and its model, on the listener queue.
    /// - Returns: the token that keeps the listener: it is removed when the token is released.
    /// - Throws: `ModelError.tableNotFound` when `M`'s table does not exist,
    ///   `ModelError.columnNotInTable` when it lacks a column of `M` (unless `M.addsMissingColumns`),
    ///   `ModelError.invalidModel` for a type that cannot be a model, `ModelError.invalidArgument`
    ///   for a model without a primary key or for `.fetch` in `kinds`.
    public func observe<M: Model>(
        _ kinds: DatabaseEvent.Kinds..., of type: M.Type, key: PrimaryKey? = nil,
        onFailure: (@Sendable (ModelEventFailure) -> Void)? = nil,
        _ listener: @escaping @Sendable (ModelEvent<M>) -> Void
    ) throws -> ObservationToken {
        let wanted = DatabaseEvent.Kinds(listing: kinds)
        guard !wanted.contains(.fetch) else {
            throw ModelError.invalidArgument(
                "typed listeners hear committed changes; listen to fetches with observe(.fetch, in: \"\(M.tableName)\")"
            )
        }
        let schema = try ModelSchema<M>.shared()
        try schema.requirePrimaryKey(for: "a typed listener")
        try read { connection in
            guard try connection.tableExists(schema.tableName) else {
                throw ModelError.tableNotFound(model: schema.modelName, table: schema.tableName)
            }
            if !M.addsMissingColumns, let missing = try connection.columnsMissing(from: schema).first {
                throw ModelError.columnNotInTable(model: schema.modelName, table: schema.tableName, column: missing)
            }
        }
        let modelName = schema.modelName
        let body: @Sendable (DatabaseEvent, any Sendable) -> Void = { event, model in
            guard let model = model as? M else { return }
            listener(ModelEvent(event: event, model: model))
        }
        var failure: (@Sendable (DatabaseEvent, any Error) -> Void)?
        if let onFailure {
            failure = { event, error in onFailure(ModelEventFailure(event: event, model: modelName, underlying: error))
            }
        }
        let modelListener = ObservationBroker.ModelListener(
            table: M.tableName, kinds: wanted, key: key, reader: CommittedModelReader<M>(),
            body: body, failure: failure)
        let broker = observation
        let id = broker.addModelListener(modelListener)
        return ObservationToken { [weak broker] in broker?.unsubscribe(id) }
    }

    /// `observe(_:of:key:onFailure:_:)` for one row: `model`'s, by its primary key (SundeedQLite's
    /// per-instance listeners).
    ///
    /// ```swift
    /// let token = try db.observe(.update, of: ada) { event in print(event.model.title) }
    /// ```
    ///
    /// - Parameters:
    ///   - kinds: any of `.insert`, `.update`, `.delete`, `.evict` (not `.fetch`).
    ///   - model: the row observed, found by its primary key.
    ///   - onFailure: told of a change whose row could not be read as `M`.
    ///   - listener: called with each change and its model, on the listener queue.
    /// - Returns: the token that keeps the listener: it is removed when the token is released.
    /// - Throws: what `observe(_:of:key:onFailure:_:)` throws, or `ModelError.encodingFailed` when
    ///   the model's key cannot be encoded.
    public func observe<M: Model>(
        _ kinds: DatabaseEvent.Kinds..., of model: M,
        onFailure: (@Sendable (ModelEventFailure) -> Void)? = nil,
        _ listener: @escaping @Sendable (ModelEvent<M>) -> Void
    ) throws -> ObservationToken {
        let schema = try ModelSchema<M>.shared()
        try schema.requirePrimaryKey(for: "a typed listener of one row")
        let values = try RowEncoder(schema: schema).collect(model)
        let key = PrimaryKey(schema.primaryKey.map { values[$0] })
        return try observe(DatabaseEvent.Kinds(listing: kinds), of: M.self, key: key, onFailure: onFailure, listener)
    }
}

extension DatabaseEvent.Kinds {
    /// The kinds a variadic list names: every change when it names none.
    init(listing kinds: [DatabaseEvent.Kinds]) {
        self = kinds.isEmpty ? .changes : kinds.reduce(into: []) { $0.formUnion($1) }
    }
}

// MARK: - Reading committed rows (writer)

/// Reads rows of one model type for typed listeners, on the writer, without the ORM's fetch
/// listeners hearing of it. Type-erased so that the broker can hold readers of any model.
protocol CommittedRowReading: Sendable {
    /// The model type read, which identifies the reader (one read per type and row).
    var modelType: ObjectIdentifier { get }
    /// The row with `key` as it is now on `connection`, nil when there is none.
    func model(key: PrimaryKey, _ connection: Connection) throws -> (any Sendable)?
    /// A row decoded from its columns' values (a deleted row, from the pre-update hook).
    func model(columns: [String], values: [DatabaseValue], _ connection: Connection) throws -> (any Sendable)?
}

struct CommittedModelReader<M: Model>: CommittedRowReading {
    var modelType: ObjectIdentifier { ObjectIdentifier(M.self) }

    func model(key: PrimaryKey, _ connection: Connection) throws -> (any Sendable)? {
        let schema = try ModelSchema<M>.shared()
        let clause = try keyCondition(schema, key)
        let required = try schema.requiredRowsCondition().map { " AND \($0)" } ?? ""
        return try ModelError.wrapping {
            try connection.fetchOwnModels(
                M.self, clause: clause.sql + required, arguments: StatementArguments(values: clause.arguments),
                reportingFetches: false
            ).first
        }
    }

    func model(columns: [String], values: [DatabaseValue], _ connection: Connection) throws -> (any Sendable)? {
        let selected = columns.enumerated().map { "?\($0.offset + 1) AS \(quoteIdentifier($0.element))" }.joined(
            separator: ", ")
        return try ModelError.wrapping {
            try connection.fetchModels(
                M.self, sql: "SELECT \(selected)", arguments: StatementArguments(values: values),
                reportingFetches: false
            ).first
        }
    }
}
