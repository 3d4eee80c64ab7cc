// One change against the local row: the merge per column and the conflict policies
// (last-writer-wins, local-wins, remote-wins, custom), and the conflicts they report.

import Foundation

extension SyncEngine {
    /// `insertRefused`: the change was tried as a new row already (`insertIfAbsent`), and refused.
    func applyChange(
        _ change: RowChange, _ mapping: TableMapping, from peer: InstanceKey, insertRefused: Bool = false,
        _ connection: Connection,
        _ report: inout ApplyReport
    ) throws -> ChangeOutcome {
        willWrite(change)
        if mapping.table.hasCounters, change.isAlive,
            let outcome = try applyCounterChange(
                change, mapping, from: peer, insertRefused: insertRefused, connection, &report)
        {
            return outcome
        }
        guard change.isPartial else {
            return try applyWholeChange(
                change, mapping, remoteHoldsLocal: true, from: peer, insertRefused: insertRefused, connection, &report)
        }
        if let outcome = try applyPartialInPlace(change, mapping, from: peer, connection) { return outcome }
        // The columns left out are held here already (the sender knows this database received the
        // row whole): completed with this row's own values and versions, they change nothing.
        guard let local = try localRow(mapping.table, change.key, connection) else {
            throw SyncError.needsWholeRows(
                "a change to \(mapping.table.name) leaves out values of a row this database does not hold")
        }
        let (completed, remoteHoldsLocal) = try completingPartial(change, mapping, local)
        // The row is here: no insert is tried, and it is not looked up again.
        return try applyWholeChange(
            completed, mapping, remoteHoldsLocal: remoteHoldsLocal, from: peer, over: local, connection, &report)
    }

    /// Applies a change that carries every value. `remoteHoldsLocal` is false when a column left
    /// out of a partial change was newer here than there: the merged row is then not the peer's
    /// state, even if it looks so (see `write`). The change is borrowed, not copied: a change
    /// holds four arrays, and copies cost their reference counting on every change of a batch.
    /// `known`: the local row, when the caller read it already. `counters`: counter columns merged
    /// already (`applyCounterChange`), their sums taken whatever the policy.
    func applyWholeChange(
        _ change: borrowing RowChange, _ mapping: TableMapping, remoteHoldsLocal: Bool, from peer: InstanceKey,
        insertRefused: Bool = false, over known: LocalRow? = nil, counters: [Int: MergedCounter] = [:],
        _ connection: Connection, _ report: inout ApplyReport
    ) throws -> ChangeOutcome {
        let table = mapping.table
        // Fast path: a new live row, the common case of a first sync.
        if known == nil, change.isAlive && !table.mayHaveDeadRows && !insertRefused,
            try insertIfAbsent(change, mapping, from: peer, connection)
        {
            return .applied
        }

        guard let local = try known ?? localRow(table, change.key, connection) else {
            return try write(
                change, mapping, nil, merged: remoteState(change, mapping, connection), status: .synced, from: peer,
                remoteHoldsIt: remoteHoldsLocal, connection)
        }
        let remoteExistence = try localVersion(change.existence, connection)
        var state = MergedState(isAlive: local.isAlive, values: local.values, versions: local.versions)
        var status = local.status
        var resolution: Conflict.Resolution?

        if local.isPending {
            switch table.policy {
            case .localWins:
                resolution = .keptLocal
            case .remoteWins:
                state = try remoteState(change, mapping, over: local, connection)
                status = .synced
                resolution = .tookRemote
            case .lastWriterWins:
                try mergeLastWriterWins(change, mapping, remoteExistence, into: &state, connection)
                resolution = .lastWriterWins
            case let .custom(merge):
                try mergeLastWriterWins(change, mapping, remoteExistence, into: &state, connection)
                if local.isAlive && change.isAlive {
                    let merged = try merge(
                        dictionary(table, change.key, local.values),
                        dictionary(table, change.key, remoteValues(change, mapping, base: local.values)))
                    let version = ownChangeVersion()
                    for (index, column) in table.valueColumns.enumerated() {
                        guard let value = merged[column], value != state.values[index] else { continue }
                        state.values[index] = value
                        state.versions.setColumn(index, to: version, columnCount: table.valueColumns.count)
                    }
                    status = .updated
                    resolution = .merged
                } else {
                    resolution = .lastWriterWins
                }
            }
        } else {
            try mergeLastWriterWins(change, mapping, remoteExistence, into: &state, connection)
            // A merged `max`/`min` value (or a row back by add-wins) at a version of this database's:
            // a change of its own to send. A tombstone's status stays (it goes out by its sequence).
            if state.hasOwnMerge, state.isAlive { status = SyncEngine.statusAfterUpdate(status) }
        }
        if state.isAlive, !counters.isEmpty {
            for (index, counter) in counters {
                state.values[index] = counter.value
                state.versions.setColumn(index, to: counter.version, columnCount: table.valueColumns.count)
            }
            state.versions.normalize()
        }

        let changed = state.isAlive != local.isAlive || state.values != local.values || state.versions != local.versions
        let lostEntirely =
            resolution == .lastWriterWins && !changed
            ? try remoteLost(change, mapping, to: local, remoteExistence, connection) : false
        if let resolution, changed || resolution != .lastWriterWins || lostEntirely {
            report.conflicts.append(
                Conflict(
                    table: table.name, key: change.key, peer: peer,
                    local: local.isAlive ? dictionary(table, change.key, local.values) : nil,
                    remote: change.isAlive
                        ? dictionary(table, change.key, remoteValues(change, mapping, base: local.values)) : nil,
                    resolution: resolution))
        }
        guard changed else { return .unchanged }
        return try write(
            change, mapping, local, merged: state, status: status, from: peer, remoteHoldsIt: remoteHoldsLocal,
            connection)
    }

