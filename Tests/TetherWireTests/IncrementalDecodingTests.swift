import Testing
import TetherBatch
@testable import TetherWire

/// The stream decoder gives the same messages however the bytes are cut.
@Suite struct IncrementalDecodingTests {
    /// Every sample message as one stream, with compression.
    static func stream() throws -> (bytes: [UInt8], messages: [WireMessage]) {
        let encoder = FrameEncoder(compression: true)
        var bytes: [UInt8] = []
        for message in WireSamples.messages { try encoder.encode(message, into: &bytes) }
        return (bytes, WireSamples.messages)
    }

    static func drain(_ decoder: inout FrameDecoder) throws -> [WireMessage] {
        var messages: [WireMessage] = []
        while let message = try decoder.nextMessage() { messages.append(message) }
        return messages
    }

    @Test func splitAtEveryByteBoundary() throws {
        let (bytes, expected) = try Self.stream()
        for split in 0...bytes.count {
            var decoder = FrameDecoder()
            decoder.append(bytes[..<split])
            var messages = try Self.drain(&decoder)
            decoder.append(bytes[split...])
            messages += try Self.drain(&decoder)
            #expect(messages == expected, "split at \(split)")
            #expect(decoder.bufferedByteCount == 0)
        }
    }

    @Test func byteByByte() throws {
        let (bytes, expected) = try Self.stream()
        var decoder = FrameDecoder()
        var messages: [WireMessage] = []
        var maximumBuffered = 0
        for byte in bytes {
            decoder.append(CollectionOfOne(byte))
            messages += try Self.drain(&decoder)
            maximumBuffered = max(maximumBuffered, decoder.bufferedByteCount)
        }
        #expect(messages == expected)
        // Never more than one unfinished frame held.
        let largestFrame = try WireSamples.messages.map { try encode($0, compression: true).count }.max() ?? 0
        #expect(maximumBuffered < largestFrame)
    }

    @Test func everyFrameSplitInThreeAtEveryPairOfBoundaries() throws {
        for message in [
            WireMessage.pull(Pull(after: 5, maxChanges: 1, maxBytes: 300)), .bye(reason: "bye"),
            .hello(
                Hello(
                    instanceKey: WireSamples.keyA, schemaFingerprint: WireSamples.fingerprint,
                    tables: [WireSamples.tables[0]])),
        ] {
            let frame = try encode(message)
            for first in 0...frame.count {
                for second in first...frame.count {
                    var decoder = FrameDecoder()
                    var messages: [WireMessage] = []
                    for part in [frame[..<first], frame[first..<second], frame[second...]] {
                        decoder.append(part)
                        messages += try Self.drain(&decoder)
                    }
                    #expect(messages == [message])
                }
            }
        }
    }

    @Test func oversizedLengthIsRefusedFromTheHeaderAlone() throws {
        var decoder = FrameDecoder(limits: WireLimits(maxFrameSize: 1_000))
        decoder.append([0, 0, 3])
        #expect(try decoder.nextMessage() == nil)
        decoder.append([0xE9])  // 1001
        expectWireError(.frameTooLarge(length: 1_001, limit: 1_000)) { _ = try decoder.nextMessage() }
    }

    @Test func bufferedBytesStayBelowOneFrameBetweenCalls() throws {
        let limits = WireLimits(maxFrameSize: 4_096)
        let big = WireMessage.bye(reason: String(repeating: "x", count: 4_000))
        let frame = try encode(big, limits: limits)
        #expect(frame.count == 4 + 2 + 2 + 4_000)
        var decoder = FrameDecoder(limits: limits)
        var stream: [UInt8] = []
        for _ in 0..<20 { stream += frame }
        var received = 0
        var index = 0
        while index < stream.count {
            let chunk = stream[index..<min(stream.count, index + 1_500)]
            index += chunk.count
            decoder.append(chunk)
            received += try Self.drain(&decoder).count
            #expect(decoder.bufferedByteCount < limits.maxFrameSize + WireProtocol.frameHeaderSize)
        }
        #expect(received == 20)
    }

    @Test func errorsAreSticky() {
        var decoder = FrameDecoder()
        decoder.append(rawFrame(type: 0x42, body: []))
        expectWireError(.unknownMessageType(0x42)) { _ = try decoder.nextMessage() }
        decoder.append((try? encode(.ping(1))) ?? [])
        expectWireError(.unknownMessageType(0x42)) { _ = try decoder.nextMessage() }
        #expect(decoder.bufferedByteCount == 0)
    }

    @Test func compressedFramesCanBeRefusedUntilNegotiated() throws {
        let frame = try encode(.batch(WireSamples.largeBatch), compression: true)
        #expect(frame[5] == 1)
        var decoder = FrameDecoder(acceptsCompressedFrames: false)
        decoder.append(frame)
        expectWireError(.compressionNotAllowed(.batch)) { _ = try decoder.nextMessage() }
        var accepting = FrameDecoder()
        accepting.append(frame)
        #expect(try accepting.nextMessage() == .batch(WireSamples.largeBatch))
    }
}
