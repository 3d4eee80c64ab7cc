import Foundation
import Testing
import TetherBatch
@testable import TetherWire

/// Mutated valid frames: the decoder returns a message or throws a WireError
/// (the typed throws make anything else a compile error), and never crashes
/// or hangs. A message it returns is one the encoder can send again.
///
/// TETHER_WIRE_MUTATIONS sets the count (default 100,000), TETHER_WIRE_SEED
/// the seed (default fixed, so a failure can be replayed).
@Suite struct MutationTests {
    static let environment = ProcessInfo.processInfo.environment
    static let iterations = environment["TETHER_WIRE_MUTATIONS"].flatMap(Int.init) ?? 100_000
    static let seed = environment["TETHER_WIRE_SEED"].flatMap { UInt64($0) } ?? 0x7E7E_5EED

    /// Small limits too, so mutated lengths and counts cross them often.
    static let limitSets = [
        WireLimits.default,
        WireLimits(maxFrameSize: 512, maxDecompressedSize: 1_024, maxStringLength: 40, maxTables: 3),
    ]

    static func seeds() throws -> [[UInt8]] {
        var frames: [[UInt8]] = []
        for message in WireSamples.messages {
            frames.append(try encode(message, compression: false))
            frames.append(try encode(message, compression: true))
        }
        frames += try VectorCatalog.all().map(\.bytes)
        return frames
    }

    static func mutate(_ frame: [UInt8], _ random: inout SeededGenerator) -> [UInt8] {
        var bytes = frame
        let rounds = Int.random(in: 1...3, using: &random)
        for _ in 0..<rounds {
            switch Int.random(in: 0..<9, using: &random) {
            case 0 where !bytes.isEmpty:  // flip bits
                for _ in 0..<Int.random(in: 1...4, using: &random) {
                    bytes[Int.random(in: 0..<bytes.count, using: &random)] ^=
                        1 << UInt8.random(in: 0...7, using: &random)
                }
            case 1:  // insert bytes
                let count = Int.random(in: 1...8, using: &random)
                bytes.insert(
                    contentsOf: (0..<count).map { _ in UInt8.random(in: 0...255, using: &random) },
                    at: Int.random(in: 0...bytes.count, using: &random))
            case 2 where !bytes.isEmpty:  // delete bytes
                let start = Int.random(in: 0..<bytes.count, using: &random)
                bytes.removeSubrange(start..<min(bytes.count, start + Int.random(in: 1...8, using: &random)))
            case 3:  // truncate
                bytes.removeLast(Int.random(in: 0...bytes.count, using: &random))
            case 4 where bytes.count >= 4:  // edit the length field: fix it up, nudge it, or replace it
                let actual = bytes.count - 4
                let length: Int
                switch Int.random(in: 0..<4, using: &random) {
                case 0: length = actual
                case 1: length = max(0, actual + Int.random(in: -3...3, using: &random))
                case 2: length = Int(UInt32.random(in: 0...UInt32.max, using: &random))
                default: length = Int.random(in: 0...600, using: &random)
                }
                for index in 0..<4 { bytes[index] = UInt8(truncatingIfNeeded: length >> (24 - 8 * index)) }
            case 5 where bytes.count >= 6:  // type or flags
                bytes[Int.random(in: 4...5, using: &random)] = UInt8.random(in: 0...10, using: &random)
            case 6 where !bytes.isEmpty:  // interesting byte values
                bytes[Int.random(in: 0..<bytes.count, using: &random)] =
                    [0x00, 0x01, 0x7F, 0x80, 0xFF].randomElement(using: &random) ?? 0
            case 7 where bytes.count > 8:  // duplicate a chunk
                let start = Int.random(in: 0..<bytes.count, using: &random)
                let chunk = bytes[start..<min(bytes.count, start + Int.random(in: 1...32, using: &random))]
                bytes.insert(contentsOf: chunk, at: Int.random(in: 0...bytes.count, using: &random))
            default:  // swap two bytes
                if bytes.count >= 2 {
                    bytes.swapAt(
                        Int.random(in: 0..<bytes.count, using: &random), Int.random(in: 0..<bytes.count, using: &random)
                    )
                }
            }
        }
        // Usually make the length agree again, so the mutation reaches the body decoders.
        if bytes.count >= 4 && Int.random(in: 0..<10, using: &random) < 6 {
            let length = bytes.count - 4
            for index in 0..<4 { bytes[index] = UInt8(truncatingIfNeeded: length >> (24 - 8 * index)) }
        }
        return bytes
    }

    @Test func mutatedFramesNeverCrashOrHang() throws {
        let seeds = try Self.seeds()
        var random = SeededGenerator(seed: Self.seed)
        var decoded = 0
        var errorCases: [String: Int] = [:]
        let clock = ContinuousClock()
        let start = clock.now
        for iteration in 0..<Self.iterations {
            let original = seeds[iteration % seeds.count]
            let mutant = Self.mutate(original, &random)
            let limits = Self.limitSets[iteration % 7 == 0 ? 1 : 0]
            do {
                let message = try FrameDecoder.decode(frame: mutant, limits: limits)
                decoded += 1
                checkReencodes(message, limits: limits, seed: Self.seed, iteration: iteration)
            } catch {
                errorCases[error.caseName, default: 0] += 1
            }
            // The stream decoder, fed in random pieces, ends in a message, an error or a wait for bytes.
            if iteration % 4 == 0 { try streamDecode(mutant, limits: limits, random: &random) }
        }
        let elapsed = clock.now - start
        print(
            """
            mutation test: \(Self.iterations) mutants (seed \(Self.seed)) in \(elapsed): \(decoded) decoded, \
            errors \(errorCases.sorted { $0.key < $1.key })
            """)
        // Most mutants are refused, some still decode, and the refusals are varied.
        #expect(decoded > 0 && decoded < Self.iterations)
        #expect(errorCases.count >= 10, "\(errorCases)")
    }

    /// A decoded message encodes, and decoding that gives an encoding that is stable.
    func checkReencodes(_ message: WireMessage, limits: WireLimits, seed: UInt64, iteration: Int) {
        let encoder = FrameEncoder(limits: limits, compression: true)
        do {
            let frame = try encoder.encode(message)
            let again = try FrameDecoder.decode(frame: frame, limits: limits)
            #expect(try encoder.encode(again) == frame, "seed \(seed) iteration \(iteration)")
        } catch .frameTooLarge {
            // A compressed mutant can hold a body that LZ4_compress_default packs less tightly.
        } catch {
            Issue.record("seed \(seed) iteration \(iteration): decoded \(message) but cannot re-encode it: \(error)")
        }
    }

    func streamDecode(_ bytes: [UInt8], limits: WireLimits, random: inout SeededGenerator) throws {
        var decoder = FrameDecoder(limits: limits)
        var index = 0
        var calls = 0
        while index < bytes.count {
            let end = min(bytes.count, index + Int.random(in: 1...64, using: &random))
            decoder.append(bytes[index..<end])
            index = end
            do {
                while try decoder.nextMessage() != nil {
                    calls += 1
                    #expect(calls <= bytes.count, "more messages than bytes")
                    if calls > bytes.count { return }
                }
            } catch {
                return
            }
            #expect(decoder.bufferedByteCount < limits.maxFrameSize + WireProtocol.frameHeaderSize)
        }
    }
}
