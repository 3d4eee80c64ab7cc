// Applying an eviction: a row that left this database's scope is removed without a tombstone and
// without being captured (so never relayed as a delete), and observers hear `evict`.

import CSQLite
import Foundation
import TetherBatch

/// The evictions applied here, for observers that read the changelog back (another process,
/// `tether watch`): the only code that reads or writes `tether_evictions`. Each eviction takes a
/// sequence number, as a change would, so that it sits in the changelog's order; it is no change:
/// extraction never reads this log. Entries go with garbage collection, as tombstones do.
enum EvictionLog {
    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_evictions (seq INTEGER PRIMARY KEY, table_name TEXT NOT NULL, row_key BLOB \
        NOT NULL, via INTEGER) STRICT;
        CREATE INDEX IF NOT EXISTS tether_evictions_table ON tether_evictions (table_name, seq);
        """

    static func record(sequence: Int64, table: String, key: [DatabaseValue], via: Int32?, _ connection: Connection)
        throws
    {
        try connection.cachedStatement(
            "INSERT INTO tether_evictions (seq, table_name, row_key, via) VALUES (?, ?, ?, ?)"
        )
        .execute([sequence, table, StoredRowKey.encode(key), via.map { Int64($0) }])
    }

    /// The evictions after `sequence` of the tables in `tables`, as events.
    static func events(after sequence: Int64, tables: Set<String>, _ connection: Connection) throws -> [DatabaseEvent] {
        var events: [DatabaseEvent] = []
        let rows = try connection.fetchRows(
            """
            SELECT seq, table_name, row_key, \(SiteRegistry.instanceKeySQL(ofSiteIn: "via")) FROM tether_evictions \
            WHERE seq > ? ORDER BY seq
            """, [sequence])
        for row in rows {
            let table = try row.get(1, as: String.self)
            guard tables.contains(table) else { continue }
            let key = StoredRowKey.decode(try row.get(2, as: Data.self))
            let peer = Data.fromDatabaseValue(row[3]).flatMap { InstanceKey(bytes: [UInt8]($0)) }
            events.append(
                DatabaseEvent(
                    kind: .evict, table: table, rowID: nil, keyValues: key, origin: peer.map { .peer($0) } ?? .local,
                    sequence: try row.get(0, as: Int64.self)))
        }
        return events
    }

    /// The evictions of `table` in (`after`, `through`], by sequence: what a node holding a scoped
    /// subset relays to the peers it serves (the row left it, so it leaves them).
    static func entries(of table: String, after: Int64, through: Int64, _ connection: Connection) throws -> [(
        sequence: Int64, key: [DatabaseValue]
    )] {
        try connection.fetchRows(
            "SELECT seq, row_key FROM tether_evictions WHERE table_name = ? AND seq > ? AND seq <= ? ORDER BY seq",
            [table, after, through]
        ).map { row in
            (try row.get(0, as: Int64.self), StoredRowKey.decode(try row.get(1, as: Data.self)))
        }
    }

    /// The evictions of `table` in (after, through] not caused by the peer whose site id is `site`:
    /// what this database evicted because of one peer is relayed to its other peers, never back.
    static func entries(of table: String, after: Int64, through: Int64, notVia site: Int32?, _ connection: Connection)
        throws
        -> [(sequence: Int64, key: [DatabaseValue])]
    {
        try connection.fetchRows(
            """
            SELECT seq, row_key FROM tether_evictions WHERE table_name = ? AND seq > ? AND seq <= ? AND via IS \
            NOT ? ORDER BY seq
            """,
            [table, after, through, site.map { Int64($0) }]
        ).map { row in
            (try row.get(0, as: Int64.self), StoredRowKey.decode(try row.get(1, as: Data.self)))
        }
    }

    /// Forgets the evictions of `table`, which is no longer synced.
    static func forget(table: String, _ connection: Connection) throws {
        try connection.execute("DELETE FROM tether_evictions WHERE table_name = ?", [table])
    }

    /// Forgets the evictions through `sequence` (garbage collection); returns how many.
    static func collect(through sequence: Int64, _ connection: Connection) throws -> Int {
        try connection.execute("DELETE FROM tether_evictions WHERE seq <= ?", [sequence])
        return connection.changes
    }
}

extension SyncEngine {
    /// Whether the tombstone of `key` came after what `peer` acknowledged of this database's
    /// changes: a delete (this database's or one it relays from a peer it serves) that has not
    /// reached `peer` yet, which an eviction from `peer` must not drop.
    private func deleteAwaitsSender(
        _ table: SyncedTable, _ key: [DatabaseValue], _ peer: InstanceKey, _ connection: Connection
    ) throws -> Bool {
        let match = table.keyColumns.map { "\(quoteIdentifier($0)) = ?" }.joined(separator: " AND ")
        guard
            let sequence = try connection.fetchValue(
                "SELECT tether_seq FROM \(table.layout.deadTable) WHERE \(match)",
                StatementArguments(values: key), as: Int64.self)
        else { return false }
        return sequence > (try connection.peerStore.acknowledgedThrough(by: peer) ?? 0)
    }

    /// Removes the live row `change` evicts, if this database holds it and has no change to it
    /// waiting to be sent: no tombstone, no capture (not even of what it cascades to), reported to
    /// observers as `evict`. A tombstone of the key
    /// that is synced goes too (the row is no longer this database's to relay); a delete not yet
    /// sent to the sender (local, or relayed) stays, to reach it (it judges it). Returns whether a
    /// row was removed.
    func evict(_ change: RowChange, _ table: SyncedTable, from peer: InstanceKey, _ connection: Connection) throws
        -> Bool
    {
        let live = try table.statement(.selectLiveByKey, connection)
        try live.bind(StatementArguments(values: change.key))
        let rowid: Int64? = try live.step() ? sqlite3_column_int64(live.handle, RowMetadataLayout.LiveByKey.rowid) : nil
        live.reset()
        // A change made here and not sent yet stays, row and all: sent next, it is the sender's to
        // judge — refused (and recorded, and the row dropped then) or taken back into the scope.
        if let rowid, let state = try rowState(table, rowid: rowid, connection), state.status != .synced,
            !state.inFlight
        {
            return false
        }
        var droppedTombstone = false
        if table.mayHaveDeadRows, let dead = try localRow(table, change.key, connection), !dead.isAlive,
            !dead.isPending,
            try !deleteAwaitsSender(table, change.key, peer, connection)
        {
            try table.statement(.deleteDeadByKey, connection).execute(StatementArguments(values: change.key))
            droppedTombstone = true
        }
        guard let rowid else {
            // The delete goes unsent to the peers this database serves: logged as an eviction, so
            // that one still holding the row drops it (`narrow` relays the log).
            if droppedTombstone {
                try EvictionLog.record(
                    sequence: clock.nextSequence(), table: table.name, key: change.key,
                    via: try sites.id(of: peer, connection), connection)
            }
            return false
        }
        try connection.withEvictionsReported {
            try connection.withoutCapture(.everything) {
                try table.statement(.deleteLiveByRowid, connection).execute([rowid])
            }
        }
        try table.statement(.deleteRowMetadata, connection).execute([rowid])
        try EvictionLog.record(
            sequence: clock.nextSequence(), table: table.name, key: change.key, via: try sites.id(of: peer, connection),
            connection)
        return true
    }
}
