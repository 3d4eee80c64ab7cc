import Foundation

/// A database's identity among its peers: 16 random bytes, made when the
/// database is first opened and kept in it. Shown as 32 hex characters.
public struct InstanceKey: Sendable, Hashable, Comparable, CustomStringConvertible, Codable {
    /// Exactly 16 bytes.
    public let bytes: [UInt8]

    public init?(bytes: [UInt8]) {
        guard bytes.count == 16 else { return nil }
        self.bytes = bytes
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
        self.bytes = bytes
    }

    /// A new random key.
    public static func random() -> InstanceKey {
        var generator = SystemRandomNumberGenerator()
        // Exactly 16 bytes, so the failable init cannot fail.
        return InstanceKey(uncheckedBytes: (0..<16).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }

    init(uncheckedBytes: [UInt8]) { bytes = uncheckedBytes }

    public var hex: String { bytes.map { String(format: "%02x", $0) }.joined() }
    public var description: String { hex }

    /// Ties between equal clocks break on the instance key, byte by byte.
    public static func < (lhs: InstanceKey, rhs: InstanceKey) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let key = InstanceKey(hex: text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not an instance key (32 hex characters): \(text)"))
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
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public init(milliseconds: UInt64, counter: UInt16) { rawValue = milliseconds << 16 | UInt64(counter) }

    public var milliseconds: UInt64 { rawValue >> 16 }
    public var counter: UInt16 { UInt16(truncatingIfNeeded: rawValue) }
    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
    public static let zero = HybridTimestamp(rawValue: 0)

    public var description: String { "\(milliseconds).\(counter)" }

    /// The wall clock as a timestamp with a zero counter.
    static func wallClock() -> HybridTimestamp {
        HybridTimestamp(milliseconds: UInt64(max(0, Date().timeIntervalSince1970 * 1000)), counter: 0)
    }
}

/// The version of one value: when it was written, and where. Versions are
/// totally ordered: by timestamp, then by instance key.
public struct Version: Sendable, Hashable, Comparable, CustomStringConvertible {
    public let timestamp: HybridTimestamp
    public let origin: InstanceKey
    public init(timestamp: HybridTimestamp, origin: InstanceKey) {
        self.timestamp = timestamp
        self.origin = origin
    }
    public static func < (lhs: Version, rhs: Version) -> Bool {
        lhs.timestamp != rhs.timestamp ? lhs.timestamp < rhs.timestamp : lhs.origin < rhs.origin
    }
    public var description: String { "\(timestamp)@\(origin.hex.prefix(8))" }
}
