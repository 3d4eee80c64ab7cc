import CSQLite
import Foundation
import Logging
import Synchronization

/// Replication: the public face of the engine on `Database`. Every call runs
/// on the writer, in one transaction.
///
/// ```swift
/// try db.enableSync(for: Player.self)
/// // on the sending side
/// let batch = try a.extractChanges(for: b.instanceKey, after: cursor)
/// // on the receiving side
/// let report = try b.apply(batch)
/// ```
extension Database {
    /// Opens (creating it if needed) the database at `path`; ":memory:" gives a
    /// private in-memory database. The sync engine is installed on the writer
    /// before anything can be written, so that every change to a synced table
    /// is captured.
    public convenience init(path: String, configuration: Configuration = Configuration()) throws {
        try self.init(path: path, configuration: configuration) { connection in
            guard configuration.readOnly else {
                return try SyncAttachment(
                    engine: SyncEngine.open(on: connection),
                    staging: StagingFile(besideDatabaseAt: path, isMemory: Database.isMemory(path)))
            }
            guard let key = try InstanceIdentity.storedKey(connection) else {
                throw DatabaseError(
                    extendedCode: SQLITE_ERROR,
                    message: "\(path) is not a Tether database (it has no instance key); open it read-write once first")
            }
            return SyncAttachment(instanceKey: key)
        }
        if let syncEngine {
            syncEngine.logger = configuration.logger
            try installExpiry(syncEngine)
            // Under a standing rule (`enableSync(allExcept:)`), the tables another program made
            // while this database was closed sync from this opening (without a rule, or with
            // nothing new, the opening writes nothing).
            try writeWithoutTransaction { conn in
                let awaited = try syncEngine.tablesTheStandingRuleAwaits(conn)
                guard !awaited.isEmpty else { return }
                // Each table is looked at again in the transaction: another program may have moved on.
                try conn.transaction(.immediate) {
                    for table in awaited { try syncEngine.followStandingRule(madeTable: table, conn) }
                }
            }
        }
    }

    /// A private in-memory database.
    public static func inMemory(configuration: Configuration = Configuration()) throws -> Database {
        try Database(path: ":memory:", configuration: configuration)
    }

    /// The sync layer's part of this database. The only public initializer (above) attaches a
    /// `SyncAttachment`, so the downcast cannot fail.
    var sync: SyncAttachment { unsafeDowncast(attachment, to: SyncAttachment.self) }

    /// The replication engine (nil for a read-only database); used on the writer only.
    var syncEngine: SyncEngine? { sync.engine }

    /// This database's identity among its peers.
    public var instanceKey: InstanceKey { sync.instanceKey }

    func engine() throws -> SyncEngine {
        guard let syncEngine else {
            throw DatabaseError(extendedCode: 8, message: "the database is open read-only: it cannot sync")
        }
        return syncEngine
    }

    /// Turns sync on for `M`'s table. The identity across peers is the primary
    /// key, or `identity` (a unique key) when the primary key is local
    /// (AUTOINCREMENT). With `capturingExternalWrites`, writes made by other
    /// programs (the sqlite3 shell) are captured too, by triggers; this database's own writes do
    /// not pay for them (the triggers pause while it writes, and it captures its writes as it does
    /// for any synced table). The tables of `M`'s nested models are
    /// synced too (with the same policy), when they are not already.
    ///
    /// `columnRules` chooses how some columns merge (`ColumnMergeRule`; the others: the later
    /// write wins). Every peer must choose the same rules for the columns it shares: a session
    /// with a peer that merges one by another rule is refused, naming it. Syncing a synced table
    /// again with other rules changes them: each row keeps its value, which becomes a counter's
    /// starting value (or a counter's sum becomes a plain value). `rowRule` chooses what wins
    /// between a delete and an update the deleting peer had not seen (`RowMergeRule`: the delete,
    /// by default), agreed with peers the same way.
    ///
    /// ```swift
    /// try db.enableSync(for: Item.self, columnRules: [.column(\.stock): .counter])
    /// ```
    public func enableSync<M: Model>(
        for type: M.Type, policy: ConflictPolicy = .lastWriterWins, identity: [ColumnRef<M>]? = nil,
        capturingExternalWrites: Bool = false, columnRules: [ColumnRef<M>: ColumnMergeRule] = [:],
        rowRule: RowMergeRule = .deleteWins
    ) throws {
        let schema = try ModelSchema<M>.shared()
        var key = try identity.map { try $0.map { schema.columns[try schema.column($0)].name } }
        if key == nil,
            schema.constraints.contains(where: { if case .autoIncrement = $0 { return true } else { return false } })
        {
            guard let secondary = schema.secondaryKeys.first else {
                throw SyncError.invalidTable(
                    """
                    \(M.self) has a local AUTOINCREMENT key: declare a secondary key that identifies its rows \
                    across peers
                    """)
            }
            key = secondary.map { schema.columns[$0].name }
        }
        var rules: [String: ColumnMergeRule] = [:]
        for (column, rule) in columnRules { rules[schema.columns[try schema.column(column)].name] = rule }
        try enableSync(
            table: M.tableName, identity: key, policy: policy, capturingExternalWrites: capturingExternalWrites,
            columnRules: rules, rowRule: rowRule)
        // Nested models are rows of their own tables: those sync too, or links would dangle on peers.
        for entry in schema.nested?.links ?? [] { try entry.link.enableSync(self, policy: policy) }
    }

