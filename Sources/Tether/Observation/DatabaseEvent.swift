/// One row inserted, updated, deleted or fetched, as observation reports it: after the commit
/// that made it (or the fetch that read it), never for work that was rolled back.
///
/// ```swift
/// let token = db.observe(.changes, in: "player") { event in
///     print(event.kind, event.table, event.key, event.origin)   // insert player [1] local
/// }
/// ```
public struct DatabaseEvent: Sendable, Hashable, CustomStringConvertible {
    /// What happened to the row.
    public enum Kind: String, Sendable, Hashable, Codable, CaseIterable {
        /// The row was inserted, updated or deleted, here or by a peer whose changes were applied
        /// (`origin` says which).
        case insert, update, delete
        /// A row the ORM read (listeners of `.fetch` only; never in a committed transaction).
        case fetch
        /// A row removed because it left this database's scope (partial replication): it still
        /// exists elsewhere; no tombstone is kept and nothing is relayed, unlike a delete.
        case evict
    }

    /// Which kinds of event a listener wants.
    public struct Kinds: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        /// Rows inserted.
        public static let insert = Kinds(rawValue: 1)
        /// Rows updated.
        public static let update = Kinds(rawValue: 2)
        /// Rows deleted.
        public static let delete = Kinds(rawValue: 4)
        /// Rows the ORM read; reported as each fetch returns, not after a commit.
        public static let fetch = Kinds(rawValue: 8)
        /// Rows that left this database's scope (partial replication).
        public static let evict = Kinds(rawValue: 16)
        /// Inserts, updates, deletes and evictions.
        public static let changes: Kinds = [.insert, .update, .delete, .evict]
        /// Every kind: the changes and the fetches.
        public static let all: Kinds = [.changes, .fetch]

        init(_ kind: Kind) {
            switch kind {
            case .insert: self = .insert
            case .update: self = .update
            case .delete: self = .delete
            case .fetch: self = .fetch
            case .evict: self = .evict
            }
        }
    }

    /// What happened to the row.
    public let kind: Kind
    /// The table the row belongs to.
    public let table: String
    /// The row's rowid (nil for a table WITHOUT ROWID, and for a deleted row read back from the changelog).
    // Set inside the module: a bulk insert's events are one value whose rowid moves along the run.
    public internal(set) var rowID: Int64?
    /// The primary key's values, when they are not the rowid (kept apart so that the common
    /// INTEGER PRIMARY KEY costs no allocation per event).
    let keyValues: [DatabaseValue]?
    /// Where the change came from.
    public let origin: ChangeOrigin
    /// The changelog's sequence number of the change, for events read back from it (a resumed
    /// stream, a change made by another process); nil for the live events of this process.
    public let sequence: Int64?
    /// The transaction the change belongs to where it was first written (see `SourceTransaction`):
    /// for a change applied from a peer, the source transaction of the change received; for this
    /// database's own commits, the commit's; for a row read back from the changelog, the
    /// transaction that last wrote it. Nil for an eviction, a fetch, and a commit of this database
    /// that changed no synced table (only synced tables' changes get a version).
    public internal(set) var sourceTransaction: SourceTransaction?

    init(
        kind: Kind, table: String, rowID: Int64?, keyValues: [DatabaseValue]?, origin: ChangeOrigin,
        sequence: Int64? = nil, sourceTransaction: SourceTransaction? = nil
    ) {
        self.kind = kind
        self.table = table
        self.rowID = rowID
        self.keyValues = keyValues
        self.origin = origin
        self.sequence = sequence
        self.sourceTransaction = sourceTransaction
    }

    /// The same change, from `origin`.
    func from(_ origin: ChangeOrigin) -> DatabaseEvent {
        DatabaseEvent(
            kind: kind, table: table, rowID: rowID, keyValues: keyValues, origin: origin, sequence: sequence,
            sourceTransaction: sourceTransaction)
    }

    /// The row's primary key (its rowid for an INTEGER PRIMARY KEY or a table without one).
    public var key: PrimaryKey { PrimaryKey(keyValues ?? [.integer(rowID ?? 0)]) }

    public var description: String {
        "\(kind.rawValue) \(table) \(key.values.map(\.description).joined(separator: ", ")) (\(origin))"
    }
}

/// Where a committed change came from.
public enum ChangeOrigin: Sendable, Hashable, CustomStringConvertible {
    /// This process, through the library (the ORM or raw SQL).
    case local
    /// A batch received from the peer with this instance key (in a sync session, or `apply`).
    case peer(InstanceKey)
    /// A sync file made by this instance (`importSyncFile`).
    case syncFile(InstanceKey)
    /// Another program or process writing the database file (the sqlite3 shell, `tether serve`'s
    /// own local writes), noticed through `PRAGMA data_version`.
    case external

    public var description: String {
        switch self {
        case .local: "local"
        case let .peer(key): "peer \(key)"
        case let .syncFile(key): "sync file from \(key)"
        case .external: "external"
        }
    }
}
