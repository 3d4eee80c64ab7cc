import Foundation

/// Who this database is among its peers, kept in `tether_meta` (the only code that reads or
/// writes that table): its instance key, the local site its own versions are written under, the
/// identity of the file it was last opened as (a byte copy cannot keep that true), a copy noticed
/// and not yet settled, and the mark a backup leaves on its copy. Also the layout version of the
/// sync metadata, and the highest sequence ever marked in flight.
enum InstanceIdentity {
    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_meta (key TEXT PRIMARY KEY, value ANY) STRICT;
        """

    // MARK: Instance key and local site

    /// The stored instance key; nil for a database that never had one.
    static func storedKey(_ connection: Connection) throws -> InstanceKey? {
        guard let stored = try value("instance_key", connection, as: Data.self) else { return nil }
        guard let key = InstanceKey(bytes: [UInt8](stored)) else {
            throw SyncError.corruptMetadata("tether_meta.instance_key is \(stored.count) bytes, not 16")
        }
        return key
    }

    /// Gives a new database its instance key (random) and records the current layout.
    static func create(_ connection: Connection) throws -> InstanceKey {
        let key = InstanceKey.random()
        try setValue("instance_key", .blob(Data(key.bytes)), connection)
        try recordFormat(RowMetadataLayout.formatVersion, connection)
        try setValue(inFlightMarkedThroughKey, .integer(0), connection)
        return key
    }

    /// A new key replaces the old one; this database's own versions are written from now on under
    /// `localSite` (the versions written under the old key keep it).
    static func replaceKey(with key: InstanceKey, localSite: Int32, _ connection: Connection) throws {
        try setValue("instance_key", .blob(Data(key.bytes)), connection)
        try setValue("local_site", .integer(Int64(localSite)), connection)
    }

    /// The site this database's own versions are written under: 1 until a rekey.
    static func localSite(_ connection: Connection) throws -> Int32 {
        Int32(truncatingIfNeeded: try value("local_site", connection, as: Int64.self) ?? 1)
    }

    // MARK: The file

    /// The file identity recorded when the database was last opened to write; nil before any
    /// was recorded (a database made by an earlier version, or in memory).
    static func recordedFile(_ connection: Connection) throws -> String? {
        try value("file_identity", connection, as: String.self)
    }

    static func recordFile(_ identity: String, _ connection: Connection) throws {
        try setValue("file_identity", .text(identity), connection)
    }

    /// The identity of the main database file of `connection` (its inode, which a copy cannot
    /// share with the original on the same file system, and which a rename keeps); nil for an
    /// in-memory or temporary database.
    static func currentFile(_ connection: Connection) throws -> String? {
        guard
            let path = try connection.fetchValue(
                "SELECT file FROM pragma_database_list WHERE name = 'main'", as: String.self),
            !path.isEmpty,
            let inode = try? FileManager.default.attributesOfItem(atPath: path)[.systemFileNumber] as? NSNumber
        else { return nil }
        return "inode \(inode.uint64Value)"
    }

    // MARK: Copies

    /// A copy noticed (the file is not the one this database was opened as before) and not yet
    /// settled by a rekey or a confirmed move.
    static func copyDetection(_ connection: Connection) throws -> CopyDetection? {
        guard let reason = try value("copy_reason", connection, as: String.self) else { return nil }
        let kind =
            try value("copy_kind", connection, as: String.self).flatMap(CopyDetection.Kind.init(rawValue:)) ?? .copied
        return CopyDetection(
            kind: kind, reason: reason, sequence: try value("copy_sequence", connection, as: Int64.self) ?? 0,
            timestamp: HybridTimestamp(
                rawValue: UInt64(bitPattern: try value("copy_timestamp", connection, as: Int64.self) ?? 0)))
    }

    static func recordCopy(_ detection: CopyDetection, _ connection: Connection) throws {
        try setValue("copy_kind", .text(detection.kind.rawValue), connection)
        try setValue("copy_reason", .text(detection.reason), connection)
        try setValue("copy_sequence", .integer(detection.sequence), connection)
        try setValue("copy_timestamp", .integer(Int64(bitPattern: detection.timestamp.rawValue)), connection)
    }

    static func clearCopy(_ connection: Connection) throws {
        try connection.execute(
            "DELETE FROM tether_meta WHERE key IN ('copy_kind', 'copy_reason', 'copy_sequence', 'copy_timestamp')")
    }

    /// Marks a backup: opened to write, it takes a new instance key at once (a restore is safe).
    static func markForRekeyOnOpen(_ connection: Connection) throws {
        try setValue("rekey_on_open", .integer(1), connection)
    }

    static func isMarkedForRekeyOnOpen(_ connection: Connection) throws -> Bool {
        try value("rekey_on_open", connection, as: Int64.self) == 1
    }

    static func clearRekeyOnOpen(_ connection: Connection) throws {
        try connection.execute("DELETE FROM tether_meta WHERE key = 'rekey_on_open'")
    }

    // MARK: Layout

    /// The layout version of the sync metadata (1 for databases made before it was recorded);
    /// nil for a database with no sync metadata at all.
    static func storedFormat(_ connection: Connection) throws -> Int? {
        guard try connection.tableExists("tether_meta") else { return nil }
        return try value("format", connection, as: Int.self) ?? 1
    }

    static func recordFormat(_ version: Int, _ connection: Connection) throws {
        try setValue("format", .integer(Int64(version)), connection)
    }

    /// The clock at which the database moved to format 7, from which its counter contributions
    /// keep their earlier values (`ContributionHistory`); 0 for a database made at format 7 or later.
    static func counterHistoryKeptSince(_ connection: Connection) throws -> UInt64 {
        UInt64(bitPattern: try value("counter_history_since", connection, as: Int64.self) ?? 0)
    }

    static func recordCounterHistoryKeptSince(_ clock: HybridTimestamp, _ connection: Connection) throws {
        try setValue("counter_history_since", .integer(Int64(bitPattern: clock.rawValue)), connection)
    }

    /// The highest sequence rows were ever marked in flight through: an acknowledgement visits
    /// none above it. Nil in a database made before it was kept, until its first marking.
    static func inFlightMarkedThrough(_ connection: Connection) throws -> Int64? {
        try value(inFlightMarkedThroughKey, connection, as: Int64.self)
    }

    /// Rows were marked in flight through `sequence`. In a database made before this was kept,
    /// any of its changes (through `lastSequence`) may have been marked before.
    static func recordInFlightMarks(through sequence: Int64, lastSequence: Int64, _ connection: Connection) throws {
        let stored = try inFlightMarkedThrough(connection)
        let marked = max(stored ?? lastSequence, sequence)
        guard marked != stored else { return }
        try setValue(inFlightMarkedThroughKey, .integer(marked), connection)
    }

    private static let inFlightMarkedThroughKey = "in_flight_marked_through"

    // MARK: Rows of tether_meta

    private static func value<V: DatabaseValueConvertible>(_ key: String, _ connection: Connection, as type: V.Type)
        throws -> V?
    {
        try connection.fetchValue("SELECT value FROM tether_meta WHERE key = ?", [key], as: type)
    }

    private static func setValue(_ key: String, _ value: DatabaseValue, _ connection: Connection) throws {
        try connection.execute(
            "INSERT OR REPLACE INTO tether_meta (key, value) VALUES (?, ?)",
            StatementArguments(values: [.text(key), value]))
    }
}

/// A database that noticed it is a copy of another — a restored backup, a cloned node — whose
/// instance key the original still uses, or of its own earlier self (restored in place, and
/// written since). It does not sync under that key (its writes would be taken for the original's,
/// and lost); its writes stay pending until `Database.resetInstanceKey()` gives it a key of its
/// own, or (a copy only) `Database.confirmMove()` says it is the original, moved.
public struct CopyDetection: Sendable, Equatable {
    /// How the database became a copy.
    public enum Kind: String, Sendable {
        /// A byte copy of a database, noticed when opened (its file is not the one it was).
        case copied
        /// Restored to an earlier state in the same file, and written since: a peer's
        /// `HistoryMark` showed changes under sequence numbers it already holds of another history.
        case restored
    }
    /// Whether it is a byte copy of another database or an earlier state restored in place.
    public let kind: Kind
    /// What showed it ("the file was inode 123 when last opened, now inode 456").
    public let reason: String
    /// The last sequence number when the copy was noticed: the copy's own writes come after it
    /// (0 for a restore: its own writes are told by their timestamps alone).
    public let sequence: Int64
    /// The clock when the copy was noticed (for a restore, the peer's mark): this database's
    /// versions later than it are the copy's.
    let timestamp: HybridTimestamp
}
