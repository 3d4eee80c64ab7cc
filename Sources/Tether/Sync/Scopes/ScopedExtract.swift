// Extraction for a scoped peer: each change of a batch decided against the scope and what the peer
// holds as extraction reads it, and the backfill that brings what the peer holds back to its scope
// after the scope changed or a parent moved.

import CSQLite
import Foundation

/// A scoped extraction's view of the scope (see `SyncEngine.extract(…scope:)`): the change queries
/// of each scoped table read each row's place in the peer's scope with the row, in the same pass
/// as the unscoped extraction's, and every row of the batch's window is decided as it is read:
///
/// - a live row inside the scope goes as it is (held or not: changes are whole rows), and one the
///   peer does not hold moves in (recorded as held);
/// - a live row outside it that the peer may hold goes as an eviction, one it does not hold not at
///   all (its values are never read); a delete goes only if the peer may hold the row;
/// - a row left out as an echo (the peer's own state, which it holds whatever membership says) is
///   decided too: held when inside, evicted when outside.
///
/// What the decisions do to membership is applied by `finish` for the rows the batch reaches
/// only (a query reads past the batch's end), with the evictions of rows this database evicted in
/// the window (it holds a scoped subset itself) and the tables to reconcile.
struct ScopedExtraction {
    /// The scoped queries of one table and the arguments they bind.
    struct Table {
        let name: String
        let keyIsRowid: Bool
        let live: String
        let dead: String
        let range: String
        /// For a table keyed by its rowid: the members whose rowid is in a range, merged with the
        /// range's rows (`range` then reads no membership).
        let rangeMembers: String?
        let arguments: [String: DatabaseValue]
    }

    /// What a row of the window does to membership.
    struct Step {
        enum Membership {
            /// The peer holds the row (it moves in): named by rowid, its key is read when recorded.
            case hold(rowid: Int64)
            /// The eviction or delete of a row the peer may hold goes at the row's sequence number.
            case leave(rowKey: String)
            /// Nothing recorded (a row the peer does not hold leaves it).
            case unchanged
        }
        let membership: Membership
        /// Rows of tables that reference this one, or read it, may have moved with it.
        let moves: Bool
        /// What the peer holds of this table is to be reconciled by the next backfill.
        var reconciles = false
    }

    /// What the scope makes of a row of the window.
    struct Decision {
        enum Sent { case asIs, eviction, nothing }
        enum Membership { case hold, leave }
        let sent: Sent
        let membership: Membership?
        let moves: Bool
        var reconciles = false
    }

    let scope: CompiledScope
    let peer: InstanceKey
    /// By the extraction's table index; nil for a table the scope does not name (sent whole).
    let tables: [Table?]

    /// Result columns the scoped queries add after their own, from the first on: whether the row
    /// is inside the scope (live rows; tombstones have none), its membership state (0 not held,
    /// 1 held, 2 leaving), and its key as membership records it (NULL when not held).
    enum Column {
        static func inScope(_ first: Int32) -> Int32 { first }
        static func state(_ first: Int32, isAlive: Bool) -> Int32 { isAlive ? first + 1 : first }
        static func rowKey(_ first: Int32, isAlive: Bool) -> Int32 { isAlive ? first + 2 : first + 1 }
    }

