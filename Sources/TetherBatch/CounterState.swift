import Foundation

/// The state of one counter column of one row (a column whose merge rule is `counter`): the value
/// the row was inserted with (`base`, at `baseVersion`) and each site's contribution since, each
/// changed only by its own site, so that the latest of a site's contributions wins and concurrent
/// ones add up. The column's value is `base` plus the contributions made after `baseVersion`
/// (Protocol/README.md §7.7).
///
/// A state without contributions travels and is stored as its plain value (the base, at the
/// column's version); one with contributions as a blob, `encoded()`:
///
///     0xC1                                      format
///     base          tag (0 NULL, 1 INTEGER, 2 REAL), 8 bytes LE (none for NULL)
///     baseVersion   timestamp (8 bytes LE), origin (16 bytes)
///     count         2 bytes LE, at least 1
///     count × (site (16 bytes), timestamp (8 bytes LE), amount: tag (1 or 2), 8 bytes LE)
///
/// Sites strictly ascending; each contribution's version (timestamp, site) later than the base's.
public struct CounterState: Sendable, Hashable {
    public struct Contribution: Sendable, Hashable {
        public var site: InstanceKey
        public var timestamp: HybridTimestamp
        /// An INTEGER or a REAL.
        public var amount: DatabaseValue
        public init(site: InstanceKey, timestamp: HybridTimestamp, amount: DatabaseValue) {
            self.site = site
            self.timestamp = timestamp
            self.amount = amount
        }
        public var version: Version { Version(timestamp: timestamp, origin: site) }
    }

    /// NULL, an INTEGER or a REAL.
    public var base: DatabaseValue
    public var baseVersion: Version
    /// By site, ascending; only those after `baseVersion`.
    public private(set) var contributions: [Contribution]

    public static let formatByte: UInt8 = 0xC1
    /// The size of one contribution in the encoding.
    static let contributionSize = 16 + 8 + 9

    public init(base: DatabaseValue, baseVersion: Version, contributions: [Contribution] = []) {
        self.base = base
        self.baseVersion = baseVersion
        self.contributions = contributions.filter { $0.version > baseVersion }.sorted { $0.site < $1.site }
    }

    /// The column's value: the base plus every contribution.
    public var value: DatabaseValue {
        contributions.reduce(base) { CounterArithmetic.sum($0, $1.amount) }
    }

    /// The latest of the base's and the contributions' versions: the column's version.
    public var newestVersion: Version {
        contributions.reduce(baseVersion) { max($0, $1.version) }
    }

    /// Adds `amount` to `site`'s contribution, which takes `version` (a site's own write, later
    /// than anything it has seen: a contribution from before the base starts again from zero).
    public mutating func add(_ amount: DatabaseValue, by site: InstanceKey, at timestamp: HybridTimestamp) {
        let version = Version(timestamp: timestamp, origin: site)
        guard version > baseVersion else { return }
        if let index = contributions.firstIndex(where: { $0.site == site }) {
            contributions[index].amount = CounterArithmetic.sum(contributions[index].amount, amount)
            contributions[index].timestamp = max(contributions[index].timestamp, timestamp)
        } else {
            contributions.append(Contribution(site: site, timestamp: timestamp, amount: amount))
            contributions.sort { $0.site < $1.site }
        }
    }

    /// The state both this one and `other` lead to: the later base, and per site the later
    /// contribution, those from before the base left out. Commutative, associative, idempotent:
    /// every peer reaches the same state in any order of delivery.
    public func merged(with other: CounterState) -> CounterState {
        let later = other.baseVersion > baseVersion ? other : self
        var bySite: [InstanceKey: Contribution] = [:]
        for contribution in contributions + other.contributions {
            if let known = bySite[contribution.site], known.timestamp >= contribution.timestamp {
                // Equal timestamps of one site are one write: the same amount.
                continue
            }
            bySite[contribution.site] = contribution
        }
        return CounterState(base: later.base, baseVersion: later.baseVersion, contributions: Array(bySite.values))
    }

