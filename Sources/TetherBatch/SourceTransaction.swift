/// A transaction as the database that committed it is known everywhere: its instance key and the
/// timestamp the transaction gave its changes. Every change of one transaction carries that
/// version as its newest (`Version`), on every peer and through relays, so a consumer of a peer's
/// changes tells the source's transactions apart by it, whatever unit the peer applied them in.
///
/// A row changed by several transactions before it travelled carries only the last one's (rows
/// travel with their newest values); writes of other programs noticed together (the sqlite3 shell
/// writing a table captured with triggers) count as one transaction.
public struct SourceTransaction: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// The database that committed the transaction.
    public let origin: InstanceKey
    /// The hybrid timestamp of its changes there: transactions of one origin in commit order.
    public let timestamp: HybridTimestamp

    public init(origin: InstanceKey, timestamp: HybridTimestamp) {
        self.origin = origin
        self.timestamp = timestamp
    }

    /// The transaction whose change carries `version` as its newest.
    public init(_ version: Version) {
        self.init(origin: version.origin, timestamp: version.timestamp)
    }

    /// In timestamp order (which follows causality: a transaction made after seeing another has
    /// the later timestamp), then by origin.
    public static func < (lhs: Self, rhs: Self) -> Bool {
        Version(timestamp: lhs.timestamp, origin: lhs.origin) < Version(timestamp: rhs.timestamp, origin: rhs.origin)
    }

    /// `TIMESTAMP@ORIGIN`: the raw timestamp and the instance key in hex.
    public var description: String { "\(timestamp.rawValue)@\(origin.hex)" }
}

extension RowChange {
    /// The source transaction of the change: the one of its newest version (the transaction that
    /// last wrote the row where it was written).
    public var sourceTransaction: SourceTransaction {
        var newest = existence
        for version in versions where version > newest { newest = version }
        return SourceTransaction(newest)
    }
}