    init(_ scope: CompiledScope, peer: InstanceKey, tables ordered: [SyncedTable]) {
        self.scope = scope
        self.peer = peer
        tables = ordered.map { table in
            guard let rule = scope.rules[table.name] else { return nil }
            let liveKey = ScopeMembership.rowKeySQL(quotedTable: table.quotedName, keyColumns: table.keyColumns, keyIsRowid: rule.keyIsRowid)
            let deadKey = ScopeMembership.rowKeySQL(quotedTable: table.layout.deadTable, keyColumns: table.keyColumns)
            let state = [ScopeMembership.joinedStateSQL, ScopeMembership.joinedRowKeySQL]
            var arguments = scope.parameters
            arguments[ScopeMembership.peerParameter] = .blob(Data(peer.bytes))
            arguments[ScopeMembership.tableParameter] = .text(table.name)
            let inScope = "coalesce((\(rule.condition)), 0) != 0"
            let range = rule.keyIsRowid ? table.layout.selectRangeRows(adding: [inScope], joining: "")
                : table.layout.selectRangeRows(adding: [inScope] + state, joining: ScopeMembership.joinSQL(rowKey: liveKey))
            return Table(name: table.name, keyIsRowid: rule.keyIsRowid,
                         live: table.layout.selectLiveChanges(adding: [inScope] + state, joining: ScopeMembership.joinSQL(rowKey: liveKey)),
                         dead: table.layout.selectDeadChanges(adding: state, joining: ScopeMembership.joinSQL(rowKey: deadKey)),
                         range: range, rangeMembers: rule.keyIsRowid ? ScopeMembership.membersByRowidSQL : nil, arguments: arguments)
        }
    }

    /// The rule above for one row: `isSent` is false for a row left out of the batch (an echo, or a
    /// row a backfill does not send). A row the peer may hold that leaves it is marked leaving;
    /// one it does not hold that comes inside is held.
    static func decide(isAlive: Bool, inScope: Bool, state: Int, isSent: Bool) -> Decision {
        if isAlive && inScope && !isSent && state != 1 {
            // The peer's own row (an echo) that it may have dropped since (evicted here, refused):
            // not held on its word; the backfill sends it if the peer lacks it.
            return Decision(sent: .nothing, membership: nil, moves: false, reconciles: true)
        }
        if isAlive && inScope {
            return Decision(sent: isSent ? .asIs : .nothing, membership: state == 1 ? nil : .hold, moves: isSent && state != 1)
        }
        if state == 0 && isSent { return Decision(sent: .nothing, membership: nil, moves: false) }
        return Decision(sent: isAlive ? .eviction : (isSent ? .asIs : .nothing), membership: .leave, moves: state == 1 || !isSent)
    }

    /// What the peer holds of the current row of a joined scoped query whose added columns start
    /// at `first`: whether the row is inside the scope, and the membership state.
    static func place(_ handle: OpaquePointer, first: Int32, isAlive: Bool) -> (inScope: Bool, state: Int) {
        (isAlive && sqlite3_column_int64(handle, Column.inScope(first)) != 0, Int(sqlite3_column_int64(handle, Column.state(first, isAlive: isAlive))))
    }

    /// The key the current row of a joined scoped query is recorded under, nil when not held.
    static func recordedKey(_ handle: OpaquePointer, first: Int32, isAlive: Bool) -> String? {
        let column = Column.rowKey(first, isAlive: isAlive)
        return sqlite3_column_type(handle, column) == SQLITE_NULL ? nil : SyncEngine.text(handle, column)
    }

    /// The membership step of `decision`: `recordedKey`, the key the row is recorded under (nil when
    /// the peer does not hold it); `rowid`, the live row's.
    static func step(of decision: Decision, recordedKey: () -> String?, rowid: () -> Int64) -> Step? {
        switch decision.membership {
        case nil:
            return decision.moves || decision.reconciles ? Step(membership: .unchanged, moves: decision.moves, reconciles: decision.reconciles) : nil
        case .hold:
            return Step(membership: .hold(rowid: rowid()), moves: decision.moves)
        case .leave:
            // A row the peer does not hold has no member to mark.
            guard let rowKey = recordedKey() else { return Step(membership: .unchanged, moves: decision.moves) }
            return Step(membership: .leave(rowKey: rowKey), moves: decision.moves)
        }
    }

    /// The members of a table keyed by its rowid whose rowids fall in a range, in rowid order,
    /// merged with the range's rows as they are read (cheaper than a lookup per row).
    final class MemberMerge {
        private let statement: Statement
        private var next: (rowid: Int64, isLeaving: Bool, rowKey: String)?