    // MARK: Encoding

    public func encoded() -> Data {
        var bytes: [UInt8] = []
        encode(into: &bytes)
        return Data(bytes)
    }

    /// The number of bytes `encode(into:)` appends.
    public var encodedCount: Int { 1 + 9 + 24 + 2 + contributions.count * Self.contributionSize }

    /// Appends `encoded()` to `bytes`, without a buffer of its own.
    public func encode(into bytes: inout [UInt8]) {
        bytes.reserveCapacity(bytes.count + encodedCount)
        func uint64(_ value: UInt64) {
            withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
        }
        func number(_ value: DatabaseValue) {
            switch value {
            case let .integer(integer): bytes.append(1); uint64(UInt64(bitPattern: integer))
            case let .real(real): bytes.append(2); uint64(real.bitPattern)
            default: bytes.append(0)
            }
        }
        bytes.append(Self.formatByte)
        number(base)
        uint64(baseVersion.timestamp.rawValue)
        baseVersion.origin.append(to: &bytes)
        bytes.append(UInt8(truncatingIfNeeded: contributions.count))
        bytes.append(UInt8(truncatingIfNeeded: contributions.count >> 8))
        for contribution in contributions {
            contribution.site.append(to: &bytes)
            uint64(contribution.timestamp.rawValue)
            number(contribution.amount)
        }
    }

    /// Reads an encoded state, every rule checked (counts against the bytes left before anything
    /// is allocated).
    public init(decoding data: Data) throws(CounterStateError) {
        let decoded = data.withUnsafeBytes { bytes in
            Result { () throws(CounterStateError) in try CounterState(decoding: bytes) }
        }
        self = try decoded.get()
    }

    /// The same, from bytes borrowed (a blob read in place).
    public init(decoding bytes: UnsafeRawBufferPointer) throws(CounterStateError) {
        var reader = Reader(bytes: bytes)
        guard try reader.byte("format") == Self.formatByte else {
            throw .malformed("a counter state starts with 0xC1, not 0x\(String(bytes.first ?? 0, radix: 16))")
        }
        let base = try reader.number("base", allowingNull: true)
        let baseVersion = Version(
            timestamp: HybridTimestamp(rawValue: try reader.uint64("base timestamp")),
            origin: try reader.key("base origin"))
        let count = Int(try reader.byte("count")) | Int(try reader.byte("count")) << 8
        guard count >= 1 else { throw .malformed("a counter state in a blob lists no contribution") }
        guard count <= reader.remaining / Self.contributionSize else {
            throw .malformed("\(count) contributions, more than the \(reader.remaining) bytes left hold")
        }
        var contributions: [Contribution] = []
        contributions.reserveCapacity(count)
        for _ in 0..<count {
            let site = try reader.key("site")
            if let previous = contributions.last, !(previous.site < site) {
                throw .malformed("contribution sites are not strictly ascending (\(site))")
            }
            let contribution = Contribution(
                site: site, timestamp: HybridTimestamp(rawValue: try reader.uint64("timestamp")),
                amount: try reader.number("amount", allowingNull: false))
            guard contribution.version > baseVersion else {
                throw .malformed(
                    "the contribution of \(site) (\(contribution.version)) is not after the base (\(baseVersion))")
            }
            contributions.append(contribution)
        }
        guard reader.remaining == 0 else { throw .malformed("\(reader.remaining) bytes after the contributions") }
        self.base = base
        self.baseVersion = baseVersion
        self.contributions = contributions
    }

    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        var offset = 0
        var remaining: Int { bytes.count - offset }

