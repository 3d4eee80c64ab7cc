import Foundation

/// Writes by other programs (the sqlite3 shell) to tables synced with `capturingExternalWrites`:
/// triggers (made by `RowMetadataLayout`) note each written row in `tether_external_changes`,
/// and the capture gives those rows their sequence numbers and versions when it next runs. The
/// triggers stand still while a table is listed in `tether_capture_paused`, a row that lives
/// only inside a transaction of this connection, never committed: during a `withoutCapture` scope,
/// and — for tables with a rowid — from this connection's first write of a transaction to its
/// commit, so that the library's own writes are captured as any synced table's (the hook, insert
/// ranges for bulk inserts) instead of paying for triggers meant for other programs.
///
/// When the capture triggers of tables with a rowid are the only triggers of the schema, this
/// connection runs without the schema's triggers at all (`switchSchemaTriggersForOwnWrites`):
/// SQLite then leaves them out of the statements it prepares, where a paused trigger still ran
/// its program for every row (twice the cost of an update). Any other trigger — the user's, or
/// a table WITHOUT ROWID's, which keep its keys for every writer — turns them back on, and the
/// pause does the work.
struct ExternalWriteTracking {
    /// `PRAGMA data_version` when other connections' commits were last looked for.
    var lastDataVersion: Int64 = -1
    /// Rows written by other programs (or by this connection to a trigger-captured table) wait
    /// for their metadata.
    var foldNeeded = true
    /// The triggers of `ChangeCapture.ownWriteTriggerTables` are paused for this connection's writes
    /// (their rows are in `tether_capture_paused` now).
    var ownWritesPaused = false
    /// Some pause for own writes was written in this transaction: the commit removes them (a
    /// ROLLBACK TO may have kept a row that `ownWritesPaused` no longer vouches for).
    var ownWritesPausedInTransaction = false
    /// This connection runs without the schema's triggers: its writes never reach the capture
    /// triggers, paused or not.
    var schemaTriggersOff = false
}

extension ChangeCapture {
    static let externalWritesSchema = """
        CREATE TABLE IF NOT EXISTS tether_external_changes (id INTEGER PRIMARY KEY, table_name TEXT NOT NULL, row_id \
        INTEGER NOT NULL, inserted INTEGER NOT NULL, mask INTEGER NOT NULL DEFAULT 0) STRICT;
        CREATE TABLE IF NOT EXISTS tether_capture_paused (table_name TEXT PRIMARY KEY) STRICT, WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS tether_external_counter_writes (id INTEGER PRIMARY KEY, table_name TEXT NOT NULL, \
        row_id INTEGER NOT NULL, column_name TEXT NOT NULL, before ANY, difference ANY) STRICT;
        """

    private static let externalChangesTable = Array("tether_external_changes".utf8CString)

    /// Whether the table the pre-update hook names is the triggers' queue.
    static func isExternalChangesTable(_ name: UnsafePointer<CChar>) -> Bool {
        externalChangesTable.withUnsafeBufferPointer { $0.baseAddress.map { strcmp($0, name) == 0 } ?? false }
    }

    /// Whether `connection` sees writes of other programs not yet folded (given their sequence
    /// numbers): any connection's, a reader's included.
    static func hasUnfoldedExternalChanges(_ connection: Connection) throws -> Bool {
        try connection.fetchValue("SELECT EXISTS (SELECT 1 FROM tether_external_changes)", as: Bool.self) == true
    }

    /// The rows other programs wrote to `table` and not yet folded are forgotten (it stops syncing).
    static func forgetExternalChanges(of table: String, _ connection: Connection) throws {
        try connection.execute("DELETE FROM tether_external_changes WHERE table_name = ?", [table])
        try connection.execute("DELETE FROM tether_external_counter_writes WHERE table_name = ?", [table])
    }

    /// Pauses, for the rest of this transaction, the triggers of the tables this connection's
    /// writes are captured in by the hook. Unobserved: bookkeeping, not the application's write.
    func pauseTriggersForOwnWrites(_ connection: Connection) throws {
        guard !externalWrites.ownWritesPaused, !externalWrites.schemaTriggersOff, !ownWriteTriggerTables.isEmpty else {
            return
        }
        for table in ownWriteTriggerTables {
            try connection.executeUnobserved(table.statement(.pauseTriggers, connection))
        }
        externalWrites.ownWritesPaused = true
        externalWrites.ownWritesPausedInTransaction = true
    }

    /// Before the transaction ends (or a RELEASE that may end it): the pauses go, never committed.
    func resumeTriggersAfterOwnWrites(_ connection: Connection) throws {
        guard externalWrites.ownWritesPausedInTransaction else { return }
        for table in ownWriteTriggerTables {
            try connection.executeUnobserved(table.statement(.resumeTriggers, connection))
        }
        externalWrites.ownWritesPaused = false
        externalWrites.ownWritesPausedInTransaction = false
    }

    /// Whether the hook captures this connection's writes to `table`, a trigger-captured table.
    @inline(__always)
    func capturesOwnWrites(to table: SyncedTable) -> Bool {
        (externalWrites.ownWritesPaused || externalWrites.schemaTriggersOff) && !table.isWithoutRowid
    }

