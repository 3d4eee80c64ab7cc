/// Where the sync state of a synced table's rows lives — the one place that
/// spells it. The user's table is left exactly as declared; for a synced
/// table `T`, Tether keeps:
///
/// - `tether_rows_T`, keyed by `T`'s rowid: for each live row that has its own
///   metadata, its sequence number (`seq`), `status` (`SyncStatus`),
///   `in_flight`, column `versions` (`RowVersions`), `via` (the site its
///   state was received from, so that it is not sent back there) and
///   `inserted_seq` (the sequence number of the change that inserted it, by
///   whatever path; NULL when not known, for a row that predates syncing or
///   metadata older than format 3): what tells observers reading the changelog
///   back an insert from an update, which the status cannot (an ACK changes it);
/// - `tether_dead_T`: tombstones, the key and values of deleted rows with the
///   same metadata (`tether_seq`, `tether_status`, …: prefixed, since the
///   user's columns sit beside them);
/// - rows of bulk inserts have no row in `tether_rows_T`: an entry of
///   `tether_insert_ranges` speaks for a run of them (see `InsertRange`);
/// - for a table `WITHOUT ROWID`, which has no rowid to key the rest by, `tether_keys_T`: each
///   live row's primary key with a surrogate rowid (`row_id`), which `tether_rows_T` and the
///   trigger capture's queue use as they use a rowid elsewhere (see `WithoutRowidKey`). Such a
///   table is always captured by triggers (SQLite's update hooks do not see it), which keep
///   `tether_keys_T` in step with the table whoever writes, and it never has insert ranges.
///
/// Everything else — capture, extract, apply, acknowledgement, garbage
/// collection, the ORM's view of `SyncableModel`, the CLI's status — asks this
/// type for its SQL and for where each column sits in a result.
struct RowMetadataLayout {
    /// The layout's version, recorded in `tether_meta` under `format`. 1 kept the metadata in
    /// columns of the user's table; 2 lacked `inserted_seq`; 3, the ranges of rows updated together;
    /// 4, the certificate each peer presented. `MetadataUpgrade` moves a database to the current
    /// one when it opens.
    static let formatVersion = 5

    let table: String
    let quotedTable: String
    let rowsTable: String
    let deadTable: String
    let keyColumns: [String]
    let valueColumns: [String]
    /// The primary key of a table `WITHOUT ROWID` (nil for a table with a rowid).
    let withoutRowidKey: WithoutRowidKey?
    /// `tether_keys_T`, quoted: used only for a table `WITHOUT ROWID`.
    let keysTable: String

    init(table: String, keyColumns: [String], valueColumns: [String], withoutRowidKey: WithoutRowidKey? = nil) {
        self.table = table
        quotedTable = quoteIdentifier(table)
        rowsTable = quoteIdentifier(Self.rowsTableName(of: table))
        deadTable = quoteIdentifier(Self.deadTableName(of: table))
        keysTable = quoteIdentifier(Self.keysTableName(of: table))
        self.keyColumns = keyColumns
        self.valueColumns = valueColumns
        self.withoutRowidKey = withoutRowidKey
    }

    static func rowsTableName(of table: String) -> String { "tether_rows_\(table)" }
    static func deadTableName(of table: String) -> String { "tether_dead_\(table)" }
    static func keysTableName(of table: String) -> String { "tether_keys_\(table)" }

    var isWithoutRowid: Bool { withoutRowidKey != nil }

    private var keys: [String] { keyColumns.map(quoteIdentifier) }
    private var values: [String] { valueColumns.map(quoteIdentifier) }
    private var all: [String] { keys + values }
    private func qualified(_ alias: String, _ columns: [String]) -> String { columns.map { "\(alias).\($0)" }.joined(separator: ", ") }
    private var keyMatch: String { keys.map { "\($0) = ?" }.joined(separator: " AND ") }
    private var tableLiteral: String { DatabaseValue.text(table).description }

    // How the metadata names the user's rows: by rowid, or (WITHOUT ROWID) by the surrogate
    // `row_id` of `tether_keys_T`, joined as `<alias>_k`. For a table with a rowid, these
    // spell exactly the SQL the layout has always used.

