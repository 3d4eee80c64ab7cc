import CSQLite
import Foundation

/// The replication engine of one database, attached to its writer
/// connection: it keeps the instance key, the clock, the synced tables, and
/// captures every change to them in the transaction that makes it.
///
/// All its state is used under the writer's lock, like the writer itself.
final class SyncEngine: @unchecked Sendable {
    let instanceKey: InstanceKey
    /// The local instance's id in `tether_sites`.
    static let localSite: Int32 = 1

    private(set) var tables: [String: SyncedTable] = [:]
    /// For the hook: tables in a flat array, compared by C string.
    private(set) var tableList: [SyncedTable] = []
    /// Bumped whenever the set of synced tables changes, so cached per-model decisions are redone.
    private(set) var generation = 0

    // Clock and sequence: reloaded from `tether_clock` at the first change of
    // each transaction (another process may have written), written back before COMMIT.
    var lastSequence: Int64 = 0
    var clock = HybridTimestamp.zero
    var clockDirty = false
    var needsReload = true
    /// How far ahead of our wall clock a peer's timestamps may be.
    var maximumClockSkew: Duration = .seconds(3600)

    /// PRAGMA schema_version when the tables were loaded.
    private var loadedSchemaVersion: Int64 = 0

    // Sites
    private var lastSite: (key: InstanceKey, id: Int32)?
    private var siteIDs: [InstanceKey: Int32] = [:]
    private var siteKeys: [Int32: InstanceKey] = [:]

    // Capture
    var pending: [CapturedChange] = []
    /// The bulk insert into a synced table in progress, logged as insert ranges.
    var bulkInsert: BulkInsertCapture?
    /// The tables whose capture triggers a `withoutCapture` scope paused.
    var triggersPaused: [SyncedTable] = []
    /// Set when a table captured by triggers was written: fold its pending changes.
    var externalFoldNeeded = true
    var lastDataVersion: Int64 = -1
    /// Set by a rollback: site ids registered in it may be gone.
    var sitesMayBeStale = false

    /// Set only while an apply (or a retry of kept-aside changes) runs: see `whileApplying`.
    var applying: ApplyContext?

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

    static let metadataSchema = """
        CREATE TABLE IF NOT EXISTS tether_meta (key TEXT PRIMARY KEY, value ANY) STRICT;
        CREATE TABLE IF NOT EXISTS tether_clock (id INTEGER PRIMARY KEY CHECK (id = 1), sequence INTEGER NOT NULL, timestamp INTEGER NOT NULL, collected_through INTEGER NOT NULL DEFAULT 0) STRICT;
        CREATE TABLE IF NOT EXISTS tether_sites (id INTEGER PRIMARY KEY, instance_key BLOB NOT NULL UNIQUE) STRICT;
        CREATE TABLE IF NOT EXISTS tether_external_changes (id INTEGER PRIMARY KEY, table_name TEXT NOT NULL, row_id INTEGER NOT NULL, inserted INTEGER NOT NULL, mask INTEGER NOT NULL DEFAULT 0) STRICT;
        CREATE TABLE IF NOT EXISTS tether_capture_paused (table_name TEXT PRIMARY KEY) STRICT, WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS tether_insert_ranges (table_name TEXT NOT NULL, first_rowid INTEGER NOT NULL, last_rowid INTEGER NOT NULL, first_seq INTEGER NOT NULL, timestamp INTEGER NOT NULL, site INTEGER NOT NULL, via INTEGER, status INTEGER NOT NULL DEFAULT 0, sent_through INTEGER NOT NULL DEFAULT 0, acknowledged_through INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (table_name, first_rowid)) STRICT, WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS tether_kept_for_schema (id INTEGER PRIMARY KEY, table_name TEXT NOT NULL, key TEXT NOT NULL, peer BLOB NOT NULL, change BLOB NOT NULL, missing TEXT NOT NULL, first_seen REAL NOT NULL) STRICT;
        """

