// A peer's change to a row with counters: each counter's state merged with the local one (the
// later base, each site's latest contribution), its sum written whatever the row's policy.

import CSQLite
import Foundation

extension SyncEngine {
    /// A local value column's merged counter, forced into the merged row (`applyWholeChange`).
    struct MergedCounter {
        var value: DatabaseValue
        var version: LocalVersion
    }

    /// Applies `change`, alive, to a table with counters; nil when it carries none of them (the
    /// usual way then). A peer's state that is not one (a text, a malformed blob, contributions
    /// newer than the column's version) is refused: `SyncError.invalidValue`, nothing written.
    func applyCounterChange(
        _ change: RowChange, _ mapping: TableMapping, from peer: InstanceKey, insertRefused: Bool,
        _ connection: Connection, _ report: inout ApplyReport
    ) throws -> ChangeOutcome? {
        let table = mapping.table
        let carried = mapping.localIndex.enumerated().filter { remote, local in
            local >= 0 && table.columnRules[local] == .counter && !(change.isPartial && change.omitted[remote])
        }
        guard !carried.isEmpty else { return nil }
        let local = try localRow(table, change.key, connection)
        let localCounters = try local?.rowid.map { try rowCounters(table, rowid: $0, connection) } ?? RowCounters()
        var merged = localCounters
        var rewritten = change
        var forced: [Int: MergedCounter] = [:]
        var remoteHoldsAll = true
        for (remoteIndex, localIndex) in carried {
            let remote = try remoteCounterState(change, remoteIndex, table, column: localIndex)
            var state = remote
            if let local, local.isAlive {
                let mine = try counterState(
                    localCounters, table, column: localIndex, value: local.values[localIndex],
                    version: local.versions.column(localIndex), connection)
                try checkOwnContribution(remote, against: mine, table, column: localIndex)
                state = mine.merged(with: remote)
            }
            if state != remote { remoteHoldsAll = false }
            merged.states[table.valueColumns[localIndex]] = state.contributions.isEmpty ? nil : state
            rewritten.values[remoteIndex] = state.value
            if state.newestVersion != change.version(remoteIndex) {
                if rewritten.versions.isEmpty {
                    rewritten.versions = Array(repeating: change.existence, count: change.values.count)
                }
                rewritten.versions[remoteIndex] = state.newestVersion
            }
            forced[localIndex] = MergedCounter(
                value: state.value, version: try localVersion(state.newestVersion, connection))
        }
        let outcome: ChangeOutcome
        if rewritten.isPartial {
            guard let local, local.isAlive else {
                throw SyncError.needsWholeRows(
                    "a change to \(table.name) leaves out values of a row this database does not hold")
            }
            let (completed, sameVersions) = try completingPartial(rewritten, mapping, local)
            outcome = try applyWholeChange(
                completed, mapping, remoteHoldsLocal: sameVersions && remoteHoldsAll, from: peer, over: local,
                counters: forced, connection, &report)
        } else {
            outcome = try applyWholeChange(
                rewritten, mapping, remoteHoldsLocal: remoteHoldsAll, from: peer, insertRefused: insertRefused,
                over: local, counters: forced, connection, &report)
        }
        if case .keptAside = outcome { return outcome }
        // The row as it ended: dead (a later deletion here), it keeps no counters.
        guard let rowid = try liveRowid(table, key: change.key, connection) else { return outcome }
        if merged != localCounters || local?.rowid != rowid {
            try writeRowCounters(merged, table, rowid: rowid, connection)
        }
        return outcome
    }

    /// The counter state a peer sent for column `remoteIndex` of `change` (local column `column`):
    /// a blob is one with contributions, a number (or NULL) one without (its base, at the column's
    /// version). Its newest version must be the column's.
    private func remoteCounterState(_ change: RowChange, _ remoteIndex: Int, _ table: SyncedTable, column: Int) throws
        -> CounterState
    {
        let name = table.valueColumns[column]
        let version = change.version(remoteIndex)
        let state: CounterState
        switch change.values[remoteIndex] {
        case let .blob(data):
            do {
                state = try CounterState(decoding: data)
            } catch {
                throw SyncError.invalidValue("counter \(name) of a row of \(table.name) from a peer: \(error)")
            }
        case let .text(text):
            throw SyncError.invalidValue(
                """
                counter \(name) of a row of \(table.name) from a peer holds a text ('\(text.prefix(40))'), not a \
                number
                """
            )
        case let value:
            state = CounterState(base: value, baseVersion: version)
        }
        guard state.newestVersion == version else {
            throw SyncError.invalidValue(
                """
                counter \(name) of a row of \(table.name) from a peer: its newest contribution \
                (\(state.newestVersion)) is not the column's version (\(version))
                """)
        }
        return state
    }

    /// Only this site changes its own contribution: a peer's state holding a later one than this
    /// site's (or one where this site has none since the same base) is forged.
    private func checkOwnContribution(
        _ remote: CounterState, against mine: CounterState, _ table: SyncedTable, column: Int
    ) throws {
        guard let claimed = remote.contributions.first(where: { $0.site == instanceKey }),
            claimed.version > max(mine.baseVersion, remote.baseVersion)
        else { return }
        let held = mine.contributions.first { $0.site == instanceKey }
        guard let held, claimed.timestamp < held.timestamp || claimed == held else {
            throw SyncError.forgedVersion(
                """
                counter \(table.valueColumns[column]) of a row of \(table.name): the peer's state holds a \
                contribution of this database (\(claimed.version)) that this database did not make
                """)
        }
    }

    /// The rowid of the live row with `key` (nil: none).
    func liveRowid(_ table: SyncedTable, key: [DatabaseValue], _ connection: Connection) throws -> Int64? {
        let statement = try table.statement(.selectRowidByKey, connection)
        try statement.bind(StatementArguments(values: key))
        defer { statement.reset() }
        guard try statement.step(), sqlite3_column_type(statement.handle, 0) != SQLITE_NULL else { return nil }
        return sqlite3_column_int64(statement.handle, 0)
    }

    /// Whether `change` carries a counter's state with contributions (a blob): it cannot be
    /// inserted as it is.
    func carriesCounterStates(_ change: borrowing RowChange, _ mapping: TableMapping) -> Bool {
        guard mapping.table.hasCounters else { return false }
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated()
        where localIndex >= 0 && mapping.table.columnRules[localIndex] == .counter {
            if case .blob = change.values[remoteIndex] { return true }
        }
        return false
    }
}
