// A full resync from a peer whose tombstones this database can no longer trust to be complete.

import Foundation

extension SyncEngine {
    /// During a resync, rows the sender confirms without changing them keep
    /// their sequence number: remember them so they survive the end of the resync.
    func markSeen(_ change: RowChange, _ table: SyncedTable, by peer: InstanceKey, _ connection: Connection) throws {
        guard let row = try localRow(table, change.key, connection), let rowid = row.rowid else { return }
        try connection.peerStore.markSeen(by: peer, table: table.name, rowid: rowid)
    }

    /// Ends a full resync. A row the sender did not mention, unchanged since the resync began, is
    /// one it no longer has:
    /// - if the sender held it (received from it, or acknowledged by it: see
    ///   `selectUnmentionedRowsTheSenderHeld`), it was deleted there and its tombstone collected:
    ///   returned, for the caller to delete as this database's own delete (a local update made
    ///   since loses, as it would against the tombstone), so that peers that still hold it are
    ///   told too, and the refetch below cannot bring it back;
    /// - otherwise (a synced row it may merely not have received yet) it is removed without a
    ///   tombstone, and every other peer's cursor restarts, so that it comes back from where it
    ///   lives.
    ///
    /// The other peers restart with `resync_from = -1`: `cursor(for:)` reports
    /// them as resyncing, so that they are asked with `resuming: true` and send
    /// this database's own rows too (no echo filter), which the resync may
    /// have removed. At the end of such a refetch nothing is removed.
    func finishResync(from peer: InstanceKey, startedAt resyncFrom: Int64, _ connection: Connection) throws -> [(
        table: SyncedTable, rowid: Int64
    )] {
        let peers = connection.peerStore
        guard resyncFrom >= 0 else {
            try peers.endResync(from: peer)
            return []
        }
        let senderSite = try sites.knownID(of: peer, connection)
        let acknowledgedThere = try peers.acknowledgedThrough(by: peer) ?? 0
        let storedSenderSite = senderSite.map { site in withUnsafeBytes(of: site.littleEndian) { Data($0) } }
        var deletedThere: [(table: SyncedTable, rowid: Int64)] = []
        for table in tableList {
            let held = Set(
                try connection.fetchRows(
                    table.layout.selectUnmentionedRowsTheSenderHeld,
                    [resyncFrom, Data(peer.bytes), table.name, senderSite, acknowledgedThere, storedSenderSite]
                )
                .map { try $0.get(0, as: Int64.self) })
            deletedThere += held.sorted().map { (table, $0) }
            let unconfirmed = try connection.fetchRows(
                table.layout.selectUnconfirmedRows, [resyncFrom, Data(peer.bytes), table.name])
            for row in unconfirmed {
                let rowid = try row.get(0, as: Int64.self)
                if held.contains(rowid) { continue }
                // A table WITHOUT ROWID's triggers run during an apply (see `captureWillSuspend`):
                // the tombstone they leave goes too.
                let key =
                    table.isWithoutRowid
                    ? try connection.fetchRow(table.layout.selectKeyByRowid, [rowid]).map { Array($0.values) } : nil
                try table.statement(.deleteLiveByRowid, connection).execute([rowid])
                try table.statement(.deleteRowMetadata, connection).execute([rowid])
                if let key {
                    try table.statement(.deleteDeadByKey, connection).execute(StatementArguments(values: key))
                }
            }
        }
        try peers.endResync(from: peer)
        try peers.restartEveryCursor(except: peer)
        return deletedThere
    }
}
