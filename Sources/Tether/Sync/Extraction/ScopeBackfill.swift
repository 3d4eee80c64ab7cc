import CSQLite
import Foundation

/// The changes that bring what a scoped peer holds back to its scope for the rows whose own change
/// is at or before `cursor` (the peer's cursor here; later changes come in the normal stream): the
/// rows inside the scope it does not hold, whole, and the evictions of rows it holds outside it —
/// for the tables whose rule changed since the last extraction for it, or whose rows moved with a
/// parent (or a table a filter reads). Applied with `apply(_:backfill: true)`: the cursor stays.
/// Batch after batch until `isLast`; the tables done are marked reconciled.
struct ScopeBackfill {
    /// A row to send, and the key membership records it under.
    struct Entry {
        let table: Int
        let change: RowChange
        let rowKey: String
    }

    let engine: SyncEngine
    let connection: Connection
    let peer: InstanceKey
    let cursor: Int64
    let scope: CompiledScope
    let limits: BatchLimits
    /// The synced tables by name: a change's table is its index here.
    let tables: [SyncedTable]
    /// The rows read so far, of every table reconciled.
    private var entries: [Entry] = []

    /// Prepares the backfill for `peer`, whose cursor is `cursor`: records the scope it is sent under.
    init(
        for peer: InstanceKey, after cursor: Int64, scope: CompiledScope, limits: BatchLimits, engine: SyncEngine,
        _ connection: Connection
    ) throws {
        try Extraction.prepare(engine, for: peer, connection)
        try ScopedExtraction.prepareRules(scope, peer: peer, cursor: cursor, engine: engine, connection)
        self.engine = engine
        self.connection = connection
        self.peer = peer
        self.cursor = cursor
        self.scope = scope
        self.limits = limits
        tables = engine.tablesInBatchOrder
    }

    /// Reads the tables to reconcile, records what the batch does to what the peer holds, and
    /// marks the tables done when it is their last.
    mutating func run() throws -> ChangeBatch {
        let membership = connection.scopeMembership
        let records = try membership.rules(of: peer)
        var reconciling: [Int] = []
        for (tableIndex, table) in tables.enumerated() where records[table.name]?.needsReconcile == true {
            reconciling.append(tableIndex)
            try readRows(of: tableIndex, inside: true)
            // A table going whole has no rows outside.
            if scope.rules[table.name] != nil { try readRows(of: tableIndex, inside: false) }
        }
        entries.sort { $0.change.sequence < $1.change.sequence }
        let isLast = entries.count <= limits.maximumChanges
        let taken = entries.prefix(limits.maximumChanges)
        // An eviction sent here is settled by an acknowledgement of a later change than any given now.
        let leavingAt = engine.clock.lastSequence + 1
        for entry in taken {
            let name = tables[entry.table].name
            if entry.change.isEvicted {
                try membership.markLeaving(peer, table: name, rowKey: entry.rowKey, at: leavingAt)
            } else {
                // Also for a table going whole: the next batch must not send the row again (what is
                // held of it is forgotten with its last batch).
                try membership.hold(peer, table: name, rowKey: entry.rowKey)
            }
        }
        if isLast {
            for tableIndex in reconciling {
                let name = tables[tableIndex].name
                if scope.rules[name] == nil {
                    try membership.forget(peer, table: name)
                } else {
                    try membership.reconciled(peer, table: name)
                }
            }
        }
        var changes = Array(taken).map(\.change)
        let connection = self.connection
        try engine.attachCounterStates(to: &changes, tables: tables) {
            try $0.statement(.selectCountersByKey, connection)
        }
        return ChangeBatch(
            source: engine.instanceKey, after: 0, through: cursor, isLast: isLast,
            tables: tables.map(\.descriptor), changes: changes)
    }

