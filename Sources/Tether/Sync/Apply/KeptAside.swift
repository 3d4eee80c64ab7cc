// Changes that cannot be applied yet: kept, retried after each apply, reported.

import Foundation

/// The changes a peer sent that could not be applied yet (a foreign key or unique value they
/// wait for), kept with their reason in `tether_kept_aside` and retried after every apply: the
/// only code that reads or writes that table.
struct KeptAsideStore {
    let connection: Connection

    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_kept_aside (id INTEGER PRIMARY KEY, table_name TEXT NOT NULL, key TEXT NOT \
        NULL, peer BLOB NOT NULL, change BLOB NOT NULL, reason TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 1, \
        first_seen REAL NOT NULL) STRICT;
        """

    /// One kept change, as stored: a batch of that single change, undecoded.
    struct Entry {
        let id: Int64
        let table: String
        let peer: InstanceKey?
        let batch: [UInt8]
        let reason: String
        let attempts: Int
    }

    /// Keeps `change` (of a table `table` describes) from `peer`, because of `reason`.
    func keep(_ change: RowChange, table: TableDescriptor, from peer: InstanceKey, reason: String) throws {
        var single = change
        single.table = 0
        let batch = ChangeBatch(source: peer, after: 0, through: 0, isLast: true, tables: [table], changes: [single])
        try connection.execute(
            """
            INSERT INTO tether_kept_aside (table_name, key, peer, change, reason, first_seen) VALUES (?, ?, ?, ?, ?, ?)
            """,
            [
                table.name, change.key.map(\.description).joined(separator: ", "), Data(peer.bytes),
                Data(BatchCoding.encode(batch)), reason,
                Date().timeIntervalSince1970,
            ])
    }

    /// Every kept change, oldest first.
    func entries() throws -> [Entry] {
        try connection.fetchRows(
            "SELECT id, table_name, peer, change, reason, attempts FROM tether_kept_aside ORDER BY id"
        ).map { row in
            Entry(
                id: try row.get(0, as: Int64.self), table: try row.get(1, as: String.self),
                peer: InstanceKey(bytes: [UInt8](try row.get(2, as: Data.self))),
                batch: [UInt8](try row.get(3, as: Data.self)),
                reason: try row.get(4, as: String.self), attempts: try row.get(5, as: Int.self))
        }
    }

    func count() throws -> Int {
        try connection.fetchValue("SELECT count(*) FROM tether_kept_aside", as: Int.self) ?? 0
    }

    /// The change went through.
    func remove(_ id: Int64) throws {
        try connection.execute("DELETE FROM tether_kept_aside WHERE id = ?", [id])
    }

    /// Another attempt failed, for `reason`.
    func recordAttempt(_ id: Int64, reason: String) throws {
        try connection.execute(
            "UPDATE tether_kept_aside SET attempts = attempts + 1, reason = ? WHERE id = ?", [reason, id])
    }

    /// The table stopped syncing: its kept changes go.
    func removeAll(of table: String) throws {
        try connection.execute("DELETE FROM tether_kept_aside WHERE table_name = ?", [table])
    }
}

extension Connection {
    /// The changes kept aside, read and written on this connection.
    var keptAside: KeptAsideStore { KeptAsideStore(connection: self) }
}

extension SyncEngine {

    /// Retries every kept-aside change until a pass applies none.
    func retryKeptAside(_ connection: Connection, _ report: inout ApplyReport) throws {
        defer { dropOpenAppliedRange() }
        try connection.withoutCapture(.exceptCascades) { try retryKeptAsideOnce(connection, &report) }
    }

    func retryKeptAsideOnce(_ connection: Connection, _ report: inout ApplyReport) throws {
        var progress = true
        while progress {
            progress = false
            let store = connection.keptAside
            for entry in try store.entries() {
                let id = entry.id
                let batch: ChangeBatch
                do { batch = try BatchCoding.decodeWithoutValidating(entry.batch) } catch {
                    throw SyncError.corruptMetadata("kept-aside change \(id) cannot be decoded: \(error)")
                }
                guard let change = batch.changes.first, let descriptor = batch.tables.first else { continue }
                let found: TableMapping?
                // the table is no longer synced as it was
                do { found = try self.mapping(descriptor) } catch { continue }
                guard let mapping = found else { continue }
                let outcome = try connection.withChangeOrigin(.peer(batch.source)) {
                    try applyChange(mapping.projected(change), mapping, from: batch.source, connection, &report)
                }
                switch outcome {
                case .applied, .unchanged:
                    try store.remove(id)
                    report.resolvedFromKeptAside += 1
                    progress = true
                case let .keptAside(reason):
                    try store.recordAttempt(id, reason: reason)
                }
            }
        }
        try closeOpenRange(connection)
    }
}
