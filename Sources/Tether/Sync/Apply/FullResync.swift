// A full resync from a peer whose tombstones this database can no longer trust to be complete.

import Foundation

extension SyncEngine {
    /// During a resync, rows the sender confirms without changing them keep
    /// their sequence number: remember them so they survive the end of the resync.
    func markSeen(_ change: RowChange, _ table: SyncedTable, by peer: InstanceKey, _ connection: Connection) throws {
        guard let row = try localRow(table, change.key, connection), let rowid = row.rowid else { return }
        try connection.peerStore.markSeen(by: peer, table: table.name, rowid: rowid)
    }

    /// Ends a full resync: a synced row the sender did not mention, unchanged
    /// since the resync began, was deleted there long ago (its tombstone is
    /// collected): remove it here too. It is removed without a tombstone, and
    /// every other peer's cursor restarts, so that a row the sender merely had
    /// not received yet comes back from where it lives.
    ///
    /// The other peers restart with `resync_from = -1`: `cursor(for:)` reports
    /// them as resyncing, so that they are asked with `resuming: true` and send
    /// this database's own rows too (no echo filter), which the resync may
    /// have removed. At the end of such a refetch nothing is removed.
    func finishResync(from peer: InstanceKey, startedAt resyncFrom: Int64, _ connection: Connection) throws {
        let peers = connection.peerStore
        guard resyncFrom >= 0 else { return try peers.endResync(from: peer) }
        for table in tableList {
            let unconfirmed = try connection.fetchRows(table.layout.selectUnconfirmedRows, [resyncFrom, Data(peer.bytes), table.name])
            for row in unconfirmed {
                let rowid = try row.get(0, as: Int64.self)
                // A table WITHOUT ROWID's triggers run during an apply (see `captureWillSuspend`):
                // the tombstone they leave goes too.
                let key = table.isWithoutRowid ? try connection.fetchRow(table.layout.selectKeyByRowid, [rowid]).map { Array($0.values) } : nil
                try table.statement(.deleteLiveByRowid, connection).execute([rowid])
                try table.statement(.deleteRowMetadata, connection).execute([rowid])
                if let key { try table.statement(.deleteDeadByKey, connection).execute(StatementArguments(values: key)) }
            }
        }
        try peers.endResync(from: peer)
        try peers.restartEveryCursor(except: peer)
    }
}
