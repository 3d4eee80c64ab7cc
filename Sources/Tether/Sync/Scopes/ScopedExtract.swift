// Extraction for a scoped peer: the changes of a batch window decided against the scope and what
// the peer holds (set-wise, a few queries per scoped table and batch), and the backfill that
// brings what the peer holds back to its scope after the scope changed or a parent moved.

import CSQLite
import Foundation

extension SyncEngine {
    /// One row of a scoped table changed in a batch's window, as the scope sees it.
    private struct WindowRow {
        var sequence: Int64
        var isAlive: Bool
        var inScope: Bool
        /// 0 not held, 1 held, 2 leaving (see `ScopeMembership`).
        var state: Int
        var rowKey: String
        var key: [DatabaseValue]
    }

    /// What the scope makes of a change of the window.
    private enum Decision { case send, evict, drop }

    /// Records, per table, the scope `peer` is sent under; a table whose rule changed must be
    /// reconciled (`extractScopeBackfill`), unless the peer has received nothing yet. A table newly
    /// scoped was held whole: every row counts as held, so that those outside are evicted.
    func prepareScopeRules(_ scope: CompiledScope, peer: InstanceKey, cursor: Int64, _ connection: Connection) throws {
        let membership = connection.scopeMembership
        let stored = try membership.rules(of: peer)
        for (name, rule) in scope.rules where stored[name]?.fingerprint != rule.fingerprint {
            let wasWhole = stored[name] == nil || stored[name]?.fingerprint == Self.wholeFingerprint
            if wasWhole && cursor > 0 {
                try membership.holdEveryRow(peer, of: rule.table)
                // So may the rows this database evicted after the cursor (it holds part of the
                // table): their evictions, still to be sent, must reach the peer.
                for (_, key) in try EvictionLog.entries(of: name, after: cursor, through: clock.lastSequence, connection) {
                    try membership.hold(peer, table: name, rowKey: try membershipKey(of: key, connection))
                }
            }
            try membership.saveRule(peer, table: name, fingerprint: rule.fingerprint, needsReconcile: cursor > 0)
        }
        // A table no longer scoped goes whole: what the peer lacks of it is backfilled, then forgotten.
        for (name, record) in stored where scope.rules[name] == nil && record.fingerprint != Self.wholeFingerprint {
            if cursor > 0 {
                try membership.saveRule(peer, table: name, fingerprint: Self.wholeFingerprint, needsReconcile: true)
            } else {
                try membership.forget(peer, table: name)
            }
        }
    }

    /// The fingerprint of a table that was scoped and goes whole, until its backfill is done.
    static let wholeFingerprint = "whole"

