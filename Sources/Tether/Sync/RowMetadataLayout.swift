// The names and SQL of a synced table's row metadata: its tables, live rows, own metadata, tombstones, acknowledgement.

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
    /// 4, the certificate each peer presented; 5, versions in their sparse form (`RowVersions`); 6, the
    /// earlier values of counter contributions (`ContributionHistory`).
    /// `MetadataUpgrade` moves a database to the current one when it opens.
    static let formatVersion = 7

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
    /// The value columns that are counters: the update trigger records the difference each write
    /// makes to them (`tether_external_counter_writes`), and refuses one that is not a number.
    var counterColumns: [String] = []
    /// The value columns merged as `max` or `min`: the update trigger refuses a write that makes
    /// one worse (`orderedTriggerSteps`).
    var orderedColumns: [(column: String, rule: ColumnMergeRule)] = []

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

    var keys: [String] { keyColumns.map(quoteIdentifier) }
    var values: [String] { valueColumns.map(quoteIdentifier) }
    var all: [String] { keys + values }
    func qualified(_ alias: String, _ columns: [String]) -> String {
        columns.map { "\(alias).\($0)" }.joined(separator: ", ")
    }
    private var keyMatch: String { keys.map { "\($0) = ?" }.joined(separator: " AND ") }
    var tableLiteral: String { DatabaseValue.text(table).description }

    // How the metadata names the user's rows: by rowid, or (WITHOUT ROWID) by the surrogate
    // `row_id` of `tether_keys_T`, joined as `<alias>_k`. For a table with a rowid, these
    // spell exactly the SQL the layout has always used.

    /// The `row_id` of the user's row `alias`, in a query that joins `keysJoin(alias)`.
    func rowid(_ alias: String) -> String { isWithoutRowid ? "\(alias)_k.row_id" : "\(alias).rowid" }
    /// Joins the keys table onto the user's row `alias` (nothing for a table with a rowid).
    func keysJoin(_ alias: String) -> String {
        guard let key = withoutRowidKey else { return "" }
        return " LEFT JOIN \(keysTable) AS \(alias)_k ON \(key.match(keys: "\(alias)_k", row: alias))"
    }
    /// Joins the user's row `alias` whose `row_id` is `rowid` (an SQL expression).
    func joinUser(_ alias: String, on rowid: String) -> String {
        guard let key = withoutRowidKey else { return "JOIN \(quotedTable) AS \(alias) ON \(alias).rowid = \(rowid)" }
        return """
            JOIN \(keysTable) AS \(alias)_k ON \(alias)_k.row_id = \(rowid) JOIN \(quotedTable) AS \(alias) ON \
            \(key.match(row: alias, keys: "\(alias)_k"))
            """
    }
    /// The condition on the user's table that picks the rows whose `row_id`s lie between the parameters.
    private var byRowidRange: String {
        guard let key = withoutRowidKey else { return "rowid BETWEEN ?1 AND ?2" }
        return """
            (\(key.columns.map(quoteIdentifier).joined(separator: ", "))) IN (SELECT \
            \(key.keysColumns.joined(separator: ", ")) FROM \(keysTable) WHERE row_id BETWEEN ?1 AND ?2)
            """
    }
    /// The condition on the user's table that picks the row whose `row_id` is the parameter.
    private var byRowid: String {
        guard let key = withoutRowidKey else { return "rowid = ?" }
        return """
            (\(key.columns.map(quoteIdentifier).joined(separator: ", "))) IN (SELECT \
            \(key.keysColumns.joined(separator: ", ")) FROM \(keysTable) WHERE row_id = ?)
            """
    }

    // MARK: Tables

    /// The metadata tables of a newly synced table (idempotent).
    var createTables: [String] {
        let surrogates = withoutRowidKey.map { [$0.createKeysTable(keysTable)] } ?? []
        return surrogates + [
            """
            CREATE TABLE IF NOT EXISTS \(rowsTable) (row_id INTEGER PRIMARY KEY, seq INTEGER NOT NULL, status INTEGER \
            NOT NULL,
              in_flight INTEGER NOT NULL DEFAULT 0, versions BLOB NOT NULL, via INTEGER, inserted_seq INTEGER) STRICT
            """,
            "CREATE INDEX IF NOT EXISTS \(quoteIdentifier("tether_rows_\(table)_seq")) ON \(rowsTable) (seq)",
            """
            CREATE TABLE IF NOT EXISTS \(deadTable) (\(all.joined(separator: ", ")), tether_seq INTEGER, tether_status \
            INTEGER NOT NULL DEFAULT 3,
              tether_in_flight INTEGER NOT NULL DEFAULT 0, tether_versions BLOB, tether_via INTEGER, PRIMARY KEY \
            (\(keys.joined(separator: ", "))))
            """,
            """
            CREATE INDEX IF NOT EXISTS \(quoteIdentifier("tether_seq_tether_dead_\(table)")) ON \(deadTable) \
            (tether_seq)
            """,
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
        ["DROP TABLE IF EXISTS \(rowsTable)", "DROP TABLE IF EXISTS \(deadTable)"]
            + (isWithoutRowid ? ["DROP TABLE IF EXISTS \(keysTable)"] : [])
    }

    /// WITHOUT ROWID: gives the rows that have none a surrogate (the rows already there when the table is synced).
    var insertMissingKeys: String? {
        guard let key = withoutRowidKey else { return nil }
        return """
            INSERT OR IGNORE INTO \(keysTable) (\(key.keysColumns.joined(separator: ", "))) SELECT \
            \(key.columns.map(quoteIdentifier).joined(separator: ", ")) FROM \(quotedTable)
            """
    }

    /// WITHOUT ROWID: the surrogate of the live row with a key (binds: key).
    var selectRowidByKey: String {
        """
        SELECT \(rowid("t")) FROM \(quotedTable) AS t\(keysJoin("t")) WHERE \
        \(keys.map { "t.\($0) = ?" }.joined(separator: " AND "))
        """
    }
    /// WITHOUT ROWID: gives the live row with a key a surrogate if it has none (binds: key).
    var insertKeyByKey: String? {
        guard let key = withoutRowidKey else { return nil }
        return """
            INSERT OR IGNORE INTO \(keysTable) (\(key.keysColumns.joined(separator: ", "))) SELECT \
            \(key.columns.map { "t.\(quoteIdentifier($0))" }.joined(separator: ", ")) FROM \(quotedTable) AS t \
            WHERE \(keys.map { "t.\($0) = ?" }.joined(separator: " AND "))
            """
    }

    // MARK: Live rows

    /// A live row by identity, with its metadata if it has its own (NULLs for a row of an insert range).
    var selectLiveByKey: String {
        """
        SELECT \(rowid("t")), \(qualified("t", values)), m.status, m.in_flight, m.versions FROM \(quotedTable) AS \
        t\(keysJoin("t")) LEFT JOIN \(rowsTable) AS m ON m.row_id = \(rowid("t")) WHERE \
        \(keys.map { "t.\($0) = ?" }.joined(separator: " AND "))
        """
    }
    /// A live row's rowid by its key (columns other than the rowid) and its own metadata (NULL:
    /// none), for a table with a rowid: status, in_flight, versions; then, for a row without, the
    /// insert range with the greatest first rowid at or below its rowid (`InsertRange.columns`,
    /// NULL: none), which covers it if it reaches it. One statement, not three: read per partial
    /// change applied. (A table whose key is its rowid is read by rowid: `storedState`.)
    var selectStateByKey: String {
        """
        SELECT t.rowid, m.status, m.in_flight, m.versions, \(InsertRange.qualifiedColumns("r")) FROM \(quotedTable) \
        AS t LEFT JOIN \(rowsTable) AS m ON m.row_id = t.rowid \
        \(InsertRange.joinReaching("r", table: table, rowid: "t.rowid", when: "m.row_id IS NULL")) WHERE \
        \(keys.map { "t.\($0) = ?" }.joined(separator: " AND "))
        """
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
    var insertLive: String {
        "INSERT INTO \(quotedTable) (\(all.joined(separator: ", "))) VALUES (\(placeholders(all.count)))"
    }
    /// `UPDATE` of a live row's values by rowid; nil when the table has only key columns.
    var updateLive: String? { values.isEmpty ? nil : updateLive(values.indices) }
    /// `UPDATE` of some of a live row's values (`columns`, indexes of `valueColumns`, in order) by
    /// rowid (binds: their values, the rowid).
    func updateLive(_ columns: some Sequence<Int>) -> String {
        let values = self.values
        return
            "UPDATE \(quotedTable) SET \(columns.map { "\(values[$0]) = ?" }.joined(separator: ", ")) WHERE \(byRowid)"
    }
    var deleteLiveByRowid: String { "DELETE FROM \(quotedTable) WHERE \(byRowid)" }
    /// The key of the live row with a rowid (binds: rowid).
    var selectKeyByRowid: String { "SELECT \(keys.joined(separator: ", ")) FROM \(quotedTable) WHERE \(byRowid)" }
    var liveRowExists: String { "SELECT EXISTS (SELECT 1 FROM \(quotedTable) WHERE \(byRowid))" }

    // MARK: Row metadata

    /// A row's own metadata: status, in_flight, versions, inserted_seq.
    var selectRowMetadata: String {
        "SELECT status, in_flight, versions, inserted_seq FROM \(rowsTable) WHERE row_id = ?"
    }
    /// Binds: rowid, sequence, status, versions, via, inserted sequence. A new change is never in
    /// flight. The inserted sequence is the change's own for an insert; for an update, the one the
    /// row had (or NULL), always below the change's: metadata the row has already keeps its own.
    var upsertRowMetadata: String {
        """
        INSERT INTO \(rowsTable) (row_id, seq, status, in_flight, versions, via, inserted_seq) VALUES (?, ?, ?, 0, ?, \
        ?, ?)
        ON CONFLICT (row_id) DO UPDATE SET seq = excluded.seq, status = excluded.status, in_flight = 0, versions = \
        excluded.versions, via = excluded.via,
          inserted_seq = CASE WHEN excluded.inserted_seq = excluded.seq THEN excluded.seq ELSE inserted_seq END
        """
    }
    /// Binds: rowid, sequence, status, in_flight, versions, via (a row given metadata as it stands).
    var insertRowMetadata: String {
        "INSERT INTO \(rowsTable) (row_id, seq, status, in_flight, versions, via) VALUES (?, ?, ?, ?, ?, ?)"
    }
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
        isWithoutRowid
            ? """
            DELETE FROM \(rowsTable) WHERE row_id NOT IN (SELECT \(rowid("t")) FROM \(quotedTable) AS \
            t\(keysJoin("t")))
            """
            : "DELETE FROM \(rowsTable) WHERE row_id NOT IN (SELECT rowid FROM \(quotedTable))"
    }

    // MARK: Tombstones

    /// Binds: key, values, sequence, status, in_flight, versions, via.
    var upsertDead: String {
        """
        INSERT OR REPLACE INTO \(deadTable) (\(all.joined(separator: ", ")), tether_seq, tether_status, \
        tether_in_flight, tether_versions, tether_via) VALUES (\(placeholders(all.count + 5)))
        """
    }
    var selectDeadByKey: String {
        """
        SELECT \(values.joined(separator: ", ")), tether_status, tether_in_flight, tether_versions FROM \
        \(deadTable) WHERE \(keyMatch)
        """
    }
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
        return """
            DELETE FROM \(deadTable) WHERE \(tuple) IN (SELECT \(keys.map { "+\($0)" }.joined(separator: ", ")) \
            FROM \(quotedTable) WHERE \(byRowid))
            """
    }
    /// The tombstones of the user's rows whose rowids lie between the two parameters (a run of
    /// rows inserted together), by key, read as `deleteDeadForRowid` reads it: one statement per
    /// run, not one per row. With `keyIsRowid` the key is the rowid itself: the tombstones of keys
    /// in the range, one probe of their index.
    func deleteDeadForRowids(keyIsRowid: Bool) -> String {
        if keyIsRowid, let key = keys.first { return "DELETE FROM \(deadTable) WHERE \(key) BETWEEN ?1 AND ?2" }
        let tuple = keys.count == 1 ? keys[0] : "(\(keys.joined(separator: ", ")))"
        return """
            DELETE FROM \(deadTable) WHERE \(tuple) IN (SELECT \(keys.map { "+\($0)" }.joined(separator: ", ")) \
            FROM \(quotedTable) WHERE \(byRowidRange))
            """
    }
    var deadTableHasRows: String { "SELECT EXISTS (SELECT 1 FROM \(deadTable))" }
    /// Tombstones written by triggers, waiting for their sequence number: key, versions.
    var selectUnfoldedDead: String {
        "SELECT \(keys.joined(separator: ", ")), tether_versions FROM \(deadTable) WHERE tether_seq IS NULL"
    }
    /// Binds: sequence, versions, key.
    var foldDead: String { "UPDATE \(deadTable) SET tether_seq = ?, tether_versions = ? WHERE \(keyMatch)" }
    /// Removes up to `?2` tombstones at or before sequence `?1` that are not in flight, received from
    /// the site `?3` if it is not NULL (one step of a garbage collection, by the `tether_seq` index).
    /// Binds: sequence, limit, site.
    var collectDead: String {
        """
        DELETE FROM \(deadTable) WHERE rowid IN (SELECT rowid FROM \(deadTable) WHERE tether_seq <= ?1 AND \
        tether_in_flight = 0
          AND (?3 IS NULL OR tether_via = ?3) LIMIT ?2)
        """
    }

    // MARK: In flight and acknowledged

    /// Pending changes in (after, through] become in flight (binds: after, through), rows then tombstones.
    var markInFlight: [String] {
        [
            "UPDATE \(rowsTable) SET in_flight = 1 WHERE \(rowsInRange) AND status != 0 AND in_flight = 0",
            """
            UPDATE \(deadTable) SET tether_in_flight = 1 WHERE \(tombstonesInRange) AND tether_status != 0 AND \
            tether_in_flight = 0
            """,
        ]
    }
    /// In-flight changes in (after, through] become synced (binds: after, through), rows then tombstones.
    var acknowledge: [String] {
        [
            "UPDATE \(rowsTable) SET status = 0, in_flight = 0 WHERE \(rowsInRange) AND in_flight = 1",
            """
            UPDATE \(deadTable) SET tether_status = 0, tether_in_flight = 0 WHERE \(tombstonesInRange) AND \
            tether_in_flight = 1
            """,
        ]
    }

    // The rows with a sequence in (?1, ?2], found in the sequence index alone and then visited in
    // rowid order: visited in sequence order, scattered rows cost a page read each once the table
    // outgrows the page cache (acknowledging 100,000 scattered updates of 336,776 flights: 0.20 s
    // that way, 0.14 s this way).
    private var rowsInRange: String { "row_id IN (SELECT row_id FROM \(rowsTable) WHERE seq > ?1 AND seq <= ?2)" }
    private var tombstonesInRange: String {
        "rowid IN (SELECT rowid FROM \(deadTable) WHERE tether_seq > ?1 AND tether_seq <= ?2)"
    }

    private func placeholders(_ count: Int) -> String { Array(repeating: "?", count: count).joined(separator: ", ") }
}

