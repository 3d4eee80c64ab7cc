// `max` and `min` columns: the better value wins on every peer (`mergeLastWriterWins`), so a local
// write may only make it better. A worse one is refused rather than undone at the next sync.

extension ChangeCapture {
    /// Notes the first write of the statement that makes one of `table`'s `max`/`min` columns among
    /// `changed` worse (`flush` refuses the statement's transaction with it).
    func noteOrderedWrites(_ change: PreUpdateChange, _ table: SyncedTable, changed: [Int]) {
        guard refusal == nil else { return }
        for index in changed {
            let rule = table.columnRules[index]
            guard rule.isOrdered else { continue }
            let position = table.valuePositions[index]
            let old = DatabaseValue(sqliteValue: change.oldValue(position))
            let new = DatabaseValue(sqliteValue: change.newValue(position))
            guard rule.prefers(old, over: new) else { continue }
            refuse(Self.worseValue(table, column: index, from: old, to: new))
            return
        }
    }

    static func worseValue(_ table: SyncedTable, column index: Int, from old: DatabaseValue, to new: DatabaseValue)
        -> SyncError
    {
        let rule = table.columnRules[index], column = table.valueColumns[index]
        let verb = rule == .maximum ? "raise" : "lower"
        return .invalidValue(
            """
            column \(column) of \(table.name) is merged as \(rule): a write may only \(verb) it, not change it from \
            \(old) to \(new) (write \(rule)(\(column), …))
            """)
    }
}

extension RowMetadataLayout {
    /// The capture triggers' step for `max`/`min` columns: other programs' writes that make the
    /// value worse are refused, as the library's are (the same order: BINARY text, NULL worst).
    /// `running`: the condition under which the trigger captures (nil: its WHEN has it already).
    func orderedTriggerSteps(running: String? = nil) -> String {
        orderedColumns.map { column, rule in
            let quoted = quoteIdentifier(column)
            let worse = rule == .maximum ? "<" : ">"
            let message = DatabaseValue.text(
                "column \(column) of \(table) is merged as \(rule): a write may only "
                    + (rule == .maximum ? "raise" : "lower") + " it"
            ).description
            return """
                 SELECT RAISE(ABORT, \(message)) WHERE OLD.\(quoted) IS NOT NULL AND (NEW.\(quoted) IS NULL OR \
                NEW.\(quoted) \(worse) OLD.\(quoted) COLLATE BINARY)\(running.map { " AND \($0)" } ?? "");
                """
        }.joined()
    }
}
