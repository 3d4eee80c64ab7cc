// The tables this database holds only part of, and from which peer: what it must relay as partial
// (with its evictions), never as if it were the whole table.

import Foundation
import TetherBatch

/// Which peers send this database only part of which tables (partial replication): the only code
/// that reads or writes `tether_partial_tables`.
enum PartialTables {
    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_partial_tables (peer BLOB NOT NULL, table_name TEXT NOT NULL, PRIMARY KEY \
        (peer, table_name)) STRICT, WITHOUT ROWID;
        """

    /// `peer` now sends this database only part of `tables` (and the rest of what it sends whole).
    static func replace(_ tables: Set<String>, from peer: InstanceKey, _ connection: Connection) throws {
        try connection.execute("DELETE FROM tether_partial_tables WHERE peer = ?", [Data(peer.bytes)])
        for table in tables.sorted() {
            try connection.execute(
                "INSERT INTO tether_partial_tables (peer, table_name) VALUES (?, ?)", [Data(peer.bytes), table])
        }
    }

    /// `table` is no longer synced.
    static func forget(table: String, _ connection: Connection) throws {
        try connection.execute("DELETE FROM tether_partial_tables WHERE table_name = ?", [table])
    }

    /// Per table held in part, the peers that send it in part.
    static func all(_ connection: Connection) throws -> [String: Set<InstanceKey>] {
        var result: [String: Set<InstanceKey>] = [:]
        for row in try connection.fetchRows("SELECT table_name, peer FROM tether_partial_tables") {
            guard let peer = InstanceKey(bytes: Array(try row.get(1, as: Data.self))) else { continue }
            result[try row.get(0, as: String.self), default: []].insert(peer)
        }
        return result
    }
}

extension Database {
    /// Records that `peer` sends this database only part of `tables` (its scope for this database,
    /// or this database's interest), replacing what was recorded for it. A table held in part is
    /// relayed as such to every other peer: with its evictions, and never to a peer that cannot
    /// evict (see `partialTables()`).
    public func recordPartialTables(_ tables: Set<String>, from peer: InstanceKey) throws {
        try write { try PartialTables.replace(tables, from: peer, $0) }
    }

    /// Per table this database holds only part of, the peers that send it in part.
    public func partialTables() throws -> [String: Set<InstanceKey>] {
        try read { try PartialTables.all($0) }
    }
}
