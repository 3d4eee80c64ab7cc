import CSQLite
import Foundation
import Logging

/// Rows that expire (AgileDB's `autoDeleteAfter`): a row saved with an expiry date is deleted
/// once the date has passed — before any read or write that begins after it, when the
/// database opens, and by a timer at the date itself — so no query ever returns it.
///
/// The dates live in Tether's own tables, never in the user's: `tether_expiry` for tables
/// that are not synced, `tether_synced_expiry` for synced ones. The second is a synced table
/// itself, synced by every database that syncs a table (so that every peer's HELLO lists it,
/// and a peer's expiries never make two schemas differ): a row's expiry reaches every peer
/// with the row, so each peer deletes it at the date, even one that is offline then; the
/// deletion is a change like any other.
/// An entry names the table and the row's identity across peers (its primary key, or the
/// secondary key that identifies it) as a JSON array.
enum ExpiryStore {
    static let localTable = "tether_expiry"
    static let syncedTable = "tether_synced_expiry"

    static func createSQL(_ table: String) -> [String] {
        [
            """
            CREATE TABLE IF NOT EXISTS \(table) (table_name TEXT NOT NULL, row_key TEXT NOT NULL, expires_at REAL \
            NOT NULL, PRIMARY KEY (table_name, row_key)) STRICT
            """,
            "CREATE INDEX IF NOT EXISTS \(table)_on_expires_at ON \(table) (expires_at)",
        ]
    }

