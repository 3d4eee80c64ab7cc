// Extraction for a scoped peer: each change of a batch decided against the scope and what the peer
// holds as extraction reads it.

import CSQLite
import Foundation

/// A scoped extraction's view of the scope (see `Extraction.Request.scope`): the change queries
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

    /// Where a row read stands with the peer: inside the scope or not, and whether the peer holds
    /// it (0 not held, 1 held, 2 leaving).
    struct Place {
        /// The key membership records the row under.
        enum RecordedKey {
            /// In this column of the query's row (NULL when not held), read only when needed.
            case column(Int32)
            /// Read already (from a member merge): nil when not held.
            case read(String?)
        }
        let isAlive: Bool
        let inScope: Bool
        let state: Int
        let recorded: RecordedKey
        /// The live row's (0 for a tombstone, which is never held).
        let rowid: Int64

        /// The place of the current row of a scoped change query (live rows or tombstones) whose
        /// added columns start at `first`.
        init(changedRow handle: OpaquePointer, first: Int32, isAlive: Bool, rowid: Int64) {
            self.isAlive = isAlive
            inScope = isAlive && sqlite3_column_int64(handle, Column.inScope(first)) != 0
            state = Int(sqlite3_column_int64(handle, Column.state(first, isAlive: isAlive)))
            recorded = .column(Column.rowKey(first, isAlive: isAlive))
            self.rowid = rowid
        }

        /// The place of the row `rowid` of an insert range, the current row of a scoped range
        /// query whose added columns start at `first`; what the peer holds read from `members`
        /// when the query does not join membership.
        init(rangeRow rowid: Int64, _ handle: OpaquePointer, first: Int32, members: MemberMerge?) throws {
            isAlive = true
            inScope = sqlite3_column_int64(handle, Column.inScope(first)) != 0
            if let members {
                let held = try members.held(rowid)
                state = held.state
                recorded = .read(held.recordedKey)
            } else {
                state = Int(sqlite3_column_int64(handle, Column.state(first, isAlive: true)))
                recorded = .column(Column.rowKey(first, isAlive: true))
            }
            self.rowid = rowid
        }

        /// The decision on the row: `isSent` is false for a row left out of the batch (an echo,
        /// or a row a backfill does not send).
        func decision(isSent: Bool) -> Decision {
            ScopedExtraction.decide(isAlive: isAlive, inScope: inScope, state: state, isSent: isSent)
        }

        /// The key the row is recorded under, nil when not held (`handle`: the query's).
        func recordedKey(_ handle: OpaquePointer) -> String? {
            switch recorded {
            case let .read(key): return key
            case let .column(column):
                return sqlite3_column_type(handle, column) == SQLITE_NULL ? nil : SyncEngine.text(handle, column)
            }
        }
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
            let liveKey = ScopeMembership.rowKeySQL(
                quotedTable: table.quotedName, keyColumns: table.keyColumns,
                keyIsRowid: rule.keyIsRowid)
            let deadKey = ScopeMembership.rowKeySQL(quotedTable: table.layout.deadTable, keyColumns: table.keyColumns)
            let state = [ScopeMembership.joinedStateSQL, ScopeMembership.joinedRowKeySQL]
            var arguments = scope.parameters
            arguments[ScopeMembership.peerParameter] = .blob(Data(peer.bytes))
            arguments[ScopeMembership.tableParameter] = .text(table.name)
            let inScope = "coalesce((\(rule.condition)), 0) != 0"
            let layout = table.layout
            let range =
                rule.keyIsRowid
                ? layout.selectRangeRows(adding: [inScope], joining: "")
                : layout.selectRangeRows(adding: [inScope] + state, joining: ScopeMembership.joinSQL(rowKey: liveKey))
            return Table(
                name: table.name, keyIsRowid: rule.keyIsRowid,
                live: layout.selectLiveChanges(
                    adding: [inScope] + state,
                    joining: ScopeMembership.joinSQL(rowKey: liveKey)),
                dead: layout.selectDeadChanges(
                    adding: state,
                    joining: ScopeMembership.joinSQL(rowKey: deadKey)),
                range: range, rangeMembers: rule.keyIsRowid ? ScopeMembership.membersByRowidSQL : nil,
                arguments: arguments)
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
            return Decision(
                sent: isSent ? .asIs : .nothing, membership: state == 1 ? nil : .hold,
                moves: isSent && state != 1)
        }
        if state == 0 && isSent { return Decision(sent: .nothing, membership: nil, moves: false) }
        return Decision(
            sent: isAlive ? .eviction : (isSent ? .asIs : .nothing), membership: .leave,
            moves: state == 1 || !isSent)
    }

    /// The membership step of `decision` on the row at `place` (`handle`: the query reading it).
    static func step(of decision: Decision, _ place: Place, _ handle: OpaquePointer) -> Step? {
        switch decision.membership {
        case nil:
            guard decision.moves || decision.reconciles else { return nil }
            return Step(membership: .unchanged, moves: decision.moves, reconciles: decision.reconciles)
        case .hold:
            return Step(membership: .hold(rowid: place.rowid), moves: decision.moves)
        case .leave:
            // A row the peer does not hold has no member to mark.
            guard let rowKey = place.recordedKey(handle) else {
                return Step(membership: .unchanged, moves: decision.moves)
            }
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
            guard try statement.step() else {
                next = nil
                return
            }
            next = (sqlite3_column_int64(handle, 0), sqlite3_column_int64(handle, 1) != 0, SyncEngine.text(handle, 2))
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
    func members(
        of table: Int, from first: Int64, through last: Int64,
        _ connection: Connection
    ) throws -> MemberMerge? {
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
}