    /// The `row_id` of the user's row `alias`, in a query that joins `keysJoin(alias)`.
    private func rowid(_ alias: String) -> String { isWithoutRowid ? "\(alias)_k.row_id" : "\(alias).rowid" }
    /// Joins the keys table onto the user's row `alias` (nothing for a table with a rowid).
    private func keysJoin(_ alias: String) -> String {
        guard let key = withoutRowidKey else { return "" }
        return " LEFT JOIN \(keysTable) AS \(alias)_k ON \(key.match(keys: "\(alias)_k", row: alias))"
    }
    /// Joins the user's row `alias` whose `row_id` is `rowid` (an SQL expression).
    func joinUser(_ alias: String, on rowid: String) -> String {
        guard let key = withoutRowidKey else { return "JOIN \(quotedTable) AS \(alias) ON \(alias).rowid = \(rowid)" }
        return "JOIN \(keysTable) AS \(alias)_k ON \(alias)_k.row_id = \(rowid) JOIN \(quotedTable) AS \(alias) ON \(key.match(row: alias, keys: "\(alias)_k"))"
    }
    /// The condition on the user's table that picks the rows whose `row_id`s lie between the parameters.
    private var byRowidRange: String {
        guard let key = withoutRowidKey else { return "rowid BETWEEN ?1 AND ?2" }
        return "(\(key.columns.map(quoteIdentifier).joined(separator: ", "))) IN (SELECT \(key.keysColumns.joined(separator: ", ")) FROM \(keysTable) WHERE row_id BETWEEN ?1 AND ?2)"
    }
    /// The condition on the user's table that picks the row whose `row_id` is the parameter.
    private var byRowid: String {
        guard let key = withoutRowidKey else { return "rowid = ?" }
        return "(\(key.columns.map(quoteIdentifier).joined(separator: ", "))) IN (SELECT \(key.keysColumns.joined(separator: ", ")) FROM \(keysTable) WHERE row_id = ?)"
    }

    // MARK: Tables

