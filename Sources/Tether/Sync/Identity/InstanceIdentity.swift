import Foundation

/// Who this database is among its peers — its instance key — and the layout version of its sync
/// metadata, kept in `tether_meta`: the only code that reads or writes that table.
enum InstanceIdentity {
    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_meta (key TEXT PRIMARY KEY, value ANY) STRICT;
        """

    /// The stored instance key; nil for a database that never had one.
    static func storedKey(_ connection: Connection) throws -> InstanceKey? {
        guard let stored = try connection.fetchValue("SELECT value FROM tether_meta WHERE key = 'instance_key'", as: Data.self) else { return nil }
        guard let key = InstanceKey(bytes: [UInt8](stored)) else {
            throw SyncError.corruptMetadata("tether_meta.instance_key is \(stored.count) bytes, not 16")
        }
        return key
    }

    /// Gives a new database its instance key (random) and records the current layout.
    static func create(_ connection: Connection) throws -> InstanceKey {
        let key = InstanceKey.random()
        try connection.execute("INSERT INTO tether_meta (key, value) VALUES ('instance_key', ?)", [Data(key.bytes)])
        try recordFormat(RowMetadataLayout.formatVersion, connection)
        return key
    }

    /// The layout version of the sync metadata (1 for databases made before it was recorded);
    /// nil for a database with no sync metadata at all.
    static func storedFormat(_ connection: Connection) throws -> Int? {
        guard try connection.fetchValue("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tether_meta'", as: Int.self) != nil else {
            return nil
        }
        return try connection.fetchValue("SELECT value FROM tether_meta WHERE key = 'format'", as: Int.self) ?? 1
    }

    static func recordFormat(_ version: Int, _ connection: Connection) throws {
        try connection.execute("INSERT OR REPLACE INTO tether_meta (key, value) VALUES ('format', ?)", [version])
    }
}