    /// Whether the remote row carries a value (or an existence) of another
    /// origin that differs from the pending local one and lost to it: a
    /// conflict the local row won entirely, which nothing else would report.
    func remoteLost(
        _ change: RowChange, _ mapping: TableMapping, to local: LocalRow, _ remoteExistence: LocalVersion,
        _ connection: Connection
    ) throws -> Bool {
        if change.isAlive != local.isAlive && change.existence.origin != instanceKey
            && remoteExistence != local.versions.existence
        {
            return true
        }
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated()
        where change.values[remoteIndex] != local.values[localIndex] {
            let version = change.version(remoteIndex)
            if version.origin != instanceKey, try localVersion(version, connection) != local.versions.column(localIndex)
            {
                return true
            }
        }
        return false
    }

    struct MergedState {
        var isAlive: Bool
        var values: [DatabaseValue]
        var versions: RowVersions
        /// A `max`/`min` column took the better value of an older version: a state neither side
        /// held, at a version of this database's own (`mergeLastWriterWins`).
        var hasOwnMerge = false
    }

    /// Per column, and for the row's existence, the later version wins; for a `max` or `min`
    /// column, the better value. Where the better value is the older version's, the column gets a
    /// version of this database's own, later than both: a version always names one value, which
    /// echoes, held columns and `isExactly` rely on (the peers then take the pair whole).
    func mergeLastWriterWins(
        _ change: RowChange, _ mapping: TableMapping, _ remoteExistence: LocalVersion,
        into state: inout MergedState, _ connection: Connection
    ) throws {
        let count = mapping.table.valueColumns.count
        // Columns keep their own versions when the existence version changes.
        if state.versions.columns == nil {
            state.versions.columns = Array(repeating: state.versions.existence, count: count)
        }
        let wasAlive = state.isAlive
        if try isLater(remoteExistence, than: state.versions.existence) {
            state.isAlive = change.isAlive
            state.versions.existence = remoteExistence
        }
        // Add-wins: a delete that did not see an update loses to it, and the row comes back as the
        // live side holds it, at a version of this database's own (later than the delete: every
        // peer then takes the row back as is). A tombstone's values never come back with it — nor
        // when the row comes back here by a later existence: a scoped writer's delete is checked
        // for where the row is, not for the values it carries.
        if mapping.table.rowRule == .addWins, wasAlive != change.isAlive {
            let comesBack =
                try (!wasAlive && state.isAlive)
                || (!state.isAlive && holdsUnseenUpdate(change, mapping, localIsAlive: wasAlive, state, connection))
            if comesBack {
                if !state.isAlive {
                    state.isAlive = true
                    state.hasOwnMerge = true
                    state.versions.existence = ownChangeVersion()
                }
                if !wasAlive {
                    // The peer's row as a new row would be written (its columns, defaults for those it lacks).
                    let live = try remoteState(change, mapping, connection)
                    state.values = live.values
                    state.versions.columns =
                        live.versions.columns ?? Array(repeating: live.versions.existence, count: count)
                }
                state.versions.normalize()
                return
            }
        }
        var toLocal = LocalVersionLookup(self, connection)
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated() {
            let remote = try toLocal(change.version(remoteIndex))
            let local = state.versions.column(localIndex)
            let rule = mapping.table.columnRules[localIndex]
            if try isLater(remote, than: local) {
                if rule.isOrdered, rule.prefers(state.values[localIndex], over: change.values[remoteIndex]) {
                    state.versions.setColumn(localIndex, to: ownChangeVersion(), columnCount: count)
                    state.hasOwnMerge = true
                } else {
                    state.values[localIndex] = change.values[remoteIndex]
                    state.versions.setColumn(localIndex, to: remote, columnCount: count)
                }
            } else if rule.isOrdered, remote != local,
                rule.prefers(change.values[remoteIndex], over: state.values[localIndex])
            {
                state.values[localIndex] = change.values[remoteIndex]
                state.versions.setColumn(localIndex, to: ownChangeVersion(), columnCount: count)
                state.hasOwnMerge = true
            } else if remote == local, state.values[localIndex] != change.values[remoteIndex],
                state.values[localIndex] == mapping.table.valueDefaults[localIndex]
            {
                // One version, two values: this database holds the column's default standing in for a
                // value it never saw — it got the row from a peer that lacked the column, or added the
                // column after the row was written — whether or not the column was added here. The
                // value written wins over the default (Protocol/README.md §7.3, equal versions).
                state.values[localIndex] = change.values[remoteIndex]
            }
        }
        // A column the peer lacks holds its default there at the row's existence version, as a
        // column added here does (`RowVersions.column`): a row inserted on a node without the
        // column after the value was written ends it, as an insert on a node with it would.
        for localIndex in mapping.columnsThePeerLacks
        where try isLater(remoteExistence, than: state.versions.column(localIndex)) {
            let rule = mapping.table.columnRules[localIndex]
            if rule.isOrdered, rule.prefers(state.values[localIndex], over: mapping.table.valueDefaults[localIndex]) {
                state.versions.setColumn(localIndex, to: ownChangeVersion(), columnCount: count)
                state.hasOwnMerge = true
                continue
            }
            state.values[localIndex] = mapping.table.valueDefaults[localIndex]
            state.versions.setColumn(localIndex, to: remoteExistence, columnCount: count)
        }
        state.versions.normalize()
    }

