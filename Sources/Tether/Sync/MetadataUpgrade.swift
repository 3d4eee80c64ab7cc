import Foundation

/// Moves a database's sync metadata to the current layout (`RowMetadataLayout.formatVersion`)
/// when it is opened, inside the opening transaction: nothing is lost, and peers keep their
/// cursors (sequence numbers, versions, sites and peers are carried over as they are).
///
/// Format 1 (before 2026-11-23) kept a synced row's metadata in five columns added to the
/// user's table (`tether_seq`, `tether_status`, `tether_in_flight`, `tether_versions`,
/// `tether_via`); format 2 keeps it in `tether_rows_<table>` and leaves the user's table as
/// declared; format 3 records in `inserted_seq` when each row was inserted; format 4 lets an
/// insert range stand for rows updated together (`versions`, `inserted_first_seq`); format 5
/// records the certificate each peer presented (`tether_peer_certificates.name`, `fingerprint`);
/// format 6 may store a row's versions in the sparse form (`RowVersions`), which a library of
/// format 5 would take for damaged metadata: nothing to move, the number tells it apart; format 7
/// keeps the earlier values of this site's counter contributions after a row's counter states
/// (`ContributionHistory`), from the clock of the move on.
enum MetadataUpgrade {
    static let formatOneColumns = ["tether_seq", "tether_status", "tether_in_flight", "tether_versions", "tether_via"]

    static func run(_ connection: Connection) throws {
        guard let format = try InstanceIdentity.storedFormat(connection) else { return }  // a new database
        if format == RowMetadataLayout.formatVersion { return }
        guard format < RowMetadataLayout.formatVersion else {
            throw SyncError.corruptMetadata(
                """
                the database's sync metadata has format \(format), made by a newer Tether; this version reads \
                format \(RowMetadataLayout.formatVersion) and older
                """)
        }
        if format < 2 {
            do {
                try upgradeFromFormatOne(connection)
            } catch let error as DatabaseError {
                throw SyncError.corruptMetadata(
                    """
                    cannot move the sync metadata out of the synced tables (format 1 to \
                    \(RowMetadataLayout.formatVersion)): \(error.message)
                    """)
            }
        }
        do {
            try addInsertedSequences(connection)
        } catch let error as DatabaseError {
            throw SyncError.corruptMetadata(
                """
                cannot add inserted_seq to the row metadata (format \(format) to \
                \(RowMetadataLayout.formatVersion)): \(error.message)
                """)
        }
        do {
            try addRangeVersions(connection)
        } catch let error as DatabaseError {
            throw SyncError.corruptMetadata(
                """
                cannot add the updated rows' columns to tether_insert_ranges (format \(format) to \
                \(RowMetadataLayout.formatVersion)): \(error.message)
                """)
        }
        do {
            try addPresentedCertificates(connection)
        } catch let error as DatabaseError {
            throw SyncError.corruptMetadata(
                """
                cannot add the presented certificate's columns to tether_peer_certificates (format \(format) to \
                \(RowMetadataLayout.formatVersion)): \(error.message)
                """)
        }
        if format < 7, try connection.tableExists("tether_clock") {
            try InstanceIdentity.recordCounterHistoryKeptSince(
                HybridClock.storedClock(connection).timestamp, connection)
        }
        try InstanceIdentity.recordFormat(RowMetadataLayout.formatVersion, connection)
    }

    /// Format 4 to 5: `tether_peer_certificates` gains the name and fingerprint of the certificate
    /// each peer presented, NULL for the keys it holds until their peer's next session.
    private static func addPresentedCertificates(_ connection: Connection) throws {
        guard try connection.tableExists("tether_peer_certificates") else { return }
        let present = try columnNames(of: "tether_peer_certificates", connection)
        for column in PeerStore.presentedCertificateColumns where !present.contains(column.name) {
            try connection.execute("ALTER TABLE tether_peer_certificates ADD COLUMN \(column.definition)")
        }
    }

    /// Format 2 to 3: every rows table gains `inserted_seq`, NULL for the rows it holds (not known:
    /// observers reading them back report them as updates).
    private static func addInsertedSequences(_ connection: Connection) throws {
        let rowsTables = try connection.fetchRows(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'tether\\_rows\\_%' ESCAPE '\\'"
        )
        .map { try $0.get(0, as: String.self) }
        for table in rowsTables where !(try columnNames(of: table, connection).contains("inserted_seq")) {
            try connection.execute(RowMetadataLayout.addInsertedSequence(to: table))
        }
    }

    /// Format 3 to 4: `tether_insert_ranges` gains the columns of ranges of updated rows, NULL for
    /// the ranges it holds (rows as inserted).
    private static func addRangeVersions(_ connection: Connection) throws {
        guard try connection.tableExists("tether_insert_ranges") else { return }
        let present = try columnNames(of: "tether_insert_ranges", connection)
        for column in SyncEngine.insertRangesUpdateColumns where !present.contains(column.name) {
            try connection.execute("ALTER TABLE tether_insert_ranges ADD COLUMN \(column.definition)")
        }
    }

