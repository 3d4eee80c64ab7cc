import Foundation

/// What this database syncs with a peer whose schema may differ (§8.2 of Protocol/README.md),
/// as recorded at their last handshake: for `tether status`, and to find what became shared
/// since (a column or table both sides have now), which is then backfilled (§8.3).
public struct PeerSchema: Sendable, Equatable {
    public var peer: InstanceKey
    /// Per table, the value columns (this database's names) both sides synced once the last
    /// backfill completed.
    public var shared: [String: [String]]
    /// The differences found at the last handshake, in words ("table tag is synced here, not by the peer").
    public var differences: [String]
    public var updated: Date
}

extension Database {
    /// Records what `peer` and this database share now (`shared`, this database's names) and
    /// how their schemas differ; returns what became shared since the last completed record:
    /// per table, the new columns, or no columns for a table shared as a whole for the first
    /// time. Those rows are backfilled; ``completeBackfill(from:shared:)`` then records `shared`.
    /// Before a first record for a peer, peers synced identical schemas: it returns nothing, and
    /// a peer whose schema is the same as this one is not recorded at all (nothing to show).
    public func recordPeerSchema(_ peer: InstanceKey, shared: [String: [String]], differences: [String]) throws -> [String: [String]] {
        let key = Data(peer.bytes)
        let stored = try read { connection in
            try connection.fetchRow("SELECT shared, differences FROM tether_peer_schemas WHERE peer = ?", [key])
        }
        guard let stored else {
            if !differences.isEmpty {
                try write { connection in
                    try connection.execute("INSERT INTO tether_peer_schemas (peer, shared, differences, updated) VALUES (?, ?, ?, ?)",
                                           [key, Self.encode(shared), Self.encode(differences), Date().timeIntervalSince1970])
                }
            }
            return [:]
        }
        let storedShared = try stored.get(0, as: String.self)
        let previous = try Self.decodeShared(storedShared)
        var newlyShared: [String: [String]] = [:]
        for (table, columns) in shared {
            guard let before = previous[table] else {
                newlyShared[table] = []
                continue
            }
            let added = columns.filter { !before.contains($0) }
            if !added.isEmpty { newlyShared[table] = added }
        }
        // What was shared is kept until the backfill of what is new completes.
        let recorded = newlyShared.isEmpty ? Self.encode(shared) : storedShared
        let recordedDifferences = Self.encode(differences)
        let storedDifferences = try stored.get(1, as: String.self)
        if recorded != storedShared || recordedDifferences != storedDifferences {
            try write { connection in
                try connection.execute("UPDATE tether_peer_schemas SET shared = ?, differences = ?, updated = ? WHERE peer = ?",
                                       [recorded, recordedDifferences, Date().timeIntervalSince1970, key])
            }
        }
        return newlyShared
    }

    /// The backfill from `peer` of what became shared is done: `shared` is what both sync now.
    public func completeBackfill(from peer: InstanceKey, shared: [String: [String]]) throws {
        try write { connection in
            try connection.execute("UPDATE tether_peer_schemas SET shared = ?, updated = ? WHERE peer = ?",
                                   [Self.encode(shared), Date().timeIntervalSince1970, Data(peer.bytes)])
        }
    }

    /// Every peer's schema record, by instance key.
    public func peerSchemas() throws -> [PeerSchema] {
        try read { connection in
            try connection.fetchRows("SELECT peer, shared, differences, updated FROM tether_peer_schemas ORDER BY peer").compactMap { row in
                guard let peer = InstanceKey(bytes: [UInt8](try row.get(0, as: Data.self))) else { return nil }
                return PeerSchema(peer: peer, shared: try Self.decodeShared(try row.get(1, as: String.self)),
                                  differences: try JSONDecoder().decode([String].self, from: Data(try row.get(2, as: String.self).utf8)),
                                  updated: Date(timeIntervalSince1970: try row.get(3, as: Double.self)))
            }
        }
    }

    static func decodeShared(_ text: String) throws -> [String: [String]] {
        try JSONDecoder().decode([String: [String]].self, from: Data(text.utf8))
    }

    static func encode(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return (try? encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? "[]"
    }
}

extension SyncEngine {
    /// A synced column was renamed: the peers' records of what they shared name it anew, so that
    /// it is not taken for a newly shared column (and backfilled whole) at the next handshake.
    func renameInPeerSchemas(table: String, from old: String, to new: String, _ connection: Connection) throws {
        for row in try connection.fetchRows("SELECT peer, shared FROM tether_peer_schemas") {
            var shared = try Database.decodeShared(try row.get(1, as: String.self))
            guard let columns = shared[table], columns.contains(old) else { continue }
            shared[table] = columns.map { $0 == old ? new : $0 }
            try connection.execute("UPDATE tether_peer_schemas SET shared = ? WHERE peer = ?", [Database.encode(shared), row[0]])
        }
    }
}