    /// The stores that exist in this database.
    static func existingStores(_ connection: Connection) throws -> [String] {
        try connection.fetchRows(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?) ORDER BY name",
            [localTable, syncedTable]
        ).map { try $0.get(0, as: String.self) }
    }

    /// Creates the synced store and syncs it (with the first synced table, or on opening a
    /// database that synced tables before the store existed).
    static func enableSynced(_ engine: SyncEngine, _ connection: Connection) throws {
        guard engine.tables[syncedTable] == nil else { return }
        for sql in createSQL(syncedTable) { try connection.execute(sql) }
        try engine.enableSync(
            table: syncedTable, keyColumns: nil, policy: .lastWriterWins, capturesExternalWrites: false,
            connection: connection, allowingInternalTable: true)
    }

    /// The table a change of a batch concerns: its own, or for an entry of the synced store, the
    /// table whose row it sets to expire (a peer allowed only some tables may set expiries only
    /// on their rows).
    static func tableConcerned(by change: RowChange, in batch: ChangeBatch) -> String? {
        guard batch.tables.indices.contains(change.table) else { return nil }
        let table = batch.tables[change.table]
        guard table.name == syncedTable else { return table.name }
        guard let keyIndex = table.keyColumns.firstIndex(of: "table_name"), change.key.indices.contains(keyIndex),
            case let .text(named) = change.key[keyIndex]
        else { return nil }
        return named
    }

    /// Why this database refuses `change`, a change described by `table`, as an entry of the synced
    /// store; nil when it accepts it (or it is no entry). An expiry is a change to the row it names:
    /// it must name a user's table this database syncs, and that row by its identity across peers
    /// (a JSON array of one value per key column). Otherwise storing it would let a peer delete,
    /// once the table is synced, a row it could never change — or relay the entry to other peers.
    static func refusal(of change: RowChange, describedBy table: TableDescriptor, _ engine: SyncEngine) -> String? {
        guard table.name == syncedTable else { return nil }
        guard table.keyColumns == ["table_name", "row_key"], change.key.count == 2 else {
            return """
                identifies the entries of \(syncedTable) by (\(table.keyColumns.joined(separator: ", "))), not by \
                (table_name, row_key)
                """
        }
        guard case let .text(named) = change.key[0] else { return "names no table: its table_name is \(change.key[0])" }
        guard !SyncedTable.isInternal(named) else { return "names table \(named), one of Tether's or SQLite's own" }
        guard let synced = engine.tables[named] else {
            return "names table \(named), which this database does not sync"
        }
        guard case let .text(rowKey) = change.key[1], isKey(rowKey, columnCount: synced.keyColumns.count) else {
            return """
                names a row of \(named) by \(change.key[1]), not by a JSON array of its \
                \(synced.keyColumns.count) key value(s) (\(synced.keyColumns.joined(separator: ", ")))
                """
        }
        // A date is a number of seconds: anything else would fail the store's constraint and wait, kept
        // aside, for ever.
        if change.isAlive, let index = table.valueColumns.firstIndex(of: "expires_at"),
            !(change.omitted.indices.contains(index) && change.omitted[index])
        {
            switch change.values.indices.contains(index) ? change.values[index] : .null {
            case .integer, .real: break
            case let other:
                return "sets the expiry of a row of \(named) to \(other), not to a number of seconds since 1970"
            }
        }
        return nil
    }

    /// Whether `rowKey` is a JSON array of `columnCount` numbers or strings, as `setExpiry` writes one.
    private static func isKey(_ rowKey: String, columnCount: Int) -> Bool {
        guard let values = try? JSONSerialization.jsonObject(with: Data(rowKey.utf8)) as? [Any],
            values.count == columnCount
        else { return false }
        return values.allSatisfy { $0 is String || $0 is NSNumber }
    }

    /// Refuses the batch whole when one of its changes is an entry of the synced store this
    /// database refuses (`refusal(of:describedBy:_:)`): checked before anything is written.
    static func checkEntries(of batch: ChangeBatch, _ engine: SyncEngine) throws {
        guard let storeIndex = batch.tables.firstIndex(where: { $0.name == syncedTable }) else { return }
        for (index, change) in batch.changes.enumerated() where change.table == storeIndex {
            if let reason = refusal(of: change, describedBy: batch.tables[storeIndex], engine) {
                throw SyncError.refusedExpiry(change: index, reason: reason)
            }
        }
    }

    /// Reads which tables have expiring rows, and tells when the next expiry falls.
    static func load(_ engine: SyncEngine, _ connection: Connection) throws {
        var tables = Set<String>()
        var earliest: Double?
        for store in try existingStores(connection) {
            for row in try connection.fetchRows("SELECT DISTINCT table_name FROM \(store)") {
                tables.insert(try row.get(0, as: String.self))
            }
            if let first = try connection.fetchValue("SELECT min(expires_at) FROM \(store)", as: Double.self) {
                earliest = min(earliest ?? first, first)
            }
        }
        engine.expiry.expire(tables, connection)
        if let earliest { engine.expiry.due?(earliest) }
    }

    /// The columns that identify a row of `table` in `store`: its identity across peers for
    /// the synced store (nil when the table is not synced here), else its primary key.
    private static func identity(of table: String, in store: String, _ engine: SyncEngine, _ connection: Connection)
        throws -> [String]?
    {
        // An entry stored before entries were checked (`refusal`) may name one of Tether's tables.
        guard !SyncedTable.isInternal(table) else { return nil }
        if store == syncedTable { return engine.tables[table]?.keyColumns }
        let key = try connection.fetchRows("SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", [table])
            .map { try $0.get(0, as: String.self) }
        return key.isEmpty ? nil : key
    }

    /// `"k1" = json_extract(<entry>, '$[0]') AND …`: the row an entry names.
    private static func matching(_ identity: [String], qualifiedBy table: String? = nil, entry: String) -> String {
        identity.enumerated().map { position, column in
            let name = table.map { "\(quoteIdentifier($0)).\(quoteIdentifier(column))" } ?? quoteIdentifier(column)
            return "\(name) = json_extract(\(entry), '$[\(position)]')"
        }.joined(separator: " AND ")
    }

    /// Deletes every row whose expiry has passed, with its entry. An entry for a table this
    /// database lacks (or does not sync, for the synced store) is left for later. Returns the
    /// rows deleted and the next expiry still to come.
    static func purge(_ engine: SyncEngine, _ connection: Connection, now: Double) throws -> (
        deleted: Int, next: Double?
    ) {
        var deleted = 0
        var next: Double?
        for store in try existingStores(connection) {
            let due = try connection.fetchRows(
                "SELECT table_name, row_key FROM \(store) WHERE expires_at <= ? ORDER BY expires_at", [now])
            for entry in due {
                let table = try entry.get(0, as: String.self)
                let key = try entry.get(1, as: String.self)
                guard let identity = try identity(of: table, in: store, engine, connection) else { continue }
                do {
                    deleted += try connection.savepoint {
                        try connection.execute(
                            "DELETE FROM \(quoteIdentifier(table)) WHERE \(matching(identity, entry: "?1"))", [key])
                        let count = connection.changes
                        try connection.execute(
                            "DELETE FROM \(store) WHERE table_name = ? AND row_key = ?", [table, key])
                        return count
                    }
                } catch let error as DatabaseError
                    where error.kind == .foreignKeyViolation || error.kind == .otherConstraintViolation
                {
                    // A row a constraint keeps (a foreign key that restricts its deletion) stays,
                    // with its entry, until it can go: the database stays usable meanwhile.
                    continue
                }
            }
            if let upcoming = try connection.fetchValue(
                "SELECT min(expires_at) FROM \(store) WHERE expires_at > ?", [now], as: Double.self)
            {
                next = min(next ?? upcoming, upcoming)
            }
        }
        return (deleted, next)
    }

    /// Sets (or, for nil, removes) the expiry of the row of `table` whose primary key is `key`.
    static func setExpiry(
        _ date: Date?, table: String, primaryKey: [String], key: [DatabaseValue], _ engine: SyncEngine,
        _ connection: Connection
    ) throws {
        let synced = engine.tables[table]
        // The synced store exists wherever a table is synced (`enableSynced`).
        let store = synced == nil ? localTable : syncedTable
        if synced == nil { for sql in createSQL(localTable) { try connection.execute(sql) } }
        let identity = synced?.keyColumns ?? primaryKey
        let condition = primaryKey.map { "\(quoteIdentifier($0)) = ?" }.joined(separator: " AND ")
        let keySQL = """
            SELECT json_array(\(identity.map(quoteIdentifier).joined(separator: ", "))) FROM \
            \(quoteIdentifier(table)) WHERE \(condition)
            """
        guard let rowKey = try connection.fetchValue(keySQL, StatementArguments(values: key), as: String.self) else {
            throw ModelError.notFound(
                table: table,
                key: key.count == 1 ? key[0].description : "(\(key.map(\.description).joined(separator: ", ")))")
        }
        guard let date else {
            try connection.execute("DELETE FROM \(store) WHERE table_name = ? AND row_key = ?", [table, rowKey])
            return
        }
        try connection.execute(
            """
            INSERT INTO \(store) (table_name, row_key, expires_at) VALUES (?, ?, ?)
            ON CONFLICT (table_name, row_key) DO UPDATE SET expires_at = excluded.expires_at
            """, [table, rowKey, date.timeIntervalSince1970])
        if !engine.expiry.tables.contains(table) {
            engine.expiry.expire(engine.expiry.tables.union([table]), connection)
        }
        engine.expiry.due?(date.timeIntervalSince1970)
    }

    /// The expiry of the row of `table` whose primary key is `key`, if it has one.
    static func expiry(
        table: String, primaryKey: [String], key: [DatabaseValue], _ engine: SyncEngine, _ connection: Connection
    ) throws -> Date? {
        let identity = engine.tables[table]?.keyColumns ?? primaryKey
        let condition = primaryKey.map { "t.\(quoteIdentifier($0)) = ?" }.joined(separator: " AND ")
        for store in try existingStores(connection) where (store == syncedTable) == (engine.tables[table] != nil) {
            let sql = """
                SELECT e.expires_at FROM \(quoteIdentifier(table)) t JOIN \(store) e ON e.table_name = ? AND \
                e.row_key = json_array(\(identity.map { "t.\(quoteIdentifier($0))" }.joined(separator: ", "))) \
                WHERE \(condition)
                """
            if let seconds = try connection.fetchValue(
                sql, StatementArguments(values: [.text(table)] + key), as: Double.self)
            {
                return Date(timeIntervalSince1970: seconds)
            }
        }
        return nil
    }
}

