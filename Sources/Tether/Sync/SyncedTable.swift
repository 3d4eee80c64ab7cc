/// A synced table as the engine knows it: its columns, where they sit in the
/// table (for the pre-update hook), the layout of its metadata, and the
/// engine's statements on it.
final class SyncedTable {
    let name: String
    let quotedName: String
    /// Identity across peers.
    let keyColumns: [String]
    /// The other synced columns, in the order of a row's versions.
    let valueColumns: [String]
    /// The local INTEGER primary key, when the identity is a secondary key: never synced.
    let localKeyColumn: String?
    var policy: ConflictPolicy
    /// Writes by other programs are captured by triggers (and the hook leaves this table alone).
    let capturesExternalWrites: Bool
    /// Where this table's sync metadata lives, and the SQL that reads and writes it.
    let layout: RowMetadataLayout
    /// Declared WITHOUT ROWID: its rows are named by surrogates (see `RowMetadataLayout`).
    let isWithoutRowid: Bool

    /// Positions in the table (the pre-update hook reads columns by position).
    let keyPositions: [Int32]
    let valuePositions: [Int32]
    /// The table name as C bytes, for the hook's comparison without allocating.
    let cName: [CChar]

    let descriptor: TableDescriptor
    /// No triggers and no ON CONFLICT clauses: a single-row INSERT OR FAIL
    /// behaves exactly like INSERT, without a statement journal, and an insert
    /// changes no other table.
    let insertsChangeNothingElse: Bool

    /// Whether `name` is one of Tether's own tables or SQLite's (table names are case-insensitive):
    /// never synced as a user's table, nor named by a change to one.
    static func isInternal(_ name: String) -> Bool {
        let lowercased = name.lowercased()
        return lowercased.hasPrefix("tether_") || lowercased.hasPrefix("sqlite_")
    }

    /// The engine's statements on this table, prepared once on the writer.
    enum Query: Int, CaseIterable {
        case selectLiveByKey, selectStateByKey, selectDeadByKey, selectRowMetadata, upsertRowMetadata,
            deleteRowMetadata, moveRowMetadata
        case upsertDead, deleteDeadByKey, deleteDeadForRowid, deleteDeadForRowids
        case insertLive, insertNewLive, updateLive, deleteLiveByRowid, selectLiveChanges, selectDeadChanges,
            selectRangeRows
        case selectRowidsWithMetadata, selectRangeContaining
        case pauseTriggers, resumeTriggers
        /// A table with counter columns only.
        case selectCounters, updateCounters, selectCountersByKey, upsertRowMetadataWithCounters
        /// A table WITHOUT ROWID only.
        case selectRowidByKey, insertKeyByKey
    }
    /// Read per change, under the writer's lock only: no run-time exclusivity check.
    @exclusivity(unchecked) private var prepared: [Statement?] = Array(repeating: nil, count: Query.allCases.count)

    /// Finalizes the prepared statements: a connection closes for good (its write-ahead log folded
    /// into the file) only once none is left.
    func releaseStatements() {
        prepared = Array(repeating: nil, count: Query.allCases.count)
        partialUpdates = [:]
    }

    /// A set of value columns, bit `i` for `valueColumns[i]` (tables of at most 64 value columns).
    typealias PartialColumns = UInt64
    /// The UPDATEs of some value columns of a row (binds: their values in column order, rowid).
    @exclusivity(unchecked) private var partialUpdates: [PartialColumns: Statement] = [:]

    func partialUpdate(_ columns: PartialColumns, _ connection: Connection) throws -> Statement {
        if let statement = partialUpdates[columns], !statement.isBusy { return statement }
        let statement = try connection.prepare(
            layout.updateLive(valueColumns.indices.filter { columns & (1 << $0) != 0 }))
        partialUpdates[columns] = statement
        return statement
    }

    func statement(_ query: Query, _ connection: Connection) throws -> Statement {
        if let statement = prepared[query.rawValue], !statement.isBusy { return statement }
        let statement = try connection.prepare(try sql(of: query))
        prepared[query.rawValue] = statement
        return statement
    }

    /// `query` on a connection other than the writer (a catch-up's snapshot reader, see
    /// `CatchUpSnapshot`): from that connection's own statement cache.
    func statement(_ query: Query, onReader reader: Connection) throws -> Statement {
        try reader.cachedStatement(try sql(of: query))
    }

