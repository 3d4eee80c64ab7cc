import CSQLite
import Foundation
import Logging

/// The replication engine of one database, attached to its writer
/// connection: it keeps the instance key, the clock, the synced tables, and
/// captures every change to them in the transaction that makes it.
///
/// All its state is used under the writer's lock, like the writer itself. The state the capture
/// reads per changed row is `@exclusivity(unchecked)`: Swift's run-time check of each access cost
/// hundreds of instructions per row, and no two accesses can overlap under that lock.
final class SyncEngine: @unchecked Sendable {
    /// This database's key among its peers (a rekey replaces it).
    var instanceKey: InstanceKey
    /// Set while this database is a copy not yet rekeyed: it does not sync (see `Rekey.swift`).
    var copyDetection: CopyDetection?
    /// Set by a rekey: the identity is read again at the next transaction, in case it rolled back.
    var identityMayBeStale = false
    /// The clock of this database's versions and the sequence of its changes.
    let clock = HybridClock()
    /// The instance keys met so far, by local id.
    let sites = SiteRegistry()

    private(set) var tables: [String: SyncedTable] = [:]
    /// For the hook: tables in a flat array, compared by C string.
    @exclusivity(unchecked) private(set) var tableList: [SyncedTable] = []
    /// Some synced table is WITHOUT ROWID: the hook never sees its rows, only what its triggers
    /// write to `tether_external_changes` (see `capture`).
    private(set) var hasTablesWithoutRowid = false
    /// The trigger-captured tables whose triggers pause while this connection writes (see
    /// `ExternalWrites.swift`): every one with a rowid, which the hook sees.
    private(set) var ownWriteTriggerTables: [SyncedTable] = []
    /// Bumped whenever the set of synced tables changes, so cached per-model decisions are redone.
    private(set) var generation = 0

    /// PRAGMA schema_version when the tables were loaded.
    private var loadedSchemaVersion: Int64 = 0

    /// Whether `enableSync(allExcept:)`'s standing rule is recorded: tables made on the writer are
    /// then synced as they appear (`StandingSyncRule.swift`).
    var hasStandingRule = false
    /// The function of the standing rule's custom policy, when this opening was given one.
    var standingRuleMerge: MergeFunction?
    /// Where the engine tells what it decides on its own (a table the standing rule leaves local):
    /// the database's logger.
    var logger: Logger?

    // Capture
    @exclusivity(unchecked) var pending: [CapturedChange] = []
    /// The write statement running, when it is an UPDATE of a synced table: the columns it may change.
    @exclusivity(unchecked) var runningUpdate: StatementNote?
    /// The bulk insert into a synced table in progress, logged as insert ranges.
    var bulkInsert: BulkInsertCapture?
    /// Updates of consecutive rows of an insert range, not written yet (`UpdateRuns.swift`).
    @exclusivity(unchecked) var updateRun: UpdateRun?
    /// The version of the local changes of the transaction in progress (`localChangeVersion`).
    @exclusivity(unchecked) var transactionVersion: LocalVersion?
    /// The tables whose capture triggers a `withoutCapture` scope paused.
    var triggersPaused: [SyncedTable] = []
    /// Other programs' writes to trigger-captured tables: when they were last looked for, and
    /// whether some wait for their metadata.
    @exclusivity(unchecked) var externalWrites = ExternalWriteTracking()

    /// Set only while an apply (or a retry of kept-aside changes) runs: see `whileApplying`.
    @exclusivity(unchecked) var applying: ApplyContext?
    /// Set while a scoped writer's batch is applied: its changes are checked against it (`ScopedWrites.swift`).
    var writerScope: CompiledScope?

    /// Forgets the expiry of deleted rows (see `ExpiryStore`); installed with the capture.
    private(set) lazy var expiry = ExpiryObserver(engine: self)

    // Observation
    /// The last sequence number before this transaction's first change, and the numbers the
    /// last commit gave (see `Changelog+Observation.swift`).
    var sequenceAtTransactionStart: Int64 = 0
    var lastCommittedSequences: ClosedRange<Int64>?
    var conflictObserver: (@Sendable (Conflict) -> Void)?
    var mergeFunctions: [String: MergeFunction] = [:]

    private init(instanceKey: InstanceKey) {
        self.instanceKey = instanceKey
    }

    // MARK: Opening

    /// Every table of Tether's sync metadata, each from its owner.
    static let metadataSchema = InstanceIdentity.schema + HybridClock.schema + SiteRegistry.schema + SyncedTableCatalog.schema
        + PeerStore.schema + KeptAsideStore.schema + insertRangesSchema + externalWritesSchema + keptForSchemaSchema
        + ScopeMembership.schema + EvictionLog.schema + RefusalStore.schema + PartialTables.schema

    /// Attaches the engine to the writer: creates its metadata on first open
    /// (with a new instance key), loads it otherwise.
    static func open(on connection: Connection) throws -> SyncEngine {
        let key: InstanceKey = try connection.transaction(.immediate) {
            // A database of an older layout is moved to this one first, in this transaction.
            try MetadataUpgrade.run(connection)
            try connection.executeScript(metadataSchema)
            if let key = try InstanceIdentity.storedKey(connection) { return key }
            let key = try InstanceIdentity.create(connection)
            try HybridClock.create(connection)
            try SiteRegistry.registerLocal(key, connection)
            return key
        }
        let engine = SyncEngine(instanceKey: key)
        engine.hasStandingRule = try connection.syncedTableCatalog.standingRule() != nil
        try engine.sites.load(connection)
        try engine.loadTables(connection)
        try engine.checkIdentity(connection)
        if !engine.tables.isEmpty, engine.tables[ExpiryStore.syncedTable] == nil {
            // Synced before expiry dates were: every database that syncs has the store.
            try connection.transaction(.immediate) { try ExpiryStore.enableSynced(engine, connection) }
        }
        engine.install(on: connection)
        return engine
    }

