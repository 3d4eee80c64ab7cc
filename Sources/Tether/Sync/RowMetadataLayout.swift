/// Where the sync state of a synced table's rows lives — the one place that
/// spells it. The user's table is left exactly as declared; for a synced
/// table `T`, Tether keeps:
///
/// - `tether_rows_T`, keyed by `T`'s rowid: for each live row that has its own
///   metadata, its sequence number (`seq`), `status` (`SyncStatus`),
///   `in_flight`, column `versions` (`RowVersions`) and `via` (the site its
///   state was received from, so that it is not sent back there);
/// - `tether_dead_T`: tombstones, the key and values of deleted rows with the
///   same metadata (`tether_seq`, `tether_status`, …: prefixed, since the
///   user's columns sit beside them);
/// - rows of bulk inserts have no row in `tether_rows_T`: an entry of
///   `tether_insert_ranges` speaks for a run of them (see `InsertRange`).
///
/// Everything else — capture, extract, apply, acknowledgement, garbage
/// collection, the ORM's view of `SyncableModel`, the CLI's status — asks this
/// type for its SQL and for where each column sits in a result.
struct RowMetadataLayout {
    /// The layout's version, recorded in `tether_meta` under `format`. 1 kept the metadata in
    /// columns of the user's table; `MetadataUpgrade` moves a database from 1 to 2 when it opens.
    static let formatVersion = 2

    let table: String
    let quotedTable: String
    let rowsTable: String
    let deadTable: String
    let keyColumns: [String]
    let valueColumns: [String]

    init(table: String, keyColumns: [String], valueColumns: [String]) {
        self.table = table
        quotedTable = quoteIdentifier(table)
        rowsTable = quoteIdentifier(Self.rowsTableName(of: table))
        deadTable = quoteIdentifier(Self.deadTableName(of: table))
        self.keyColumns = keyColumns
        self.valueColumns = valueColumns
    }

    static func rowsTableName(of table: String) -> String { "tether_rows_\(table)" }
    static func deadTableName(of table: String) -> String { "tether_dead_\(table)" }

    private var keys: [String] { keyColumns.map(quoteIdentifier) }
    private var values: [String] { valueColumns.map(quoteIdentifier) }
    private var all: [String] { keys + values }
    private func qualified(_ alias: String, _ columns: [String]) -> String { columns.map { "\(alias).\($0)" }.joined(separator: ", ") }
    private var keyMatch: String { keys.map { "\($0) = ?" }.joined(separator: " AND ") }
    private var tableLiteral: String { DatabaseValue.text(table).description }

    // MARK: Tables

    /// The metadata tables of a newly synced table (idempotent).
    var createTables: [String] {
        [
            """
            CREATE TABLE IF NOT EXISTS \(rowsTable) (row_id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, status INTEGER NOT NULL,
              in_flight INTEGER NOT NULL DEFAULT 0, versions BLOB NOT NULL, via INTEGER) STRICT
            """,
            "CREATE INDEX IF NOT EXISTS \(quoteIdentifier("tether_rows_\(table)_seq")) ON \(rowsTable) (seq)",
            """
            CREATE TABLE IF NOT EXISTS \(deadTable) (\(all.joined(separator: ", ")), tether_seq INTEGER, tether_status INTEGER NOT NULL DEFAULT 3,
              tether_in_flight INTEGER NOT NULL DEFAULT 0, tether_versions BLOB, tether_via INTEGER, PRIMARY KEY (\(keys.joined(separator: ", "))))
            """,
            "CREATE INDEX IF NOT EXISTS \(quoteIdentifier("tether_seq_tether_dead_\(table)")) ON \(deadTable) (tether_seq)",
        ]
    }

    /// The rows table alone: also made by `createTable` for a `SyncableModel`, whose status
    /// columns read it (a table not synced yet reads as all rows created).
    static func createRowsTable(of table: String) -> String {
        RowMetadataLayout(table: table, keyColumns: [], valueColumns: []).createTables[0]
    }

    var dropTables: [String] { ["DROP TABLE IF EXISTS \(rowsTable)", "DROP TABLE IF EXISTS \(deadTable)"] }

    // MARK: Live rows