    /// The metadata tables of a newly synced table (idempotent).
    var createTables: [String] {
        let surrogates = withoutRowidKey.map { [$0.createKeysTable(keysTable)] } ?? []
        return surrogates + [
            """
            CREATE TABLE IF NOT EXISTS \(rowsTable) (row_id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, status INTEGER NOT NULL,
              in_flight INTEGER NOT NULL DEFAULT 0, versions BLOB NOT NULL, via INTEGER, inserted_seq INTEGER) STRICT
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

    /// Format 2 to 3: the rows table `rowsTable` (of a synced table or a `SyncableModel`'s) gains `inserted_seq`.
    static func addInsertedSequence(to rowsTable: String) -> String {
        "ALTER TABLE \(quoteIdentifier(rowsTable)) ADD COLUMN inserted_seq INTEGER"
    }

    var dropTables: [String] {
        ["DROP TABLE IF EXISTS \(rowsTable)", "DROP TABLE IF EXISTS \(deadTable)"] + (isWithoutRowid ? ["DROP TABLE IF EXISTS \(keysTable)"] : [])
    }

    /// WITHOUT ROWID: gives the rows that have none a surrogate (the rows already there when the table is synced).
    var insertMissingKeys: String? {
        guard let key = withoutRowidKey else { return nil }
        return "INSERT OR IGNORE INTO \(keysTable) (\(key.keysColumns.joined(separator: ", "))) SELECT \(key.columns.map(quoteIdentifier).joined(separator: ", ")) FROM \(quotedTable)"
    }

    /// WITHOUT ROWID: the surrogate of the live row with a key (binds: key).
    var selectRowidByKey: String { "SELECT \(rowid("t")) FROM \(quotedTable) AS t\(keysJoin("t")) WHERE \(keys.map { "t.\($0) = ?" }.joined(separator: " AND "))" }
    /// WITHOUT ROWID: gives the live row with a key a surrogate if it has none (binds: key).
    var insertKeyByKey: String? {
        guard let key = withoutRowidKey else { return nil }
        return "INSERT OR IGNORE INTO \(keysTable) (\(key.keysColumns.joined(separator: ", "))) SELECT \(key.columns.map { "t.\(quoteIdentifier($0))" }.joined(separator: ", ")) FROM \(quotedTable) AS t WHERE \(keys.map { "t.\($0) = ?" }.joined(separator: " AND "))"
    }

    // MARK: Live rows

    /// A live row by identity, with its metadata if it has its own (NULLs for a row of an insert range).
    var selectLiveByKey: String {
        "SELECT \(rowid("t")), \(qualified("t", values)), m.status, m.in_flight, m.versions FROM \(quotedTable) AS t\(keysJoin("t")) LEFT JOIN \(rowsTable) AS m ON m.row_id = \(rowid("t")) WHERE \(keys.map { "t.\($0) = ?" }.joined(separator: " AND "))"
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
        values.isEmpty ? nil : "UPDATE \(quotedTable) SET \(values.map { "\($0) = ?" }.joined(separator: ", ")) WHERE \(byRowid)"
    }
    var deleteLiveByRowid: String { "DELETE FROM \(quotedTable) WHERE \(byRowid)" }
    /// The key of the live row with a rowid (binds: rowid).
    var selectKeyByRowid: String { "SELECT \(keys.joined(separator: ", ")) FROM \(quotedTable) WHERE \(byRowid)" }
    var liveRowExists: String { "SELECT EXISTS (SELECT 1 FROM \(quotedTable) WHERE \(byRowid))" }

    // MARK: Row metadata

    /// A row's own metadata: status, in_flight, versions, inserted_seq.
    var selectRowMetadata: String { "SELECT status, in_flight, versions, inserted_seq FROM \(rowsTable) WHERE row_id = ?" }
    /// Binds: rowid, sequence, status, versions, via, inserted sequence. A new change is never in
    /// flight. The inserted sequence is the change's own for an insert; for an update, the one the
    /// row had (or NULL), always below the change's: metadata the row has already keeps its own.
    var upsertRowMetadata: String {
        """
        INSERT INTO \(rowsTable) (row_id, seq, status, in_flight, versions, via, inserted_seq) VALUES (?, ?, ?, 0, ?, ?, ?)
        ON CONFLICT (row_id) DO UPDATE SET seq = excluded.seq, status = excluded.status, in_flight = 0, versions = excluded.versions, via = excluded.via,
          inserted_seq = CASE WHEN excluded.inserted_seq = excluded.seq THEN excluded.seq ELSE inserted_seq END
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
    var deleteOrphanedRowMetadata: String {
        isWithoutRowid ? "DELETE FROM \(rowsTable) WHERE row_id NOT IN (SELECT \(rowid("t")) FROM \(quotedTable) AS t\(keysJoin("t")))"
            : "DELETE FROM \(rowsTable) WHERE row_id NOT IN (SELECT rowid FROM \(quotedTable))"
    }

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
    /// The tombstone of the user's row whose rowid (`row_id`) is the parameter, looked up by its
    /// key. The key is read without its column's affinity (`+`): the tombstones' key columns have
    /// none, and comparing them with a typed column converts them, which rules out their index —
    /// every insert then scanned every tombstone (issue 35).
    var deleteDeadForRowid: String {
        let tuple = keys.count == 1 ? keys[0] : "(\(keys.joined(separator: ", ")))"
        return "DELETE FROM \(deadTable) WHERE \(tuple) IN (SELECT \(keys.map { "+\($0)" }.joined(separator: ", ")) FROM \(quotedTable) WHERE \(byRowid))"
    }
    /// The tombstones of the user's rows whose rowids lie between the two parameters (a run of
    /// rows inserted together), by key, read as `deleteDeadForRowid` reads it: one statement per
    /// run, not one per row. With `keyIsRowid` the key is the rowid itself: the tombstones of keys
    /// in the range, one probe of their index.
    func deleteDeadForRowids(keyIsRowid: Bool) -> String {
        if keyIsRowid, let key = keys.first { return "DELETE FROM \(deadTable) WHERE \(key) BETWEEN ?1 AND ?2" }
        let tuple = keys.count == 1 ? keys[0] : "(\(keys.joined(separator: ", ")))"
        return "DELETE FROM \(deadTable) WHERE \(tuple) IN (SELECT \(keys.map { "+\($0)" }.joined(separator: ", ")) FROM \(quotedTable) WHERE \(byRowidRange))"
    }
    var deadTableHasRows: String { "SELECT EXISTS (SELECT 1 FROM \(deadTable))" }
    /// Tombstones written by triggers, waiting for their sequence number: key, versions.
    var selectUnfoldedDead: String { "SELECT \(keys.joined(separator: ", ")), tether_versions FROM \(deadTable) WHERE tether_seq IS NULL" }
    /// Binds: sequence, versions, key.
    var foldDead: String { "UPDATE \(deadTable) SET tether_seq = ?, tether_versions = ? WHERE \(keyMatch)" }
    /// Removes up to `?2` tombstones at or before sequence `?1` that are not in flight, received from
    /// the site `?3` if it is not NULL (one step of a garbage collection, by the `tether_seq` index).
    /// Binds: sequence, limit, site.
    var collectDead: String {
        """
        DELETE FROM \(deadTable) WHERE rowid IN (SELECT rowid FROM \(deadTable) WHERE tether_seq <= ?1 AND tether_in_flight = 0
          AND (?3 IS NULL OR tether_via = ?3) LIMIT ?2)
        """
    }

    // MARK: Changes after a cursor

    /// Live rows with their own metadata after a sequence number, in order (binds: after, limit).
    var selectLiveChanges: String {
        "SELECT \(qualified("t", all)), m.seq, m.versions, m.status, m.via, m.row_id FROM \(rowsTable) AS m \(joinUser("t", on: "m.row_id")) WHERE m.seq > ? ORDER BY m.seq LIMIT ?"
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
    /// Never asked of a table WITHOUT ROWID, which has no insert ranges.
    var selectRangeRows: String {
        "SELECT \(qualified("t", all)), t.rowid FROM \(quotedTable) AS t WHERE t.rowid BETWEEN ? AND ? ORDER BY t.rowid"
    }
    /// The rowids in a range that have metadata of their own, in order (binds: first, last rowid).
    var selectRowidsWithMetadata: String { "SELECT row_id FROM \(rowsTable) WHERE row_id BETWEEN ? AND ? ORDER BY row_id" }

    // The same three queries with result columns of the caller's after their own, and a join of
    // the caller's (one row per row: a LEFT JOIN by key), for a scoped extraction, which reads a
    // row's place in a peer's scope with the row. The user's table is named by its own name, and
    // the metadata's columns are renamed tether_*, so that expressions written over the table (a
    // scope's filters, with bare column names) mean the table's columns. Named parameters (the
    // caller's own may appear in `adding` and `joining`). Tables with a rowid only.

    /// `selectLiveChanges`, then `adding` (binds :tether_after, :tether_limit).
    func selectLiveChanges(adding extra: [String], joining join: String) -> String {
        """
        SELECT \(qualified(quotedTable, all)), tether_m.tether_seq, tether_m.tether_versions, tether_m.tether_status, tether_m.tether_via,
          tether_m.tether_row_id, \(extra.joined(separator: ", "))
        FROM (SELECT seq AS tether_seq, versions AS tether_versions, status AS tether_status, via AS tether_via, row_id AS tether_row_id
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
        SELECT \(qualified(deadTable, all)), \(deadTable).tether_seq, \(deadTable).tether_versions, \(deadTable).tether_status, \(deadTable).tether_via,
          \(extra.joined(separator: ", "))
        FROM \(deadTable) \(join)
        WHERE \(deadTable).tether_seq > :tether_after ORDER BY \(deadTable).tether_seq LIMIT :tether_limit
        """
    }
    /// `selectRangeRows`, then `adding` (binds :tether_first, :tether_last).
    func selectRangeRows(adding extra: [String], joining join: String) -> String {
        """
        SELECT \(qualified(quotedTable, all)), \(quotedTable).rowid, \(extra.joined(separator: ", ")) FROM \(quotedTable) \(join)
        WHERE \(quotedTable).rowid BETWEEN :tether_first AND :tether_last ORDER BY \(quotedTable).rowid
        """
    }
    /// Live rows with no metadata of their own and outside every insert range: rows written before
    /// the table was synced (binds nothing).
    var selectRowsWithoutMetadata: String {
        if isWithoutRowid {
            return "SELECT \(rowid("t")) FROM \(quotedTable) AS t\(keysJoin("t")) WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = \(rowid("t"))) ORDER BY 1"
        }
        return """
        SELECT t.rowid FROM \(quotedTable) AS t WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid)
        AND NOT EXISTS (SELECT 1 FROM tether_insert_ranges r WHERE r.table_name = \(tableLiteral) AND t.rowid BETWEEN r.first_rowid AND r.last_rowid)
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
        let ownRows = """
            SELECT m.row_id FROM \(rowsTable) AS m WHERE m.status = 0 AND m.in_flight = 0 AND m.seq <= ?1
              AND m.row_id NOT IN (SELECT row_id FROM tether_resync_seen WHERE peer = ?2 AND table_name = ?3)
            """
        // Without insert ranges, the table name is still bound: said in a condition that holds.
        if isWithoutRowid { return ownRows + " AND ?3 IS NOT NULL" }
        return ownRows + """

        UNION ALL
        SELECT t.rowid FROM \(quotedTable) AS t JOIN tether_insert_ranges AS r ON r.table_name = ?3 AND t.rowid BETWEEN r.first_rowid AND r.last_rowid
          WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid)
          AND \(InsertRange.sequenceSQL(range: "r", rowid: "t.rowid")) <= ?1 AND \(InsertRange.statusSQL(range: "r", rowid: "t.rowid")) = 0
          AND t.rowid NOT IN (SELECT row_id FROM tether_resync_seen WHERE peer = ?2 AND table_name = ?3)
        """
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
        return ownRows + """

        UNION ALL
        SELECT t.rowid FROM \(quotedTable) AS t JOIN tether_insert_ranges AS r ON r.table_name = ?3 AND t.rowid BETWEEN r.first_rowid AND r.last_rowid
          WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid)
          AND \(InsertRange.sequenceSQL(range: "r", rowid: "t.rowid")) <= ?1 AND \(InsertRange.statusSQL(range: "r", rowid: "t.rowid")) IN (0, 2)
          AND t.rowid NOT IN (SELECT row_id FROM tether_resync_seen WHERE peer = ?2 AND table_name = ?3)
          AND (r.via IS ?4 OR r.site IS ?4 OR coalesce(r.inserted_first_seq, r.first_seq) + (t.rowid - r.first_rowid) <= ?5)
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
    /// `withoutRowidKey`: the primary key of a table WITHOUT ROWID.
    static func inspectionSQL(table: String, withoutRowidKey: [String]? = nil) -> String {
        let rows = quoteIdentifier(rowsTableName(of: table))
        let rowid = rowidSQL(table: table, alias: "u", withoutRowidKey: withoutRowidKey)
        return """
            (SELECT u.*, m.seq AS tether_seq, \(statusSQL(table: table, rowid: rowid)) AS tether_status,
              \(inFlightSQL(table: table, rowid: rowid)) AS tether_in_flight, m.versions AS tether_versions, m.via AS tether_via,
              coalesce(m.seq, \(InsertRange.rowSequenceSQL(table: table, rowid: rowid))) AS tether_effective_seq
             FROM \(quoteIdentifier(table)) AS u LEFT JOIN \(rows) AS m ON m.row_id = \(rowid)) AS \(quoteIdentifier(table))
            """
    }

    /// The `row_id` of the row `alias` of `table` in its metadata (an SQL expression): its rowid,
    /// or for a table WITHOUT ROWID (`primaryKey` its key columns) its surrogate.
    static func rowidSQL(table: String, alias: String, withoutRowidKey primaryKey: [String]?) -> String {
        guard let primaryKey else { return "\(alias).rowid" }
        let match = primaryKey.enumerated().map { "k.\(WithoutRowidKey.keysColumn($0.offset)) = \(alias).\(quoteIdentifier($0.element))" }
        return "(SELECT k.row_id FROM \(quoteIdentifier(keysTableName(of: table))) AS k WHERE \(match.joined(separator: " AND ")))"
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
         // Rows of insert ranges (a table WITHOUT ROWID has none).
         isWithoutRowid ? "SELECT 0"
            : "SELECT count(*) FROM \(quotedTable) AS t WHERE NOT EXISTS (SELECT 1 FROM \(rowsTable) AS m WHERE m.row_id = t.rowid) AND \(InsertRange.rowStatusSQL(table: table, rowid: "t.rowid", status: true)) != 0"]
    }

    // MARK: Writes by other programs

    /// The names of the triggers that capture writes by other programs.
    var triggerNames: [String] { ["insert", "update", "rekey", "delete"].map { "tether_\($0)_\(table)" } }

    /// Triggers that record what any program writes (the sqlite3 shell included) in
    /// `tether_external_changes` and the tombstone table; the engine gives those changes their
    /// metadata when it next runs. The engine pauses them (`tether_capture_paused`) while it
    /// writes rows itself. Each trigger runs per changed row.
    var createTriggers: [String] {
        if let key = withoutRowidKey { return createWithoutRowidTriggers(key) }
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
            // Only an UPDATE that sets a key column (or the rowid, which a key may alias) can move a
            // key: SQLite leaves this trigger out of every other UPDATE when it prepares it, the
            // library's own included (a trigger left in runs its program per row, paused or not).
            """
            CREATE TRIGGER \(names[2]) AFTER UPDATE OF \((keys + ["rowid", "oid", "_rowid_"]).joined(separator: ", ")) ON \(quotedTable)
            WHEN \(running) AND (\(keyChanged)) BEGIN \(buryOld) \(recordInsert) END
            """,
            "CREATE TRIGGER \(names[3]) AFTER DELETE ON \(quotedTable) WHEN \(running) BEGIN \(buryOld) END",
        ]
    }