    // MARK: Clock

    /// Reads again, at the first change of a transaction, what another process (or a rollback)
    /// may have changed: the tables' layout, the sites, whether tombstones exist, the clock.
    func prepareClock(_ connection: Connection) throws {
        guard clock.needsReload else { return }
        try reloadIdentityIfStale(connection)
        // The hook reads columns by position: after a schema change (here or
        // in another process) the synced tables' layout is read again.
        if !tableList.isEmpty, try connection.fetchValue("PRAGMA schema_version", as: Int64.self) != loadedSchemaVersion {
            try loadTables(connection)
        }
        sites.reloadIfStale(connection)
        for table in tableList {
            // Whether inserts must look for a tombstone to replace (another
            // process may have deleted rows since the last transaction).
            table.mayHaveDeadRows = try connection.fetchValue(table.layout.deadTableHasRows, as: Bool.self) ?? true
        }
        try clock.reload(connection)
        sequenceAtTransactionStart = clock.lastSequence
    }

    func version(_ local: LocalVersion) throws -> Version {
        Version(timestamp: HybridTimestamp(rawValue: local.timestamp), origin: try sites.key(of: local.site))
    }

    func localVersion(_ version: Version, _ connection: Connection) throws -> LocalVersion {
        LocalVersion(timestamp: version.timestamp.rawValue, site: try sites.id(of: version.origin, connection))
    }

    // MARK: Tables

    func table(named name: String) -> SyncedTable? { tables[name] }

    func loadTables(_ connection: Connection) throws {
        var loaded: [String: SyncedTable] = [:]
        let catalog = connection.syncedTableCatalog
        for record in try catalog.records() {
            let name = record.name
            let values = record.valueColumns
            let policyName = record.policyName
            let policy = ConflictPolicy(storedName: policyName, merge: mergeFunctions[name])
                ?? (policyName == "custom" ? .lastWriterWins : nil)
            guard let policy else { throw SyncError.corruptMetadata("unknown conflict policy \(policyName) for \(name)") }
            let positions = try columnPositions(of: name, connection)
            let defaults = try columnDefaults(of: name, connection)
            let added = try catalog.addedColumns(of: name)
            let table = try SyncedTable(name: name, keyColumns: record.keyColumns, valueColumns: values, localKeyColumn: record.localKeyColumn,
                                        policy: policy, capturesExternalWrites: record.capturesExternalWrites, positions: positions,
                                        insertsChangeNothingElse: try connection.insertsChangeNothingElse(into: name),
                                        withoutRowidKey: try WithoutRowidKey.of(name, connection))
            if policyName == "custom" && mergeFunctions[name] == nil { table.needsMergeFunction = true }
            table.valueDefaults = values.map { defaults[$0] ?? .null }
            table.addedColumns = values.map(added.contains)
            // An INTEGER PRIMARY KEY aliases the rowid unless declared DESC, which gives it an index.
            table.keyIsRowid = try table.keyColumns.count == 1 && !table.isWithoutRowid
                && connection.fetchValue("""
                    SELECT count(*) = 1 AND max(pk = 1 AND name = ?1 AND upper(type) = 'INTEGER')
                      AND NOT EXISTS (SELECT 1 FROM pragma_index_list(?2) WHERE origin = 'pk')
                    FROM pragma_table_info(?2) WHERE pk > 0
                    """, [table.keyColumns[0], name], as: Bool.self) == true
            loaded[name] = table
        }
        tables = loaded
        tableList = Array(loaded.values)
        hasTablesWithoutRowid = tableList.contains(where: \.isWithoutRowid)
        ownWriteTriggerTables = tableList.filter { $0.capturesExternalWrites && !$0.isWithoutRowid }
        try switchSchemaTriggersForOwnWrites(connection)
        generation += 1
        loadedSchemaVersion = try connection.fetchValue("PRAGMA schema_version", as: Int64.self) ?? 0
        clock.invalidate()
        updateCaptureHook(connection)
    }

    /// Each column's default value (NULL without one), its expression evaluated once.
    func columnDefaults(of table: String, _ connection: Connection) throws -> [String: DatabaseValue] {
        var defaults: [String: DatabaseValue] = [:]
        for row in try connection.fetchRows("SELECT name, dflt_value FROM pragma_table_info(?) WHERE dflt_value IS NOT NULL", [table]) {
            let expression = try row.get(1, as: String.self)
            defaults[try row.get(0, as: String.self)] = (try? connection.fetchRow("SELECT \(expression)"))?.values.first ?? .null
        }
        return defaults
    }

    func columnPositions(of table: String, _ connection: Connection) throws -> [String: Int32] {
        var positions: [String: Int32] = [:]
        for row in try connection.fetchRows("SELECT cid, name FROM pragma_table_info(?)", [table]) {
            positions[try row.get(1, as: String.self)] = try row.get(0, as: Int32.self)
        }
        return positions
    }
}