    /// A live row by identity, with its metadata if it has its own (NULLs for a row of an insert range).
    var selectLiveByKey: String {
        "SELECT t.rowid, \(qualified("t", values)), m.status, m.in_flight, m.versions FROM \(quotedTable) AS t LEFT JOIN \(rowsTable) AS m ON m.row_id = t.rowid WHERE \(keys.map { "t.\($0) = ?" }.joined(separator: " AND "))"
    }
    /// Result columns of `selectLiveByKey`.
    enum LiveByKey {
        static let rowid: Int32 = 0
        static func value(_ index: Int) -> Int32 { Int32(1 + index) }
        static func status(valueCount: Int) -> Int32 { Int32(1 + valueCount) }
        static func inFlight(valueCount: Int) -> Int32 { Int32(2 + valueCount) }
        static func versions(valueCount: Int) -> Int32 { Int32(3 + valueCount) }
    }

    /// `INSERT` of a live row's key and values (its metadata is written by `upsertRowMetadata`).
    var insertLive: String { "INSERT INTO \(quotedTable) (\(all.joined(separator: ", "))) VALUES (\(placeholders(all.count)))" }
    /// `UPDATE` of a live row's values by rowid; nil when the table has only key columns.
    var updateLive: String? {
        values.isEmpty ? nil : "UPDATE \(quotedTable) SET \(values.map { "\($0) = ?" }.joined(separator: ", ")) WHERE rowid = ?"
    }
    var deleteLiveByRowid: String { "DELETE FROM \(quotedTable) WHERE rowid = ?" }
    var liveRowExists: String { "SELECT EXISTS (SELECT 1 FROM \(quotedTable) WHERE rowid = ?)" }

    // MARK: Row metadata

    /// A row's own metadata: status, in_flight, versions.
    var selectRowMetadata: String { "SELECT status, in_flight, versions FROM \(rowsTable) WHERE row_id = ?" }
    /// Binds: rowid, sequence, status, versions, via. A new change is never in flight.
    var upsertRowMetadata: String {
        """
        INSERT INTO \(rowsTable) (row_id, seq, status, in_flight, versions, via) VALUES (?, ?, ?, 0, ?, ?)
        ON CONFLICT (row_id) DO UPDATE SET seq = excluded.seq, status = excluded.status, in_flight = 0, versions = excluded.versions, via = excluded.via
        """
    }
    /// Binds: rowid, sequence, status, in_flight, versions, via (a row given metadata as it stands).
    var insertRowMetadata: String { "INSERT INTO \(rowsTable) (row_id, seq, status, in_flight, versions, via) VALUES (?, ?, ?, ?, ?, ?)" }
    var deleteRowMetadata: String { "DELETE FROM \(rowsTable) WHERE row_id = ?" }
    /// The versions of live rows and of tombstones changed after a sequence number (a rekey
    /// moves the copy's own writes to its new key), and their update.
    var selectVersionsAfter: String { "SELECT row_id, versions FROM \(rowsTable) WHERE seq > ?" }
    var updateVersions: String { "UPDATE \(rowsTable) SET versions = ? WHERE row_id = ?" }
    var selectDeadVersionsAfter: String { "SELECT rowid, tether_versions FROM \(deadTable) WHERE tether_seq > ?" }
    var updateDeadVersions: String { "UPDATE \(deadTable) SET tether_versions = ? WHERE rowid = ?" }
    /// Binds: new rowid, old rowid (a row whose rowid changed keeps its metadata).
    var moveRowMetadata: String { "UPDATE OR REPLACE \(rowsTable) SET row_id = ? WHERE row_id = ?" }
    /// Metadata rows whose live row is gone (removed without capture, as a full resync does).
    var deleteOrphanedRowMetadata: String { "DELETE FROM \(rowsTable) WHERE row_id NOT IN (SELECT rowid FROM \(quotedTable))" }

    // MARK: Tombstones