/// Forgets the expiry of rows as they are deleted, whatever deletes them — the ORM, raw SQL, a
/// foreign-key action, the purge itself — so that a row inserted again under the same key does
/// not inherit it. An observer of the writer, listening only while some table has expiring rows.
///
/// Not while an apply runs: the peer that deleted a row sends the deletion of its expiry too.
/// It does not write in the deleting statement's transaction: in autocommit mode the expiry is
/// forgotten just after (a crash between leaves an entry whose row is gone, which the purge drops).
final class ExpiryObserver: TransactionObserver {
    private unowned let engine: SyncEngine
    /// Tables with rows that expire.
    private(set) var tables: Set<String> = []
    /// Their names, and as C strings for the pre-update hook.
    private var names: [(name: String, cName: ContiguousArray<CChar>)] = []
    /// Tables the statement running deleted expiring rows from.
    private var deletedFrom: [String] = []
    /// Tells the database when the next expiry falls (seconds since 1970).
    var due: ((Double) -> Void)?

    init(engine: SyncEngine) {
        self.engine = engine
    }

    /// Rows of `tables` expire from now on: deletes from them are watched.
    func expire(_ tables: Set<String>, _ connection: Connection) {
        self.tables = tables
        names = tables.map { ($0, ContiguousArray($0.utf8CString)) }
        connection.observersDidChange()
    }

