import Foundation

/// Changes that name a table or columns this database does not sync yet (a peer, or a sync
/// file, of a newer schema): applied without them, and kept whole in `tether_kept_for_schema`
/// with their versions, until a migration adds the columns or syncs the table. Then they are
/// applied again, and merge by version like any change (what was applied already is unchanged).
extension SyncEngine {
    static let keptForSchemaSchema = """
        CREATE TABLE IF NOT EXISTS tether_kept_for_schema (id INTEGER PRIMARY KEY, table_name TEXT NOT NULL, key TEXT \
        NOT NULL, peer BLOB NOT NULL, change BLOB NOT NULL, missing TEXT NOT NULL, first_seen REAL NOT NULL) STRICT;
        """

    /// Keeps `change` (as received, with its table's descriptor) for when this database has
    /// `missing` (the columns it lacks; empty: the whole table).
    func keepForSchema(
        _ change: RowChange, table: TableDescriptor, from peer: InstanceKey, missing: [String], _ connection: Connection
    ) throws {
        var single = change
        single.table = 0
        let batch = ChangeBatch(source: peer, after: 0, through: 0, isLast: true, tables: [table], changes: [single])
        try connection.execute(
            """
            INSERT INTO tether_kept_for_schema (table_name, key, peer, change, missing, first_seen) VALUES (?, ?, ?, ?,\
             ?, ?)
            """,
            [
                table.name, change.key.map(\.description).joined(separator: ", "), Data(peer.bytes),
                Data(BatchCoding.encode(batch)),
                String(decoding: try JSONEncoder().encode(missing), as: UTF8.self), Date().timeIntervalSince1970,
            ])
    }

    /// Applies the kept changes whose table is synced now (after a migration added columns or
    /// synced a table): an entry whose columns are all here now is done; the others wait on.
    func applyKeptForSchema(_ connection: Connection) throws {
        guard try connection.fetchValue("SELECT EXISTS (SELECT 1 FROM tether_kept_for_schema)", as: Bool.self) == true
        else { return }
        try prepareClock(connection)
        var report = ApplyReport()
        try whileApplying(&report, connection) { report in
            defer { dropOpenAppliedRange() }
            try connection.withoutCapture(.exceptCascades) {
                for entry in try connection.fetchRows("SELECT id, change FROM tether_kept_for_schema ORDER BY id") {
                    let id = try entry.get(0, as: Int64.self)
                    let batch: ChangeBatch
                    do {
                        batch = try BatchCoding.decodeWithoutValidating([UInt8](try entry.get(1, as: Data.self)))
                    } catch {
                        throw SyncError.corruptMetadata(
                            "change \(id) kept for a later schema cannot be decoded: \(error)")
                    }
                    guard let change = batch.changes.first, let descriptor = batch.tables.first else { continue }
                    // An expiry entry kept before entries were checked on arrival: dropped, never applied.
                    if ExpiryStore.refusal(of: change, describedBy: descriptor, self) != nil {
                        try connection.execute("DELETE FROM tether_kept_for_schema WHERE id = ?", [id])
                        continue
                    }
                    guard let mapping = try mapping(descriptor) else { continue }
                    _ = try sites.id(of: batch.source, connection)
                    // Observers see the peer's change, which it is, arriving late.
                    let outcome = try connection.withChangeOrigin(.peer(batch.source)) {
                        try applyChange(mapping.projected(change), mapping, from: batch.source, connection, &report)
                    }
                    switch outcome {
                    case .applied, .unchanged:
                        if mapping.projection == nil {
                            try connection.execute("DELETE FROM tether_kept_for_schema WHERE id = ?", [id])
                        } else {
                            try connection.execute(
                                "UPDATE tether_kept_for_schema SET missing = ? WHERE id = ?",
                                [String(decoding: try JSONEncoder().encode(mapping.unknownColumns), as: UTF8.self), id])
                        }
                    case .keptAside:
                        // A constraint fails now: left for the next time (the values stay kept).
                        break
                    }
                }
                try closeOpenRange(connection)
            }
        }
    }
}
