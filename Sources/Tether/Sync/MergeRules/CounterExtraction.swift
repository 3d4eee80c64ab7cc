// A change sent carries each counter's state, not its sum: the receiver adds the contributions it
// lacks (Protocol/README.md §7.7).

import CSQLite
import Foundation

extension SyncEngine {
    /// Puts the counter states of the live rows of `changes` (a change's table is its index in
    /// `tables`) in place of their counters' values: those with contributions; a counter without
    /// any goes as its plain value. `reading` gives a table's `selectCountersByKey` on the
    /// connection the rows were read from (a catch-up's snapshot).
    func attachCounterStates(
        to changes: inout [RowChange], tables: [SyncedTable], reading: (SyncedTable) throws -> Statement
    ) throws {
        guard tables.contains(where: \.hasCounters) else { return }
        for index in changes.indices {
            let table = tables[changes[index].table]
            guard table.hasCounters, changes[index].isAlive, !changes[index].isEvicted else { continue }
            let statement = try reading(table)
            try statement.bind(StatementArguments(values: changes[index].key))
            defer { statement.reset() }
            guard try statement.step() else { continue }
            let counters = try rowCounters(statement.handle, column: 0, table)
            guard !counters.isEmpty else { continue }
            for column in table.counterColumns {
                guard let state = counters.states[table.valueColumns[column]],
                    changes[index].omitted.isEmpty || !changes[index].omitted[column]
                else { continue }
                changes[index].values[column] = .blob(state.encoded())
            }
        }
    }
}
