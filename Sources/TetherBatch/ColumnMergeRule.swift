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
    /// The greatest value ever written wins (a high-water mark, a "last seen" time), by SQLite's
    /// order of values with BINARY text: NULL below every number, numbers below texts, texts
    /// below blobs. A local write may only raise the value: `SET seen = max(seen, ?)`.
    case maximum = "max"
    /// The smallest value ever written wins (a first-seen time, a best score); NULL still counts
    /// as never written. A local write may only lower the value.
    case minimum = "min"

    public var description: String { rawValue }

    /// Whether the rule keeps the better of two values (`maximum`, `minimum`).
    public var isOrdered: Bool { self == .maximum || self == .minimum }

    /// Whether `value` is better than `other` under this ordered rule: greater for `maximum`,
    /// smaller for `minimum`; a value is always better than NULL (never written). False for
    /// equal values and for the other rules.
    public func prefers(_ value: DatabaseValue, over other: DatabaseValue) -> Bool {
        switch (self, value, other) {
        case (_, .null, _): return false
        case (.maximum, _, .null), (.minimum, _, .null): return true
        case (.maximum, _, _): return ValueOrder.compare(value, other) > 0
        case (.minimum, _, _): return ValueOrder.compare(value, other) < 0
        default: return false
        }
    }

    /// The rule's number in a session's RULES (Protocol/README.md §6.13).
    public var wireCode: UInt8 {
        switch self {
        case .lastWriterWins: return 0
        case .counter: return 1
        case .maximum: return 2
        case .minimum: return 3
        }
    }

    public init?(wireCode: UInt8) {
        guard let rule = Self.allCases.first(where: { $0.wireCode == wireCode }) else { return nil }
        self = rule
    }
}

/// A total order of values, SQLite's where SQLite has one: NULL, then numbers by value (an
/// INTEGER before a REAL of the same value, so that no two distinct values tie), then texts by
/// their UTF-8 bytes (BINARY), then blobs by their bytes. Every peer orders alike, whatever the
/// column's declared collation.
public enum ValueOrder {
    /// Negative, zero or positive as `a` is before, the same as, or after `b`.
    public static func compare(_ a: DatabaseValue, _ b: DatabaseValue) -> Int {
        switch (a, b) {
        case (.null, .null): return 0
        case (.null, _): return -1
        case (_, .null): return 1
        case let (.integer(x), .integer(y)): return x < y ? -1 : (x == y ? 0 : 1)
        case let (.real(x), .real(y)): return x < y ? -1 : (x == y ? 0 : (x > y ? 1 : nanOrder(x, y)))
        case let (.integer(x), .real(y)): return mixed(x, y)
        case let (.real(x), .integer(y)): return -mixed(y, x)
        case (.integer, _), (.real, _): return -1
        case (_, .integer), (_, .real): return 1
        case let (.text(x), .text(y)): return bytes(Array(x.utf8), Array(y.utf8))
        case (.text, .blob): return -1
        case (.blob, .text): return 1
        case let (.blob(x), .blob(y)): return bytes(Array(x), Array(y))
        }
    }

    /// An integer against a real: by value, exactly (a Double does not hold every Int64); the
    /// integer first when they are equal.
    private static func mixed(_ integer: Int64, _ real: Double) -> Int {
        if real.isNaN { return 1 }
        if real >= 9_223_372_036_854_775_808.0 { return -1 }
        if real < -9_223_372_036_854_775_808.0 { return 1 }
        let truncated = Int64(real.rounded(.towardZero))
        if integer != truncated { return integer < truncated ? -1 : 1 }
        let fraction = real - real.rounded(.towardZero)
        return fraction > 0 ? -1 : (fraction < 0 ? 1 : -1)
    }

    /// NaN (which SQLite stores as NULL, but a peer may send) after every other real.
    private static func nanOrder(_ x: Double, _ y: Double) -> Int {
        if x.isNaN && y.isNaN { return 0 }
        return x.isNaN ? 1 : -1
    }

    private static func bytes(_ x: [UInt8], _ y: [UInt8]) -> Int {
        for (a, b) in zip(x, y) where a != b { return a < b ? -1 : 1 }
        return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
    }
}