    /// Turns sync on for a table by name (see `enableSync(for:)`); `columnRules` by column name.
    public func enableSync(
        table: String, identity: [String]? = nil, policy: ConflictPolicy = .lastWriterWins,
        capturingExternalWrites: Bool = false, columnRules: [String: ColumnMergeRule] = [:],
        rowRule: RowMergeRule = .deleteWins
    ) throws {
        let engine = try engine()
        try write { conn in
            try engine.enableSync(
                table: table, keyColumns: identity, policy: policy, capturesExternalWrites: capturingExternalWrites,
                columnRules: columnRules, rowRule: rowRule, connection: conn)
        }
    }

    /// Syncs every table of the database except `excluded`, now and from now on, and returns the
    /// tables it turned on now, by name (AgileDB's `setUnsyncedTables`: "any tables not in this
    /// array will be synced").
    ///
    /// The exclusion list is a standing rule, recorded in the database (a later call replaces it):
    /// a table made afterwards — by SQL, `createTable`, a migration, or `setValue(_:inTable:forKey:)`
    /// making its table — is synced in the transaction that makes it, unless listed, so its first
    /// rows reach peers; one made by another program while the database was closed is synced when
    /// it is next opened. A listed name need not be a table yet: the table of that name stays local
    /// whenever it is made (check the returned list and ``unsyncedTables()`` for a misspelt name).
    /// ``disableSync(table:)`` adds the table to the list. Tether's own tables are never synced this
    /// way, and tables already synced are left as they are.
    ///
    /// Each table is turned on as `enableSync(table:)` does, with `policy` and
    /// `capturingExternalWrites`. A table that cannot be synced by its primary key (it has none,
    /// or a local AUTOINCREMENT one) throws `SyncError.invalidTable` naming it when it exists
    /// now (the tables before it stay synced); made later, it stays local with a warning in the
    /// log (the code that makes it may know nothing of sync) and ``unsyncedTables()`` lists it.
    /// Sync such a table by another key with `enableSync(table:identity:)`.
    ///
    /// A `.custom` policy's function cannot be recorded: a table the rule syncs after the
    /// database is reopened refuses peers' changes (`SyncError.missingMergeFunction`) until
    /// `setConflictPolicy` gives it one, as every custom table does.
    ///
    /// ```swift
    /// try db.enableSync(allExcept: ["drafts", "cache"])
    /// ```
    @discardableResult
    public func enableSync(
        allExcept excluded: [String], policy: ConflictPolicy = .lastWriterWins,
        capturingExternalWrites: Bool = false
    ) throws -> [String] {
        let engine = try engine()
        var merge: MergeFunction?
        if case let .custom(function) = policy { merge = function }
        let rule = StandingSyncRule(
            excluded: excluded, policyName: policy.description,
            capturesExternalWrites: capturingExternalWrites)
        // The rule first: a table made from now on follows it.
        let chosen = try write { conn in
            try engine.setStandingRule(rule, merge: merge, conn)
            return try conn.userTableNames().filter { engine.tables[$0] == nil && rule.covers($0) }
        }
        for table in chosen {
            try enableSync(table: table, policy: policy, capturingExternalWrites: capturingExternalWrites)
        }
        return chosen
    }

    /// The user's tables that are not synced, by name (AgileDB's `unsyncedTables`).
    public func unsyncedTables() throws -> [String] {
        let engine = try engine()
        return try write { conn in try conn.userTableNames().filter { engine.tables[$0] == nil } }
    }