    /// The triggers of a table WITHOUT ROWID: the same capture, each row named by its surrogate;
    /// and, paused or not, they keep `tether_keys_T` in step with the table (a row inserted gets
    /// a surrogate, a row deleted loses it, a row whose primary key changes keeps it). Every
    /// capture writes `tether_external_changes` (for a delete, an entry naming no row): that is
    /// how the engine hears of its own connection's writes, since SQLite's pre-update hook sees
    /// that table but never a table WITHOUT ROWID.
    private func createWithoutRowidTriggers(_ key: WithoutRowidKey) -> [String] {
        let names = triggerNames.map(quoteIdentifier)
        let running = "NOT EXISTS (SELECT 1 FROM tether_capture_paused WHERE table_name = \(tableLiteral))"
        let keyChanged = keys.map { "OLD.\($0) IS NOT NEW.\($0)" }.joined(separator: " OR ")
        let valueChanged = values.isEmpty ? "0" : values.map { "OLD.\($0) IS NOT NEW.\($0)" }.joined(separator: " OR ")
        let primaryKeyChanged = key.columns.map { "OLD.\(quoteIdentifier($0)) IS NOT NEW.\(quoteIdentifier($0))" }.joined(separator: " OR ")
        let mask = values.count > 62 || values.isEmpty ? "-1" :
            values.enumerated().map { "((OLD.\($1) IS NOT NEW.\($1)) << \($0))" }.joined(separator: " | ")
        let keysColumns = key.keysColumns.joined(separator: ", ")
        func surrogate(_ row: String) -> String { "(SELECT k.row_id FROM \(keysTable) AS k WHERE \(key.match(keys: "k", row: row)))" }
        // Not INSERT OR IGNORE: the statement's own conflict clause (INSERT OR REPLACE) would override it.
        let giveNewKey = """
            INSERT INTO \(keysTable) (\(keysColumns)) SELECT \(key.columns.map { "NEW.\(quoteIdentifier($0))" }.joined(separator: ", "))
              WHERE NOT EXISTS (SELECT 1 FROM \(keysTable) AS k WHERE \(key.match(keys: "k", row: "NEW")));
            """
        let assignments = zip(key.keysColumns, key.columns).map { "\($0) = NEW.\(quoteIdentifier($1))" }.joined(separator: ", ")
        // OR REPLACE: a surrogate left behind by a row that REPLACE deleted (no trigger sees that) gives way.
        let followKey = "UPDATE OR REPLACE \(keysTable) SET \(assignments) WHERE \(key.match(keys: keysTable, row: "OLD")) AND (\(primaryKeyChanged));"
        let buryOld = """
            INSERT OR REPLACE INTO \(deadTable) (\(all.joined(separator: ", ")), tether_seq, tether_status, tether_in_flight, tether_versions, tether_via)
              SELECT \(all.map { "OLD.\($0)" }.joined(separator: ", ")), NULL, \(SyncStatus.deleted.rawValue), 0,
                (SELECT versions FROM \(rowsTable) WHERE row_id = \(surrogate("OLD"))), NULL WHERE \(running);
            DELETE FROM \(rowsTable) WHERE row_id = \(surrogate("OLD")) AND \(running);
            """
        let recordInsert = "INSERT INTO tether_external_changes (table_name, row_id, inserted) SELECT \(tableLiteral), \(surrogate("NEW")), 1 WHERE \(running);"
        return [
            "CREATE TRIGGER \(names[0]) AFTER INSERT ON \(quotedTable) BEGIN \(giveNewKey) \(recordInsert) END",
            """
            CREATE TRIGGER \(names[1]) AFTER UPDATE ON \(quotedTable) WHEN NOT (\(keyChanged)) AND (\(valueChanged) OR \(primaryKeyChanged))
            BEGIN
              \(followKey)
              \(giveNewKey)
              INSERT INTO tether_external_changes (table_name, row_id, inserted, mask)
                SELECT \(tableLiteral), \(surrogate("NEW")), 0, \(mask) WHERE \(running) AND (\(valueChanged));
            END
            """,
            "CREATE TRIGGER \(names[2]) AFTER UPDATE ON \(quotedTable) WHEN \(keyChanged) BEGIN \(buryOld) \(followKey) \(giveNewKey) \(recordInsert) END",
            """
            CREATE TRIGGER \(names[3]) AFTER DELETE ON \(quotedTable) BEGIN \(buryOld)
              INSERT INTO tether_external_changes (table_name, row_id, inserted) SELECT \(tableLiteral), 0, 0 WHERE \(running);
              DELETE FROM \(keysTable) WHERE \(key.match(keys: keysTable, row: "OLD"));
            END
            """,
        ]
    }