    /// Attaches the engine to the writer: creates its metadata on first open
    /// (with a new instance key), loads it otherwise.
    static func open(on connection: Connection) throws -> SyncEngine {
        let key: InstanceKey = try connection.transaction(.immediate) {
            // A database of an older layout is moved to this one first, in this transaction.
            try MetadataUpgrade.run(connection)
            try connection.executeScript(metadataSchema + SyncedTableCatalog.schema + PeerStore.schema + KeptAsideStore.schema)
            if let stored = try connection.fetchValue("SELECT value FROM tether_meta WHERE key = 'instance_key'", as: Data.self) {
                guard let key = InstanceKey(bytes: [UInt8](stored)) else {
                    throw SyncError.corruptMetadata("tether_meta.instance_key is \(stored.count) bytes, not 16")
                }
                return key
            }
            let key = InstanceKey.random()
            try connection.execute("INSERT INTO tether_meta (key, value) VALUES ('instance_key', ?)", [Data(key.bytes)])
            try connection.execute("INSERT OR REPLACE INTO tether_meta (key, value) VALUES ('format', ?)", [RowMetadataLayout.formatVersion])
            try connection.execute("INSERT OR IGNORE INTO tether_clock (id, sequence, timestamp) VALUES (1, 0, 0)")
            try connection.execute("INSERT OR REPLACE INTO tether_sites (id, instance_key) VALUES (?, ?)", [Int(localSite), Data(key.bytes)])
            return key
        }
        let engine = SyncEngine(instanceKey: key)
        try engine.loadSites(connection)
        try engine.loadTables(connection)
        if !engine.tables.isEmpty, engine.tables[ExpiryStore.syncedTable] == nil {
            // Synced before expiry dates were: every database that syncs has the store.
            try connection.transaction(.immediate) { try ExpiryStore.enableSynced(engine, connection) }
        }
        engine.install(on: connection)
        return engine
    }

    // MARK: Clock

    /// Reloads the clock at the first change of a transaction.
    func prepareClock(_ connection: Connection) throws {
        guard needsReload else { return }
        // The hook reads columns by position: after a schema change (here or
        // in another process) the synced tables' layout is read again.
        if !tableList.isEmpty, try connection.fetchValue("PRAGMA schema_version", as: Int64.self) != loadedSchemaVersion {
            try loadTables(connection)
        }
        if sitesMayBeStale {
            forgetUncommittedSites(connection)
            sitesMayBeStale = false
        }
        for table in tableList {
            // Whether inserts must look for a tombstone to replace (another
            // process may have deleted rows since the last transaction).
            table.mayHaveDeadRows = try connection.fetchValue(table.layout.deadTableHasRows, as: Bool.self) ?? true
        }
        let statement = try connection.cachedStatement("SELECT sequence, timestamp FROM tether_clock WHERE id = 1")
        try statement.bind(StatementArguments())
        defer { statement.reset() }
        guard try statement.step() else { throw SyncError.corruptMetadata("tether_clock has no row") }
        // max: a rolled-back transaction may have used numbers beyond what is
        // stored; skipping them is harmless, and the clock never goes back.
        lastSequence = max(lastSequence, sqlite3_column_int64(statement.handle, 0))
        sequenceAtTransactionStart = lastSequence
        clock = max(clock, HybridTimestamp(rawValue: UInt64(bitPattern: sqlite3_column_int64(statement.handle, 1))))
        needsReload = false
    }

    @inline(__always)
    func nextSequence() -> Int64 {
        lastSequence += 1
        clockDirty = true
        return lastSequence
    }

    /// A timestamp after every one issued or received.
    func nextTimestamp() -> HybridTimestamp {
        let wall = HybridTimestamp.wallClock()
        clock = wall > clock ? wall : HybridTimestamp(rawValue: clock.rawValue + 1)
        clockDirty = true
        return clock
    }