    /// Whether the live side of a delete and a row (the local row when `localIsAlive`, else the
    /// change) holds a column written later than the deleted side's version of it: an update the
    /// delete did not see (a tombstone keeps the versions its row had when deleted).
    private func holdsUnseenUpdate(
        _ change: RowChange, _ mapping: TableMapping, localIsAlive: Bool, _ state: MergedState,
        _ connection: Connection
    ) throws -> Bool {
        var toLocal = LocalVersionLookup(self, connection)
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated() where localIndex >= 0 {
            let remote = try toLocal(change.version(remoteIndex)), local = state.versions.column(localIndex)
            let (live, deleted) = localIsAlive ? (local, remote) : (remote, local)
            if try isLater(live, than: deleted) { return true }
        }
        return false
    }

    func isLater(_ a: LocalVersion, than b: LocalVersion) throws -> Bool {
        if a.timestamp != b.timestamp { return a.timestamp > b.timestamp }
        if a.site == b.site { return false }
        return try sites.key(of: a.site) > sites.key(of: b.site)
    }

    /// The remote row as the new state (absent locally, or remoteWins).
    func remoteState(
        _ change: RowChange, _ mapping: TableMapping, over local: LocalRow? = nil, _ connection: Connection
    ) throws -> MergedState {
        let count = mapping.table.valueColumns.count
        let existence = try localVersion(change.existence, connection)
        // Columns the peer lacks keep their local values, or in a new row their defaults.
        var values = local?.values ?? mapping.table.valueDefaults
        var versions = RowVersions(existence: existence, columns: Array(repeating: existence, count: count))
        if let local { for index in 0..<count { versions.columns?[index] = local.versions.column(index) } }
        var toLocal = LocalVersionLookup(self, connection)
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated() {
            values[localIndex] = change.values[remoteIndex]
            versions.columns?[localIndex] = try toLocal(change.version(remoteIndex))
        }
        versions.normalize()
        return MergedState(isAlive: change.isAlive, values: values, versions: versions)
    }

    func remoteValues(_ change: RowChange, _ mapping: TableMapping, base: [DatabaseValue]) -> [DatabaseValue] {
        var values = base
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated() {
            values[localIndex] = change.values[remoteIndex]
        }
        return values
    }

    func dictionary(_ table: SyncedTable, _ key: [DatabaseValue], _ values: [DatabaseValue]) -> [String: DatabaseValue]
    {
        var result: [String: DatabaseValue] = [:]
        for (name, value) in zip(table.keyColumns, key) { result[name] = value }
        for (name, value) in zip(table.valueColumns, values) { result[name] = value }
        return result
    }
}