    /// Binds: key, values, sequence, status, in_flight, versions, via.
    var upsertDead: String {
        "INSERT OR REPLACE INTO \(deadTable) (\(all.joined(separator: ", ")), tether_seq, tether_status, tether_in_flight, tether_versions, tether_via) VALUES (\(placeholders(all.count + 5)))"
    }
    var selectDeadByKey: String { "SELECT \(values.joined(separator: ", ")), tether_status, tether_in_flight, tether_versions FROM \(deadTable) WHERE \(keyMatch)" }
    /// Result columns of `selectDeadByKey`.
    enum DeadByKey {
        static func value(_ index: Int) -> Int32 { Int32(index) }
        static func status(valueCount: Int) -> Int32 { Int32(valueCount) }
        static func inFlight(valueCount: Int) -> Int32 { Int32(valueCount + 1) }
        static func versions(valueCount: Int) -> Int32 { Int32(valueCount + 2) }
    }
    var deleteDeadByKey: String { "DELETE FROM \(deadTable) WHERE \(keyMatch)" }
    var deleteDeadForRowid: String {
        let tuple = keys.count == 1 ? keys[0] : "(\(keys.joined(separator: ", ")))"
        return "DELETE FROM \(deadTable) WHERE \(tuple) IN (SELECT \(keys.joined(separator: ", ")) FROM \(quotedTable) WHERE rowid = ?)"
    }
    var deadTableHasRows: String { "SELECT EXISTS (SELECT 1 FROM \(deadTable))" }
    /// Tombstones written by triggers, waiting for their sequence number: key, versions.
    var selectUnfoldedDead: String { "SELECT \(keys.joined(separator: ", ")), tether_versions FROM \(deadTable) WHERE tether_seq IS NULL" }
    /// Binds: sequence, versions, key.
    var foldDead: String { "UPDATE \(deadTable) SET tether_seq = ?, tether_versions = ? WHERE \(keyMatch)" }
    var collectDead: String { "DELETE FROM \(deadTable) WHERE tether_seq <= ? AND tether_in_flight = 0" }

    // MARK: Changes after a cursor

    /// Live rows with their own metadata after a sequence number, in order (binds: after, limit).
    var selectLiveChanges: String {
        "SELECT \(qualified("t", all)), m.seq, m.versions, m.status, m.via, m.row_id FROM \(rowsTable) AS m JOIN \(quotedTable) AS t ON t.rowid = m.row_id WHERE m.seq > ? ORDER BY m.seq LIMIT ?"
    }
    /// Tombstones after a sequence number, in order (binds: after, limit).
    var selectDeadChanges: String {
        "SELECT \(all.joined(separator: ", ")), tether_seq, tether_versions, tether_status, tether_via FROM \(deadTable) WHERE tether_seq > ? ORDER BY tether_seq LIMIT ?"
    }
    /// Result columns of `selectLiveChanges` and `selectDeadChanges`, after the key and value columns.
    enum Changes {
        static func sequence(_ base: Int32) -> Int32 { base }
        static func versions(_ base: Int32) -> Int32 { base + 1 }
        static func status(_ base: Int32) -> Int32 { base + 2 }
        static func via(_ base: Int32) -> Int32 { base + 3 }
        /// Live rows only.
        static func rowid(_ base: Int32) -> Int32 { base + 4 }
    }
    /// The live rows in a rowid range, in order (binds: first rowid, last rowid); the rowid follows
    /// the values. Those of an insert range are the ones not in `selectRowidsWithMetadata`.
    var selectRangeRows: String {
        "SELECT \(qualified("t", all)), t.rowid FROM \(quotedTable) AS t WHERE t.rowid BETWEEN ? AND ? ORDER BY t.rowid"
    }
    /// The rowids in a range that have metadata of their own, in order (binds: first, last rowid).
    var selectRowidsWithMetadata: String { "SELECT row_id FROM \(rowsTable) WHERE row_id BETWEEN ? AND ? ORDER BY row_id" }
    /// Live rows with no metadata of their own and outside every insert range: rows written before
    /// the table was synced (binds nothing).
    var selectRowsWithoutMetadata: String {
        """
        SELECT t.rowid FROM \(quotedTable) AS t WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid)
        AND NOT EXISTS (SELECT 1 FROM tether_insert_ranges r WHERE r.table_name = \(tableLiteral) AND t.rowid BETWEEN r.first_rowid AND r.last_rowid)
        ORDER BY t.rowid
        """
    }

    /// Forgets the insert ranges no row belongs to any more (binds: table name).
    var pruneInsertRanges: String {
        """
        DELETE FROM tether_insert_ranges WHERE table_name = ? AND NOT EXISTS (
          SELECT 1 FROM \(quotedTable) AS t WHERE t.rowid BETWEEN first_rowid AND last_rowid
          AND NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid))
        """
    }

