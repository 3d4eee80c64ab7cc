// The layout's queries that end a full resync: the rows the sender did not confirm, or no longer holds.

extension RowMetadataLayout {
    /// Synced rows the end of a full resync removes: unchanged since it began (seq at most the
    /// `?1`), not confirmed by the sender (binds: resync start, peer, table name).
    var selectUnconfirmedRows: String {
        let ownRows = """
            SELECT m.row_id FROM \(rowsTable) AS m WHERE m.status = 0 AND m.in_flight = 0 AND m.seq <= ?1
              AND m.row_id NOT IN (SELECT row_id FROM tether_resync_seen WHERE peer = ?2 AND table_name = ?3)
            """
        // Without insert ranges, the table name is still bound: said in a condition that holds.
        if isWithoutRowid { return ownRows + " AND ?3 IS NOT NULL" }
        return ownRows + unmentionedRangeRows(status: "= 0")
    }

    /// Of the rows a full resync did not mention, those its sender held: made there (their
    /// existence version is the sender's), received from it, or inserted here (or, inserted before
    /// Tether knew, last changed here) at or before the sequence it acknowledged — synced, or
    /// updated here since. The sender no longer has them: they were deleted there. Binds: the
    /// sequence the resync began at, the sender, the table, the sender's site, the sequence the
    /// sender acknowledged, the sender's site as stored in `versions` (`RowVersions`: 4 bytes,
    /// little-endian, after the tag and the existence timestamp).
    var selectUnmentionedRowsTheSenderHeld: String {
        let ownRows = """
            SELECT m.row_id FROM \(rowsTable) AS m WHERE m.status IN (0, 2) AND m.seq <= ?1
              AND m.row_id NOT IN (SELECT row_id FROM tether_resync_seen WHERE peer = ?2 AND table_name = ?3)
              AND (m.via IS ?4 OR coalesce(m.inserted_seq, m.seq) <= ?5 OR substr(m.versions, 10, 4) = ?6)
            """
        if isWithoutRowid { return ownRows + " AND ?3 IS NOT NULL" }
        return ownRows + unmentionedRangeRows(status: "IN (0, 2)") + """

              AND (r.via IS ?4 OR r.site IS ?4 OR coalesce(r.inserted_first_seq, r.first_seq) + (t.rowid - \
            r.first_rowid) <= ?5)
            """
    }

    /// The other half of both queries: rows of insert ranges (no metadata of their own) unchanged
    /// since the resync began (`?1`), whose range status is `status`, not confirmed by the sender
    /// (`?2`) for the table (`?3`); `r` names the range for conditions added after it.
    private func unmentionedRangeRows(status: String) -> String {
        """

        UNION ALL
        SELECT t.rowid FROM \(quotedTable) AS t JOIN tether_insert_ranges AS r ON r.table_name = ?3
          AND t.rowid BETWEEN r.first_rowid AND r.last_rowid
          WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid)
          AND \(InsertRange.sequenceSQL(range: "r", rowid: "t.rowid")) <= ?1 AND \
        \(InsertRange.statusSQL(range: "r", rowid: "t.rowid")) \(status)
          AND t.rowid NOT IN (SELECT row_id FROM tether_resync_seen WHERE peer = ?2 AND table_name = ?3)
        """
    }
}
