import Foundation
import Testing

@testable import Tether

/// The counter state's encoding and merge (Protocol/README.md §7.7).
@Suite struct CounterStateTests {
    static let origin = InstanceKey(hex: String(repeating: "11", count: 16))
    static let site = InstanceKey(hex: String(repeating: "22", count: 16))
    static let other = InstanceKey(hex: String(repeating: "33", count: 16))
    /// §7.7's example, without spaces.
    static let example =
        "c1010a00000000000000010000000000000011111111111111111111111111111111"
        + "010022222222222222222222222222222222020000000000000001fdffffffffffffff"

    static func bytes(_ hex: String) -> Data {
        var data = Data()
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            data.append(UInt8(hex[index..<next], radix: 16) ?? 0)
            index = next
        }
        return data
    }

    static func exampleState() throws -> CounterState {
        let origin = try #require(Self.origin), site = try #require(Self.site)
        return CounterState(
            base: .integer(10), baseVersion: Version(timestamp: HybridTimestamp(rawValue: 1), origin: origin),
            contributions: [.init(site: site, timestamp: HybridTimestamp(rawValue: 2), amount: .integer(-3))])
    }

    @Test func theSpecificationsExampleEncodesByteForByte() throws {
        let state = try Self.exampleState()
        #expect(state.encoded() == Self.bytes(Self.example))
        #expect(try CounterState(decoding: Self.bytes(Self.example)) == state)
        #expect(state.value == .integer(7))
        #expect(state.newestVersion.timestamp.rawValue == 2)
    }

    static let head: String = "c1010a00000000000000010000000000000011111111111111111111111111111111"
    static let contribution: String = "22222222222222222222222222222222020000000000000001fdffffffffffffff"
    static let early: String = "c1010a00000000000000050000000000000011111111111111111111111111111111"
    static let broken: [(String, String)] = [
        ("", "empty"),
        ("c2", "another format byte"),
        (String(example.dropLast(2)), "truncated amount"),
        (example + "00", "a byte after the contributions"),
        (head + "0000", "no contribution"),
        (head + "0200" + contribution, "a count the bytes cannot hold"),
        (early + "0100" + contribution, "a contribution before its base"),
        (String(example.dropLast(18)) + "000000000000000000", "a NULL amount"),
        (String(example.dropLast(18)) + "030000000000000000", "an unknown amount type"),
    ]

    @Test(arguments: broken)
    func aBrokenStateIsRefused(hex: String, what: String) {
        #expect(throws: CounterStateError.self, "\(what)") { try CounterState(decoding: Self.bytes(hex)) }
    }

    @Test func sitesOutOfOrderAreRefused() throws {
        let twice = Self.head + "0200" + Self.contribution + Self.contribution
        #expect(throws: CounterStateError.self) { try CounterState(decoding: Self.bytes(twice)) }
    }

    /// Any order of merging the same states gives the same state; merging twice changes nothing.
    @Test func mergeIsCommutativeAssociativeAndIdempotent() throws {
        let origin = try #require(Self.origin), site = try #require(Self.site), other = try #require(Self.other)
        let base = Version(timestamp: HybridTimestamp(rawValue: 1), origin: origin)
        let a = CounterState(
            base: .integer(10), baseVersion: base,
            contributions: [.init(site: site, timestamp: HybridTimestamp(rawValue: 5), amount: .integer(-3))])
        let b = CounterState(
            base: .integer(10), baseVersion: base,
            contributions: [
                .init(site: site, timestamp: HybridTimestamp(rawValue: 2), amount: .integer(-1)),
                .init(site: other, timestamp: HybridTimestamp(rawValue: 3), amount: .real(2.5)),
            ])
        // A later base (the row inserted again): contributions before it are gone.
        let c = CounterState(
            base: .integer(100), baseVersion: Version(timestamp: HybridTimestamp(rawValue: 4), origin: other))
        #expect(a.merged(with: b) == b.merged(with: a))
        #expect(a.merged(with: b).value == .real(9.5))
        #expect(a.merged(with: b).merged(with: c) == c.merged(with: b).merged(with: a))
        #expect(a.merged(with: b).merged(with: c).value == .integer(97))
        #expect(a.merged(with: a) == a)
    }

    @Test func integerSumsThatOverflowBecomeReal() {
        #expect(CounterArithmetic.sum(.integer(.max), .integer(1)) == .real(Double(Int64.max) + 1))
        #expect(CounterArithmetic.difference(.integer(.min), .integer(1)) == .real(Double(Int64.min) - 1))
        #expect(CounterArithmetic.difference(.integer(5), .null) == .integer(5))
        #expect(CounterArithmetic.difference(.text("a"), .integer(1)) == nil)
    }
}
