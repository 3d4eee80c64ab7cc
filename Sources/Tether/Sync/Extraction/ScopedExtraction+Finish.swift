// The end of a scoped extraction: what the rows the batch reached do to what the peer holds, the
// evictions of rows this database evicted in the batch's window, and the tables to reconcile.

import CSQLite
import Foundation

extension ScopedExtraction {
    /// The rows a batch reaches, as its cut goes: each one's membership step, by table, and the
    /// tables with a row in the window (sent or not).
    struct Window {
        var steps: [[(sequence: Int64, step: Step)]]
        var tables: [Bool]

        init(tableCount: Int) {
            steps = Array(repeating: [], count: tableCount)
            tables = Array(repeating: false, count: tableCount)
        }

        /// The batch reaches the row `sequence` of table `table`.
        mutating func reach(_ table: Int, sequence: Int64, step: Step?) {
            tables[table] = true
            if let step { steps[table].append((sequence, step)) }
        }
    }

    /// What the window does to the peer's holdings, gathered table by table.
    private struct Settlement {
        /// Tables whose rows moved (in or out): rows of tables depending on them may have moved too.
        var moved = Set<String>()
        var reconciling = Set<String>()
        /// Tables with a row in the window, or a row this database evicted in it.
        var changedTables = Set<String>()
        var evictions: [RowChange] = []
    }

    /// Applies the steps of the rows the batch reached (`window`), adds the evictions of rows this
    /// database evicted in the window (`changes` stays in sequence order), and marks the tables
    /// whose rows may have moved with another's for the next backfill.
    func finish(
        _ window: Window, changes: inout [RowChange], after cursor: Int64, through: Int64,
        tables ordered: [SyncedTable], source: InstanceKey, peerSite: Int32?, _ connection: Connection
    ) throws {
        var settled = Settlement()
        for (index, reached) in window.tables.enumerated() where reached {
            settled.changedTables.insert(ordered[index].name)
        }
        let evicted = Version(timestamp: .zero, origin: source)
        for (tableIndex, table) in tables.enumerated() {
            guard let table else {
                // A table the peer holds whole, of which this database holds part (a peer's scope or
                // its own interest narrowed it): what this database evicted leaves the peer too
                // (one it does not hold ignores the eviction), unless the peer caused it.
                let name = ordered[tableIndex].name
                let entries = try EvictionLog.entries(
                    of: name, after: cursor, through: through, notVia: peerSite,
                    connection)
                for (sequence, key) in entries {
                    settled.evictions.append(
                        .eviction(
                            table: tableIndex, key: key, existence: evicted,
                            sequence: sequence))
                }
                continue
            }
            try record(window.steps[tableIndex], of: table, ordered[tableIndex], &settled, connection)
            // Rows this database evicted (it holds a scoped subset): they leave the peers it serves too.
            let entries = try EvictionLog.entries(of: table.name, after: cursor, through: through, connection)
            for (sequence, key) in entries {
                settled.changedTables.insert(table.name)
                guard try passOn(eviction: key, at: sequence, of: table, &settled, connection) else { continue }
                settled.evictions.append(.eviction(table: tableIndex, key: key, existence: evicted, sequence: sequence))
            }
        }
        if !settled.evictions.isEmpty {
            changes += settled.evictions
            changes.sort { $0.sequence < $1.sequence }
        }
        try markStale(settled, connection)
    }

    /// Records the membership `steps` of the rows of `table` (`synced`) the batch reached.
    private func record(
        _ steps: [(sequence: Int64, step: Step)], of table: Table, _ synced: SyncedTable,
        _ settled: inout Settlement, _ connection: Connection
    ) throws {
        let membership = connection.scopeMembership
        var movingIn: [Int64] = []
        for (sequence, step) in steps {
            if step.moves { settled.moved.insert(table.name) }
            if step.reconciles { settled.reconciling.insert(table.name) }
            switch step.membership {
            case let .hold(rowid): movingIn.append(rowid)
            case let .leave(rowKey): try membership.markLeaving(peer, table: table.name, rowKey: rowKey, at: sequence)
            case .unchanged: break
            }
        }
        try membership.hold(peer, table: synced, rowids: movingIn, keyIsRowid: table.keyIsRowid)
    }

    /// Whether the eviction of the row `key` of `table`, at `sequence`, goes to the peer: only if
    /// the peer may hold the row, which then leaves it.
    private func passOn(
        eviction key: [DatabaseValue], at sequence: Int64, of table: Table,
        _ settled: inout Settlement, _ connection: Connection
    ) throws -> Bool {
        var arguments = table.arguments
        for (index, value) in key.enumerated() { arguments[":tether_k\(index)"] = value }
        let rowKey = key.indices.map { "quote(:tether_k\($0))" }.joined(separator: " || ',' || ")
        var found: (key: String, state: Int)?
        let sql = "SELECT \(rowKey), \(ScopeMembership.stateSQL(rowKey: rowKey))"
        try SyncEngine.read(sql, arguments, connection) { handle in
            found = (SyncEngine.text(handle, 0), Int(sqlite3_column_int64(handle, 1)))
        }
        guard let found, found.state != 0 else { return false }
        try connection.scopeMembership.markLeaving(peer, table: table.name, rowKey: found.key, at: sequence)
        if found.state == 1 { settled.moved.insert(table.name) }
        // The row may be back here since, its change in this window (sent, or an echo): the backfill
        // settles what the peer holds of it.
        settled.reconciling.insert(table.name)
        return true
    }

    /// Rows whose own change is older than the window may move with a parent, or with a table a
    /// filter reads (whether its change was sent or left out as an echo): those tables are
    /// reconciled by the next backfill.
    private func markStale(_ settled: Settlement, _ connection: Connection) throws {
        var stale = Set<String>()
        for name in settled.moved { stale.formUnion(scope.dependents(of: name)) }
        for name in settled.reconciling {
            stale.insert(name)
            stale.formUnion(scope.dependents(of: name))
        }
        for (name, rule) in scope.rules where !rule.subqueryReads.isDisjoint(with: settled.changedTables) {
            stale.insert(name)
        }
        if !stale.isEmpty { try connection.scopeMembership.setNeedsReconcile(peer, tables: stale) }
    }
}