    var observesStatements: Bool { !tables.isEmpty }
    var writesInTransaction: Bool { false }

    func rowWillChange(_ change: PreUpdateChange) {
        guard change.operation == SQLITE_DELETE, !engine.capture.writingPeerChanges,
            strcmp(change.databaseName, "main") == 0
        else { return }
        let tableName = change.tableName
        guard
            let match = names.first(where: {
                $0.cName.withUnsafeBufferPointer { $0.baseAddress.map { strcmp($0, tableName) == 0 } ?? false }
            }),
            !deletedFrom.contains(match.name)
        else { return }
        deletedFrom.append(match.name)
    }

    func statementDidExecute(_ statement: Statement, _ connection: Connection) throws {
        guard !deletedFrom.isEmpty else { return }
        let deleted = deletedFrom
        deletedFrom.removeAll()
        for table in deleted { try forgetExpiryOfDeletedRows(in: table, connection) }
    }

    func statementDidFail(_ statement: Statement, _ connection: Connection) { deletedFrom.removeAll() }
    func transactionDidRollBack() { deletedFrom.removeAll() }

    /// Inserts delete nothing: a bulk insert runs unobserved by this observer.
    func bulkInsertWillBegin(into table: String, rowCount: Int, _ connection: Connection) throws
        -> BulkInsertObservation
    { .rowidRanges }

    /// Forgets the expiry of the rows of `table` that are gone.
    private func forgetExpiryOfDeletedRows(in table: String, _ connection: Connection) throws {
        for store in try ExpiryStore.existingStores(connection) {
            let identity: [String]
            if store == ExpiryStore.syncedTable {
                guard let synced = engine.tables[table] else { continue }
                identity = synced.keyColumns
            } else {
                identity = try connection.fetchRows(
                    "SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", [table]
                )
                .map { try $0.get(0, as: String.self) }
                guard !identity.isEmpty else { continue }
            }
            let match = identity.enumerated().map { position, column in
                "t.\(quoteIdentifier(column)) = json_extract(e.row_key, '$[\(position)]')"
            }.joined(separator: " AND ")
            try connection.execute(
                """
                DELETE FROM \(store) AS e WHERE e.table_name = ? AND NOT EXISTS (SELECT 1 FROM \
                \(quoteIdentifier(table)) t WHERE \(match))
                """, [table])
        }
    }
}

// MARK: - Public API

extension Database {
    /// Inserts `model`, to be deleted once `expiresAt` has passed (AgileDB's `autoDeleteAfter`):
    /// from then on no query returns it. On a synced table the expiry reaches peers with the
    /// row, and the deletion is a change like any other.
    ///
    /// ```swift
    /// try db.insert(Session(id: "s1", user: "arthur"), expiresAt: Date().addingTimeInterval(3600))
    /// ```
    @discardableResult
    public func insert<M: Model>(_ model: M, expiresAt date: Date) throws -> Int64 {
        let engine = try expiryEngine()
        return try write { conn in
            let rowid = try conn.insertRow(model)
            try setExpiry(date, of: model, rowid: rowid, engine, conn)
            return rowid
        }
    }

    /// Saves `model` (insert or update), to be deleted once `expiresAt` has passed; a row that
    /// had an expiry gets this one.
    ///
    /// ```swift
    /// try db.save(cachedPage, expiresAt: Date().addingTimeInterval(600))
    /// ```
    public func save<M: Model>(_ model: M, expiresAt date: Date) throws {
        let engine = try expiryEngine()
        try write { conn in
            try conn.upsertRow(model)
            try setExpiry(date, of: model, engine, conn)
        }
    }

