// The triggers that capture other programs' writes to a synced table, and their pause.

extension RowMetadataLayout {
    /// Drops the capture triggers (before a DDL statement that would trip on them, or when the
    /// table stops syncing or capturing other programs' writes).
    func dropTriggers(_ connection: Connection) throws {
        for trigger in triggerNames { try connection.execute("DROP TRIGGER IF EXISTS \(quoteIdentifier(trigger))") }
    }

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
        let mask =
            values.count > 62 || values.isEmpty
            ? "-1" : values.enumerated().map { "((OLD.\($1) IS NOT NEW.\($1)) << \($0))" }.joined(separator: " | ")
        let buryOld = """
            INSERT OR REPLACE INTO \(deadTable) (\(all.joined(separator: ", ")), tether_seq, tether_status, \
            tether_in_flight, tether_versions, tether_via)
            VALUES (\(all.map { "OLD.\($0)" }.joined(separator: ", ")), NULL, \(SyncStatus.deleted.rawValue), 0, \
            (SELECT versions FROM \(rowsTable) WHERE row_id = OLD.rowid), NULL);
            DELETE FROM \(rowsTable) WHERE row_id = OLD.rowid;
            """
        let recordInsert =
            "INSERT INTO tether_external_changes (table_name, row_id, inserted) VALUES (\(tableLiteral), NEW.rowid, 1);"
        let counters = counterTriggerSteps()
        return [
            """
            CREATE TRIGGER \(names[0]) AFTER INSERT ON \(quotedTable) WHEN \(running) BEGIN \
            \(counters.check)\(recordInsert) END
            """,
            """
            CREATE TRIGGER \(names[1]) AFTER UPDATE ON \(quotedTable) WHEN \(running) AND NOT (\(keyChanged)) AND \
            (\(valueChanged) OR OLD.rowid IS NOT NEW.rowid)
            BEGIN\(counters.check)\(orderedTriggerSteps())\(counters.record)
              UPDATE OR REPLACE \(rowsTable) SET row_id = NEW.rowid WHERE row_id = OLD.rowid AND OLD.rowid IS NOT \
            NEW.rowid;
              INSERT INTO tether_external_changes (table_name, row_id, inserted, mask) SELECT \(tableLiteral), \
            NEW.rowid, 0, \(mask) WHERE \(valueChanged);
            END
            """,
            // Only an UPDATE that sets a key column (or the rowid, which a key may alias) can move a
            // key: SQLite leaves this trigger out of every other UPDATE when it prepares it, the
            // library's own included (a trigger left in runs its program per row, paused or not).
            """
            CREATE TRIGGER \(names[2]) AFTER UPDATE OF \((keys + ["rowid", "oid", "_rowid_"]).joined(separator: ", ")) \
            ON \(quotedTable)
            WHEN \(running) AND (\(keyChanged)) BEGIN \(buryOld) \(recordInsert) END
            """,
            "CREATE TRIGGER \(names[3]) AFTER DELETE ON \(quotedTable) WHEN \(running) BEGIN \(buryOld) END",
        ]
    }

    /// The steps the capture triggers take for counter columns: refuse a value that is not a
    /// number, and record the difference an update makes (NULL counts as 0) with the value before.
    /// `rowid` names the row (`NEW.rowid`, or a table WITHOUT ROWID's surrogate); `running`, when
    /// the trigger runs paused too, is the condition of capture.
    private func counterTriggerSteps(rowid: String = "NEW.rowid", running: String? = nil) -> (
        check: String, record: String
    ) {
        var check = "", record = ""
        let when = running.map { "\($0) AND " } ?? ""
        for column in counterColumns {
            let quoted = quoteIdentifier(column), name = DatabaseValue.text(column).description
            let message = DatabaseValue.text(
                "column \(column) of \(table) is a counter: it holds numbers (or NULL)"
            ).description
            check += " SELECT RAISE(ABORT, \(message)) WHERE \(when)typeof(NEW.\(quoted)) IN ('text', 'blob');"
            record += """
                 INSERT INTO tether_external_counter_writes (table_name, row_id, column_name, before, difference) \
                SELECT \(tableLiteral), \(rowid), \(name), OLD.\(quoted), coalesce(NEW.\(quoted), 0) - \
                coalesce(OLD.\(quoted), 0) WHERE \(when)OLD.\(quoted) IS NOT NEW.\(quoted);
                """
        }
        return (check, record)
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
        let primaryKeyChanged = key.columns.map { "OLD.\(quoteIdentifier($0)) IS NOT NEW.\(quoteIdentifier($0))" }
            .joined(separator: " OR ")
        let mask =
            values.count > 62 || values.isEmpty
            ? "-1" : values.enumerated().map { "((OLD.\($1) IS NOT NEW.\($1)) << \($0))" }.joined(separator: " | ")
        let keysColumns = key.keysColumns.joined(separator: ", ")
        func surrogate(_ row: String) -> String {
            "(SELECT k.row_id FROM \(keysTable) AS k WHERE \(key.match(keys: "k", row: row)))"
        }
        // Not INSERT OR IGNORE: the statement's own conflict clause (INSERT OR REPLACE) would override it.
        let giveNewKey = """
            INSERT INTO \(keysTable) (\(keysColumns)) SELECT \
            \(key.columns.map { "NEW.\(quoteIdentifier($0))" }.joined(separator: ", "))
              WHERE NOT EXISTS (SELECT 1 FROM \(keysTable) AS k WHERE \(key.match(keys: "k", row: "NEW")));
            """
        let assignments = zip(key.keysColumns, key.columns).map { "\($0) = NEW.\(quoteIdentifier($1))" }.joined(
            separator: ", ")
        // OR REPLACE: a surrogate left behind by a row that REPLACE deleted (no trigger sees that) gives way.
        let followKey = """
            UPDATE OR REPLACE \(keysTable) SET \(assignments) WHERE \(key.match(keys: keysTable, row: "OLD")) AND \
            (\(primaryKeyChanged));
            """
        let buryOld = """
            INSERT OR REPLACE INTO \(deadTable) (\(all.joined(separator: ", ")), tether_seq, tether_status, \
            tether_in_flight, tether_versions, tether_via)
              SELECT \(all.map { "OLD.\($0)" }.joined(separator: ", ")), NULL, \(SyncStatus.deleted.rawValue), 0,
                (SELECT versions FROM \(rowsTable) WHERE row_id = \(surrogate("OLD"))), NULL WHERE \(running);
            DELETE FROM \(rowsTable) WHERE row_id = \(surrogate("OLD")) AND \(running);
            """
        let recordInsert = """
            INSERT INTO tether_external_changes (table_name, row_id, inserted) SELECT \(tableLiteral), \
            \(surrogate("NEW")), 1 WHERE \(running);
            """
        // After the surrogate follows the key: the counter's difference is recorded under it.
        let counters = counterTriggerSteps(rowid: surrogate("NEW"), running: running)
        return [
            """
            CREATE TRIGGER \(names[0]) AFTER INSERT ON \(quotedTable) BEGIN\(counters.check) \(giveNewKey) \
            \(recordInsert) END
            """,
            """
            CREATE TRIGGER \(names[1]) AFTER UPDATE ON \(quotedTable) WHEN NOT (\(keyChanged)) AND (\(valueChanged) OR \
            \(primaryKeyChanged))
            BEGIN\(counters.check)\(orderedTriggerSteps(running: running))
              \(followKey)
              \(giveNewKey)\(counters.record)
              INSERT INTO tether_external_changes (table_name, row_id, inserted, mask)
                SELECT \(tableLiteral), \(surrogate("NEW")), 0, \(mask) WHERE \(running) AND (\(valueChanged));
            END
            """,
            """
            CREATE TRIGGER \(names[2]) AFTER UPDATE ON \(quotedTable) WHEN \(keyChanged) BEGIN\(counters.check) \
            \(buryOld) \(followKey) \(giveNewKey) \(recordInsert) END
            """,
            """
            CREATE TRIGGER \(names[3]) AFTER DELETE ON \(quotedTable) BEGIN \(buryOld)
              INSERT INTO tether_external_changes (table_name, row_id, inserted) SELECT \(tableLiteral), 0, 0 WHERE \
            \(running);
              DELETE FROM \(keysTable) WHERE \(key.match(keys: keysTable, row: "OLD"));
            END
            """,
        ]
    }

    /// Pauses the triggers of this table (in the current transaction, never committed).
    var pauseTriggers: String { "INSERT OR IGNORE INTO tether_capture_paused (table_name) VALUES (\(tableLiteral))" }
    var resumeTriggers: String { "DELETE FROM tether_capture_paused WHERE table_name = \(tableLiteral)" }
}