        init(_ statement: Statement) throws {
            self.statement = statement
            statement.isBusy = true
            try advance()
        }

        private func advance() throws {
            let handle = statement.handle
            next = try statement.step() ? (sqlite3_column_int64(handle, 0), sqlite3_column_int64(handle, 1) != 0, SyncEngine.text(handle, 2)) : nil
        }

        /// The state (0 not held, 1 held, 2 leaving) and recorded key of the row `rowid`; rowids
        /// are asked in increasing order.
        func held(_ rowid: Int64) throws -> (state: Int, recordedKey: String?) {
            while let member = next, member.rowid < rowid { try advance() }
            guard let member = next, member.rowid == rowid else { return (0, nil) }
            return (member.isLeaving ? 2 : 1, member.rowKey)
        }

        func close() {
            statement.isBusy = false
            statement.reset()
        }
    }

    /// The member merge for the rows `first...last` of table `table` (nil unless it is keyed by its
    /// rowid: its range query joins membership instead).
    func members(of table: Int, from first: Int64, through last: Int64, _ connection: Connection) throws -> MemberMerge? {
        guard let scopedTable = tables[table], let sql = scopedTable.rangeMembers else { return nil }
        let statement = try connection.cachedStatement(sql)
        try bind(statement, table: table, [":tether_first": .integer(first), ":tether_last": .integer(last)])
        return try MemberMerge(statement)
    }

    /// Binds the arguments `statement` uses (with `extra`: the window's bounds).
    func bind(_ statement: Statement, table: Int, _ extra: [String: DatabaseValue]) throws {
        guard let table = tables[table] else { return }
        try SyncEngine.bindUsed(statement, table.arguments.merging(extra) { $1 })
    }

    /// Applies the steps of the rows the batch reached (`steps`, by table index; `windowTables`,
    /// the tables with a row in the window), adds the evictions of rows this database evicted in
    /// the window (`changes` stays in sequence order), and marks the tables whose rows may have
    /// moved with another's for the next backfill.
    func finish(steps: [[(sequence: Int64, step: Step)]], windowTables: [Bool], changes: inout [RowChange], after cursor: Int64, through: Int64,
                tables ordered: [SyncedTable], source: InstanceKey, peerSite: Int32?, _ connection: Connection) throws {
        let membership = connection.scopeMembership
        var moved = Set<String>()
        var reconciling = Set<String>()
        var changedTables = Set<String>()
        for (index, changed) in windowTables.enumerated() where changed { changedTables.insert(ordered[index].name) }
        var evictions: [RowChange] = []
        for (tableIndex, table) in tables.enumerated() {
            guard let table else {
                // A table the peer holds whole, of which this database holds part (a peer's scope or
                // its own interest narrowed it): what this database evicted leaves the peer too
                // (one it does not hold ignores the eviction), unless the peer caused it.
                for (sequence, key) in try EvictionLog.entries(of: ordered[tableIndex].name, after: cursor, through: through, notVia: peerSite, connection) {
                    evictions.append(.eviction(table: tableIndex, key: key, existence: Version(timestamp: .zero, origin: source), sequence: sequence))
                }
                continue
            }
            var movingIn: [Int64] = []
            for (sequence, step) in steps[tableIndex] {
                if step.moves { moved.insert(table.name) }
                if step.reconciles { reconciling.insert(table.name) }
                switch step.membership {
                case let .hold(rowid): movingIn.append(rowid)
                case let .leave(rowKey): try membership.markLeaving(peer, table: table.name, rowKey: rowKey, at: sequence)
                case .unchanged: break
                }
            }
            try membership.hold(peer, table: ordered[tableIndex], rowids: movingIn, keyIsRowid: table.keyIsRowid)
            // Rows this database evicted (it holds a scoped subset): they leave the peers it serves too.
            for (sequence, key) in try EvictionLog.entries(of: table.name, after: cursor, through: through, connection) {
                changedTables.insert(table.name)
                var arguments = table.arguments
                for (index, value) in key.enumerated() { arguments[":tether_k\(index)"] = value }
                let rowKey = key.indices.map { "quote(:tether_k\($0))" }.joined(separator: " || ',' || ")
                var found: (key: String, state: Int)?
                try SyncEngine.read("SELECT \(rowKey), \(ScopeMembership.stateSQL(rowKey: rowKey))", arguments, connection) { handle in
                    found = (SyncEngine.text(handle, 0), Int(sqlite3_column_int64(handle, 1)))
                }
                guard let found, found.state != 0 else { continue }
                try membership.markLeaving(peer, table: table.name, rowKey: found.key, at: sequence)
                if found.state == 1 { moved.insert(table.name) }
                // The row may be back here since, its change in this window (sent, or an echo):
                // the backfill settles what the peer holds of it.
                reconciling.insert(table.name)
                evictions.append(.eviction(table: tableIndex, key: key, existence: Version(timestamp: .zero, origin: source), sequence: sequence))
            }
        }
        if !evictions.isEmpty {
            changes += evictions
            changes.sort { $0.sequence < $1.sequence }
        }
        // Rows whose own change is older than the window may move with a parent, or with a table a
        // filter reads (whether its change was sent or left out as an echo): those tables are
        // reconciled by the next backfill.
        var stale = Set<String>()
        for name in moved { stale.formUnion(scope.dependents(of: name)) }
        for name in reconciling { stale.insert(name); stale.formUnion(scope.dependents(of: name)) }
        for (name, rule) in scope.rules where !rule.subqueryReads.isDisjoint(with: changedTables) { stale.insert(name) }
        if !stale.isEmpty { try membership.setNeedsReconcile(peer, tables: stale) }
    }
}

