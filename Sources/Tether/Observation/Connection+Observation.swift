import CSQLite

/// Which tables a query reads, as SQLite's authorizer tells when the query is prepared
/// (SQLITE_READ, views expanded to their tables): what a query observation watches.
extension Connection {
    /// Runs `body`, recording the tables read by every statement it runs through this connection.
    func recordingReadTables<T>(_ body: () throws -> T) throws -> (value: T, tables: Set<String>) {
        let outer = recordedReads
        recordedReads = []
        defer { recordedReads = outer.map { $0.union(recordedReads ?? []) } }
        let value = try body()
        return (value, recordedReads ?? [])
    }

    /// Adds what `statement` reads to the tables being recorded (asked of SQLite once per statement).
    func recordReads(of statement: Statement) throws {
        let tables: Set<String>
        if let known = statement.readTables {
            tables = known
        } else {
            tables = try readTables(ofSQL: statement.sql)
            statement.readTables = tables
        }
        recordedReads?.formUnion(tables)
    }

    /// Prepares `sql` again with the authorizer collecting its reads (nothing is run).
    func readTables(ofSQL sql: String) throws -> Set<String> {
        collectedReads = []
        defer { collectedReads = nil }
        try prepareForAuthorizer(sql)
        return collectedReads ?? []
    }

    /// Prepares `sql` again with the authorizer collecting the tables it reads or writes, its
    /// triggers' and views' included (nothing is run).
    func accessedTables(ofSQL sql: String) throws -> Set<TableAccess> {
        collectedAccesses = []
        defer { collectedAccesses = nil }
        try prepareForAuthorizer(sql)
        return collectedAccesses ?? []
    }

    /// Prepares `sql` (and finalizes it, nothing run) for what the authorizer collects.
    private func prepareForAuthorizer(_ sql: String) throws {
        let db = try liveHandle(sql: sql)
        var handle: OpaquePointer?
        let rc = sqlite3_prepare_v2(db, sql, -1, &handle, nil)
        sqlite3_finalize(handle)
        guard rc == SQLITE_OK else { throw error(rc, sql: sql) }
    }
}

extension Connection {
    /// Runs `body` with its writes reported as coming from `origin`; inside another origin's
    /// scope (a sync file's batches), the outer origin stays.
    func withChangeOrigin<T>(_ origin: ChangeOrigin, _ body: () throws -> T) rethrows -> T {
        guard let broker = observationBroker, case .local = broker.origin else { return try body() }
        broker.origin = origin
        defer {
            broker.origin = .local
            broker.sourceTransaction = nil
        }
        return try body()
    }

    /// The broker that records the source transactions of a peer's changes as they are written:
    /// nil when no one observes (the apply then spends nothing on them). Asked once per batch.
    var sourceTransactionRecorder: ObservationBroker? {
        guard let broker = observationBroker, broker.isActive else { return nil }
        return broker
    }

    /// Runs `body` with the rows it deletes reported as evictions (see `DatabaseEvent.Kind.evict`).
    func withEvictionsReported<T>(_ body: () throws -> T) rethrows -> T {
        guard let broker = observationBroker else { return try body() }
        broker.reportsDeletesAsEvictions = true
        defer { broker.reportsDeletesAsEvictions = false }
        return try body()
    }

    /// Where the writes in progress come from (a peer's batch, an import); local otherwise.
    var changeOrigin: ChangeOrigin { observationBroker?.origin ?? .local }

    /// The database's observation broker, told of fetches (attached by `Database` to its connections).
    var observationBroker: ObservationBroker? { attachment(ObservationBroker.self) }
}

extension Connection {
    /// Tells fetch listeners which rows the ORM read (SundeedQLite's retrieve events).
    func reportFetch<M: Model>(of models: [M], _ schema: ModelSchema<M>, to broker: ObservationBroker) throws {
        guard broker.listensToFetches(of: M.tableName) else { return }
        let encoder = RowEncoder(schema: schema)
        let keys = try models.map { model in
            let values = try encoder.collect(model)
            return schema.primaryKey.map { values[$0] }
        }
        broker.didFetch(M.tableName, keys: keys)
    }
}

/// One action SQLite's authorizer reported while a statement was prepared: its code
/// (`SQLITE_READ`, `SQLITE_FUNCTION`…) and its first two arguments (for a read, the table and
/// column; for a function call, nil and the function's name).
struct AuthorizedAction: Hashable {
    let code: Int32
    let first: String?
    let second: String?
}

extension Connection {
    /// Runs `body`, which prepares statements (and runs none), returning every action the
    /// authorizer reported meanwhile, in order.
    func collectingAuthorizations<T>(_ body: () throws -> T) rethrows -> (value: T, actions: [AuthorizedAction]) {
        let outer = collectedActions
        collectedActions = []
        defer { collectedActions = outer }
        let value = try body()
        return (value, collectedActions ?? [])
    }
}