    /// Pauses the triggers of this table (in the current transaction, never committed).
    var pauseTriggers: String { "INSERT OR IGNORE INTO tether_capture_paused (table_name) VALUES (\(tableLiteral))" }
    var resumeTriggers: String { "DELETE FROM tether_capture_paused WHERE table_name = \(tableLiteral)" }

    private func placeholders(_ count: Int) -> String { Array(repeating: "?", count: count).joined(separator: ", ") }
}

/// The primary key of a table `WITHOUT ROWID`, whose rows the metadata names by a surrogate
/// rowid: `tether_keys_T` maps each live row's primary key (columns `k0`, `k1`, … of the same
/// types and collations, and as STRICT as the table, so that they compare as the table's do)
/// to its `row_id`. Its columns are named by position, so that renaming a key column leaves it be.
struct WithoutRowidKey: Equatable {
    /// The primary key's columns, in key order.
    let columns: [String]
    /// Each one's declared type and collation.
    let declarations: [String]
    let isStrict: Bool

    static func keysColumn(_ index: Int) -> String { "k\(index)" }
    var keysColumns: [String] { columns.indices.map(Self.keysColumn) }

    /// The keys table's row `keys` names the user's row `row` (an SQL condition: the left side's collation compares).
    func match(keys: String, row: String) -> String {
        columns.indices.map { "\(keys).\(Self.keysColumn($0)) = \(row).\(quoteIdentifier(columns[$0]))" }.joined(separator: " AND ")
    }