extension SyncEngine {
    /// Records, per table, the scope `peer` is sent under; a table whose rule changed must be
    /// reconciled (`extractScopeBackfill`), unless the peer has received nothing yet. A table newly
    /// scoped was held whole: every row counts as held, so that those outside are evicted.
    ///
    /// What the peer may hold is judged by what this database sent it, not by the cursor the peer
    /// shows (a claim): a peer that was never sent anything holds nothing, and is told nothing of
    /// the rows outside its scope, whatever cursor it shows.
    func prepareScopeRules(_ scope: CompiledScope, peer: InstanceKey, cursor claimedCursor: Int64, _ connection: Connection) throws {
        let cursor = min(claimedCursor, try connection.peerStore.sentThrough(to: peer) ?? 0)
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

    /// Runs `sql` with the named `arguments` it uses, calling `row` for each result row.
    static func read(_ sql: String, _ arguments: [String: DatabaseValue], _ connection: Connection, _ row: (OpaquePointer) throws -> Void) throws {
        let statement = try connection.cachedStatement(sql)
        try bindUsed(statement, arguments)
        defer { statement.reset() }
        while try statement.step() { try row(statement.handle) }
    }

    func read(_ sql: String, _ arguments: [String: DatabaseValue], _ connection: Connection, _ row: (OpaquePointer) throws -> Void) throws {
        try Self.read(sql, arguments, connection, row)
    }

    /// Binds the named parameters `statement` uses from `arguments` (NULL for one it lacks).
    static func bindUsed(_ statement: Statement, _ arguments: [String: DatabaseValue]) throws {
        var used: [String: DatabaseValue] = [:]
        for index in 0..<Int32(statement.parameterCount) {
            guard let cName = sqlite3_bind_parameter_name(statement.handle, index + 1) else { continue }
            let name = String(cString: cName)
            used[name] = arguments[":" + name.dropFirst()] ?? .null
        }
        try statement.bind(StatementArguments(named: used))
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
        try ensureHistoryHolds(for: peer, connection)
        try capture.foldExternalWritesIfAny(connection)
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
                    versions = range.rowVersions
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
