// Choosing and changing a synced table's column merge rules.

import Foundation

extension SyncEngine {
    /// `rules` checked against the table: value columns only, `max` and `min` under the
    /// last-writer-wins policy (another policy decides whole rows, and would undo the better
    /// value). Last-writer-wins entries are dropped (the default).
    func checkedRules(
        _ rules: [String: ColumnMergeRule], of table: String, valueColumns: [String], policy: ConflictPolicy
    ) throws -> [String: ColumnMergeRule] {
        var checked: [String: ColumnMergeRule] = [:]
        for (column, rule) in rules.sorted(by: { $0.key < $1.key }) where rule != .lastWriterWins {
            guard valueColumns.contains(column) else {
                throw SyncError.invalidTable(
                    "\(table) has no value column \(column) to merge as a \(rule): a key column's rule is its identity")
            }
            if rule.isOrdered, policy.description != ConflictPolicy.lastWriterWins.description {
                throw SyncError.invalidTable(
                    "column \(column) of \(table) is merged as \(rule): only under the lastWriterWins policy, "
                        + "not \(policy)")
            }
            checked[column] = rule
        }
        return checked
    }

    /// Moves the table to `rules`: a column that becomes a counter starts from its value on each
    /// row (its base, at the column's version: peers that synced the row start from the same one);
    /// a counter that stops being one keeps its sum as a plain value.
    func changeRules(
        of table: String, to rules: [String: ColumnMergeRule], _ layout: RowMetadataLayout, _ connection: Connection
    ) throws {
        let hasColumn = try connection.fetchValue(layout.hasCountersColumn, as: Int64.self) == 1
        if rules.values.contains(.counter) {
            if !hasColumn { try connection.execute(layout.addCountersColumn) }
        } else if hasColumn {
            try connection.execute(layout.clearCounters)
        }
        guard let before = tables[table] else { return }
        // A counter that stops being one: its states go (the value in the table is the sum already).
        let stopped = before.counterColumns.map { before.valueColumns[$0] }.filter { rules[$0] != .counter }
        guard !stopped.isEmpty, rules.values.contains(.counter) else { return }
        let rows = try connection.fetchRows(
            "SELECT row_id, counters FROM \(layout.rowsTable) WHERE counters IS NOT NULL")
        for row in rows {
            guard case let .blob(data) = row[1], var counters = RowCounters(encoded: data) else { continue }
            for name in stopped { counters.states[name] = nil }
            let value: DatabaseValue = counters.isEmpty ? .null : .blob(Data(counters.encoded()))
            try connection.execute(layout.updateCounters, StatementArguments(values: [value, row[0]]))
        }
    }
}
