// A row's sync status and in-flight flag as SQL the application reads, inspection, and the counts of changes.

extension RowMetadataLayout {
    /// The column names a `SyncableModel` maps `syncStatus` and `inFlight` onto: read from the
    /// metadata, never stored in the user's table.
    static let statusColumn = "tether_status"
    static let inFlightColumn = "tether_in_flight"
    static let syncStateColumns: Set<String> = [statusColumn, inFlightColumn]

    /// The SQL expression a model's select reads for one of `syncStateColumns`.
    static func syncStateSQL(column: String, table: String) -> String {
        let rowid = "\(quoteIdentifier(table)).rowid"
        return column == statusColumn ? statusSQL(table: table, rowid: rowid) : inFlightSQL(table: table, rowid: rowid)
    }

    /// The status of the row `rowid` of `table` (an SQL expression): its own, its insert range's,
    /// or `created` for a row of a table not synced yet.
    static func statusSQL(table: String, rowid: String) -> String {
        let rows = quoteIdentifier(rowsTableName(of: table))
        return """
            coalesce((SELECT m.status FROM \(rows) AS m WHERE m.row_id = \(rowid)), \
            \(InsertRange.rowStatusSQL(table: table, rowid: rowid, status: true)), \(SyncStatus.created.rawValue))
            """
    }

    /// Whether the row `rowid` of `table` is in flight (an SQL expression, 0 or 1).
    static func inFlightSQL(table: String, rowid: String) -> String {
        let rows = quoteIdentifier(rowsTableName(of: table))
        return """
            coalesce((SELECT m.in_flight FROM \(rows) AS m WHERE m.row_id = \(rowid)), \
            \(InsertRange.rowStatusSQL(table: table, rowid: rowid, status: false)), 0)
            """
    }

    /// `table`'s rows with their metadata as columns — `tether_seq` (NULL for a row of an insert
    /// range), `tether_status`, `tether_in_flight`, `tether_versions`, `tether_via` — as a
    /// subquery named like the table, to read in place of it when inspecting (tests, debugging).
    /// `withoutRowidKey`: the primary key of a table WITHOUT ROWID.
    static func inspectionSQL(table: String, withoutRowidKey: [String]? = nil) -> String {
        let rows = quoteIdentifier(rowsTableName(of: table))
        let rowid = rowidSQL(table: table, alias: "u", withoutRowidKey: withoutRowidKey)
        return """
            (SELECT u.*, m.seq AS tether_seq, \(statusSQL(table: table, rowid: rowid)) AS tether_status,
              \(inFlightSQL(table: table, rowid: rowid)) AS tether_in_flight, m.versions AS tether_versions, m.via AS \
            tether_via,
              coalesce(m.seq, \(InsertRange.rowSequenceSQL(table: table, rowid: rowid))) AS tether_effective_seq
             FROM \(quoteIdentifier(table)) AS u LEFT JOIN \(rows) AS m ON m.row_id = \(rowid)) AS \
            \(quoteIdentifier(table))
            """
    }

    /// The `row_id` of the row `alias` of `table` in its metadata (an SQL expression): its rowid,
    /// or for a table WITHOUT ROWID (`primaryKey` its key columns) its surrogate.
    static func rowidSQL(table: String, alias: String, withoutRowidKey primaryKey: [String]?) -> String {
        guard let primaryKey else { return "\(alias).rowid" }
        let match = primaryKey.enumerated().map {
            "k.\(WithoutRowidKey.keysColumn($0.offset)) = \(alias).\(quoteIdentifier($0.element))"
        }
        return """
            (SELECT k.row_id FROM \(quoteIdentifier(keysTableName(of: table))) AS k WHERE \
            \(match.joined(separator: " AND ")))
            """
    }

    /// Rows of `table` with a change not acknowledged yet, or in flight (an SQL condition).
    static func pendingSQL(table: String) -> String {
        let rowid = "\(quoteIdentifier(table)).rowid"
        return "(\(statusSQL(table: table, rowid: rowid)) != 0 OR \(inFlightSQL(table: table, rowid: rowid)) != 0)"
    }

    /// Rows of `table` whose change was sent and awaits acknowledgement (an SQL condition).
    static func inFlightConditionSQL(table: String) -> String {
        "\(inFlightSQL(table: table, rowid: "\(quoteIdentifier(table)).rowid")) != 0"
    }

    /// Changes after a sequence number (binds: after, and the table name for the ranges' rows).
    var countChangesAfter: [String] {
        [
            "SELECT count(*) FROM \(rowsTable) WHERE seq > ?1 AND (?2 IS NULL OR via IS NOT ?2)",
            "SELECT count(*) FROM \(deadTable) WHERE tether_seq > ?1 AND (?2 IS NULL OR tether_via IS NOT ?2)",
            // Rows of insert ranges, counted by their sequence numbers (a row changed since is counted
            // twice: an estimate).
            """
            SELECT coalesce(sum(max(0, min(last_rowid - first_rowid + 1, first_seq + last_rowid - first_rowid - ?1))), \
            0)
            FROM tether_insert_ranges WHERE table_name = ?3 AND (?2 IS NULL OR via IS NOT ?2)
            """,
        ]
    }
    /// Changes not acknowledged yet, or in flight (binds nothing).
    var countPending: [String] {
        [
            "SELECT count(*) FROM \(rowsTable) WHERE status != 0 OR in_flight != 0",
            "SELECT count(*) FROM \(deadTable) WHERE tether_status != 0 OR tether_in_flight != 0",
            // Rows of insert ranges (a table WITHOUT ROWID has none).
            isWithoutRowid
                ? "SELECT 0"
                : """
                SELECT count(*) FROM \(quotedTable) AS t WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE \
                m.row_id = t.rowid) AND \(InsertRange.rowStatusSQL(table: table, rowid: "t.rowid", status: true)) \
                != 0
                """,
        ]
    }
}
