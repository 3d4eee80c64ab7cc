import Foundation
import Testing
import TetherBatch
@testable import TetherWire

/// When bodies are compressed, and what a compressed body looks like.
@Suite struct CompressionTests {
    static func isCompressed(_ frame: [UInt8]) -> Bool { frame[5] & 1 != 0 }

    /// A BYE whose body (length prefix included) is exactly `size` bytes, highly compressible.
    static func bye(bodySize size: Int) -> WireMessage {
        let prefix = size - 1 < 128 ? 1 : 2
        return .bye(reason: String(repeating: "z", count: size - prefix))
    }

    @Test func thresholdDecides() throws {
        let threshold = WireLimits.default.compressionThreshold
        #expect(threshold == 512)
        let below = try encode(Self.bye(bodySize: threshold - 1), compression: true)
        #expect(below.count == 6 + threshold - 1 && !Self.isCompressed(below))
        let at = try encode(Self.bye(bodySize: threshold), compression: true)
        #expect(Self.isCompressed(at) && at.count < 6 + threshold)
        // Without compression, the same body goes raw.
        #expect(!Self.isCompressed(try encode(Self.bye(bodySize: threshold), compression: false)))
        // Another threshold.
        let limits = WireLimits(compressionThreshold: 64)
        #expect(Self.isCompressed(try encode(Self.bye(bodySize: 64), compression: true, limits: limits)))
        #expect(!Self.isCompressed(try encode(Self.bye(bodySize: 63), compression: true, limits: limits)))
    }

    @Test func incompressibleBodiesGoRaw() throws {
        var generator = SeededGenerator(seed: 7)
        let noise = Data((0..<4_000).map { _ in UInt8.random(in: 0...255, using: &generator) })
        let batch = ChangeBatch(
            source: WireSamples.keyA, after: 0, through: 1, isLast: true,
            tables: [TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["data"])],
            changes: [
                RowChange(
                    table: 0, key: [.integer(1)], isAlive: true,
                    existence: Version(timestamp: WireSamples.timestamp(0), origin: WireSamples.keyA),
                    values: [.blob(noise)], versions: [], sequence: 1)
            ])
        let frame = try encode(.batch(batch), compression: true)
        #expect(!Self.isCompressed(frame))
        #expect(frame == (try encode(.batch(batch), compression: false)))
    }

    @Test func helloIsNeverCompressed() throws {
        let tables = (0..<200).map { TableDescriptor(name: "table_\($0)", keyColumns: ["id"], valueColumns: ["value"]) }
        let hello = WireMessage.hello(
            Hello(instanceKey: WireSamples.keyA, schemaFingerprint: WireSamples.fingerprint, tables: tables))
        let frame = try encode(hello, compression: true)
        #expect(frame.count > 2_000 && !Self.isCompressed(frame))
    }

    @Test func compressedBodyIsRawLengthThenAnLZ4Block() throws {
        let frame = try encode(.batch(WireSamples.largeBatch), compression: true)
        #expect(Self.isCompressed(frame))
        let raw = BatchCoding.encode(WireSamples.largeBatch)
        let body = Array(frame[6...])
        let rawLength = uvarintBytes(UInt64(raw.count))
        #expect(Array(body.prefix(rawLength.count)) == rawLength)
        let block = Array(body[rawLength.count...])
        let decompressed = try block.withUnsafeBytes { bytes in
            try LZ4Block.decompress(bytes, rawLength: raw.count, type: .batch)
        }
        #expect(decompressed == raw)
        #expect(frame.count < raw.count / 2, "\(frame.count) of \(raw.count)")
        // The length field counts the compressed bytes.
        let length = frame[0..<4].reduce(0) { $0 << 8 | Int($1) }
        #expect(length == frame.count - 4)
    }

    @Test func bodiesAboveTheDecompressionLimitGoRaw() throws {
        let limits = WireLimits(maxDecompressedSize: 1_000)
        let message = Self.bye(bodySize: 2_000)
        let frame = try encode(message, compression: true, limits: limits)
        #expect(!Self.isCompressed(frame))
        #expect(try FrameDecoder.decode(frame: frame, limits: limits) == message)
        // A frame within maxFrameSize may carry a body up to maxDecompressedSize once decompressed.
        let large = Self.bye(bodySize: 60_000)
        let frameLimits = WireLimits(maxFrameSize: 1_000)
        let compressed = try encode(large, compression: true, limits: frameLimits)
        #expect(Self.isCompressed(compressed) && compressed.count <= 1_004)
        #expect(try FrameDecoder.decode(frame: compressed, limits: frameLimits) == large)
        expectWireError(case: "frameTooLarge") { _ = try encode(large, compression: false, limits: frameLimits) }
    }
}

/// A small deterministic generator (SplitMix64), so failures can be replayed from their seed.
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
