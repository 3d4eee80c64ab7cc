/// How a table settles a remote change to a row that has a pending or
/// in-flight local change.
public enum ConflictPolicy: Sendable, CustomStringConvertible {
    /// Per column, the later version wins (hybrid clock, then instance key).
    /// Every peer reaches the same result whatever the order of delivery.
    case lastWriterWins
    /// The local row is kept as is (sModel's rule, for a client of an
    /// authoritative server): pending and in-flight rows are not overwritten.
    case localWins
    /// The remote row replaces the local one, and the local change is dropped.
    case remoteWins
    /// A function given both versions returns the merged values; the result is
    /// written as a new local change, so it reaches the other peers.
    case custom(MergeFunction)

    public var description: String {
        switch self {
        case .lastWriterWins: return "lastWriterWins"
        case .localWins: return "localWins"
        case .remoteWins: return "remoteWins"
        case .custom: return "custom"
        }
    }

    init?(storedName: String, merge: MergeFunction?) {
        switch storedName {
        case "lastWriterWins": self = .lastWriterWins
        case "localWins": self = .localWins
        case "remoteWins": self = .remoteWins
        case "custom":
            guard let merge else { return nil }
            self = .custom(merge)
        default: return nil
        }
    }
}

/// Merges a conflicting row: given the local and the remote version of the
/// row (column name → value), returns the values to keep.
public typealias MergeFunction = @Sendable (_ local: [String: DatabaseValue], _ remote: [String: DatabaseValue]) throws -> [String: DatabaseValue]

/// A synced table as the engine knows it: its columns, where they sit in the
/// table (for the pre-update hook), and the SQL the engine runs on it.
final class SyncedTable {
    let name: String
    let quotedName: String
    /// Identity across peers.
    let keyColumns: [String]
    /// The other synced columns, in the order of `tether_versions`.
    let valueColumns: [String]
    /// The local INTEGER primary key, when the identity is a secondary key: never synced.
    let localKeyColumn: String?
    var policy: ConflictPolicy
    /// Writes by other programs are captured by triggers (and the hook leaves this table alone).
    let capturesExternalWrites: Bool
    let deadTableName: String

    /// Positions in the table (the pre-update hook reads columns by position).
    let keyPositions: [Int32]
    let valuePositions: [Int32]
    let versionsPosition: Int32
    let statusPosition: Int32
    /// The table name as C bytes, for the hook's comparison without allocating.
    let cName: [CChar]

    let descriptor: TableDescriptor
    /// No triggers and no ON CONFLICT clauses: a single-row INSERT OR FAIL
    /// behaves exactly like INSERT, without a statement journal, and an insert
    /// changes no other table.
    let isSimple: Bool

    /// The engine's statements on this table, prepared once on the writer.
    enum Query: Int, CaseIterable {
        case selectLiveByKey, selectDeadByKey, updateMetaByRowid, upsertDead, deleteDeadByKey, deleteDeadForRowid
        case insertLive, insertNewLive, insertNewRanged, updateLive, deleteLiveByRowid, selectLiveChanges, selectDeadChanges, selectRangeRows
    }
    private var prepared: [Statement?] = Array(repeating: nil, count: Query.allCases.count)

    func statement(_ query: Query, _ connection: Connection) throws -> Statement {
        if let statement = prepared[query.rawValue], !statement.isBusy { return statement }
        let sql: String
        switch query {
        case .selectLiveByKey: sql = selectLiveByKey
        case .selectDeadByKey: sql = selectDeadByKey
        case .updateMetaByRowid: sql = updateMetaByRowid
        case .upsertDead: sql = upsertDead
        case .deleteDeadByKey: sql = deleteDeadByKey
        case .deleteDeadForRowid: sql = deleteDeadForRowid
        case .insertLive: sql = insertLive
        case .insertNewLive: sql = isSimple ? insertLive.replacingOccurrences(of: "INSERT INTO", with: "INSERT OR FAIL INTO") : insertLive
        case .insertNewRanged:
            // A row of an insert range: synced, its sequence number and versions left to the range.
            let columns = allColumns.map(quoteIdentifier)
            sql = "INSERT OR FAIL INTO \(quotedName) (\(columns.joined(separator: ", ")), tether_status, tether_in_flight) VALUES ("
                + Array(repeating: "?", count: columns.count).joined(separator: ", ") + ", 0, 0)"
        case .updateLive: sql = updateLive
        case .deleteLiveByRowid: sql = deleteLiveByRowid
        case .selectLiveChanges: sql = selectLiveChanges
        case .selectDeadChanges: sql = selectDeadChanges
        case .selectRangeRows:
            sql = "SELECT \(allColumns.map(quoteIdentifier).joined(separator: ", ")), rowid FROM \(quotedName) WHERE rowid BETWEEN ? AND ? AND tether_seq IS NULL ORDER BY rowid LIMIT ?"
        }
        let statement = try connection.prepare(sql)
        prepared[query.rawValue] = statement
        return statement
    }

    /// Set once a dead row may exist, so that inserts look for one to replace.
    var mayHaveDeadRows = true
    /// The stored policy is custom, but no merge function is registered in this process.
    var needsMergeFunction = false

    // SQL
    let selectLiveByKey: String
    let selectDeadByKey: String
    let updateMetaByRowid: String
    let upsertDead: String
    let deleteDeadByKey: String
    let deleteDeadForRowid: String
    let insertLive: String
    let updateLive: String
    let deleteLiveByRowid: String
    let selectLiveChanges: String
    let selectDeadChanges: String