    /// Turns sync off for a table; its rows stay, its tombstones go. Under the standing rule of
    /// `enableSync(allExcept:)`, the table joins the tables it leaves out.
    public func disableSync(table: String) throws {
        let engine = try engine()
        try write { conn in
            try engine.disableSync(table: table, connection: conn)
            try engine.excludeFromStandingRule(table, conn)
        }
    }

    /// The synced tables, by name (the user's: not Tether's own store of expiry dates, which
    /// every database that syncs a table syncs too).
    public var syncedTables: [String] {
        (try? write { _ in syncEngine?.tables.keys.filter { $0 != ExpiryStore.syncedTable }.sorted() ?? [] }) ?? []
    }

    /// Changes the conflict policy of a synced table (a custom merge function
    /// must be set again each time the database is opened).
    public func setConflictPolicy(_ policy: ConflictPolicy, for table: String) throws {
        let engine = try engine()
        try write { conn in
            guard let synced = engine.tables[table] else { throw SyncError.notSynced(table) }
            try conn.syncedTableCatalog.setPolicy(policy, of: table)
            if case let .custom(merge) = policy {
                engine.syncedTables.mergeFunctions[table] = merge
            } else {
                engine.syncedTables.mergeFunctions[table] = nil
            }
            synced.policy = policy
            synced.needsMergeFunction = false
        }
    }

    /// Calls `observer` after each apply that met conflicts, once per conflict.
    public func onConflict(_ observer: @escaping @Sendable (Conflict) -> Void) {
        _ = try? writeWithoutTransaction { _ in syncEngine?.conflictObserver = observer }
    }

    /// The highest sequence number this database has given a change.
    public func lastSequence() throws -> Int64 {
        try read { try HybridClock.storedSequence($0) }
    }

    /// Gives the rows other programs (the sqlite3 shell) wrote to tables synced with
    /// `capturingExternalWrites` their sequence numbers now, rather than at the next extract,
    /// apply or write, so that `lastSequence()` counts them. Cheap when no other program
    /// committed since the last call (one `PRAGMA data_version`); nothing to do without such tables.
    public func captureExternalWrites() throws {
        let engine = try engine()
        try writeWithoutTransaction { try engine.capture.foldExternalWrites($0) }
    }

    /// How many changes to the synced tables (all, or those named) wait: those after `sequence`
    /// (what a peer that acknowledged through it still lacks), or, with nil, those no peer has
    /// acknowledged yet. Rows of bulk inserts are counted by their sequence numbers, so a row
    /// changed since its insert may count twice: an estimate, for progress and status.
    ///
    /// With `peer` (and `sequence`), the rows whose state came from `peer` are left out: it holds
    /// them, and extraction for it leaves them out too. The count is then what that peer lacks.
    public func pendingChangeCount(
        tables names: [String]? = nil, after sequence: Int64? = nil,
        excludingChangesFrom peer: InstanceKey? = nil
    ) throws -> Int {
        let engine = try engine()
        return try writeWithoutTransaction { conn in
            try conn.transaction {
                var total = 0
                let via: DatabaseValue =
                    try peer.flatMap { try SiteRegistry.storedID(of: $0, conn) }.map { .integer($0) } ?? .null
                for table in engine.tableList where names?.contains(table.name) ?? true {
                    if let sequence {
                        let queries = table.layout.countChangesAfter
                        total += try conn.fetchValue(queries[0], [sequence, via], as: Int.self) ?? 0
                        total += try conn.fetchValue(queries[1], [sequence, via], as: Int.self) ?? 0
                        total += try conn.fetchValue(queries[2], [sequence, via, table.name], as: Int.self) ?? 0
                    } else {
                        for sql in table.layout.countPending { total += try conn.fetchValue(sql, as: Int.self) ?? 0 }
                    }
                }
                return total
            }
        }
    }

    // MARK: Extract and apply

    /// Where to ask `peer` for changes from: this database's cursor on it, and
    /// whether a full resync from it is under way.
    public func cursor(for peer: InstanceKey) throws -> (after: Int64, resyncing: Bool) {
        try read { conn in
            let cursor = try conn.peerStore.receiveCursor(of: peer)
            return (cursor?.receivedThrough ?? 0, cursor?.resyncFrom != nil)
        }
    }

