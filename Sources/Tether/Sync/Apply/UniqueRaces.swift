// Two rows claiming one unique value on two peers: the later version keeps it.

import Foundation

extension SyncEngine {
    /// Two rows claim one unique value: the row whose unique columns have the
    /// later version keeps it. A losing local row is deleted as a local change
    /// (its values stay in its tombstone, and peers learn of it); a losing
    /// remote row is kept aside until that deletion reaches it.
    func settleUniqueRace(
        _ error: DatabaseError, _ change: RowChange, _ mapping: TableMapping, _ state: MergedState,
        status: SyncStatus, from peer: InstanceKey, remoteHoldsIt: Bool, _ connection: Connection
    ) throws -> ChangeOutcome? {
        let table = mapping.table
        let columns = error.constrainedColumns.compactMap { table.valueColumns.firstIndex(of: $0) }
        guard !columns.isEmpty else { return nil }
        let condition = columns.map { "\(quoteIdentifier(table.valueColumns[$0])) = ?" }.joined(separator: " AND ")
        let keys = table.keyColumns.map(quoteIdentifier).joined(separator: ", ")
        guard
            let holder = try connection.fetchRow(
                "SELECT \(keys) FROM \(table.quotedName) WHERE \(condition)",
                StatementArguments(values: columns.map { state.values[$0] })),
            let holderRow = try localRow(table, Array(holder.values), connection)
        else { return nil }
        func latest(_ versions: RowVersions) throws -> LocalVersion {
            try columns.map { versions.column($0) }.reduce(versions.column(columns[0])) {
                try isLater($1, than: $0) ? $1 : $0
            }
        }
        let incomingWins = try isLater(latest(state.versions), than: latest(holderRow.versions))
        guard incomingWins, let holderRowid = holderRow.rowid else {
            return .keptAside(
                """
                \(error.message): the row \(holder.values.map(\.description).joined(separator: ", ")) holds the \
                value with a later version
                """)
        }
        // Evict the holder as a local delete, then write the incoming row.
        var versions = holderRow.versions
        if versions.columns == nil {
            versions.columns = Array(repeating: versions.existence, count: table.valueColumns.count)
        }
        versions.existence = ownChangeVersion()
        versions.normalize()
        try table.statement(.deleteLiveByRowid, connection).execute([holderRowid])
        try table.statement(.deleteRowMetadata, connection).execute([holderRowid])
        try writeDead(
            table, key: Array(holder.values),
            state: MergedState(isAlive: false, values: holderRow.values, versions: versions),
            status: .deleted, via: nil, connection)
        applying?.evictions.append(
            Conflict(
                table: table.name, key: change.key, peer: peer,
                local: dictionary(table, Array(holder.values), holderRow.values),
                remote: dictionary(table, change.key, state.values),
                resolution: .uniqueRace(winner: change.key, loser: Array(holder.values))))
        let local = try localRow(table, change.key, connection)
        return try write(
            change, mapping, local, merged: state, status: status, from: peer, remoteHoldsIt: remoteHoldsIt, connection)
    }
}