    /// Narrows `changes`, the batch (`cursor`, `through`] for `peer`, to `scope`: per scoped table,
    /// a change of a row inside the scope goes as it is (held or not: changes are whole rows);
    /// a live row outside it that the peer may hold goes as an eviction, one it does not hold not at
    /// all; a delete goes only if the peer may hold the row. Rows left out as echoes (the peer's own
    /// state, which it holds whatever membership says) are decided too: held when inside, evicted
    /// when outside. Rows this database evicted in the window (it holds a scoped subset itself) are
    /// evicted from the peer if it may hold them. Membership follows.
    func narrow(_ changes: inout [RowChange], to scope: CompiledScope, peer: InstanceKey, after cursor: Int64, through: Int64,
                tables ordered: [SyncedTable], _ connection: Connection) throws {
        try prepareScopeRules(scope, peer: peer, cursor: cursor, connection)
        guard through > cursor else { return }
        let membership = connection.scopeMembership
        var decisions: [Int64: Decision] = [:]
        var echoEvictions: [RowChange] = []
        var moved = Set<String>()
        var echoesNotHeld = Set<String>()
        let sent = Set(changes.map(\.sequence))
        var changedTableIndices = Set<Int>()
        for change in changes { changedTableIndices.insert(change.table) }
        var changedTables = Set(changedTableIndices.map { ordered[$0].name })
        let source = instanceKey
        for (tableIndex, table) in ordered.enumerated() {
            guard let rule = scope.rules[table.name] else {
                // A table the peer holds whole, of which this database holds part (its own scope or
                // interest narrowed it): what this database evicted leaves the peer too.
                for (sequence, key) in try EvictionLog.entries(of: table.name, after: cursor, through: through, connection) {
                    echoEvictions.append(.eviction(table: tableIndex, key: key, existence: Version(timestamp: .zero, origin: source), sequence: sequence))
                }
                continue
            }
            // Rows this database evicted (it holds a scoped subset): they leave the peers it serves too.
            // Before the window's rows are decided: a row back here since (its change in the window) is
            // then moving in again, and held, rather than left marked as leaving.
            for (sequence, key) in try EvictionLog.entries(of: table.name, after: cursor, through: through, connection) {
                var arguments: [String: DatabaseValue] = [ScopeMembership.peerParameter: .blob(Data(peer.bytes)), ScopeMembership.tableParameter: .text(table.name)]
                for (index, value) in key.enumerated() { arguments[":tether_k\(index)"] = value }
                let rowKey = key.indices.map { "quote(:tether_k\($0))" }.joined(separator: " || ',' || ")
                var found: (key: String, state: Int)?
                try read("SELECT \(rowKey), \(ScopeMembership.stateSQL(rowKey: rowKey))", arguments, connection) { handle in
                    found = (Self.text(handle, 0), Int(sqlite3_column_int64(handle, 1)))
                }
                guard let found, found.state != 0 else { continue }
                try membership.markLeaving(peer, table: table.name, rowKey: found.key, at: sequence)
                if found.state == 1 { moved.insert(table.name) }
                echoEvictions.append(.eviction(table: tableIndex, key: key, existence: Version(timestamp: .zero, origin: source), sequence: sequence))
            }
            let rows = try windowRows(of: table, rule, scope, peer: peer, after: cursor, through: through, sent: sent, connection)
            if !rows.isEmpty { changedTables.insert(table.name) }
            var movingIn: [String] = []
            for row in rows {
                // A change left out as an echo is the peer's own state: it holds the row, whatever
                // membership says (it wrote it, or received it from elsewhere).
                let isEcho = !sent.contains(row.sequence)
                let decision: Decision
                if row.isAlive && row.inScope {
                    decision = .send
                    if row.state != 1 && isEcho {
                        // The peer's own row, which it may have dropped since (evicted by this
                        // database, refused): not sent here, so the backfill sends it if it is not held.
                        echoesNotHeld.insert(table.name)
                    } else if row.state != 1 {
                        movingIn.append(row.rowKey)
                        moved.insert(table.name)
                    }
                } else if row.state == 0 && !isEcho {
                    decision = .drop
                } else {
                    decision = row.isAlive ? .evict : .send
                    try membership.markLeaving(peer, table: table.name, rowKey: row.rowKey, at: row.sequence)
                    if row.state == 1 || isEcho { moved.insert(table.name) }
                    if row.isAlive && isEcho {
                        echoEvictions.append(.eviction(table: tableIndex, key: row.key, existence: Version(timestamp: .zero, origin: source),
                                                       sequence: row.sequence))
                    }
                }
                decisions[row.sequence] = decision
            }
            try membership.hold(peer, table: table.name, rowKeys: movingIn)
        }
        // In place: a change holds four arrays, and copying each costs their reference counting.
        let scoped = ordered.map { scope.rules[$0.name] != nil }
        for index in changes.indices where scoped[changes[index].table] && decisions[changes[index].sequence] == .evict {
            changes[index] = .eviction(table: changes[index].table, key: changes[index].key, existence: Version(timestamp: .zero, origin: source),
                                       sequence: changes[index].sequence)
        }
        changes.removeAll { scoped[$0.table] && decisions[$0.sequence].map { $0 == .drop } ?? true }
        if !echoEvictions.isEmpty {
            changes += echoEvictions
            changes.sort { $0.sequence < $1.sequence }
        }
        // Rows whose own change is older than the window may move with a parent, or with a table a
        // filter reads: those tables are reconciled by the next backfill.
        var stale = echoesNotHeld
        for name in moved.union(echoesNotHeld) { stale.formUnion(scope.dependents(of: name)) }
        for (name, rule) in scope.rules where !rule.subqueryReads.isDisjoint(with: changedTables) { stale.insert(name) }
        if !stale.isEmpty { try membership.setNeedsReconcile(peer, tables: stale) }
    }