    // MARK: In flight and acknowledged

    /// Pending changes in (after, through] become in flight (binds: after, through), rows then tombstones.
    var markInFlight: [String] {
        ["UPDATE \(rowsTable) SET in_flight = 1 WHERE seq > ? AND seq <= ? AND status != 0 AND in_flight = 0",
         "UPDATE \(deadTable) SET tether_in_flight = 1 WHERE tether_seq > ? AND tether_seq <= ? AND tether_status != 0 AND tether_in_flight = 0"]
    }
    /// In-flight changes in (after, through] become synced (binds: after, through), rows then tombstones.
    var acknowledge: [String] {
        ["UPDATE \(rowsTable) SET status = 0, in_flight = 0 WHERE in_flight = 1 AND seq > ? AND seq <= ?",
         "UPDATE \(deadTable) SET tether_status = 0, tether_in_flight = 0 WHERE tether_in_flight = 1 AND tether_seq > ? AND tether_seq <= ?"]
    }

    // MARK: Full resync

    /// Synced rows the end of a full resync removes: unchanged since it began (seq at most the
    /// `?1`), not confirmed by the sender (binds: resync start, peer, table name).
    var selectUnconfirmedRows: String {
        """
        SELECT m.row_id FROM \(rowsTable) AS m WHERE m.status = 0 AND m.in_flight = 0 AND m.seq <= ?1
          AND m.row_id NOT IN (SELECT row_id FROM tether_resync_seen WHERE peer = ?2 AND table_name = ?3)
        UNION ALL
        SELECT t.rowid FROM \(quotedTable) AS t JOIN tether_insert_ranges AS r ON r.table_name = ?3 AND t.rowid BETWEEN r.first_rowid AND r.last_rowid
          WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid)
          AND \(InsertRange.sequenceSQL(range: "r", rowid: "t.rowid")) <= ?1 AND \(InsertRange.statusSQL(range: "r", rowid: "t.rowid")) = 0
          AND t.rowid NOT IN (SELECT row_id FROM tether_resync_seen WHERE peer = ?2 AND table_name = ?3)
        """
    }

