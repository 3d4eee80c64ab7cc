import Foundation

/// A database's identity among its peers: 16 random bytes, made when the
/// database is first opened and kept in it. Shown as 32 hex characters.
public struct InstanceKey: Sendable, Hashable, Comparable, CustomStringConvertible, Codable {
    // Two big-endian words rather than a byte array: keys are compared and
    // hashed for every version of every change, and an array would cost a
    // heap allocation, reference counting and a byte-by-byte hash.
    // Usable from inline so that comparing and hashing, done per version in
    // Tether's apply and extract, inline across the module boundary.
    @usableFromInline let high: UInt64
    @usableFromInline let low: UInt64

    /// The 16 bytes.
    public var bytes: [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: high >> (56 - 8 * UInt64($0))) }
            + (0..<8).map { UInt8(truncatingIfNeeded: low >> (56 - 8 * UInt64($0))) }
    }

    /// Appends `bytes` to `buffer`, without an array of its own.
    public func append(to buffer: inout [UInt8]) {
        withUnsafeBytes(of: high.bigEndian) { buffer.append(contentsOf: $0) }
        withUnsafeBytes(of: low.bigEndian) { buffer.append(contentsOf: $0) }
    }

    /// nil unless exactly 16 bytes.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == 16 else { return nil }
        self.init(uncheckedBytes: bytes)
    }

    /// Parses 32 hexadecimal characters (either case).
    public init?(hex: String) {
        guard hex.utf8.count == 32 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(16)
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            guard let byte = UInt8(hex[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        self.init(uncheckedBytes: bytes)
    }

    /// A new random key.
    public static func random() -> InstanceKey {
        var generator = SystemRandomNumberGenerator()
        return InstanceKey(high: generator.next(), low: generator.next())
    }

    private init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// From exactly 16 bytes (checked by the caller).
    package init(uncheckedBytes bytes: some Collection<UInt8>) {
        var high: UInt64 = 0
        var low: UInt64 = 0
        for (index, byte) in bytes.prefix(16).enumerated() {
            if index < 8 { high = high << 8 | UInt64(byte) } else { low = low << 8 | UInt64(byte) }
        }
        self.init(high: high, low: low)
    }

    public var hex: String {
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(32)
        for word in [high, low] {
            for shift in stride(from: 60, through: 0, by: -4) { text.append(digits[Int(word >> UInt64(shift) & 0xf)]) }
        }
        return String(decoding: text, as: UTF8.self)
    }

    public var description: String { hex }

    /// Ties between equal clocks break on the instance key, byte by byte
    /// (the words are big-endian, so comparing them compares the bytes).
    @inlinable
    public static func < (lhs: InstanceKey, rhs: InstanceKey) -> Bool {
        lhs.high != rhs.high ? lhs.high < rhs.high : lhs.low < rhs.low
    }

    @inlinable
    public static func == (lhs: InstanceKey, rhs: InstanceKey) -> Bool { lhs.high == rhs.high && lhs.low == rhs.low }

    @inlinable
    public func hash(into hasher: inout Hasher) {
        hasher.combine(high)
        hasher.combine(low)
    }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let key = InstanceKey(hex: text) else {
            throw DecodingError.dataCorrupted(
                .init(
                    codingPath: decoder.codingPath, debugDescription: "not an instance key (32 hex characters): \(text)"
                ))
        }
        self = key
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(hex)
    }
}

/// A hybrid logical clock timestamp: milliseconds since 1970 in the high 48
/// bits, a counter in the low 16. It follows the wall clock but never goes
/// backwards, and it moves past every timestamp received from a peer, so a
/// change made after seeing another always has the greater timestamp.
public struct HybridTimestamp: Sendable, Hashable, Comparable, CustomStringConvertible {
    public let rawValue: UInt64
    @inlinable public init(rawValue: UInt64) { self.rawValue = rawValue }
    @inlinable public init(milliseconds: UInt64, counter: UInt16) { rawValue = milliseconds << 16 | UInt64(counter) }

    @inlinable public var milliseconds: UInt64 { rawValue >> 16 }
    @inlinable public var counter: UInt16 { UInt16(truncatingIfNeeded: rawValue) }
    @inlinable public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
    @inlinable public static func == (lhs: Self, rhs: Self) -> Bool { lhs.rawValue == rhs.rawValue }
    public static let zero = HybridTimestamp(rawValue: 0)

    public var description: String { "\(milliseconds).\(counter)" }

    /// The wall clock as a timestamp with a zero counter.
    package static func wallClock() -> HybridTimestamp {
        HybridTimestamp(milliseconds: UInt64(max(0, Date().timeIntervalSince1970 * 1000)), counter: 0)
    }
}

/// The version of one value: when it was written, and where. Versions are
/// totally ordered: by timestamp, then by instance key.
public struct Version: Sendable, Hashable, Comparable, CustomStringConvertible {
    public let timestamp: HybridTimestamp
    public let origin: InstanceKey
    @inlinable
    public init(timestamp: HybridTimestamp, origin: InstanceKey) {
        self.timestamp = timestamp
        self.origin = origin
    }
    @inlinable
    public static func < (lhs: Version, rhs: Version) -> Bool {
        lhs.timestamp != rhs.timestamp ? lhs.timestamp < rhs.timestamp : lhs.origin < rhs.origin
    }
    @inlinable
    public static func == (lhs: Version, rhs: Version) -> Bool {
        lhs.timestamp == rhs.timestamp && lhs.origin == rhs.origin
    }
    public var description: String { "\(timestamp)@\(origin.hex.prefix(8))" }
}