    /// The changes `peer` lacks after `cursor` (its cursor on this database),
    /// leaving out those that came from `peer`. With `markInFlight`, the
    /// pending rows sent become in flight until `acknowledge` is called.
    ///
    /// With `allowingPartialRows`, a row inserted before the end of a catch-up `peer` applied
    /// (where it held every row; see `PeerStore.completePoint`) and updated since is sent with
    /// only the columns changed after its insert; a receiver that turns out not to hold them
    /// refuses the batch with `SyncError.needsWholeRows`, and is then sent whole rows.
    ///
    /// With `backfill`, the batch holds only the rows of tables or columns newly shared with
    /// `peer` (see ``BackfillScope``); nothing is marked in flight nor recorded as sent.
    ///
    /// With `scope`, `peer` holds only the rows of each scoped table inside it (see ``SyncScope``,
    /// and `extractScopeBackfill` for what a scope change or a parent's move brings). A scope
    /// holding a peer's interest is evaluated within `interestBudget` (a fresh ``InterestBudget``
    /// if nil): past it, `ScopeError` and nothing extracted.
    ///
    /// With `snapshot`, a catch-up of more than one batch is served from one read of this
    /// database (see ``CatchUpSnapshot``): its last batch ends where that read did, however fast
    /// this database is written meanwhile. Not for a backfill, a scope or a resync.
    public func extractChanges(
        for peer: InstanceKey?, after cursor: Int64, resuming resync: Bool = false,
        limits: BatchLimits = BatchLimits(), markInFlight: Bool = true,
        allowingPartialRows: Bool = false, backfill: BackfillScope? = nil, scope: SyncScope? = nil,
        interestBudget: InterestBudget? = nil, servedFrom snapshot: CatchUpSnapshot? = nil
    ) throws -> ChangeBatch {
        let engine = try engine()
        // A catch-up of every row, to a known peer, goes from one snapshot; a backfill, a scoped
        // peer's or a resync's batches are read afresh each.
        let snapshot = backfill == nil && scope == nil && !resync && peer != nil ? snapshot : nil
        func extract(_ request: Extraction.Request) throws -> ChangeBatch {
            try write { conn in
                try conn.evaluatingInterest(of: scope, within: interestBudget) {
                    var compiled = request
                    compiled.scope = try scope.map { try engine.compile($0, conn) }
                    let reader = peer.flatMap { snapshot?.reader(continuing: cursor, for: $0) }
                    return try engine.extract(compiled, conn, reading: reader)
                }
            }
        }
        let request = Extraction.Request(
            peer: peer, cursor: cursor, resuming: resync, limits: limits,
            markInFlight: markInFlight && backfill == nil,
            allowingPartialRows: allowingPartialRows, backfill: backfill)
        let batch: ChangeBatch
        do {
            batch = try extract(request)
        } catch let error as DatabaseError where error.isStorageFailure {
            // A full disk must not stop this database from sending its changes: extracted again
            // without writing anything (rows not marked in flight, the peer's send position not
            // recorded), they are sent all the same and stay pending until acknowledged.
            var writingNothing = request
            writingNothing.markInFlight = false
            writingNothing.recordingPeer = false
            batch = try extract(writingNothing)
        }
        if let snapshot, let peer, !batch.isResync { try snapshot.served(batch, to: peer, on: self) }
        return batch
    }

    /// The batch of a pull by `peer` after `cursor` when it is sure to hold nothing — the cursor
    /// is at the end of the log this database committed, and no write of another program waits to
    /// be numbered — read without the writer; nil otherwise (`extractChanges` then takes it). Only
    /// while a catch-up's applier holds the writer (`CatchUpApplier`), which would give the whole
    /// catch-up up for a write that waits: a session's pulls of a peer with nothing new are
    /// answered without one. Nothing is recorded of such a batch (the peer was sent nothing).
    package func batchWithNothingToSend(for peer: InstanceKey, after cursor: Int64) throws -> ChangeBatch? {
        guard writerWaits.someoneHoldsForLong else { return nil }
        let engine = try engine()
        let nothing = try read { conn in
            try HybridClock.storedSequence(conn) == cursor && !(try ChangeCapture.hasUnfoldedExternalChanges(conn))
        }
        guard nothing else { return nil }
        return ChangeBatch(
            source: engine.instanceKey, after: cursor, through: cursor, isLast: true, isResync: false,
            tables: engine.tablesInBatchOrder.map(\.descriptor), changes: [])
    }

