// The layout's reads of the changes after a cursor (live rows, tombstones, insert ranges), plain and scoped.

extension RowMetadataLayout {
    /// Live rows with their own metadata after a sequence number, in order, but those received
    /// from a site (echoes, skipped here rather than read and dropped: a peer that sent this
    /// database a million rows has them all behind its cursor) (binds: after, limit, that site's
    /// id or NULL).
    var selectLiveChanges: String {
        """
        SELECT \(qualified("t", all)), m.seq, m.versions, m.status, m.via, m.row_id, m.inserted_seq \
        FROM \(rowsTable) AS m \(joinUser("t", on: "m.row_id")) WHERE m.seq > ?1 AND (?3 IS NULL OR m.via IS NOT ?3) \
        ORDER BY m.seq LIMIT ?2
        """
    }
    /// Tombstones after a sequence number, in order, but those received from a site (binds: after,
    /// limit, that site's id or NULL).
    var selectDeadChanges: String {
        """
        SELECT \(all.joined(separator: ", ")), tether_seq, tether_versions, tether_status, tether_via FROM \
        \(deadTable) WHERE tether_seq > ?1 AND (?3 IS NULL OR tether_via IS NOT ?3) ORDER BY tether_seq LIMIT ?2
        """
    }
    /// Result columns of `selectLiveChanges` and `selectDeadChanges`, after the key and value columns.
    enum Changes {
        static func sequence(_ base: Int32) -> Int32 { base }
        static func versions(_ base: Int32) -> Int32 { base + 1 }
        static func status(_ base: Int32) -> Int32 { base + 2 }
        static func via(_ base: Int32) -> Int32 { base + 3 }
        /// Live rows only.
        static func rowid(_ base: Int32) -> Int32 { base + 4 }
        /// Live rows only, not in the scoped query: the sequence number of the row's insert (NULL: unknown).
        static func insertedSequence(_ base: Int32) -> Int32 { base + 5 }
    }
    /// The live rows in a rowid range, in order (binds: first rowid, last rowid); the rowid follows
    /// the values. Those of an insert range are the ones not in `selectRowidsWithMetadata`.
    /// Never asked of a table WITHOUT ROWID, which has no insert ranges.
    var selectRangeRows: String {
        "SELECT \(qualified("t", all)), t.rowid FROM \(quotedTable) AS t WHERE t.rowid BETWEEN ? AND ? ORDER BY t.rowid"
    }
    /// The rowids in a range that have metadata of their own, in order (binds: first, last rowid).
    var selectRowidsWithMetadata: String {
        "SELECT row_id FROM \(rowsTable) WHERE row_id BETWEEN ? AND ? ORDER BY row_id"
    }

    // The same three queries with result columns of the caller's after their own, and a join of
    // the caller's (one row per row: a LEFT JOIN by key), for a scoped extraction, which reads a
    // row's place in a peer's scope with the row. The user's table is named by its own name, and
    // the metadata's columns are renamed tether_*, so that expressions written over the table (a
    // scope's filters, with bare column names) mean the table's columns. Named parameters (the
    // caller's own may appear in `adding` and `joining`). Tables with a rowid only.

    /// `selectLiveChanges`, then `adding` (binds :tether_after, :tether_limit).
    func selectLiveChanges(adding extra: [String], joining join: String) -> String {
        """
        SELECT \(qualified(quotedTable, all)), tether_m.tether_seq, tether_m.tether_versions, tether_m.tether_status, \
        tether_m.tether_via,
          tether_m.tether_row_id, \(extra.joined(separator: ", "))
        FROM (SELECT seq AS tether_seq, versions AS tether_versions, status AS tether_status, via AS tether_via, \
        row_id AS tether_row_id
              FROM \(rowsTable)) AS tether_m
        JOIN \(quotedTable) ON \(quotedTable).rowid = tether_m.tether_row_id
        \(join)
        WHERE tether_m.tether_seq > :tether_after ORDER BY tether_m.tether_seq LIMIT :tether_limit
        """
    }
    /// `selectDeadChanges`, then `adding`, over the tombstones table named `deadTable` (binds
    /// :tether_after, :tether_limit).
    func selectDeadChanges(adding extra: [String], joining join: String) -> String {
        """
        SELECT \(qualified(deadTable, all)), \(deadTable).tether_seq, \(deadTable).tether_versions, \
        \(deadTable).tether_status, \(deadTable).tether_via,
          \(extra.joined(separator: ", "))
        FROM \(deadTable) \(join)
        WHERE \(deadTable).tether_seq > :tether_after ORDER BY \(deadTable).tether_seq LIMIT :tether_limit
        """
    }
    /// `selectRangeRows`, then `adding` (binds :tether_first, :tether_last).
    func selectRangeRows(adding extra: [String], joining join: String) -> String {
        """
        SELECT \(qualified(quotedTable, all)), \(quotedTable).rowid, \(extra.joined(separator: ", ")) FROM \
        \(quotedTable) \(join)
        WHERE \(quotedTable).rowid BETWEEN :tether_first AND :tether_last ORDER BY \(quotedTable).rowid
        """
    }
    /// Live rows with no metadata of their own and outside every insert range: rows written before
    /// the table was synced (binds nothing).
    var selectRowsWithoutMetadata: String {
        if isWithoutRowid {
            return """
                SELECT \(rowid("t")) FROM \(quotedTable) AS t\(keysJoin("t")) WHERE NOT EXISTS (SELECT 1 FROM \
                \(rowsTable) AS m WHERE m.row_id = \(rowid("t"))) ORDER BY 1
                """
        }
        return """
            SELECT t.rowid FROM \(quotedTable) AS t WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = \
            t.rowid)
            AND NOT EXISTS (SELECT 1 FROM tether_insert_ranges r WHERE r.table_name = \(tableLiteral) AND t.rowid \
            BETWEEN r.first_rowid AND r.last_rowid)
            ORDER BY t.rowid
            """
    }

    /// Forgets the insert ranges no row belongs to any more (binds: table name).
    var pruneInsertRanges: String {
        if isWithoutRowid { return "DELETE FROM tether_insert_ranges WHERE table_name = ?" }
        return """
            DELETE FROM tether_insert_ranges WHERE table_name = ? AND NOT EXISTS (
              SELECT 1 FROM \(quotedTable) AS t WHERE t.rowid BETWEEN first_rowid AND last_rowid
              AND NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid))
            """
    }
}