    /// The rows of `table` whose change falls in (`cursor`, `through`]: live rows with metadata of
    /// their own, rows of insert ranges, tombstones.
    private func windowRows(of table: SyncedTable, _ rule: CompiledScope.TableRule, _ scope: CompiledScope, peer: InstanceKey,
                            after cursor: Int64, through: Int64, sent: Set<Int64>, _ connection: Connection) throws -> [WindowRow] {
        let keyCount = table.keyColumns.count
        // A live row's key is read only when the scope may act on it: not for a change sent as it is
        // to a peer holding the row, nor for one left out of a peer not holding it (most rows).
        func liveRow(_ handle: OpaquePointer, sequence: Int64) -> WindowRow {
            let inScope = sqlite3_column_int64(handle, 1) != 0
            let state = Int(sqlite3_column_int64(handle, 2))
            let settled = sent.contains(sequence) && (inScope ? state == 1 : state == 0)
            return WindowRow(sequence: sequence, isAlive: true, inScope: inScope, state: state, rowKey: settled ? "" : Self.text(handle, 3),
                             key: settled ? [] : (0..<keyCount).map { DatabaseValue(statement: handle, index: Int32(4 + $0)) })
        }
        let layout = table.layout
        let quoted = table.quotedName
        let liveKey = ScopeMembership.rowKeySQL(quotedTable: quoted, keyColumns: table.keyColumns)
        let keys = table.keyColumns.map { "\(quoted).\(quoteIdentifier($0))" }.joined(separator: ", ")
        let inScope = "coalesce((\(rule.condition)), 0) != 0"
        var arguments = scope.parameters
        arguments[ScopeMembership.peerParameter] = .blob(Data(peer.bytes))
        arguments[ScopeMembership.tableParameter] = .text(table.name)
        arguments[":tether_after"] = .integer(cursor)
        arguments[":tether_through"] = .integer(through)
        var rows: [WindowRow] = []
        // The user's table alone in FROM: the filter's bare column names can only mean its columns.
        let live = """
            SELECT (SELECT m.seq FROM \(layout.rowsTable) AS m WHERE m.row_id = \(quoted).rowid), \(inScope),
              \(ScopeMembership.stateSQL(rowKey: liveKey)), \(liveKey), \(keys)
            FROM \(quoted) WHERE \(quoted).rowid IN (SELECT row_id FROM \(layout.rowsTable) WHERE seq > :tether_after AND seq <= :tether_through)
            """
        try read(live, arguments, connection) { handle in rows.append(liveRow(handle, sequence: sqlite3_column_int64(handle, 0))) }
        let ranges = try insertRanges(of: table, after: cursor, connection)
        if !ranges.isEmpty {
            let rangeRows = """
                SELECT \(quoted).rowid, \(inScope), \(ScopeMembership.stateSQL(rowKey: liveKey)), \(liveKey), \(keys)
                FROM \(quoted) WHERE \(quoted).rowid BETWEEN :tether_first AND :tether_last
                  AND NOT EXISTS (SELECT 1 FROM \(layout.rowsTable) AS m WHERE m.row_id = \(quoted).rowid)
                """
            for range in ranges {
                let first = max(range.firstRowid, range.rowid(ofSequence: cursor + 1))
                let last = min(range.lastRowid, range.rowid(ofSequence: through))
                guard first <= last else { continue }
                var rangeArguments = arguments
                rangeArguments[":tether_first"] = .integer(first)
                rangeArguments[":tether_last"] = .integer(last)
                try read(rangeRows, rangeArguments, connection) { handle in
                    rows.append(liveRow(handle, sequence: range.sequence(ofRowid: sqlite3_column_int64(handle, 0))))
                }
            }
        }
        let dead = layout.deadTable
        let deadKey = ScopeMembership.rowKeySQL(quotedTable: dead, keyColumns: table.keyColumns)
        let deadRows = """
            SELECT tether_seq, \(ScopeMembership.stateSQL(rowKey: deadKey)), \(deadKey) FROM \(dead)
            WHERE tether_seq > :tether_after AND tether_seq <= :tether_through
            """
        try read(deadRows, arguments, connection) { handle in
            rows.append(WindowRow(sequence: sqlite3_column_int64(handle, 0), isAlive: false, inScope: false,
                                  state: Int(sqlite3_column_int64(handle, 1)), rowKey: Self.text(handle, 2), key: []))
        }
        return rows
    }