    private func sql(of query: Query) throws -> String {
        let sql: String
        switch query {
        case .selectLiveByKey: sql = layout.selectLiveByKey
        case .selectStateByKey: sql = layout.selectStateByKey
        case .selectDeadByKey: sql = layout.selectDeadByKey
        case .selectRowMetadata: sql = layout.selectRowMetadata
        case .upsertRowMetadata: sql = layout.upsertRowMetadata
        case .deleteRowMetadata: sql = layout.deleteRowMetadata
        case .moveRowMetadata: sql = layout.moveRowMetadata
        case .upsertDead: sql = layout.upsertDead
        case .deleteDeadByKey: sql = layout.deleteDeadByKey
        case .deleteDeadForRowid: sql = layout.deleteDeadForRowid
        case .deleteDeadForRowids: sql = layout.deleteDeadForRowids(keyIsRowid: keyIsRowid)
        case .insertLive: sql = layout.insertLive
        case .insertNewLive:
            sql =
                insertsChangeNothingElse
                ? layout.insertLive.replacingOccurrences(of: "INSERT INTO", with: "INSERT OR FAIL INTO")
                : layout.insertLive
        case .updateLive:
            guard let update = layout.updateLive else {
                throw SyncError.corruptMetadata("table \(name) has no value column to update")
            }
            sql = update
        case .deleteLiveByRowid: sql = layout.deleteLiveByRowid
        case .selectLiveChanges: sql = layout.selectLiveChanges
        case .selectDeadChanges: sql = layout.selectDeadChanges
        case .selectRangeRows: sql = layout.selectRangeRows
        case .selectRowidsWithMetadata: sql = layout.selectRowidsWithMetadata
        case .selectRangeContaining: sql = InsertRange.selectContainingSQL(table: name)
        case .pauseTriggers: sql = layout.pauseTriggers
        case .resumeTriggers: sql = layout.resumeTriggers
        case .selectCounters: sql = layout.selectCounters
        case .updateCounters: sql = layout.updateCounters
        case .selectCountersByKey: sql = layout.selectCountersByKey
        case .upsertRowMetadataWithCounters: sql = layout.upsertRowMetadataWithCounters
        case .selectRowidByKey: sql = layout.selectRowidByKey
        case .insertKeyByKey:
            guard let insert = layout.insertKeyByKey else {
                throw SyncError.corruptMetadata("table \(name) has a rowid: it has no surrogate keys")
            }
            sql = insert
        }
        return sql
    }

    /// Set once a dead row may exist, so that inserts look for one to replace.
    var mayHaveDeadRows = true
    /// The stored policy is custom, but no merge function is registered in this process.
    var needsMergeFunction = false
    /// Each value column's default (NULL without one): what a new row from a peer that lacks the
    /// column gets, and what a value written elsewhere wins over (see `mergeLastWriterWins`).
    var valueDefaults: [DatabaseValue] = []
    /// Per value column, whether it was added after the table was synced (`tether_added_columns`):
    /// rows inserted before hold its default standing in for a value they never received, which a
    /// peer may send later at the same version (see `mergeLastWriterWins`), so a partial change
    /// never leaves such a column out as held by the receiver.
    var addedColumns: [Bool] = []
    /// Each value column's merge rule, in `valueColumns`' order.
    var columnRules: [ColumnMergeRule] = []
    /// The value columns whose rule is `counter` (indices of `valueColumns`): empty for most
    /// tables, which then take no step of the counters' own.
    var counterColumns: [Int] = []
    var hasCounters: Bool { !counterColumns.isEmpty }
    /// The value columns whose rule is `max` or `min`: their better value wins (`mergeOrdered`).
    var orderedColumns: [Int] = []
    var hasOrderedColumns: Bool { !orderedColumns.isEmpty }
    /// What wins between a delete and an update it did not see (`mergeLastWriterWins`).
    var rowRule: RowMergeRule = .deleteWins
    /// Whether the table's one key column is its rowid (an INTEGER PRIMARY KEY that identifies
    /// rows across peers): a run of rowids is then a run of keys.
    var keyIsRowid = false

    init(
        name: String, keyColumns: [String], valueColumns: [String], localKeyColumn: String?, policy: ConflictPolicy,
        capturesExternalWrites: Bool, positions: [String: Int32], insertsChangeNothingElse: Bool,
        withoutRowidKey: WithoutRowidKey? = nil
    ) throws {
        self.insertsChangeNothingElse = insertsChangeNothingElse
        self.name = name
        self.keyColumns = keyColumns
        self.valueColumns = valueColumns
        self.localKeyColumn = localKeyColumn
        self.policy = policy
        self.capturesExternalWrites = capturesExternalWrites
        quotedName = quoteIdentifier(name)
        layout = RowMetadataLayout(
            table: name, keyColumns: keyColumns, valueColumns: valueColumns, withoutRowidKey: withoutRowidKey)
        isWithoutRowid = withoutRowidKey != nil
        func position(_ column: String) throws -> Int32 {
            guard let position = positions[column] else {
                throw SyncError.schemaMismatch("table \(name) has no column \(column)")
            }
            return position
        }
        keyPositions = try keyColumns.map(position)
        valuePositions = try valueColumns.map(position)
        cName = Array(name.utf8CString)
        descriptor = TableDescriptor(name: name, keyColumns: keyColumns, valueColumns: valueColumns)
    }

    var allColumns: [String] { keyColumns + valueColumns }
}