    /// Applies a batch from a peer in one transaction, with the peer's cursor:
    /// all of it or, on error, none. Applying a batch twice changes nothing.
    ///
    /// The batch may describe a table with fewer or more value columns than this database syncs
    /// (a peer of another schema version): columns it lacks keep their values here (a new row
    /// gets their defaults); columns this database lacks, and tables it does not sync (it lacks
    /// them, or has them unsynced), are kept with their versions and applied when a migration or
    /// `enableSync` syncs them (`ApplyReport.keptForSchema`). Only a table no database can sync
    /// (one of Tether's or SQLite's own, a name holding U+0000) has the batch refused whole
    /// (`SyncError.invalidTable`). A sync session never gets this far with a table this database
    /// did not announce: it refuses such a batch first (ERROR 5, Protocol/README.md §7.2).
    ///
    /// A `backfill` batch (§8.3 of Protocol/README.md) leaves the cursor on the peer where it is.
    /// `mark`, the mark of the sender's history the batch came with (§8.9), is kept with it (see
    /// `historyMark(of:)`).
    ///
    /// With `scope`, the writer's (partial replication), each change must stay inside it: the row
    /// here before, and the row as written. A change that does not is refused — not written, listed
    /// in `ApplyReport.refused` for the writer — and the rest of the batch is applied. A change that
    /// depends on a refused one is judged on its own: a line of a refused order finds no order inside
    /// the scope here, and is refused too.
    @discardableResult
    public func apply(
        _ batch: ChangeBatch, backfill: Bool = false, keepingMark mark: HistoryMark? = nil,
        scope: SyncScope? = nil
    ) throws -> ApplyReport {
        let engine = try engine()
        let report: ApplyReport
        func applyBatch(_ conn: Connection) throws -> ApplyReport {
            let report = try engine.withWriterScope(scope, conn) {
                try engine.apply(batch, backfill: backfill, connection: conn)
            }
            if let mark, !backfill { try conn.peerStore.recordHistoryMark(mark, of: batch.source) }
            return report
        }
        do {
            report = try write(applyBatch)
        } catch let error as DatabaseError where error.isStorageFailure {
            // Short of room: the write-ahead log may hold space a checkpoint gives back. Once; then
            // the caller hears of the full disk (a session pulls smaller batches).
            do {
                guard try reclaimLogSpace() else { throw error }
                report = try write(applyBatch)
            } catch let full as DatabaseError
                where full.isStorageFailure && batch.changes.isEmpty && !batch.isResync && !backfill
            {
                // A batch of no change only moves the cursor: on a full disk it goes unrecorded (the
                // next session asks again from the old cursor, and gets the same nothing), so that a
                // full node's peers are not kept waiting by it.
                return try reportWithoutRecording(batch)
            }
        }
        if let observer = engine.conflictObserver {
            for conflict in report.conflicts { observer(conflict) }
        }
        logKeptAside(by: report, of: batch)
        return report
    }

    /// One line per apply that kept changes aside (they wait for a row or a unique value; kept,
    /// never dropped, but an operator should know), and one at `debug` when kept changes went through.
    func logKeptAside(by report: ApplyReport, of batch: ChangeBatch) {
        let logger = configuration.logger
        if report.keptAside > 0 {
            let tables = Set(batch.changes.compactMap { batch.tableConcerned(by: $0) }).sorted()
            logger.warning(
                "changes kept aside: they cannot be applied yet",
                metadata: [
                    "tether.peer.instance": "\(batch.source)", "tether.tables": "\(tables.joined(separator: ","))",
                    "tether.kept_aside": "\(report.keptAside)", "tether.still_kept_aside": "\(report.stillKeptAside)",
                ])
        }
        if report.resolvedFromKeptAside > 0 {
            logger.debug(
                "kept-aside changes applied",
                metadata: [
                    "tether.resolved": "\(report.resolvedFromKeptAside)",
                    "tether.still_kept_aside": "\(report.stillKeptAside)",
                ])
        }
    }

    /// What applying `batch`, which holds no change, would report, without writing its cursor.
    private func reportWithoutRecording(_ batch: ChangeBatch) throws -> ApplyReport {
        try read { conn in
            var report = ApplyReport()
            let received = try conn.peerStore.receiveCursor(of: batch.source)?.receivedThrough ?? 0
            report.cursor = batch.after <= received ? max(received, batch.through) : received
            report.sequenceBefore = try HybridClock.storedSequence(conn)
            report.sequenceAfter = report.sequenceBefore
            report.stillKeptAside = try conn.keptAside.count()
            return report
        }
    }