    /// The user's row `row` is the one the keys table's row `keys` names.
    func match(row: String, keys: String) -> String {
        columns.indices.map { "\(row).\(quoteIdentifier(columns[$0])) = \(keys).\(Self.keysColumn($0))" }.joined(separator: " AND ")
    }

    func createKeysTable(_ keysTable: String) -> String {
        let definitions = columns.indices.map { "\(Self.keysColumn($0)) \(declarations[$0])" }.joined(separator: ", ")
        return "CREATE TABLE IF NOT EXISTS \(keysTable) (row_id INTEGER PRIMARY KEY, \(definitions), UNIQUE (\(keysColumns.joined(separator: ", "))))"
            + (isStrict ? " STRICT" : "")
    }

    /// `table`'s primary key when it is declared WITHOUT ROWID; nil when it has a rowid.
    static func of(_ table: String, _ connection: Connection) throws -> WithoutRowidKey? {
        guard let info = try connection.fetchRow("SELECT wr, strict FROM pragma_table_list WHERE schema = 'main' AND name = ?", [table]),
              try info.get(0, as: Int.self) != 0 else { return nil }
        let columns = try connection.fetchRows("""
            SELECT c.name, c.type, coalesce(x.coll, 'BINARY') FROM pragma_table_info(?1) AS c
            LEFT JOIN pragma_index_list(?1) AS i ON i.origin = 'pk'
            LEFT JOIN pragma_index_xinfo(i.name) AS x ON x.name = c.name AND x.key = 1
            WHERE c.pk > 0 ORDER BY c.pk
            """, [table])
        guard !columns.isEmpty else { throw SyncError.invalidTable("\(table) is WITHOUT ROWID but has no primary key") }
        return WithoutRowidKey(
            columns: try columns.map { try $0.get(0, as: String.self) },
            declarations: try columns.map { row in
                let type = try row.get(1, as: String.self)
                return (type.isEmpty ? "" : type + " ") + "COLLATE " + quoteIdentifier(try row.get(2, as: String.self))
            },
            isStrict: try info.get(1, as: Int.self) != 0)
    }
}