    private static func upgradeFromFormatOne(_ connection: Connection) throws {
        if try connection.tableExists("tether_insert_ranges") {
            for column in ["status", "sent_through", "acknowledged_through"] {
                try connection.execute(
                    "ALTER TABLE tether_insert_ranges ADD COLUMN \(column) INTEGER NOT NULL DEFAULT 0")
            }
        }
        try connection.executeScript(SyncEngine.metadataSchema)
        let synced =
            try connection.tableExists("tether_tables")
            ? try connection.fetchRows("SELECT name, key_columns, value_columns, captures_external FROM tether_tables")
            : []
        var syncedNames = Set<String>()
        for row in synced {
            let name = try row.get(0, as: String.self)
            syncedNames.insert(name)
            let decoder = JSONDecoder()
            let layout = RowMetadataLayout(
                table: name,
                keyColumns: try decoder.decode([String].self, from: Data(try row.get(1, as: String.self).utf8)),
                valueColumns: try decoder.decode([String].self, from: Data(try row.get(2, as: String.self).utf8)))
            try upgrade(layout, capturesExternalWrites: try row.get(3, as: Bool.self), connection)
        }
        // A SyncableModel's table that was never synced had the two status columns too.
        for name in try connection.userTableNames() {
            guard !syncedNames.contains(name) else { continue }
            let columns = Set(try columnNames(of: name, connection))
            guard columns.contains("tether_status") && columns.contains("tether_in_flight") else { continue }
            try dropFormatOneColumns(of: name, present: columns, connection)
            try connection.execute(RowMetadataLayout.createRowsTable(of: name))
        }
        if try connection.tableExists("tether_pending_updates") {
            try connection.execute(
                """
                INSERT INTO tether_external_changes (table_name, row_id, inserted, mask)
                SELECT table_name, row_id, 0, mask FROM tether_pending_updates WHERE mask != 0 ORDER BY id
                """)
            try connection.execute("DROP TABLE tether_pending_updates")
        }
    }

    private static func upgrade(_ layout: RowMetadataLayout, capturesExternalWrites: Bool, _ connection: Connection)
        throws
    {
        let table = layout.quotedTable
        let name = layout.table
        for trigger in ["update", "rekey", "delete"] {
            try connection.execute("DROP TRIGGER IF EXISTS \(quoteIdentifier("tether_\(trigger)_\(name)"))")
        }
        for sql in layout.createTables { try connection.execute(sql) }
        let columns = Set(try columnNames(of: name, connection))
        guard columns.isSuperset(of: formatOneColumns) else {
            throw SyncError.corruptMetadata("synced table \(name) lacks the sync columns of format 1")
        }
        // Rows with their own metadata.
        try connection.execute(
            """
            INSERT OR REPLACE INTO \(layout.rowsTable) (row_id, seq, status, in_flight, versions, via)
            SELECT rowid, tether_seq, tether_status, tether_in_flight, tether_versions, tether_via FROM \(table)
            WHERE tether_seq IS NOT NULL AND tether_versions IS NOT NULL
            """)
        // Rows of insert ranges: a range speaks for synced rows only (ranges of format 1 had no
        // status); a row that is pending gets its own metadata, at the range's sequence and version.
        let ranged = try connection.fetchRows(
            """
            SELECT t.rowid, r.first_seq + (t.rowid - r.first_rowid), r.timestamp, r.site, r.via, t.tether_status, \
            t.tether_in_flight
            FROM \(table) AS t JOIN tether_insert_ranges AS r ON r.table_name = ? AND t.rowid BETWEEN r.first_rowid \
            AND r.last_rowid
            WHERE t.tether_seq IS NULL AND (t.tether_status != 0 OR t.tether_in_flight != 0)
            """, [name])
        for row in ranged {
            let version = LocalVersion(
                timestamp: UInt64(bitPattern: try row.get(2, as: Int64.self)), site: try row.get(3, as: Int32.self))
            try connection.execute(
                layout.insertRowMetadata,
                StatementArguments(values: [
                    row[0], row[1], row[5], row[6], .blob(Data(RowVersions.uniform(version).encoded())), row[4],
                ]))
        }
        // Rows written by another program and not folded yet (triggers left their sequence NULL).
        if capturesExternalWrites {
            try connection.execute(
                """
                INSERT INTO tether_external_changes (table_name, row_id, inserted)
                SELECT ?, t.rowid, 1 FROM \(table) AS t WHERE t.tether_seq IS NULL
                AND NOT EXISTS (SELECT 1 FROM tether_insert_ranges AS r WHERE r.table_name = ? AND t.rowid BETWEEN \
                r.first_rowid AND r.last_rowid)
                ORDER BY t.rowid
                """, [name, name])
        }
        try connection.execute("DROP INDEX IF EXISTS \(quoteIdentifier("tether_seq_\(name)"))")
        try dropFormatOneColumns(of: name, present: columns, connection)
        if capturesExternalWrites {
            for sql in layout.createTriggers { try connection.execute(sql) }
        }
    }

    private static func dropFormatOneColumns(of table: String, present: Set<String>, _ connection: Connection) throws {
        for column in formatOneColumns where present.contains(column) {
            try connection.execute("ALTER TABLE \(quoteIdentifier(table)) DROP COLUMN \(column)")
        }
    }

    private static func columnNames(of table: String, _ connection: Connection) throws -> [String] {
        try connection.fetchRows("SELECT name FROM pragma_table_info(?)", [table]).map {
            try $0.get(0, as: String.self)
        }
    }
}