    /// Sets the expiry of the row with this primary key, or removes it (nil). Throws
    /// `ModelError.notFound` when there is no such row. A row keeps its expiry when it is saved
    /// again without one; it loses it when it is deleted (through the ORM or raw SQL).
    ///
    /// ```swift
    /// try db.setExpiry(of: Session.self, key: PrimaryKey("s1"), to: nil)   // keep it after all
    /// ```
    public func setExpiry<M: Model>(of type: M.Type, key: PrimaryKey, to date: Date?) throws {
        let engine = try expiryEngine()
        try write { conn in
            let schema = try ModelSchema<M>.shared()
            _ = try keyCondition(schema, key)
            try ExpiryStore.setExpiry(
                date, table: schema.tableName, primaryKey: schema.keyNames, key: key.values, engine, conn)
        }
    }

    /// When the row with this primary key expires, if it does.
    ///
    /// ```swift
    /// let date = try db.expiry(of: Session.self, key: PrimaryKey("s1"))
    /// ```
    public func expiry<M: Model>(of type: M.Type, key: PrimaryKey) throws -> Date? {
        let engine = try expiryEngine()
        return try write { conn in
            let schema = try ModelSchema<M>.shared()
            _ = try keyCondition(schema, key)
            return try ExpiryStore.expiry(
                table: schema.tableName, primaryKey: schema.keyNames, key: key.values, engine, conn)
        }
    }

    /// Deletes the rows whose expiry has passed now, rather than before the next read or
    /// write; returns how many (those the timer or an earlier read or write already deleted
    /// are not counted).
    ///
    /// ```swift
    /// let deleted = try db.deleteExpiredRows()
    /// ```
    @discardableResult
    public func deleteExpiredRows() throws -> Int {
        let engine = try expiryEngine()
        // In place of the deletion due as the write begins, which would leave nothing to count.
        return try doingDueWork { conn -> (result: Int, next: Double?) in
            let purged = try conn.transaction(.immediate) {
                try ExpiryStore.purge(engine, conn, now: Date().timeIntervalSince1970)
            }
            return (purged.deleted, purged.next)
        }
    }

    private func expiryEngine() throws -> SyncEngine {
        guard let syncEngine else {
            throw DatabaseError(extendedCode: 8, message: "the database is open read-only: rows cannot expire")
        }
        return syncEngine
    }

    /// `rowid`: what an insert returned, the key of a model whose integer key was nil.
    private func setExpiry<M: Model>(
        _ date: Date, of model: M, rowid: Int64? = nil, _ engine: SyncEngine, _ conn: Connection
    ) throws {
        let statements = try conn.statements(for: M.self)
        let schema = statements.schema
        let values = try statements.encoder.collect(model)
        var key = schema.primaryKey.map { values[$0] }
        if let rowid, key == [.null] { key = [.integer(rowid)] }
        try ExpiryStore.setExpiry(date, table: schema.tableName, primaryKey: schema.keyNames, key: key, engine, conn)
    }

    /// Installs the deletion of expired rows on this database (at open): rows whose expiry
    /// passed while it was closed are deleted now.
    func installExpiry(_ engine: SyncEngine) throws {
        let dueWork = self.dueWork
        let logger = configuration.logger
        dueWork.install { conn in
            let purged = try conn.transaction(.immediate) {
                try ExpiryStore.purge(engine, conn, now: Date().timeIntervalSince1970)
            }
            if purged.deleted > 0 {
                logger.debug("deleted expired rows", metadata: ["tether.rows": "\(purged.deleted)"])
            }
            return purged.next
        }
        engine.expiry.due = { time in dueWork.due(at: time) }
        try writeWithoutTransaction { conn in try ExpiryStore.load(engine, conn) }
        // The check as a write begins deletes what is already due.
        try writeWithoutTransaction { _ in }
    }
}

extension ChangeBatch {
    /// The table `change` concerns: its own, or for an expiry entry (Tether's synced store of
    /// expiry dates), the table whose row it sets to expire. A peer restricted to some tables
    /// is sent, and may send, only the changes concerning them.
    public func tableConcerned(by change: RowChange) -> String? {
        ExpiryStore.tableConcerned(by: change, in: self)
    }
}
