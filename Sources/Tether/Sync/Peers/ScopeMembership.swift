import Foundation

/// What each scoped peer holds of each scoped table, and the scope it was last sent under — the
/// only code that reads or writes those records (`tether_scope_members`, `tether_scope_rules`).
///
/// A row is recorded by its key, as the text SQLite's `quote()` gives each key column (joined by
/// commas): the same for the live row and its tombstone, and computed in SQL only, so that every
/// query that joins membership agrees with every other.
///
/// A member is *held* (the peer has the row) or *leaving* (`removed_seq` set: an eviction or a delete
/// was sent at that sequence, and the peer may not have applied it yet). A leaving member still
/// counts as possibly held — an eviction is sent again if the row changes — and is forgotten once
/// the peer acknowledges through `removed_seq`: membership errs only towards sending more. A member
/// the peer may have lost (`markMayBeLost`) is leaving at a sequence no acknowledgement reaches:
/// possibly held until the backfill sends the row whole again, or its eviction or delete is sent.
///
/// Members are keyed by the row's key first: a scoped extraction looks up every row of its batch,
/// and each comparison of that lookup is then decided by the key alone, not after a peer and a
/// table name that every member of the table shares. The members of a table keyed by its rowid are
/// indexed by that integer too, so that the rows of a range of rowids are merged with theirs.
struct ScopeMembership {
    let connection: Connection

    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_scope_members (row_key TEXT NOT NULL, table_name TEXT NOT NULL, peer BLOB \
        NOT NULL, removed_seq INTEGER, PRIMARY KEY (row_key, table_name, peer)) STRICT, WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS tether_scope_members_removed ON tether_scope_members (peer, removed_seq) WHERE \
        removed_seq IS NOT NULL;
        CREATE INDEX IF NOT EXISTS tether_scope_members_by_integer ON tether_scope_members (table_name, peer, \
        CAST(row_key AS INTEGER));
        CREATE TABLE IF NOT EXISTS tether_scope_rules (peer BLOB NOT NULL, table_name TEXT NOT NULL, fingerprint TEXT \
        NOT NULL, needs_reconcile INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (peer, table_name)) STRICT, WITHOUT ROWID;
        """

    /// Named parameters of the queries below: the peer's instance key and the table's name.
    static let peerParameter = ":tether_peer"
    static let tableParameter = ":tether_table"

    /// A row's key as membership records it (an SQL expression over `quotedTable.key…`).
    static func rowKeySQL(quotedTable: String, keyColumns: [String]) -> String {
        keyColumns.map { "quote(\(quotedTable).\(quoteIdentifier($0)))" }.joined(separator: " || ',' || ")
    }

    /// `rowKeySQL`, for a key that is the table's rowid (`keyIsRowid`, an integer) spelled as a
    /// cast, which gives an integer the text quote() gives it without a function call per row.
    static func rowKeySQL(quotedTable: String, keyColumns: [String], keyIsRowid: Bool) -> String {
        guard keyIsRowid, keyColumns.count == 1 else {
            return rowKeySQL(quotedTable: quotedTable, keyColumns: keyColumns)
        }
        return "CAST(\(quotedTable).\(quoteIdentifier(keyColumns[0])) AS TEXT)"
    }

    /// 0 when the peer does not hold the row `rowKey` (an SQL expression), 1 when it holds it,
    /// 2 when it is leaving (an SQL expression; binds the peer and table parameters).
    static func stateSQL(rowKey: String) -> String {
        "coalesce(\(memberSQL("CASE WHEN s.removed_seq IS NULL THEN 1 ELSE 2 END", rowKey: rowKey)), 0)"
    }

    /// `expression` (over `s`, the member's record) for the row `rowKey`, NULL when the peer does not
    /// hold it (binds the peer and table parameters).
    private static func memberSQL(_ expression: String, rowKey: String) -> String {
        """
        (SELECT \(expression) FROM tether_scope_members AS s
          WHERE s.peer = \(peerParameter) AND s.table_name = \(tableParameter) AND s.row_key = \(rowKey))
        """
    }

    /// Whether the peer holds the row (an SQL condition, not leaving).
    static func heldSQL(rowKey: String) -> String { "\(stateSQL(rowKey: rowKey)) = 1" }

    /// `removed_seq` of a member the peer may have lost (`markMayBeLost`): no acknowledgement reaches it.
    static let mayBeLostSequence = Int64.max

    /// Whether the peer holds the row or may have lost it (an SQL condition): not an eviction or a
    /// delete on its way, so one is due if the row is outside its scope (binds the peer and table
    /// parameters).
    static func heldOrMayBeLostSQL(rowKey: String) -> String {
        let heldOrMayBeLost = "s.removed_seq IS NULL OR s.removed_seq = \(mayBeLostSequence)"
        return "coalesce(\(memberSQL(heldOrMayBeLost, rowKey: rowKey)), 0)"
    }

    /// What the peer holds of the row `rowKey` (an SQL expression), joined to a query as
    /// `tether_member` (a LEFT JOIN: nothing when not held), its columns renamed tether_member_* so
    /// that the bare column names of the query's other expressions cannot mean them. One cursor for
    /// the whole query, where `stateSQL` opens one per row. Binds the peer and table parameters.
    static func joinSQL(rowKey: String) -> String {
        """
        LEFT JOIN (SELECT row_key AS tether_member_key, table_name AS tether_member_table, peer AS tether_member_peer, \
        removed_seq AS tether_member_removed
                   FROM tether_scope_members) AS tether_member
          ON tether_member.tether_member_key = \(rowKey) AND tether_member.tether_member_table = \(tableParameter) AND \
        tether_member.tether_member_peer = \(peerParameter)
        """
    }

    /// In a query with `joinSQL`: the state, as `stateSQL` gives it.
    static let joinedStateSQL = """
        CASE WHEN tether_member.tether_member_key IS NULL THEN 0 WHEN tether_member.tether_member_removed IS NULL \
        THEN 1 ELSE 2 END
        """
    /// In a query with `joinSQL`: the row's key as recorded, NULL when the peer does not hold it.
    static let joinedRowKeySQL = "tether_member.tether_member_key"

    /// The members of a table keyed by its rowid (`keyIsRowid`: every key an integer, recorded as its
    /// decimal text) whose rowids are in :tether_first...:tether_last, in rowid order: rowid, whether
    /// leaving, recorded key (binds the peer and table parameters). A key that is not an integer's
    /// text (recorded before the table's key changed) casts to a number it is not, and is left out.
    static let membersByRowidSQL = """
        SELECT CAST(row_key AS INTEGER), removed_seq IS NOT NULL, row_key FROM tether_scope_members
        WHERE table_name = \(tableParameter) AND peer = \(peerParameter) AND CAST(row_key AS INTEGER) BETWEEN \
        :tether_first AND :tether_last
          AND row_key = CAST(CAST(row_key AS INTEGER) AS TEXT)
        ORDER BY CAST(row_key AS INTEGER)
        """

    // MARK: Rows

    /// The peer holds the row (again): not leaving.
    func hold(_ peer: InstanceKey, table: String, rowKey: String) throws {
        try connection.cachedStatement(
            """
            INSERT INTO tether_scope_members (peer, table_name, row_key) VALUES (?, ?, ?)
            ON CONFLICT (row_key, table_name, peer) DO UPDATE SET removed_seq = NULL
            """
        ).execute([Data(peer.bytes), table, rowKey])
    }

    /// The peer holds these rows of `table` (again), named by rowid: their keys are read here, by
    /// one statement for them all (`keyIsRowid`: see `rowKeySQL(quotedTable:keyColumns:keyIsRowid:)`).
    func hold(_ peer: InstanceKey, table: SyncedTable, rowids: [Int64], keyIsRowid: Bool) throws {
        guard !rowids.isEmpty else { return }
        let quoted = table.quotedName
        // A key that is the rowid is the rowid: its text is made from it, without reading the row.
        // WHERE before ON CONFLICT: SQLite's parser needs it to tell the upsert from a join.
        let rows =
            keyIsRowid
            ? """
            SELECT ?, ?, \(Self.rowKeySQL(quotedTable: "rowids", keyColumns: ["value"], keyIsRowid: true)) FROM \
            json_each(?) AS rowids WHERE true
            """
            : """
            SELECT ?, ?, \(Self.rowKeySQL(quotedTable: quoted, keyColumns: table.keyColumns)) FROM \(quoted) \
            WHERE \(quoted).rowid IN (SELECT value FROM json_each(?))
            """
        try connection.cachedStatement(
            """
            INSERT INTO tether_scope_members (peer, table_name, row_key) \(rows)
            ON CONFLICT (row_key, table_name, peer) DO UPDATE SET removed_seq = NULL
            """
        ).execute([Data(peer.bytes), table.name, "[" + rowids.map(String.init).joined(separator: ",") + "]"])
    }

    /// An eviction or a delete of the row went to the peer at `sequence`.
    func markLeaving(_ peer: InstanceKey, table: String, rowKey: String, at sequence: Int64) throws {
        try connection.cachedStatement(
            "UPDATE tether_scope_members SET removed_seq = ? WHERE peer = ? AND table_name = ? AND row_key = ?"
        )
        .execute([sequence, Data(peer.bytes), table, rowKey])
    }

    /// The held rows of `table` whose keys `rowKeys` selects (an SQL query; `arguments` binds it and
    /// the peer and table parameters, and those of `rowKeys` among others) may be lost at the peer
    /// (the rows referencing one of its refused rows: dropping that row, it may have dropped them).
    func markMayBeLost(rowKeys: String, _ arguments: [String: DatabaseValue]) throws {
        try SyncEngine.read(
            """
            UPDATE tether_scope_members SET removed_seq = \(Self.mayBeLostSequence)
            WHERE peer = \(Self.peerParameter) AND table_name = \(Self.tableParameter) AND removed_seq IS NULL AND \
            row_key IN (\(rowKeys))
            """, arguments, connection
        ) { _ in }
    }

    /// Records every live row of `table` as held: what a peer that received the table whole holds
    /// when a scope first applies to it (errs towards evicting rows it may lack, which is harmless).
    func holdEveryRow(_ peer: InstanceKey, of table: SyncedTable) throws {
        try connection.execute(
            """
            INSERT OR IGNORE INTO tether_scope_members (peer, table_name, row_key)
            SELECT ?, ?, \(Self.rowKeySQL(quotedTable: table.quotedName, keyColumns: table.keyColumns)) FROM \
            \(table.quotedName)
            """, [Data(peer.bytes), table.name])
    }

    /// The peer's change to the row was refused: it drops its version, and holds the row no more
    /// until the table's next reconcile sends this database's (when inside its scope).
    func forgetRow(_ peer: InstanceKey, table: String, rowKey: String) throws {
        try connection.execute(
            "DELETE FROM tether_scope_members WHERE peer = ? AND table_name = ? AND row_key = ?",
            [Data(peer.bytes), table, rowKey])
        try setNeedsReconcile(peer, tables: [table])
    }

    /// Whether acknowledging `sequence` would confirm that rows left `peer`.
    func awaitsAcknowledgement(of peer: InstanceKey, through sequence: Int64) throws -> Bool {
        try connection.fetchValue(
            """
            SELECT EXISTS (SELECT 1 FROM tether_scope_members WHERE peer = ? AND removed_seq IS NOT NULL AND \
            removed_seq <= ?)
            """, [Data(peer.bytes), sequence], as: Bool.self) ?? true
    }

    /// `peer` applied this database's changes through `sequence`: the rows that left it by then are gone.
    func acknowledge(_ peer: InstanceKey, through sequence: Int64) throws {
        try connection.cachedStatement(
            "DELETE FROM tether_scope_members WHERE peer = ? AND removed_seq IS NOT NULL AND removed_seq <= ?"
        )
        .execute([Data(peer.bytes), sequence])
    }

    // MARK: Rules

    struct RuleRecord {
        var fingerprint: String
        var needsReconcile: Bool
    }

    /// The scope each table of `peer` was last sent under, by table name.
    func rules(of peer: InstanceKey) throws -> [String: RuleRecord] {
        var records: [String: RuleRecord] = [:]
        for row in try connection.fetchRows(
            "SELECT table_name, fingerprint, needs_reconcile FROM tether_scope_rules WHERE peer = ?", [Data(peer.bytes)]
        ) {
            records[try row.get(0, as: String.self)] = RuleRecord(
                fingerprint: try row.get(1, as: String.self), needsReconcile: try row.get(2, as: Bool.self))
        }
        return records
    }

    /// Records `table`'s rule for `peer`; with `needsReconcile`, what the peer holds must be compared
    /// with the rule again (`SyncEngine.extractScopeBackfill`).
    func saveRule(_ peer: InstanceKey, table: String, fingerprint: String, needsReconcile: Bool) throws {
        try connection.execute(
            """
            INSERT INTO tether_scope_rules (peer, table_name, fingerprint, needs_reconcile) VALUES (?, ?, ?, ?)
            ON CONFLICT (peer, table_name) DO UPDATE SET fingerprint = excluded.fingerprint,
              needs_reconcile = max(needs_reconcile, excluded.needs_reconcile)
            """, [Data(peer.bytes), table, fingerprint, needsReconcile])
    }

    func setNeedsReconcile(_ peer: InstanceKey, tables: Set<String>) throws {
        for table in tables {
            try connection.cachedStatement(
                "UPDATE tether_scope_rules SET needs_reconcile = 1 WHERE peer = ? AND table_name = ?"
            )
            .execute([Data(peer.bytes), table])
        }
    }

    func reconciled(_ peer: InstanceKey, table: String) throws {
        try connection.execute(
            "UPDATE tether_scope_rules SET needs_reconcile = 0 WHERE peer = ? AND table_name = ?",
            [Data(peer.bytes), table])
    }

    /// `table` is no longer synced: what every peer holds of it, and the scope each was sent it
    /// under, are forgotten (synced again, it counts as newly scoped for each peer).
    func forgetTable(_ table: String) throws {
        try connection.execute("DELETE FROM tether_scope_members WHERE table_name = ?", [table])
        try connection.execute("DELETE FROM tether_scope_rules WHERE table_name = ?", [table])
    }

    /// The peer holds `table` whole again: nothing of it is recorded.
    func forget(_ peer: InstanceKey, table: String) throws {
        try connection.execute(
            "DELETE FROM tether_scope_members WHERE peer = ? AND table_name = ?", [Data(peer.bytes), table])
        try connection.execute(
            "DELETE FROM tether_scope_rules WHERE peer = ? AND table_name = ?", [Data(peer.bytes), table])
    }
}

extension Connection {
    /// What scoped peers hold, read and written on this connection.
    var scopeMembership: ScopeMembership { ScopeMembership(connection: self) }
}
