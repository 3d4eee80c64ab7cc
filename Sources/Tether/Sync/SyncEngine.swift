import CSQLite
import Foundation
import Logging

/// The replication engine of one database, attached to its writer connection: it keeps the
/// instance key, the clock, the sites and the synced tables, and holds the capture of local
/// changes (`Capture/`), the extraction of what a peer lacks and the apply of what a peer sends
/// (`Apply/`).
///
/// All its state is used under the writer's lock, like the writer itself.
final class SyncEngine: @unchecked Sendable {
    /// This database's key among its peers (a rekey replaces it).
    var instanceKey: InstanceKey
    /// Set while this database is a copy not yet rekeyed: it does not sync (see `Rekey.swift`).
    var copyDetection: CopyDetection?
    /// Set by a rekey: the identity is read again at the next transaction, in case it rolled back.
    var identityMayBeStale = false
    /// The clock of this database's versions and the sequence of its changes.
    let clock = HybridClock()
    /// Since when this site's counter contributions keep their earlier values (`ContributionHistory`):
    /// 0, or the clock at which the database moved to format 7.
    var counterHistoryKeptSince: UInt64 = 0
    /// The floor below which they need not, read at most once a second (`contributionHistoryFloor`).
    var contributionFloorCache: (floor: UInt64, read: ContinuousClock.Instant)?
    /// The instance keys met so far, by local id.
    let sites = SiteRegistry()

    /// The synced tables as loaded from the catalog (shared with the capture).
    let syncedTables = SyncedTables()
    var tables: [String: SyncedTable] { syncedTables.byName }
    var tableList: [SyncedTable] { syncedTables.list }
    /// A version for a change made here now: the next timestamp, under this database's site.
    func newLocalVersion() -> LocalVersion {
        LocalVersion(timestamp: clock.nextTimestamp().rawValue, site: sites.local)
    }

    /// The synced tables in the order a batch lists them (by name): the index a change refers to.
    var tablesInBatchOrder: [SyncedTable] { tableList.sorted { $0.name < $1.name } }

    /// Where the engine tells what it decides on its own (a table the standing rule leaves local):
    /// the database's logger.
    var logger: Logger?

    /// The capture of local changes, an observer of the writer (`Capture/`).
    private(set) lazy var capture = ChangeCapture(engine: self)
    /// Forgets the expiry of deleted rows (see `ExpiryStore`); installed with the capture.
    private(set) lazy var expiry = ExpiryObserver(engine: self)

    // Apply
    /// Set only while an apply (or a retry of kept-aside changes) runs: see `whileApplying`.
    /// Unchecked: read for every row a first sync inserts (`logAppliedInsert`).
    @exclusivity(unchecked) var applying: ApplyContext?
    /// While an apply runs and someone observes: where the source transaction of each change it
    /// writes is told (`willWrite`). Apart from `applying`, whose reading copies the whole context.
    @exclusivity(unchecked) var sourceTransactionRecorder: ObservationBroker?
    /// Set while a scoped writer's batch is applied: its changes are checked against it (`ScopedWrites.swift`).
    var writerScope: CompiledScope?
    var conflictObserver: (@Sendable (Conflict) -> Void)?

    private init(instanceKey: InstanceKey) {
        self.instanceKey = instanceKey
    }

    // MARK: Opening

