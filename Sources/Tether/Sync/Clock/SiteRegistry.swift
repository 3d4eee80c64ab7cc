import Foundation

/// The instance keys this database has met, each under a small local id (`tether_sites`, the
/// only code that reads or writes it): versions store the id, not the 16-byte key.
///
/// Used under the writer's lock, like the engine that holds it.
final class SiteRegistry: @unchecked Sendable {
    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_sites (id INTEGER PRIMARY KEY, instance_key BLOB NOT NULL UNIQUE) STRICT;
        """
    /// The id a new database's own key gets.
    static let firstLocal: Int32 = 1
    /// The id this database's own versions are written under: `firstLocal` until a rekey gives
    /// the database a new key (the versions written under the old one keep their id).
    private(set) var local: Int32 = firstLocal

    /// The two keys met last: a batch's changes mostly share one origin, and each applied change
    /// also names the peer it came through (another key when the peer relays others' changes).
    // Read per applied change, under the writer's lock only: no run-time exclusivity check.
    @exclusivity(unchecked) private var lastSite: (key: InstanceKey, id: Int32)?
    @exclusivity(unchecked) private var previousSite: (key: InstanceKey, id: Int32)?
    private var ids: [InstanceKey: Int32] = [:]
    private var keys: [Int32: InstanceKey] = [:]
    /// Set by a rollback: ids registered in it may be gone.
    private var mayBeStale = false

    /// Registers this database's own key as the local site of a new database.
    static func registerLocal(_ key: InstanceKey, _ connection: Connection) throws {
        try connection.execute(
            "INSERT OR REPLACE INTO tether_sites (id, instance_key) VALUES (?, ?)", [Int(firstLocal), Data(key.bytes)])
    }

    func load(_ connection: Connection) throws {
        local = try InstanceIdentity.localSite(connection)
        for row in try connection.fetchRows("SELECT id, instance_key FROM tether_sites") {
            guard let key = InstanceKey(bytes: [UInt8](try row.get(1, as: Data.self))) else {
                throw SyncError.corruptMetadata("tether_sites holds a key that is not 16 bytes")
            }
            let id = try row.get(0, as: Int32.self)
            ids[key] = id
            keys[id] = key
        }
    }

    /// The local id of an instance key, registered on first sight.
    func id(of key: InstanceKey, _ connection: Connection) throws -> Int32 {
        if let lastSite, lastSite.key == key { return lastSite.id }
        if let previousSite, previousSite.key == key { return previousSite.id }
        if let id = try knownID(of: key, connection) {
            previousSite = lastSite
            lastSite = (key, id)
            return id
        }
        try connection.execute("INSERT OR IGNORE INTO tether_sites (instance_key) VALUES (?)", [Data(key.bytes)])
        guard let id = try knownID(of: key, connection) else {
            throw SyncError.corruptMetadata("cannot register site \(key)")
        }
        return id
    }

    /// The local id of an instance key met before; nil for one never met (nothing is written:
    /// extraction for a new peer must work on a full disk).
    func knownID(of key: InstanceKey, _ connection: Connection) throws -> Int32? {
        if let id = ids[key] { return id }
        guard let stored = try Self.storedID(of: key, connection) else { return nil }
        let id = Int32(truncatingIfNeeded: stored)
        ids[key] = id
        keys[id] = key
        return id
    }

    func key(of id: Int32) throws -> InstanceKey {
        guard let key = keys[id] else { throw SyncError.corruptMetadata("unknown site id \(id) in tether_versions") }
        return key
    }

    /// This database's own versions are written from now on under `key` (a rekey); returns its id.
    func switchLocal(to key: InstanceKey, _ connection: Connection) throws -> Int32 {
        local = try id(of: key, connection)
        return local
    }

    /// A rollback may have undone registrations: they are read again before the next change.
    func noteRollback() { mayBeStale = true }

    /// Forgets registrations a rollback undid (their ids may be reused).
    func reloadIfStale(_ connection: Connection) {
        guard mayBeStale else { return }
        lastSite = nil
        previousSite = nil
        ids.removeAll()
        keys.removeAll()
        try? load(connection)
        mayBeStale = false
    }

    // MARK: Stored values, on any connection

    /// The id `key` is stored under, nil if it never was (read without registering).
    static func storedID(of key: InstanceKey, _ connection: Connection) throws -> Int64? {
        try connection.fetchValue(
            "SELECT id FROM tether_sites WHERE instance_key = ?", [Data(key.bytes)], as: Int64.self)
    }

    /// The key stored under `id` (another process may have registered it after this one loaded).
    static func storedKey(of id: Int32, _ connection: Connection) throws -> InstanceKey? {
        try connection.fetchValue("SELECT instance_key FROM tether_sites WHERE id = ?", [id], as: Data.self).flatMap {
            InstanceKey(bytes: [UInt8]($0))
        }
    }

    /// SQL for the instance key of the site whose id is in `column` (NULL: none), for queries
    /// that report origins.
    static func instanceKeySQL(ofSiteIn column: String) -> String {
        "(SELECT instance_key FROM tether_sites WHERE id = \(column))"
    }
}