    // MARK: Status, as the application sees it

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
        return "coalesce((SELECT m.status FROM \(rows) AS m WHERE m.row_id = \(rowid)), \(InsertRange.rowStatusSQL(table: table, rowid: rowid, status: true)), \(SyncStatus.created.rawValue))"
    }

    /// Whether the row `rowid` of `table` is in flight (an SQL expression, 0 or 1).
    static func inFlightSQL(table: String, rowid: String) -> String {
        let rows = quoteIdentifier(rowsTableName(of: table))
        return "coalesce((SELECT m.in_flight FROM \(rows) AS m WHERE m.row_id = \(rowid)), \(InsertRange.rowStatusSQL(table: table, rowid: rowid, status: false)), 0)"
    }

    /// `table`'s rows with their metadata as columns — `tether_seq` (NULL for a row of an insert
    /// range), `tether_status`, `tether_in_flight`, `tether_versions`, `tether_via` — as a
    /// subquery named like the table, to read in place of it when inspecting (tests, debugging).
    static func inspectionSQL(table: String) -> String {
        let rows = quoteIdentifier(rowsTableName(of: table))
        return """
            (SELECT u.*, m.seq AS tether_seq, \(statusSQL(table: table, rowid: "u.rowid")) AS tether_status,
              \(inFlightSQL(table: table, rowid: "u.rowid")) AS tether_in_flight, m.versions AS tether_versions, m.via AS tether_via,
              coalesce(m.seq, \(InsertRange.rowSequenceSQL(table: table, rowid: "u.rowid"))) AS tether_effective_seq
             FROM \(quoteIdentifier(table)) AS u LEFT JOIN \(rows) AS m ON m.row_id = u.rowid) AS \(quoteIdentifier(table))
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
        ["SELECT count(*) FROM \(rowsTable) WHERE seq > ?1 AND (?2 IS NULL OR via IS NOT ?2)",
         "SELECT count(*) FROM \(deadTable) WHERE tether_seq > ?1 AND (?2 IS NULL OR tether_via IS NOT ?2)",
         // Rows of insert ranges, counted by their sequence numbers (a row changed since is counted twice: an estimate).
         """
         SELECT coalesce(sum(max(0, min(last_rowid - first_rowid + 1, first_seq + last_rowid - first_rowid - ?1))), 0)
         FROM tether_insert_ranges WHERE table_name = ?3 AND (?2 IS NULL OR via IS NOT ?2)
         """]
    }
    /// Changes not acknowledged yet, or in flight (binds nothing).
    var countPending: [String] {
        ["SELECT count(*) FROM \(rowsTable) WHERE status != 0 OR in_flight != 0",
         "SELECT count(*) FROM \(deadTable) WHERE tether_status != 0 OR tether_in_flight != 0",
         "SELECT count(*) FROM \(quotedTable) AS t WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid) AND \(InsertRange.rowStatusSQL(table: table, rowid: "t.rowid", status: true)) != 0"]
    }

    // MARK: Writes by other programs

    /// The names of the triggers that capture writes by other programs.
    var triggerNames: [String] { ["insert", "update", "rekey", "delete"].map { "tether_\($0)_\(table)" } }

    /// Triggers that record what any program writes (the sqlite3 shell included) in
    /// `tether_external_changes` and the tombstone table; the engine gives those changes their
    /// metadata when it next runs. The engine pauses them (`tether_capture_paused`) while it
    /// writes rows itself. Each trigger runs per changed row.
    var createTriggers: [String] {
        let names = triggerNames.map(quoteIdentifier)
        let running = "NOT EXISTS (SELECT 1 FROM tether_capture_paused WHERE table_name = \(tableLiteral))"
        let keyChanged = keys.map { "OLD.\($0) IS NOT NEW.\($0)" }.joined(separator: " OR ")
        let valueChanged = values.isEmpty ? "0" : values.map { "OLD.\($0) IS NOT NEW.\($0)" }.joined(separator: " OR ")
        let mask = values.count > 62 || values.isEmpty ? "-1" :
            values.enumerated().map { "((OLD.\($1) IS NOT NEW.\($1)) << \($0))" }.joined(separator: " | ")
        let buryOld = """
            INSERT OR REPLACE INTO \(deadTable) (\(all.joined(separator: ", ")), tether_seq, tether_status, tether_in_flight, tether_versions, tether_via)
            VALUES (\(all.map { "OLD.\($0)" }.joined(separator: ", ")), NULL, \(SyncStatus.deleted.rawValue), 0, (SELECT versions FROM \(rowsTable) WHERE row_id = OLD.rowid), NULL);
            DELETE FROM \(rowsTable) WHERE row_id = OLD.rowid;
            """
        let recordInsert = "INSERT INTO tether_external_changes (table_name, row_id, inserted) VALUES (\(tableLiteral), NEW.rowid, 1);"
        return [
            "CREATE TRIGGER \(names[0]) AFTER INSERT ON \(quotedTable) WHEN \(running) BEGIN \(recordInsert) END",
            """
            CREATE TRIGGER \(names[1]) AFTER UPDATE ON \(quotedTable) WHEN \(running) AND NOT (\(keyChanged)) AND (\(valueChanged) OR OLD.rowid IS NOT NEW.rowid)
            BEGIN
              UPDATE OR REPLACE \(rowsTable) SET row_id = NEW.rowid WHERE row_id = OLD.rowid AND OLD.rowid IS NOT NEW.rowid;
              INSERT INTO tether_external_changes (table_name, row_id, inserted, mask) SELECT \(tableLiteral), NEW.rowid, 0, \(mask) WHERE \(valueChanged);
            END
            """,
            "CREATE TRIGGER \(names[2]) AFTER UPDATE ON \(quotedTable) WHEN \(running) AND (\(keyChanged)) BEGIN \(buryOld) \(recordInsert) END",
            "CREATE TRIGGER \(names[3]) AFTER DELETE ON \(quotedTable) WHEN \(running) BEGIN \(buryOld) END",
        ]
    }

    /// Pauses the triggers of this table (in the current transaction, never committed).
    var pauseTriggers: String { "INSERT OR IGNORE INTO tether_capture_paused (table_name) VALUES (\(tableLiteral))" }
    var resumeTriggers: String { "DELETE FROM tether_capture_paused WHERE table_name = \(tableLiteral)" }

    private func placeholders(_ count: Int) -> String { Array(repeating: "?", count: count).joined(separator: ", ") }
}
