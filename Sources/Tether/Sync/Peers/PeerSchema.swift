import Foundation

/// What this database syncs with a peer whose schema may differ (§8.2 of Protocol/README.md),
/// as recorded at their last handshake: for `tether status`, and to find what became shared
/// since (a column or table both sides have now), which is then backfilled (§8.3).
public struct PeerSchema: Sendable, Equatable {
    /// The peer's instance key.
    public var peer: InstanceKey
    /// Per table, the value columns (this database's names) both sides synced once the last
    /// backfill completed.
    public var shared: [String: [String]]
    /// The differences found at the last handshake, in words ("table tag is synced here, not by the peer").
    public var differences: [String]
    /// When this was recorded: the peer's last handshake with this database.
    public var updated: Date
}

extension Database {
    /// Records what `peer` and this database share now (`shared`, this database's names) and
    /// how their schemas differ; returns what became shared since the last completed record:
    /// per table, the new columns, or no columns for a table shared as a whole for the first
    /// time. Those rows are backfilled; ``completeBackfill(from:shared:)`` then records `shared`.
    /// Before a first record for a peer, peers synced identical schemas: it returns nothing, and
    /// a peer whose schema is the same as this one is not recorded at all (nothing to show).
    public func recordPeerSchema(_ peer: InstanceKey, shared: [String: [String]], differences: [String]) throws
        -> [String: [String]]
    {
        // Read first: a session between identical schemas writes nothing at the handshake (and
        // does not wait for the writer).
        guard let stored = try read({ try $0.peerStore.schema(of: peer) }) else {
            if !differences.isEmpty {
                try write {
                    try $0.peerStore.save(
                        PeerSchema(peer: peer, shared: shared, differences: differences, updated: Date()))
                }
            }
            return [:]
        }
        var newlyShared: [String: [String]] = [:]
        for (table, columns) in shared {
            guard let before = stored.shared[table] else {
                newlyShared[table] = []
                continue
            }
            let added = columns.filter { !before.contains($0) }
            if !added.isEmpty { newlyShared[table] = added }
        }
        // What was shared is kept until the backfill of what is new completes.
        let recorded = newlyShared.isEmpty ? shared : stored.shared
        if recorded != stored.shared || differences != stored.differences {
            try write {
                try $0.peerStore.save(
                    PeerSchema(peer: peer, shared: recorded, differences: differences, updated: Date()))
            }
        }
        return newlyShared
    }

    /// The backfill from `peer` of what became shared is done: `shared` is what both sync now.
    public func completeBackfill(from peer: InstanceKey, shared: [String: [String]]) throws {
        try write { connection in
            let store = connection.peerStore
            guard var schema = try store.schema(of: peer) else { return }
            schema.shared = shared
            schema.updated = Date()
            try store.save(schema)
        }
    }

    /// Every peer's schema record, by instance key.
    public func peerSchemas() throws -> [PeerSchema] {
        try read { try $0.peerStore.schemas() }
    }
}

extension SyncEngine {
    /// A synced column was renamed: the peers' records of what they shared name it anew, so that
    /// it is not taken for a newly shared column (and backfilled whole) at the next handshake.
    func renameInPeerSchemas(table: String, from old: String, to new: String, _ connection: Connection) throws {
        let store = connection.peerStore
        for var schema in try store.schemas() {
            guard let columns = schema.shared[table], columns.contains(old) else { continue }
            schema.shared[table] = columns.map { $0 == old ? new : $0 }
            try store.save(schema)
        }
    }
}
