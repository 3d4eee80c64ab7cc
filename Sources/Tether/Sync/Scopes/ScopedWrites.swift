// Writes from a scoped peer: each change is checked against the writer's scope before and after,
// and refused (not written, reported) when it reaches outside; the writer records what was refused.

import Foundation
import TetherBatch

/// The changes of this database that peers refused, until garbage collection of nothing: the only
/// code that reads or writes `tether_refusals`.
enum RefusalStore {
    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_refusals (id INTEGER PRIMARY KEY, peer BLOB NOT NULL, table_name TEXT NOT \
        NULL, row_key BLOB NOT NULL,
          seq INTEGER NOT NULL, reason TEXT NOT NULL, refused_at REAL NOT NULL) STRICT;
        CREATE INDEX IF NOT EXISTS tether_refusals_row ON tether_refusals (peer, table_name, row_key);
        """

    /// Records `refusal`, in place of an earlier refusal of the same row by the same peer: what is
    /// kept is bounded by the rows each peer may refuse, however often it refuses them.
    static func record(_ refusal: RefusedChange, by peer: InstanceKey, _ connection: Connection) throws {
        let rowKey = StoredRowKey.encode(refusal.key)
        try connection.execute(
            "DELETE FROM tether_refusals WHERE peer = ? AND table_name = ? AND row_key = ?",
            [Data(peer.bytes), refusal.table, rowKey])
        try connection.execute(
            """
            INSERT INTO tether_refusals (peer, table_name, row_key, seq, reason, refused_at) VALUES (?, ?, ?, ?, \
            ?, ?)
            """,
            [Data(peer.bytes), refusal.table, rowKey, refusal.sequence, refusal.reason, Date().timeIntervalSince1970])
    }

    /// Forgets the refusals of changes to `table`, which is no longer synced.
    static func forget(table: String, _ connection: Connection) throws {
        try connection.execute("DELETE FROM tether_refusals WHERE table_name = ?", [table])
    }

    static func all(_ connection: Connection) throws -> [RefusedChange] {
        try connection.fetchRows("SELECT peer, table_name, row_key, seq, reason FROM tether_refusals ORDER BY id")
            .compactMap { row in
                guard let peer = InstanceKey(bytes: [UInt8](try row.get(0, as: Data.self))) else { return nil }
                let key = StoredRowKey.decode(try row.get(2, as: Data.self))
                return RefusedChange(
                    table: try row.get(1, as: String.self), key: key, sequence: try row.get(3, as: Int64.self),
                    reason: try row.get(4, as: String.self), refusedBy: peer)
            }
    }
}

/// What a scoped writer's batch is checked against beyond its scope, read once per batch.
struct WriterChecks {
    /// The writer's scope.
    var scope: CompiledScope
    /// Instance keys pinned here to another certificate than the writer's (see `ForgedOrigins.swift`).
    var foreignOrigins: [InstanceKey: String]
    /// The certificate the writer's key is pinned to, for the refusals' words.
    var writerCertificate: String?
}

/// What a scoped writer's change comes to, judged against its scope here.
enum WriterVerdict: Equatable {
    /// Applied as any peer's change is.
    case applied
    /// Taken, with nothing to write: a delete of a row this database does not hold (the writer
    /// opened and closed it between two syncs, or it is deleted here already). No tombstone is
    /// written, so a writer cannot mark as deleted rows it never held.
    case nothingToWrite
    /// Refused for this reason: nothing of it is written.
    case refused(String)
}

extension SyncEngine {
    /// What becomes of `change` from a scoped writer (Protocol/README.md §8.10, §7.4, §7.2): refused
    /// for a version claiming the key of another peer known here (a forged origin), an expiry entry
    /// on a row outside the writer's scope, a row outside it.
    func writerVerdict(of change: RowChange, _ mapping: TableMapping, _ checks: WriterChecks, _ connection: Connection)
        throws -> WriterVerdict
    {
        if let forged = try originRefusal(of: change, mapping, checks, connection) { return .refused(forged) }
        if mapping.table.name == ExpiryStore.syncedTable {
            return try expiryRefusal(of: change, scope: checks.scope, connection).map(WriterVerdict.refused) ?? .applied
        }
        return try verdict(on: change, mapping, scope: checks.scope, connection)
    }

    /// Why an expiry entry from a writer scoped by `scope` is refused, nil when it is applied: an
    /// expiry is a change to the row it names (§7.4), so that row must be inside the writer's scope
    /// here, as the batch leaves it (entries are applied after the batch's rows). An entry that
    /// sets an expiry needs the row; one removing it (a tombstone) may name a row gone here (the
    /// writer deleted it: its entry goes with it). A table the scope does not name is the writer's
    /// whole. `ExpiryStore.checkEntries` already refused entries that do not name a synced table's
    /// row by a JSON array of its key values.
    func expiryRefusal(of change: RowChange, scope: CompiledScope, _ connection: Connection) throws -> String? {
        guard change.key.count == 2, case let .text(named) = change.key[0], case let .text(rowKey) = change.key[1],
            let table = tables[named]
        else {
            return "an expiry entry that names no row of a table synced here"
        }
        guard let rule = scope.rules[named] else { return nil }
        var arguments = scope.parameters
        arguments[":tether_row_key"] = .text(rowKey)
        let quoted = table.quotedName
        let match = table.keyColumns.enumerated().map { position, column in
            "\(quoted).\(quoteIdentifier(column)) = json_extract(:tether_row_key, '$[\(position)]')"
        }.joined(separator: " AND ")
        var inside: Bool?
        try read("SELECT coalesce((\(rule.condition)), 0) != 0 FROM \(quoted) WHERE \(match)", arguments, connection) {
            handle in
            inside = sqlite3_column_int64(handle, 0) != 0
        }
        switch inside {
        case true?: return nil
        case false?: return "an expiry of row \(rowKey) of \(named), which is outside the writer's scope here"
        case nil: return change.isAlive ? "an expiry of row \(rowKey) of \(named), which does not exist here" : nil
        }
    }

    /// Whether `change` from a writer scoped by `scope` stays inside: the row as it is here must be
    /// inside (when it exists: an update or a delete may only touch a row the writer holds; a
    /// delete of a row absent here has nothing to write), and the row as the writer sent it must
    /// be inside (an insert or an update must land inside; its values are checked, the synced columns
    /// the writer sent, other columns read as NULL). Tables the scope does not name are the writer's whole.
    func verdict(on change: RowChange, _ mapping: TableMapping, scope: CompiledScope, _ connection: Connection) throws
        -> WriterVerdict
    {
        let table = mapping.table
        guard let rule = scope.rules[table.name] else { return .applied }
        var arguments = scope.parameters
        for (index, value) in change.key.enumerated() { arguments[":tether_k\(index)"] = value }
        let quoted = table.quotedName
        let match = table.keyColumns.indices.map {
            "\(quoted).\(quoteIdentifier(table.keyColumns[$0])) = :tether_k\($0)"
        }.joined(separator: " AND ")
        var liveHere: Bool?
        try read("SELECT coalesce((\(rule.condition)), 0) != 0 FROM \(quoted) WHERE \(match)", arguments, connection) {
            handle in
            liveHere = sqlite3_column_int64(handle, 0) != 0
        }
        if liveHere == false { return .refused("the row is outside the writer's scope here") }
        guard change.isAlive else {
            if liveHere == nil, try localRow(table, change.key, connection) == nil {
                return .nothingToWrite
            }
            return .applied
        }
        // The row as the writer sent it (a partial change completed with the values held here).
        var values = change.values
        if change.isPartial, let local = try localRow(table, change.key, connection) {
            for (remoteIndex, left) in change.omitted.enumerated() where left && remoteIndex < mapping.localIndex.count
            {
                values[remoteIndex] = local.values[mapping.localIndex[remoteIndex]]
            }
        }
        var columns: [String: DatabaseValue] = [:]
        for (index, name) in table.keyColumns.enumerated() { columns[name] = change.key[index] }
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated() {
            columns[table.valueColumns[localIndex]] = values[remoteIndex]
        }
        let names = try connection.fetchRows("SELECT name FROM pragma_table_info(?)", [table.name]).map {
            try $0.get(0, as: String.self)
        }
        var selected: [String] = []
        for (index, name) in names.enumerated() {
            arguments[":tether_c\(index)"] = columns[name] ?? .null
            selected.append(":tether_c\(index) AS \(quoteIdentifier(name))")
        }
        var inside = false
        try read(
            """
            SELECT coalesce((\(rule.condition)), 0) != 0 FROM (SELECT \(selected.joined(separator: ", "))) AS \
            \(quoted)
            """, arguments, connection
        ) { handle in
            inside = sqlite3_column_int64(handle, 0) != 0
        }
        return inside ? .applied : .refused("the row as written is outside the writer's scope")
    }

    /// A refused change's row is the writer's no more: what it holds of it is forgotten, and the
    /// next backfill for it sends this database's row if it is inside its scope.
    func forgetRefused(_ change: RowChange, table: SyncedTable, writer: InstanceKey, _ connection: Connection) throws {
        try connection.scopeMembership.forgetRow(
            writer, table: table.name, rowKey: try membershipKey(of: change.key, connection))
        // Had the row left the scope here, its children went with it: not through this row's
        // eviction (the writer drops the row itself), so through a reconcile.
        if let scope = writerScope {
            try connection.scopeMembership.setNeedsReconcile(writer, tables: scope.dependents(of: table.name))
            try resendReferencingRows(of: table, key: change.key, writer: writer, scope: scope, connection)
        }
    }

    /// The writer drops its version of a refused row, and SQLite's ON DELETE CASCADE may take there
    /// the rows that reference it, even those this database accepted from it. The rows referencing it
    /// by the scope's links (and theirs, down the chain) that are inside the writer's scope may be
    /// lost, not forgotten (`ScopeMembership.markMayBeLost`): the backfill sends them whole again
    /// (sending a row the writer kept is harmless), and until then a change moving one out still
    /// sends its eviction. The others stay held: their eviction, due anyway, is harmless where the
    /// row is gone.
    func resendReferencingRows(
        of table: SyncedTable, key: [DatabaseValue], writer: InstanceKey, scope: CompiledScope,
        _ connection: Connection
    ) throws {
        var arguments = scope.parameters
        arguments[ScopeMembership.peerParameter] = .blob(Data(writer.bytes))
        for (index, value) in key.enumerated() { arguments[":tether_k\(index)"] = value }
        // Each table reached, with an SQL condition on its rows: those below the refused row.
        var frontier: [(table: String, rows: String)] = [
            (
                table.name,
                table.keyColumns.enumerated().map { index, column in
                    "\(table.quotedName).\(quoteIdentifier(column)) IS :tether_k\(index)"
                }.joined(separator: " AND ")
            )
        ]
        let rules = scope.rules.sorted { $0.key < $1.key }
        while let (parent, parentRows) = frontier.popLast() {
            for (name, rule) in rules {
                for link in rule.links where link.parent == parent {
                    let quoted = quoteIdentifier(name), quotedParent = quoteIdentifier(parent)
                    let rows = """
                        \(quoted).\(quoteIdentifier(link.column)) IN (SELECT \(quotedParent).\
                        \(quoteIdentifier(link.parentColumn)) FROM \(quotedParent) WHERE \(parentRows))
                        """
                    let rowKey = ScopeMembership.rowKeySQL(quotedTable: quoted, keyColumns: rule.table.keyColumns)
                    arguments[ScopeMembership.tableParameter] = .text(name)
                    try connection.scopeMembership.markMayBeLost(
                        rowKeys: """
                            SELECT \(rowKey) FROM \(quoted) WHERE \(rows) AND coalesce((\(rule.condition)), 0) != 0
                            """, arguments)
                    frontier.append((name, rows))
                }
            }
        }
    }

    /// A row a peer sent, of a table this database sends it in part (the change was not refused):
    /// the peer holds the row, whatever the merge here makes of it — so that a later change moving
    /// it out of the peer's scope evicts it there, even when that change supersedes the write before
    /// the peer pulls its echo, and so that an echo of a row not held is known as one the peer dropped.
    func holdWritten(_ change: RowChange, table: SyncedTable, writer: InstanceKey, _ connection: Connection) throws {
        try connection.scopeMembership.hold(
            writer, table: table.name, rowKey: try membershipKey(of: change.key, connection))
    }

    /// A row's key as membership records it (`ScopeMembership.rowKeySQL`), from its values.
    func membershipKey(of key: [DatabaseValue], _ connection: Connection) throws -> String {
        var arguments: [String: DatabaseValue] = [:]
        for (index, value) in key.enumerated() { arguments[":tether_k\(index)"] = value }
        let rowKey = key.indices.map { "quote(:tether_k\($0))" }.joined(separator: " || ',' || ")
        var text = ""
        try read("SELECT \(rowKey)", arguments, connection) { handle in text = Self.text(handle, 0) }
        return text
    }

    /// Runs `body` (an apply) with the changes checked against `scope`, the writer's.
    func withWriterScope<T>(_ scope: SyncScope?, _ connection: Connection, _ body: () throws -> T) throws -> T {
        guard let scope else { return try body() }
        let outer = writerScope
        writerScope = try compile(scope, connection)
        defer { writerScope = outer }
        return try body()
    }

    /// Records that `peer` refused `refusals`, changes of this database's, and drops this database's
    /// version of each row (live row, metadata and tombstone, without capture): the refusing peer
    /// sends its own at the next pull, when the row is inside this database's scope.
    func recordRefusals(_ refusals: [RefusedChange], by peer: InstanceKey, _ connection: Connection) throws {
        for refusal in refusals {
            try RefusalStore.record(refusal, by: peer, connection)
            guard let table = tables[refusal.table] else { continue }
            _ = try evict(
                .eviction(
                    table: 0, key: refusal.key, existence: Version(timestamp: .zero, origin: peer),
                    sequence: refusal.sequence),
                table, from: peer, connection)
            try connection.withoutCapture(.everything) {
                try table.statement(.deleteDeadByKey, connection).execute(StatementArguments(values: refusal.key))
            }
        }
    }
}

import CSQLite