    /// Moves the clock past a received timestamp; refuses one too far ahead of the wall clock.
    func observe(_ timestamp: HybridTimestamp) throws {
        guard timestamp > clock else { return }
        let wall = HybridTimestamp.wallClock().milliseconds
        let limit = maximumClockSkew.components.seconds * 1000 + maximumClockSkew.components.attoseconds / 1_000_000_000_000_000
        if timestamp.milliseconds > wall, timestamp.milliseconds - wall > UInt64(max(0, limit)) {
            throw SyncError.clockSkew(ahead: .milliseconds(Int64(clamping: timestamp.milliseconds - wall)), limit: maximumClockSkew)
        }
        clock = timestamp
        clockDirty = true
    }

    /// Writes the clock back; runs before every COMMIT that follows changes.
    func writeClock(_ connection: Connection) throws {
        guard clockDirty else { return }
        try connection.cachedStatement("UPDATE tether_clock SET sequence = max(sequence, ?), timestamp = max(timestamp, ?) WHERE id = 1")
            .execute([lastSequence, Int64(bitPattern: clock.rawValue)])
        clockDirty = false
    }

    // MARK: Sites

    private func loadSites(_ connection: Connection) throws {
        for row in try connection.fetchRows("SELECT id, instance_key FROM tether_sites") {
            guard let key = InstanceKey(bytes: [UInt8](try row.get(1, as: Data.self))) else {
                throw SyncError.corruptMetadata("tether_sites holds a key that is not 16 bytes")
            }
            let id = try row.get(0, as: Int32.self)
            siteIDs[key] = id
            siteKeys[id] = key
        }
    }

    /// The local id of a peer's instance key, registered on first sight.
    func siteID(_ key: InstanceKey, _ connection: Connection) throws -> Int32 {
        // The changes of a batch mostly share one origin.
        if let lastSite, lastSite.key == key { return lastSite.id }
        if let id = siteIDs[key] {
            lastSite = (key, id)
            return id
        }
        try connection.execute("INSERT OR IGNORE INTO tether_sites (instance_key) VALUES (?)", [Data(key.bytes)])
        guard let id = try connection.fetchValue("SELECT id FROM tether_sites WHERE instance_key = ?", [Data(key.bytes)], as: Int32.self) else {
            throw SyncError.corruptMetadata("cannot register site \(key)")
        }
        siteIDs[key] = id
        siteKeys[id] = key
        return id
    }

    func siteKey(_ id: Int32) throws -> InstanceKey {
        guard let key = siteKeys[id] else { throw SyncError.corruptMetadata("unknown site id \(id) in tether_versions") }
        return key
    }

    /// Rolled back site registrations must be forgotten (their ids may be reused).
    func forgetUncommittedSites(_ connection: Connection) {
        lastSite = nil
        siteIDs.removeAll()
        siteKeys.removeAll()
        try? loadSites(connection)
    }

    func version(_ local: LocalVersion) throws -> Version {
        Version(timestamp: HybridTimestamp(rawValue: local.timestamp), origin: try siteKey(local.site))
    }

    func localVersion(_ version: Version, _ connection: Connection) throws -> LocalVersion {
        LocalVersion(timestamp: version.timestamp.rawValue, site: try siteID(version.origin, connection))
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
            let definition = try connection.fetchValue("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [name], as: String.self) ?? ""
            let hasTriggers = try connection.fetchValue("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?)", [name], as: Bool.self) ?? true
            let table = try SyncedTable(name: name, keyColumns: record.keyColumns, valueColumns: values, localKeyColumn: record.localKeyColumn,
                                        policy: policy, capturesExternalWrites: record.capturesExternalWrites, positions: positions,
                                        isSimple: !hasTriggers && definition.range(of: "ON CONFLICT", options: .caseInsensitive) == nil)
            if policyName == "custom" && mergeFunctions[name] == nil { table.needsMergeFunction = true }
            table.valueDefaults = values.map { defaults[$0] ?? .null }
            table.hasAddedColumns = values.contains(where: added.contains)
            loaded[name] = table
        }
        tables = loaded
        tableList = Array(loaded.values)
        generation += 1
        loadedSchemaVersion = try connection.fetchValue("PRAGMA schema_version", as: Int64.self) ?? 0
        needsReload = true
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