    /// Every table of Tether's sync metadata, each from its owner.
    static let metadataSchema =
        InstanceIdentity.schema + HybridClock.schema + SiteRegistry.schema + SyncedTableCatalog.schema
        + PeerStore.schema + KeptAsideStore.schema + StagedBatchStore.formerTableSchema + insertRangesSchema
        + ChangeCapture.externalWritesSchema
        + keptForSchemaSchema
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
        engine.syncedTables.hasStandingRule = try connection.syncedTableCatalog.standingRule() != nil
        try engine.sites.load(connection)
        engine.counterHistoryKeptSince = try InstanceIdentity.counterHistoryKeptSince(connection)
        try engine.loadTables(connection)
        try engine.checkIdentity(connection)
        if !engine.tables.isEmpty, engine.tables[ExpiryStore.syncedTable] == nil {
            // Synced before expiry dates were: every database that syncs has the store.
            try connection.transaction(.immediate) { try ExpiryStore.enableSynced(engine, connection) }
        }
        engine.install(on: connection)
        return engine
    }

    /// Installs the capture and the expiry observer on the writer.
    func install(on connection: Connection) {
        capture.install(on: connection)
        connection.add(expiry)
    }

    func uninstall(from connection: Connection) {
        connection.remove(expiry)
        capture.uninstall(from: connection)
        for table in tableList { table.releaseStatements() }
    }

    // MARK: Clock

    /// Reads again, at the first change of a transaction, what another process (or a rollback)
    /// may have changed: the tables' layout, the sites, whether tombstones exist, the clock.
    func prepareClock(_ connection: Connection) throws {
        guard clock.needsReload else { return }
        try reloadIdentityIfStale(connection)
        // The hook reads columns by position: after a schema change (here or
        // in another process) the synced tables' layout is read again.
        if !tableList.isEmpty,
            try connection.fetchValue("PRAGMA schema_version", as: Int64.self) != syncedTables.schemaVersion
        {
            try loadTables(connection)
        }
        sites.reloadIfStale(connection)
        for table in tableList {
            // Whether inserts must look for a tombstone to replace (another
            // process may have deleted rows since the last transaction).
            table.mayHaveDeadRows = try connection.fetchValue(table.layout.deadTableHasRows, as: Bool.self) ?? true
        }
        try clock.reload(connection)
        capture.sequenceAtTransactionStart = clock.lastSequence
    }

    /// The transaction's changes are undone: so is what the clock and the sites took in memory.
    func transactionDidRollBack() {
        // The rolled-back transaction's clock write is gone with it; the numbers it used stay used
        // in memory (skipping them is harmless). Left set, the flag made the next COMMIT write the
        // clock, which fails in a read-only transaction (the reads of an in-memory database).
        clock.discardUnwritten()
        sites.noteRollback()
    }

    func version(_ local: LocalVersion) throws -> Version {
        Version(timestamp: HybridTimestamp(rawValue: local.timestamp), origin: try sites.key(of: local.site))
    }

    func localVersion(_ version: Version, _ connection: Connection) throws -> LocalVersion {
        LocalVersion(timestamp: version.timestamp.rawValue, site: try sites.id(of: version.origin, connection))
    }

    /// Translates one change's versions to local ones: the columns of a row mostly share a version
    /// or two, looked up once per run.
    struct LocalVersionLookup {
        let engine: SyncEngine
        let connection: Connection
        private var last: (version: Version, local: LocalVersion)?

        init(_ engine: SyncEngine, _ connection: Connection) {
            self.engine = engine
            self.connection = connection
        }

        mutating func callAsFunction(_ version: Version) throws -> LocalVersion {
            if let last, last.version == version { return last.local }
            let local = try engine.localVersion(version, connection)
            last = (version, local)
            return local
        }
    }

    /// The versions of a row's `count` value columns: the columns of a row mostly share a version
    /// or two, looked up once per run.
    func columnVersions(_ versions: RowVersions, count: Int) throws -> [Version] {
        var last: (local: LocalVersion, version: Version)?
        return try (0..<count).map { index in
            let local = versions.column(index)
            if let last, last.local == local { return last.version }
            let found = try version(local)
            last = (local, found)
            return found
        }
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
            let merge = syncedTables.mergeFunctions[name]
            let policy =
                ConflictPolicy(storedName: policyName, merge: merge)
                ?? (policyName == "custom" ? .lastWriterWins : nil)
            guard let policy else {
                throw SyncError.corruptMetadata("unknown conflict policy \(policyName) for \(name)")
            }
            let positions = try columnPositions(of: name, connection)
            let defaults = try columnDefaults(of: name, connection)
            let added = try catalog.addedColumns(of: name)
            let table = try SyncedTable(
                name: name, keyColumns: record.keyColumns, valueColumns: values, localKeyColumn: record.localKeyColumn,
                policy: policy, capturesExternalWrites: record.capturesExternalWrites, positions: positions,
                insertsChangeNothingElse: try connection.insertsChangeNothingElse(into: name),
                withoutRowidKey: try WithoutRowidKey.of(name, connection))
            if policyName == "custom" && merge == nil { table.needsMergeFunction = true }
            table.valueDefaults = values.map { defaults[$0] ?? .null }
            table.addedColumns = values.map(added.contains)
            table.columnRules = values.map(record.rule(of:))
            table.counterColumns = table.columnRules.indices.filter { table.columnRules[$0] == .counter }
            table.orderedColumns = table.columnRules.indices.filter { table.columnRules[$0].isOrdered }
            table.rowRule = record.rowRule
            // An INTEGER PRIMARY KEY aliases the rowid unless declared DESC, which gives it an index.
            table.keyIsRowid =
                try table.keyColumns.count == 1 && !table.isWithoutRowid
                && connection.fetchValue(
                    """
                    SELECT count(*) = 1 AND max(pk = 1 AND name = ?1 AND upper(type) = 'INTEGER')
                      AND NOT EXISTS (SELECT 1 FROM pragma_index_list(?2) WHERE origin = 'pk')
                    FROM pragma_table_info(?2) WHERE pk > 0
                    """, [table.keyColumns[0], name], as: Bool.self) == true
            loaded[name] = table
        }
        syncedTables.replace(
            with: loaded, schemaVersion: try connection.fetchValue("PRAGMA schema_version", as: Int64.self) ?? 0)
        clock.invalidate()
        try capture.tablesDidLoad(connection)
    }

    /// Each column's default value (NULL without one), its expression evaluated once.
    func columnDefaults(of table: String, _ connection: Connection) throws -> [String: DatabaseValue] {
        var defaults: [String: DatabaseValue] = [:]
        for row in try connection.fetchRows(
            "SELECT name, dflt_value FROM pragma_table_info(?) WHERE dflt_value IS NOT NULL", [table])
        {
            let expression = try row.get(1, as: String.self)
            defaults[try row.get(0, as: String.self)] =
                (try? connection.fetchRow("SELECT \(expression)"))?.values.first ?? .null
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