    /// Runs `sql` with the named `arguments` it uses, calling `row` for each result row.
    func read(_ sql: String, _ arguments: [String: DatabaseValue], _ connection: Connection, _ row: (OpaquePointer) throws -> Void) throws {
        let statement = try connection.cachedStatement(sql)
        var used: [String: DatabaseValue] = [:]
        for index in 0..<Int32(statement.parameterCount) {
            guard let cName = sqlite3_bind_parameter_name(statement.handle, index + 1) else { continue }
            let name = String(cString: cName)
            used[name] = arguments[":" + name.dropFirst()] ?? .null
        }
        try statement.bind(StatementArguments(named: used))
        defer { statement.reset() }
        while try statement.step() { try row(statement.handle) }
    }

    static func text(_ handle: OpaquePointer, _ column: Int32) -> String {
        sqlite3_column_text(handle, column).map { String(cString: $0) } ?? ""
    }

    // MARK: Backfill after a scope change

    /// The changes that bring what `peer` holds back to `scope` for the rows whose own change is at
    /// or before `cursor` (the peer's cursor here; later changes come in the normal stream): the rows
    /// inside the scope it does not hold, whole, and the evictions of rows it holds outside it — for
    /// the tables whose rule changed since the last extraction for it, or whose rows moved with a
    /// parent (or a table a filter reads). Applied with `apply(_:backfill: true)`: the cursor stays.
    /// Batch after batch until `isLast`; the tables done are marked reconciled.
    func extractScopeBackfill(for peer: InstanceKey, after cursor: Int64, scope: CompiledScope, limits: BatchLimits,
                              connection: Connection) throws -> ChangeBatch {
        try ensureNotACopy()
        try foldExternalWritesIfAny(connection)
        try prepareClock(connection)
        try prepareScopeRules(scope, peer: peer, cursor: cursor, connection)
        let ordered = tableList.sorted { $0.name < $1.name }
        let membership = connection.scopeMembership
        let records = try membership.rules(of: peer)
        struct Entry {
            let table: Int
            let change: RowChange
            let rowKey: String
        }
        var entries: [Entry] = []
        var reconciling: [Int] = []
        for (tableIndex, table) in ordered.enumerated() where records[table.name]?.needsReconcile == true {
            reconciling.append(tableIndex)
            let rule = scope.rules[table.name]
            let quoted = table.quotedName
            let rowKey = ScopeMembership.rowKeySQL(quotedTable: quoted, keyColumns: table.keyColumns)
            let columns = table.allColumns.map { "\(quoted).\(quoteIdentifier($0))" }.joined(separator: ", ")
            let inScope = rule.map { "coalesce((\($0.condition)), 0) != 0" } ?? "1"
            var arguments = scope.parameters
            arguments[ScopeMembership.peerParameter] = .blob(Data(peer.bytes))
            arguments[ScopeMembership.tableParameter] = .text(table.name)
            let metadata = "(SELECT m.seq FROM \(table.layout.rowsTable) AS m WHERE m.row_id = \(quoted).rowid), (SELECT m.versions FROM \(table.layout.rowsTable) AS m WHERE m.row_id = \(quoted).rowid)"
            // Inside the scope, not held: sent whole.
            let missing = "SELECT \(quoted).rowid, \(rowKey), \(metadata), \(columns) FROM \(quoted) WHERE \(inScope) AND NOT \(ScopeMembership.heldSQL(rowKey: rowKey))"
            let keyCount = table.keyColumns.count
            let valueCount = table.valueColumns.count
            try read(missing, arguments, connection) { handle in
                let rowid = sqlite3_column_int64(handle, 0)
                let values = (0..<valueCount).map { DatabaseValue(statement: handle, index: Int32(4 + keyCount + $0)) }
                let key = (0..<keyCount).map { DatabaseValue(statement: handle, index: Int32(4 + $0)) }
                let sequence: Int64
                let versions: RowVersions
                if sqlite3_column_type(handle, 2) != SQLITE_NULL {
                    sequence = sqlite3_column_int64(handle, 2)
                    versions = try self.versions(handle, 3, table)
                } else if let range = try insertRange(of: table, containing: rowid, connection) {
                    sequence = range.sequence(ofRowid: rowid)
                    versions = .uniform(range.version)
                } else {
                    return // written before the table was synced: no change of it exists to send
                }
                guard sequence <= cursor else { return }
                let existence = try version(versions.existence)
                let columnVersions: [Version] = versions.columns == nil ? [] : try (0..<valueCount).map { try version(versions.column($0)) }
                entries.append(Entry(table: tableIndex, change: RowChange(table: tableIndex, key: key, isAlive: true, existence: existence,
                                                                           values: values, versions: columnVersions, sequence: sequence),
                                     rowKey: Self.text(handle, 1)))
            }
            guard rule != nil else { continue }
            // Held, outside the scope: evicted.
            let extra = "SELECT \(quoted).rowid, \(rowKey), \(metadata), \(columns) FROM \(quoted) WHERE NOT (\(inScope)) AND \(ScopeMembership.heldSQL(rowKey: rowKey))"
            try read(extra, arguments, connection) { handle in
                let rowid = sqlite3_column_int64(handle, 0)
                let sequence: Int64
                if sqlite3_column_type(handle, 2) != SQLITE_NULL {
                    sequence = sqlite3_column_int64(handle, 2)
                } else if let range = try insertRange(of: table, containing: rowid, connection) {
                    sequence = range.sequence(ofRowid: rowid)
                } else {
                    return
                }
                guard sequence <= cursor else { return }
                let key = (0..<keyCount).map { DatabaseValue(statement: handle, index: Int32(4 + $0)) }
                entries.append(Entry(table: tableIndex, change: .eviction(table: tableIndex, key: key, existence: Version(timestamp: .zero, origin: instanceKey),
                                                                          sequence: sequence),
                                     rowKey: Self.text(handle, 1)))
            }
        }
        entries.sort { $0.change.sequence < $1.change.sequence }
        let isLast = entries.count <= limits.maximumChanges
        let taken = entries.prefix(limits.maximumChanges)
        // An eviction sent here is settled by an acknowledgement of a later change than any given now.
        let leavingAt = clock.lastSequence + 1
        for entry in taken {
            let name = ordered[entry.table].name
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
                let name = ordered[tableIndex].name
                if scope.rules[name] == nil { try membership.forget(peer, table: name) } else { try membership.reconciled(peer, table: name) }
            }
        }
        return ChangeBatch(source: instanceKey, after: 0, through: cursor, isLast: isLast, tables: ordered.map(\.descriptor), changes: Array(taken).map(\.change))
    }
}