        mutating func byte(_ field: String) throws(CounterStateError) -> UInt8 {
            guard offset < bytes.count else { throw .malformed("the counter state ends before its \(field)") }
            defer { offset += 1 }
            return bytes[offset]
        }
        mutating func uint64(_ field: String) throws(CounterStateError) -> UInt64 {
            guard remaining >= 8 else { throw .malformed("the counter state ends before its \(field)") }
            let value = UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
            offset += 8
            return value
        }
        mutating func key(_ field: String) throws(CounterStateError) -> InstanceKey {
            guard remaining >= 16,
                let key = InstanceKey(bytes: UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + 16]))
            else {
                throw .malformed("the counter state ends before its \(field)")
            }
            offset += 16
            return key
        }
        mutating func number(_ field: String, allowingNull: Bool) throws(CounterStateError) -> DatabaseValue {
            switch try byte(field) {
            case 0 where allowingNull: return .null
            case 1: return .integer(Int64(bitPattern: try uint64(field)))
            case 2: return .real(Double(bitPattern: try uint64(field)))
            case let tag: throw .malformed("the \(field)'s type \(tag) is not \(allowingNull ? "0, " : "")1 or 2")
            }
        }
    }
}

/// A counter state that breaks the rules of its encoding.
public enum CounterStateError: Error, Sendable, Hashable, CustomStringConvertible {
    case malformed(String)
    public var description: String {
        switch self {
        case let .malformed(reason): return "malformed counter state: \(reason)"
        }
    }
}

/// A counter's number: NULL, an INTEGER or a REAL. A plain value (no reference counted payload),
/// so that the capture notes a write to a counter without copying anything.
public enum CounterNumber: Sendable, Hashable {
    case null
    case integer(Int64)
    case real(Double)

    /// nil for a TEXT or a BLOB.
    public init?(_ value: DatabaseValue) {
        switch value {
        case .null: self = .null
        case let .integer(integer): self = .integer(integer)
        case let .real(real): self = .real(real)
        case .text, .blob: return nil
        }
    }

    public var value: DatabaseValue {
        switch self {
        case .null: return .null
        case let .integer(integer): return .integer(integer)
        case let .real(real): return .real(real)
        }
    }

    private var real: Double {
        switch self {
        case .null: return 0
        case let .integer(integer): return Double(integer)
        case let .real(real): return real
        }
    }

    /// The sum as SQLite computes it: INTEGER while it fits, REAL when either side is REAL or an
    /// INTEGER sum overflows; NULL counts as 0.
    public static func + (a: CounterNumber, b: CounterNumber) -> CounterNumber {
        switch (a, b) {
        case (.null, _): return b
        case (_, .null): return a
        case let (.integer(x), .integer(y)):
            let (result, overflow) = x.addingReportingOverflow(y)
            return overflow ? .real(Double(x) + Double(y)) : .integer(result)
        default: return .real(a.real + b.real)
        }
    }

    /// `a − b` the same way (NULL − NULL is 0).
    public static func - (a: CounterNumber, b: CounterNumber) -> CounterNumber {
        switch (a, b) {
        case let (.integer(x), .integer(y)):
            let (result, overflow) = x.subtractingReportingOverflow(y)
            return overflow ? .real(Double(x) - Double(y)) : .integer(result)
        case (_, .null): return a == .null ? .integer(0) : a
        case let (.null, .integer(y)):
            let (result, overflow) = Int64(0).subtractingReportingOverflow(y)
            return overflow ? .real(-Double(y)) : .integer(result)
        default: return .real(a.real - b.real)
        }
    }
}

/// Sums and differences of a counter's values (`CounterNumber`'s arithmetic on database values).
public enum CounterArithmetic {
    /// `a + b`; a TEXT or a BLOB (never a counter's) counts as 0.0.
    public static func sum(_ a: DatabaseValue, _ b: DatabaseValue) -> DatabaseValue {
        ((CounterNumber(a) ?? .real(0)) + (CounterNumber(b) ?? .real(0))).value
    }

    /// `a − b`; nil when either is not a number (TEXT or BLOB).
    public static func difference(_ a: DatabaseValue, _ b: DatabaseValue) -> DatabaseValue? {
        guard let x = CounterNumber(a), let y = CounterNumber(b) else { return nil }
        return (x - y).value
    }

    /// NULL, an INTEGER or a REAL.
    public static func isNumber(_ value: DatabaseValue) -> Bool { CounterNumber(value) != nil }
}