    /// Reads the rows of table `tableIndex` whose change is at or before the cursor that the peer
    /// lacks (`inside`: inside the scope, not held; sent whole) or holds outside the scope (evicted).
    private mutating func readRows(of tableIndex: Int, inside: Bool) throws {
        let table = tables[tableIndex]
        let quoted = table.quotedName
        let rowKey = ScopeMembership.rowKeySQL(quotedTable: quoted, keyColumns: table.keyColumns)
        let columns = table.allColumns.map { "\(quoted).\(quoteIdentifier($0))" }.joined(separator: ", ")
        let inScope = scope.rules[table.name].map { "coalesce((\($0.condition)), 0) != 0" } ?? "1"
        var arguments = scope.parameters
        arguments[ScopeMembership.peerParameter] = .blob(Data(peer.bytes))
        arguments[ScopeMembership.tableParameter] = .text(table.name)
        let metadata =
            "(SELECT m.seq FROM \(table.layout.rowsTable) AS m WHERE m.row_id = \(quoted).rowid), "
            + "(SELECT m.versions FROM \(table.layout.rowsTable) AS m WHERE m.row_id = \(quoted).rowid)"
        let condition =
            inside
            ? "\(inScope) AND NOT \(ScopeMembership.heldSQL(rowKey: rowKey))"
            : "NOT (\(inScope)) AND \(ScopeMembership.heldOrMayBeLostSQL(rowKey: rowKey))"
        let sql = "SELECT \(quoted).rowid, \(rowKey), \(metadata), \(columns) FROM \(quoted) WHERE \(condition)"
        try SyncEngine.read(sql, arguments, connection) { handle in
            guard let change = try inside ? missingRow(handle, of: tableIndex) : heldRow(handle, of: tableIndex) else {
                return
            }
            entries.append(Entry(table: tableIndex, change: change, rowKey: SyncEngine.text(handle, 1)))
        }
    }

    /// The current row (columns: rowid, row key, sequence, versions, key, values), inside the scope
    /// and not held: sent whole, if its change is at or before the cursor.
    private func missingRow(_ handle: OpaquePointer, of tableIndex: Int) throws -> RowChange? {
        let table = tables[tableIndex]
        let keyCount = table.keyColumns.count
        let valueCount = table.valueColumns.count
        let values = Extraction.readColumns(handle, from: 4 + keyCount, count: valueCount)
        let key = Extraction.readColumns(handle, from: 4, count: keyCount)
        guard let change = try lastChange(handle, table) else { return nil }
        let versions = try change.range?.rowVersions ?? engine.versions(handle, 3, table)
        guard change.sequence <= cursor else { return nil }
        let existence = try engine.version(versions.existence)
        let columnVersions = versions.columns == nil ? [] : try engine.columnVersions(versions, count: valueCount)
        return RowChange(
            table: tableIndex, key: key, isAlive: true, existence: existence, values: values,
            versions: columnVersions, sequence: change.sequence)
    }

    /// The current row, held outside the scope: evicted, if its change is at or before the cursor.
    private func heldRow(_ handle: OpaquePointer, of tableIndex: Int) throws -> RowChange? {
        let table = tables[tableIndex]
        guard let change = try lastChange(handle, table), change.sequence <= cursor else { return nil }
        let key = Extraction.readColumns(handle, from: 4, count: table.keyColumns.count)
        return .eviction(
            table: tableIndex, key: key, existence: Version(timestamp: .zero, origin: engine.instanceKey),
            sequence: change.sequence)
    }

    /// The sequence number of the current row's last change: its metadata's, or its insert range's
    /// (`range`, whose versions are the row's); nil for a row written before the table was synced,
    /// of which no change exists to send.
    private func lastChange(_ handle: OpaquePointer, _ table: SyncedTable) throws
        -> (sequence: Int64, range: InsertRange?)?
    {
        if sqlite3_column_type(handle, 2) != SQLITE_NULL { return (sqlite3_column_int64(handle, 2), nil) }
        let rowid = sqlite3_column_int64(handle, 0)
        guard let range = try engine.insertRange(of: table, containing: rowid, connection) else { return nil }
        return (range.sequence(ofRowid: rowid), range)
    }
}

extension SyncEngine {
    /// The backfill a scoped `peer` needs after its scope changed or rows moved with a parent (see
    /// `ScopeBackfill`).
    func extractScopeBackfill(
        for peer: InstanceKey, after cursor: Int64, scope: CompiledScope, limits: BatchLimits,
        connection: Connection
    ) throws -> ChangeBatch {
        var backfill = try ScopeBackfill(
            for: peer, after: cursor, scope: scope, limits: limits, engine: self,
            connection)
        return try backfill.run()
    }
}