    init(name: String, keyColumns: [String], valueColumns: [String], localKeyColumn: String?, policy: ConflictPolicy,
         capturesExternalWrites: Bool, positions: [String: Int32], isSimple: Bool) throws {
        self.isSimple = isSimple
        self.name = name
        self.keyColumns = keyColumns
        self.valueColumns = valueColumns
        self.localKeyColumn = localKeyColumn
        self.policy = policy
        self.capturesExternalWrites = capturesExternalWrites
        quotedName = quoteIdentifier(name)
        deadTableName = "tether_dead_\(name)"
        let dead = quoteIdentifier(deadTableName)
        func position(_ column: String) throws -> Int32 {
            guard let position = positions[column] else {
                throw SyncError.schemaMismatch("table \(name) has no column \(column)")
            }
            return position
        }
        keyPositions = try keyColumns.map(position)
        valuePositions = try valueColumns.map(position)
        versionsPosition = try position("tether_versions")
        statusPosition = try position("tether_status")
        cName = Array(name.utf8CString)
        descriptor = TableDescriptor(name: name, keyColumns: keyColumns, valueColumns: valueColumns)

        let keys = keyColumns.map(quoteIdentifier)
        let values = valueColumns.map(quoteIdentifier)
        let keyMatch = keys.map { "\($0) = ?" }.joined(separator: " AND ")
        let all = (keys + values).joined(separator: ", ")
        let meta = "tether_seq, tether_status, tether_in_flight, tether_versions, tether_via"
        let allPlaceholders = Array(repeating: "?", count: keys.count + values.count + 5).joined(separator: ", ")
        selectLiveByKey = "SELECT rowid, \(all), tether_status, tether_in_flight, tether_versions FROM \(quotedName) WHERE \(keyMatch)"
        selectDeadByKey = "SELECT \(all), tether_status, tether_in_flight, tether_versions FROM \(dead) WHERE \(keyMatch)"
        updateMetaByRowid = "UPDATE \(quotedName) SET tether_seq = ?, tether_status = ?, tether_in_flight = 0, tether_versions = ?, tether_via = ? WHERE rowid = ?"
        upsertDead = "INSERT OR REPLACE INTO \(dead) (\(all), \(meta)) VALUES (\(allPlaceholders))"
        deleteDeadByKey = "DELETE FROM \(dead) WHERE \(keyMatch)"
        let keyTuple = keys.count == 1 ? keys[0] : "(\(keys.joined(separator: ", ")))"
        deleteDeadForRowid = "DELETE FROM \(dead) WHERE \(keyTuple) IN (SELECT \(keys.joined(separator: ", ")) FROM \(quotedName) WHERE rowid = ?)"
        insertLive = "INSERT INTO \(quotedName) (\(all), \(meta)) VALUES (\(allPlaceholders))"
        let setValues = (values.map { "\($0) = ?" } + ["tether_seq = ?", "tether_status = ?", "tether_in_flight = ?", "tether_versions = ?", "tether_via = ?"]).joined(separator: ", ")
        updateLive = "UPDATE \(quotedName) SET \(setValues) WHERE rowid = ?"
        deleteLiveByRowid = "DELETE FROM \(quotedName) WHERE rowid = ?"
        selectLiveChanges = "SELECT \(all), tether_seq, tether_versions, tether_status, tether_via, rowid FROM \(quotedName) WHERE tether_seq > ? ORDER BY tether_seq LIMIT ?"
        selectDeadChanges = "SELECT \(all), tether_seq, tether_versions, tether_status, tether_via FROM \(dead) WHERE tether_seq > ? ORDER BY tether_seq LIMIT ?"
    }

    var allColumns: [String] { keyColumns + valueColumns }
}

/// Errors of the replication engine.
public enum SyncError: Error, Sendable, CustomStringConvertible {
    /// A table cannot be synced as asked, and why.
    case invalidTable(String)
    /// A batch does not match this database's synced tables.
    case schemaMismatch(String)
    /// The table is not synced.
    case notSynced(String)
    /// A peer's clock is too far ahead of ours.
    case clockSkew(String)
    /// A sync file cannot be read.
    case invalidSyncFile(String)
    /// The engine's own metadata is damaged.
    case corruptMetadata(String)
    /// A table uses a custom merge, but none is registered in this process.
    case missingMergeFunction(String)
    /// A batch left out values this database does not hold at their versions: nothing of it was
    /// applied; ask the sender for whole rows (`extractChanges(…, allowingPartialRows: false)`).
    case needsWholeRows(String)

    public var description: String {
        switch self {
        case let .invalidTable(reason): return "cannot sync table: \(reason)"
        case let .schemaMismatch(reason): return "schema mismatch: \(reason)"
        case let .notSynced(table): return "table \(table) is not synced"
        case let .clockSkew(reason): return "clock skew: \(reason)"
        case let .invalidSyncFile(reason): return "invalid sync file: \(reason)"
        case let .corruptMetadata(reason): return "damaged sync metadata: \(reason)"
        case let .needsWholeRows(reason): return "the batch needs whole rows: \(reason)"
        case let .missingMergeFunction(table): return "table \(table) resolves conflicts with a custom merge, but none is registered; call setConflictPolicy(.custom(…), for:) after opening"
        }
    }
}
