import Foundation
import Logging

/// `enableSync(allExcept:)` as a rule of the database rather than a call (AgileDB's
/// `setUnsyncedTables`: "any tables not in this array will be synced"): every user table syncs,
/// those made later as they appear, except the tables listed. Recorded in the catalog, so it holds
/// across openings.
struct StandingSyncRule: Sendable, Equatable {
    /// The tables left out, as the caller named them (SQLite's names are case-insensitive).
    var excluded: [String]
    /// The conflict policy of the tables it syncs, by its stored name (``ConflictPolicy/description``).
    var policyName: String
    /// Whether the tables it syncs capture other programs' writes.
    var capturesExternalWrites: Bool

    /// Whether the rule syncs `table`: one of the user's tables that is not left out.
    func covers(_ table: String) -> Bool {
        !SyncedTable.isInternal(table) && !excludes(table)
    }

    func excludes(_ table: String) -> Bool {
        excluded.contains { $0.caseInsensitiveCompare(table) == .orderedSame }
    }
}

extension SyncEngine {
    /// Records `rule`; `merge` is the function of a custom policy, kept for this opening only (a
    /// function cannot be stored: after reopening, a table the rule syncs under a custom policy
    /// waits for its function, as any custom table does).
    func setStandingRule(_ rule: StandingSyncRule, merge: MergeFunction?, _ connection: Connection) throws {
        try connection.syncedTableCatalog.saveStandingRule(rule)
        syncedTables.standingRuleMerge = merge
        syncedTables.hasStandingRule = true
        // The capture now listens for tables being made, even while none is synced.
        connection.observersDidChange()
    }

    /// A table `table` was just made on the writer (or, at opening, by another program while the
    /// database was closed): synced at once, in the transaction that made it, when the standing
    /// rule covers it (its rows, written after, are captured as any others). One the rule cannot
    /// sync (no primary key, a local AUTOINCREMENT key) stays local, with a warning: the code
    /// that made it may know nothing of sync, and the table is listed by `unsyncedTables()`.
    func followStandingRule(madeTable table: String, _ connection: Connection) throws {
        // The catalog, not the tables in memory, says what is synced: those may still hold a
        // table whose making (and syncing) a rollback undid.
        let catalog = connection.syncedTableCatalog
        guard syncedTables.hasStandingRule, let rule = try catalog.standingRule(), rule.covers(table),
            try catalog.record(named: table) == nil,
            try connection.fetchValue(
                "SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?", [table], as: Int.self) != nil
        else { return }  // a TEMP table is no table of the database
        do {
            try enableSync(table, under: rule, connection)
        } catch SyncError.invalidTable(let reason) {
            // Refused before anything was written: the transaction goes on.
            logger?.warning(
                """
                a table stays local: the standing rule of enableSync(allExcept:) cannot sync it; give it a primary key,\
                 or list it and sync it with enableSync(table:identity:)
                """,
                metadata: [
                    "tether.table": "\(table)", "tether.reason": "\(reason)",
                ])
        }
    }

    /// The user's tables the standing rule covers that are not synced: made while this database
    /// was closed, by another program (or ones it cannot sync). Empty without a rule.
    func tablesTheStandingRuleAwaits(_ connection: Connection) throws -> [String] {
        let catalog = connection.syncedTableCatalog
        guard syncedTables.hasStandingRule, let rule = try catalog.standingRule() else { return [] }
        let synced = Set(try catalog.records().map(\.name))
        return try connection.userTableNames().filter { !synced.contains($0) && rule.covers($0) }
    }

    /// `table` stops syncing while a standing rule holds: it joins the tables the rule leaves out,
    /// or the next opening would sync it again.
    func excludeFromStandingRule(_ table: String, _ connection: Connection) throws {
        guard var rule = try connection.syncedTableCatalog.standingRule(), !rule.excludes(table) else { return }
        rule.excluded.append(table)
        try connection.syncedTableCatalog.saveStandingRule(rule)
    }

    private func enableSync(_ table: String, under rule: StandingSyncRule, _ connection: Connection) throws {
        let policy = ConflictPolicy(storedName: rule.policyName, merge: syncedTables.standingRuleMerge)
        try enableSync(
            table: table, keyColumns: nil, policy: policy ?? .lastWriterWins,
            capturesExternalWrites: rule.capturesExternalWrites,
            connection: connection)
        guard policy == nil else { return }
        // A custom policy whose function this opening was not given: recorded as custom, the table
        // refuses peers' changes until `setConflictPolicy` gives it one.
        try connection.syncedTableCatalog.setPolicy(named: rule.policyName, of: table)
        try loadTables(connection)
    }
}