// MARK: Counters

extension RowMetadataLayout {
    /// The rows table's column of counter states (`RowCounters`), added when a column of the
    /// table becomes a counter; NULL for a row whose counters hold no contribution.
    var addCountersColumn: String { "ALTER TABLE \(rowsTable) ADD COLUMN counters BLOB" }
    var hasCountersColumn: String {
        let rows = DatabaseValue.text(Self.rowsTableName(of: table)).description
        return "SELECT count(*) FROM pragma_table_info(\(rows)) WHERE name = 'counters'"
    }
    /// Binds: rowid.
    var selectCounters: String { "SELECT counters FROM \(rowsTable) WHERE row_id = ?" }
    /// Binds: counters, rowid.
    var updateCounters: String { "UPDATE \(rowsTable) SET counters = ?1 WHERE row_id = ?2" }
    /// The counter states of the live row with a key (binds: key).
    var selectCountersByKey: String {
        """
        SELECT m.counters FROM \(quotedTable) AS t\(keysJoin("t")) JOIN \(rowsTable) AS m ON m.row_id = \(rowid("t")) \
        WHERE \(keys.map { "t.\($0) = ?" }.joined(separator: " AND "))
        """
    }
    /// `upsertRowMetadata` writing the row's counter states too (binds: those of
    /// `upsertRowMetadata`, then the counters): a local update of counters is one write.
    var upsertRowMetadataWithCounters: String {
        """
        INSERT INTO \(rowsTable) (row_id, seq, status, in_flight, versions, via, inserted_seq, counters) VALUES (?, ?, \
        ?, 0, ?, ?, ?, ?)
        ON CONFLICT (row_id) DO UPDATE SET seq = excluded.seq, status = excluded.status, in_flight = 0, versions = \
        excluded.versions, via = excluded.via,
          inserted_seq = CASE WHEN excluded.inserted_seq = excluded.seq THEN excluded.seq ELSE inserted_seq END,
          counters = excluded.counters
        """
    }
    /// Drops every row's counter states (the table has counters no more).
    var clearCounters: String { "UPDATE \(rowsTable) SET counters = NULL WHERE counters IS NOT NULL" }
}
