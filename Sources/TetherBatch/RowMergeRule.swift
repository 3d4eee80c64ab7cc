/// What wins when one peer deletes a row while another updates it, chosen per synced table
/// (`enableSync(…rowRule:)`), recorded in the catalog and agreed with every peer like the column
/// rules (Protocol/README.md §6.12, §7.9).
public enum RowMergeRule: String, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// The delete wins over every update it did not see as well: the row stays deleted. The default.
    case deleteWins
    /// An update the deleting peer had not seen brings the row back, with every value it held
    /// merged as usual (a cart's item added again on one device while another empties the cart).
    /// A delete made after seeing every update still deletes.
    case addWins

    public var description: String { rawValue }

    /// The rule's number in SCOPE's rules, where it is listed with an empty column name (§6.12).
    public var wireCode: UInt8 {
        switch self {
        case .deleteWins: return 0
        case .addWins: return 1
        }
    }

    public init?(wireCode: UInt8) {
        guard let rule = Self.allCases.first(where: { $0.wireCode == wireCode }) else { return nil }
        self = rule
    }
}