    /// The changes that could not be applied yet, and why.
    public func keptAsideChanges() throws -> [KeptAsideChange] {
        try read { conn in
            try conn.keptAside.entries().map { entry in
                let batch = try BatchCoding.decodeWithoutValidating(entry.batch)
                return KeptAsideChange(
                    id: entry.id, table: entry.table, key: batch.changes.first?.key ?? [],
                    peer: entry.peer ?? batch.source,
                    reason: entry.reason, attempts: entry.attempts)
            }
        }
    }

    /// Retries the kept-aside changes now (each apply also does).
    @discardableResult
    public func retryKeptAside() throws -> ApplyReport {
        let engine = try engine()
        let report = try write { conn in
            var report = ApplyReport()
            try engine.whileApplying(&report, conn) { report in try engine.retryKeptAside(conn, &report) }
            report.stillKeptAside = try conn.keptAside.count()
            return report
        }
        // Conflicts met while retrying are reported like those of an apply, after the commit.
        if let observer = engine.conflictObserver {
            for conflict in report.conflicts { observer(conflict) }
        }
        configuration.logger.debug(
            "retried the kept-aside changes",
            metadata: [
                "tether.resolved": "\(report.resolvedFromKeptAside)",
                "tether.still_kept_aside": "\(report.stillKeptAside)",
            ])
        return report
    }

    /// How far ahead of this machine's clock a peer's timestamps may be (default one hour).
    /// A batch carrying a later timestamp is refused whole (`SyncError.clockSkew`); a sync
    /// session defers it and pulls it again later (Protocol/README.md §8.3), so it goes through
    /// once this clock has caught up to within the limit.
    public func setMaximumClockSkew(_ limit: Duration) throws {
        let engine = try engine()
        try writeWithoutTransaction { _ in engine.clock.maximumSkew = max(.zero, limit) }
    }

    /// Records that `peer` deferred this database's changes after `after` through `through`
    /// (they stay pending, and are sent again when it pulls them): `tether status` shows why
    /// until the peer acknowledges changes beyond `after`.
    public func recordDeferral(by peer: InstanceKey, after: Int64, through: Int64, reason: String) throws {
        try write { try $0.peerStore.recordDeferral(by: peer, after: after, through: through, reason: reason) }
    }

    // MARK: Peers and garbage collection

    /// What this database knows of each of its peers, by instance key.
    public func peers() throws -> [PeerState] {
        try read { try $0.peerStore.all() }
    }
}

extension Condition {
    /// Rows with a local change not yet acknowledged (created or updated), or in flight.
    public static var pendingSync: Condition { .sql(RowMetadataLayout.pendingSQL(table: M.tableName)) }
    /// Rows whose local change was sent and awaits acknowledgement.
    public static var inFlight: Condition { .sql(RowMetadataLayout.inFlightConditionSQL(table: M.tableName)) }
}

/// What the sync layer attaches to an open database: its identity among peers and, when it is
/// writable, the engine whose capture observes the writer.
final class SyncAttachment: DatabaseAttachment {
    /// Read from any thread; changed only by a rekey.
    private let key: Mutex<InstanceKey>
    let engine: SyncEngine?
    /// Where a catch-up's batches wait for its last one (nil for a read-only database).
    let staging: StagingFile?
    /// The catch-ups applied as their batches arrive.
    let catchUpAppliers = CatchUpAppliers()
    /// Acknowledgements that changed no row, waiting for the writer a catch-up holds.
    let postponedAcknowledgements = PostponedAcknowledgements()
    /// The catch-ups served from snapshots now.
    let snapshotSlots = SnapshotSlots()

    init(engine: SyncEngine, staging: StagingFile) {
        key = Mutex(engine.instanceKey)
        self.engine = engine
        self.staging = staging
    }

    init(instanceKey: InstanceKey) {
        key = Mutex(instanceKey)
        engine = nil
        staging = nil
    }

    var instanceKey: InstanceKey { key.withLock { $0 } }

    func didChangeKey(to newKey: InstanceKey) { key.withLock { $0 = newKey } }

    func detach(from writer: Connection) {
        engine?.uninstall(from: writer)
        staging?.close()
    }

    var changelog: (any ChangelogSource)? { engine }
}