    /// Turns this connection's schema triggers off when the only ones, in every database it has
    /// attached, are the capture triggers of `ownWriteTriggerTables`; on otherwise.
    func switchSchemaTriggersForOwnWrites(_ connection: Connection) throws {
        let captureTriggers = Set(ownWriteTriggerTables.flatMap(\.layout.triggerNames))
        var off = !captureTriggers.isEmpty
        if off {
            let schemas = try connection.fetchRows("SELECT name FROM pragma_database_list WHERE name != 'temp'").map {
                try $0.get(0, as: String.self)
            }
            for schema in schemas where off {
                let triggers = try connection.fetchRows(
                    "SELECT name FROM \(quoteIdentifier(schema)).sqlite_master WHERE type = 'trigger'"
                )
                .map { try $0.get(0, as: String.self) }
                off = triggers.allSatisfy { schema == "main" && captureTriggers.contains($0) }
            }
        }
        guard off != externalWrites.schemaTriggersOff else { return }
        try connection.enableSchemaTriggers(!off)
        externalWrites.schemaTriggersOff = off
    }

    /// Notices commits made by other connections (PRAGMA data_version), whose
    /// changes to trigger-captured tables are waiting for their metadata.
    func noticeExternalWrites(_ connection: Connection) throws {
        guard tables.list.contains(where: \.capturesExternalWrites) else { return }
        let version = try connection.fetchValue("PRAGMA data_version", as: Int64.self) ?? 0
        if version != externalWrites.lastDataVersion {
            externalWrites.lastDataVersion = version
            externalWrites.foldNeeded = true
        }
    }

    /// Folds, in the current transaction, what other programs wrote since the last look.
    func foldExternalWritesIfAny(_ connection: Connection) throws {
        try noticeExternalWrites(connection)
        if externalWrites.foldNeeded { try foldExternalChanges(connection) }
    }

    /// Folds what other programs wrote, in a transaction of its own opened only when there is
    /// something to fold (one `PRAGMA data_version` otherwise).
    func foldExternalWrites(_ connection: Connection) throws {
        guard tables.list.contains(where: \.capturesExternalWrites) else { return }
        try noticeExternalWrites(connection)
        guard externalWrites.foldNeeded else { return }
        try connection.transaction(.immediate) { try foldExternalChanges(connection) }
    }

    /// Gives the changes that triggers recorded their sequence numbers and versions.
    func foldExternalChanges(_ connection: Connection) throws {
        externalWrites.foldNeeded = false
        let triggered = tables.list.filter(\.capturesExternalWrites)
        guard !triggered.isEmpty else { return }
        var version: LocalVersion?
        func foldVersion() throws -> LocalVersion {
            if let version { return version }
            try engine.prepareClock(connection)
            // Its own version, not the transaction's: other programs' commits are other transactions
            // than the local writes this one may hold (`SourceTransaction`).
            let made = engine.newLocalVersion()
            version = made
            return made
        }
        for table in triggered {
            let layout = table.layout
            // Deleted rows (and the old identity of re-keyed rows).
            for row in try connection.fetchRows(layout.selectUnfoldedDead) {
                let now = try foldVersion()
                let stored = row.values.last.flatMap { Data.fromDatabaseValue($0) }.flatMap {
                    RowVersions(encoded: [UInt8]($0))
                }
                var versions = stored ?? .uniform(now)
                versions.markDeleted(at: now, columnCount: table.valueColumns.count)
                let numbered: [DatabaseValue] = [.integer(clock.nextSequence()), .blob(Data(versions.encoded()))]
                try connection.execute(layout.foldDead, StatementArguments(values: numbered + row.values.dropLast()))
                table.mayHaveDeadRows = true
            }
        }
        // Inserted and updated rows, in the order they were written across tables: an order and
        // its line written in one transaction are numbered as written, parent first, whatever
        // order the tables are held in (a peer judging the line by its parent sees both).
        let byName = Dictionary(uniqueKeysWithValues: triggered.map { ($0.name, $0) })
        var folded: Set<String> = []
        for row in try connection.fetchRows(
            "SELECT table_name, row_id, inserted, mask FROM tether_external_changes ORDER BY id")
        {
            guard let table = byName[try row.get(0, as: String.self)] else { continue }
            folded.insert(table.name)
            let rowid = try row.get(1, as: Int64.self)
            guard try connection.fetchValue(table.layout.liveRowExists, [rowid], as: Bool.self) == true else {
                continue
            }  // deleted since
            let now = try foldVersion()
            if try row.get(2, as: Bool.self) {
                try engine.stampInserted(table, rowid: rowid, versions: RowVersions.uniform(now).encoded(), connection)
                continue
            }
            let mask = try row.get(3, as: Int64.self)
            let before = try engine.rowState(table, rowid: rowid, connection)
            var versions = before?.versions ?? .uniform(now)
            for column in table.valueColumns.indices
            where mask == -1 || (column < 63 && mask & (1 << Int64(column)) != 0) {
                versions.setColumn(column, to: now, columnCount: table.valueColumns.count)
            }
            try engine.stamp(
                table, rowid: rowid, status: SyncEngine.statusAfterUpdate(before?.status ?? .created),
                versions: versions.encoded(), inserted: .earlier(before?.insertedSequence), connection)
            if table.hasCounters {
                try foldCounterWrites(table, rowid: rowid, before: before?.versions, version: now, connection)
            }
        }
        // Nothing written when nothing was queued: a fold may come at the end of a read (a
        // statement that failed after its triggers ran leaves `foldNeeded` set, and nothing queued).
        for name in folded.sorted() { try Self.forgetExternalChanges(of: name, connection) }
    }
}
