/// How a table settles a remote change to a row that has a pending or
/// in-flight local change.
public enum ConflictPolicy: Sendable, CustomStringConvertible {
    /// Per column, the later version wins (hybrid clock, then instance key).
    /// Every peer reaches the same result whatever the order of delivery.
    case lastWriterWins
    /// The local row is kept as is (sModel's rule, for a client of an
    /// authoritative server): pending and in-flight rows are not overwritten.
    case localWins
    /// The remote row replaces the local one, and the local change is dropped.
    case remoteWins
    /// A function given both versions returns the merged values; the result is
    /// written as a new local change, so it reaches the other peers.
    case custom(MergeFunction)

    public var description: String {
        switch self {
        case .lastWriterWins: return "lastWriterWins"
        case .localWins: return "localWins"
        case .remoteWins: return "remoteWins"
        case .custom: return "custom"
        }
    }

    init?(storedName: String, merge: MergeFunction?) {
        switch storedName {
        case "lastWriterWins": self = .lastWriterWins
        case "localWins": self = .localWins
        case "remoteWins": self = .remoteWins
        case "custom":
            guard let merge else { return nil }
            self = .custom(merge)
        default: return nil
        }
    }
}

/// Merges a conflicting row: given the local and the remote version of the
/// row (column name → value), returns the values to keep.
public typealias MergeFunction =
    @Sendable (_ local: [String: DatabaseValue], _ remote: [String: DatabaseValue]) throws -> [String: DatabaseValue]
