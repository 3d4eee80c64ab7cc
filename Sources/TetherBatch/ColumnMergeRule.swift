/// How a synced column's concurrent changes merge, chosen per column when its table is synced
/// (`enableSync(…columnRules:)`), recorded in the catalog and agreed with every peer (a session
/// whose peer merges a shared column by another rule is refused, naming the column).
public enum ColumnMergeRule: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// The later write wins (hybrid clock, then instance key): a name, a status. The default.
    case lastWriterWins
    /// Concurrent changes add up: each write records the difference it made as its site's
    /// contribution, and the value is the inserted value plus every site's contribution (stock,
    /// balances, counts). A column of numbers; NULL counts as 0.
    case counter

    public var description: String { rawValue }

    /// The rule's number in a session's RULES (Protocol/README.md §6.13).
    public var wireCode: UInt8 {
        switch self {
        case .lastWriterWins: return 0
        case .counter: return 1
        }
    }

    public init?(wireCode: UInt8) {
        guard let rule = Self.allCases.first(where: { $0.wireCode == wireCode }) else { return nil }
        self = rule
    }
}
