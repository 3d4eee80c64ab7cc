import Foundation
import Testing
import TetherBatch
@testable import TetherWire

/// Every way a frame can be refused, each with its exact error.
@Suite struct LimitTests {
    static let compressedBatch: [UInt8] = BatchCoding.encode(WireSamples.largeBatch)

    /// A compressed BATCH frame with this declared raw length and LZ4 block.
    static func compressedFrame(rawLength: UInt64, block: [UInt8], type: UInt8 = 3) -> [UInt8] {
        rawFrame(type: type, flags: 1, body: uvarintBytes(rawLength) + block)
    }

    @Test func frameLength() {
        for length in [0, 1] {
            expectWireError(.frameTooShort(length: length)) {
                _ = try FrameDecoder.decode(frame: rawFrame(type: 6, body: [], length: length))
            }
        }
        let limit = WireLimits.default.maxFrameSize
        #expect(limit == 16 << 20)
        expectWireError(.frameTooLarge(length: limit + 1, limit: limit)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 6, body: [], length: limit + 1))
        }
        expectWireError(.frameTooLarge(length: 0xFFFF_FFFF, limit: limit)) {
            _ = try FrameDecoder.decode(frame: [0xFF, 0xFF, 0xFF, 0xFF, 6, 0])
        }
        // Exactly at a (small) limit is fine; one above is not, whatever the body.
        let small = WireLimits(maxFrameSize: 10)
        #expect(throws: Never.self) { try FrameDecoder.decode(frame: encode(.ping(7)), limits: small) }
        #expect(throws: Never.self) { try encode(.ping(7), limits: small) }
        expectWireError(.frameTooLarge(length: 11, limit: 10)) {
            _ = try encode(.bye(reason: "12345678"), limits: small)
        }
        expectWireError(.frameTooLarge(length: 11, limit: 10)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 9, body: [8] + Array("12345678".utf8)), limits: small)
        }
    }

    @Test func truncatedAndTrailing() throws {
        let frame = try encode(.ping(9))
        for count in 0..<WireProtocol.frameHeaderSize {
            expectWireError(.truncatedFrame(expected: 4, available: count)) {
                _ = try FrameDecoder.decode(frame: Array(frame.prefix(count)))
            }
        }
        for count in WireProtocol.frameHeaderSize..<frame.count {
            expectWireError(.truncatedFrame(expected: 14, available: count)) {
                _ = try FrameDecoder.decode(frame: Array(frame.prefix(count)))
            }
        }
        expectWireError(.trailingBytes(after: "frame", count: 2)) {
            _ = try FrameDecoder.decode(frame: frame + [0, 0])
        }
        expectWireError(.trailingBytes(after: "ACK body", count: 1)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 4, body: [5, 0]))
        }
        expectWireError(.trailingBytes(after: "PING body", count: 1)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 6, body: Array(repeating: 1, count: 9)))
        }
    }

    /// Every proper prefix of every body is refused: no field is optional.
    @Test func everyCutBodyIsTruncated() throws {
        for message in WireSamples.messages {
            let frame = try encode(message)
            let body = Array(frame[6...])
            for cut in 0..<body.count {
                let cutFrame = rawFrame(type: message.type.rawValue, body: Array(body.prefix(cut)))
                if message.type == .batch {
                    expectWireError(case: "batch") { _ = try FrameDecoder.decode(frame: cutFrame) }
                } else {
                    expectWireError(case: "truncated") { _ = try FrameDecoder.decode(frame: cutFrame) }
                }
            }
        }
        expectWireError(.truncated(field: "ACK.through", offset: 0)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 4, body: []))
        }
        expectWireError(.truncated(field: "ACK.through", offset: 0)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 4, body: [0x80, 0x80]))
        }
        expectWireError(.truncated(field: "PULL.maxChanges", offset: 2)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 2, body: [1, 0]))
        }
        expectWireError(.truncated(field: "BYE.reason", offset: 1)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 9, body: [3, 0x61]))
        }
        expectWireError(.truncated(field: "PONG.nonce", offset: 0)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 7, body: [1, 2, 3]))
        }
        expectWireError(.truncated(field: "DEFERRED.message", offset: 4)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 10, body: [1, 2, 1, 0]))
        }
    }

    @Test func typesAndFlags() throws {
        for type: UInt8 in [0, 14, 0x7F, 0xFF] {
            expectWireError(.unknownMessageType(type)) {
                _ = try FrameDecoder.decode(frame: rawFrame(type: type, body: []))
            }
        }
        for flags: UInt8 in [2, 3, 0x80, 0xFF] {
            expectWireError(.unknownFlags(flags)) {
                _ = try FrameDecoder.decode(frame: rawFrame(type: 6, flags: flags, body: Array(repeating: 0, count: 8)))
            }
        }
        // The type is checked before the flags.
        expectWireError(.unknownMessageType(0)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 0, flags: 0xFF, body: []))
        }
        // HELLO is never compressed.
        let helloBody = Array(try encode(.hello(WireSamples.hello))[6...])
        let compressedHello = Self.compressedFrame(
            rawLength: UInt64(helloBody.count), block: LZ4Block.compress(helloBody) ?? [], type: 1)
        expectWireError(.compressionNotAllowed(.hello)) { _ = try FrameDecoder.decode(frame: compressedHello) }
    }

    @Test func decompression() throws {
        let body = Self.compressedBatch
        let block = try #require(LZ4Block.compress(body))
        // The valid form, for reference.
        #expect(
            try FrameDecoder.decode(frame: Self.compressedFrame(rawLength: UInt64(body.count), block: block))
                == .batch(WireSamples.largeBatch))

        let limit = WireLimits.default.maxDecompressedSize
        #expect(limit == 64 << 20)
        for declared in [UInt64(limit) + 1, 1 << 40, UInt64.max] {
            expectWireError(.decompressedSizeTooLarge(declared: declared, limit: limit)) {
                _ = try FrameDecoder.decode(frame: Self.compressedFrame(rawLength: declared, block: block))
            }
        }
        // At the limit the declared size is believed, and then found false.
        expectWireError(.decompressedSizeMismatch(declared: limit, actual: body.count)) {
            _ = try FrameDecoder.decode(frame: Self.compressedFrame(rawLength: UInt64(limit), block: block))
        }
        expectWireError(.decompressedSizeMismatch(declared: body.count + 1, actual: body.count)) {
            _ = try FrameDecoder.decode(frame: Self.compressedFrame(rawLength: UInt64(body.count + 1), block: block))
        }
        expectWireError(.decompressionFailed(.batch)) {
            _ = try FrameDecoder.decode(frame: Self.compressedFrame(rawLength: UInt64(body.count - 1), block: block))
        }
        var corrupt = block
        corrupt[corrupt.count / 2] ^= 0xFF
        corrupt.removeLast(3)
        expectWireError(.decompressionFailed(.batch)) {
            _ = try FrameDecoder.decode(frame: Self.compressedFrame(rawLength: UInt64(body.count), block: corrupt))
        }
        expectWireError(.decompressionFailed(.batch)) {
            _ = try FrameDecoder.decode(frame: Self.compressedFrame(rawLength: 10, block: []))
        }
        expectWireError(.truncated(field: "BATCH.rawLength", offset: 0)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 3, flags: 1, body: [0x80]))
        }
        expectWireError(case: "malformedBody") {
            _ = try FrameDecoder.decode(
                frame: rawFrame(type: 3, flags: 1, body: Array(repeating: 0xFF, count: 10) + [1]))
        }
        // Decompressed bodies are checked like raw ones.
        let trailing = BatchCoding.encode(WireSamples.emptyBatch) + [0]
        expectWireError(case: "batch") {
            _ = try FrameDecoder.decode(
                frame: Self.compressedFrame(rawLength: UInt64(trailing.count), block: LZ4Block.compress(trailing) ?? [])
            )
        }
    }

    @Test func strings() throws {
        let limit = WireLimits.default.maxStringLength
        #expect(limit == 65_536)
        let atLimit = String(repeating: "é", count: limit / 2)
        #expect(try FrameDecoder.decode(frame: encode(.bye(reason: atLimit))) == .bye(reason: atLimit))
        let over = atLimit + "x"
        expectWireError(.stringTooLong(field: "BYE.reason", length: UInt64(limit + 1), limit: limit)) {
            _ = try encode(.bye(reason: over))
        }
        expectWireError(.stringTooLong(field: "BYE.reason", length: UInt64(limit + 1), limit: limit)) {
            _ = try FrameDecoder.decode(
                frame: rawFrame(type: 9, body: uvarintBytes(UInt64(limit + 1)) + Array(over.utf8)))
        }
        // Refused from the length alone, before the bytes arrive.
        expectWireError(.stringTooLong(field: "ERROR.message", length: 1 << 40, limit: limit)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 8, body: [1] + uvarintBytes(1 << 40)))
        }
        let small = WireLimits(maxStringLength: 3)
        expectWireError(.stringTooLong(field: "HELLO.column name", length: 4, limit: 3)) {
            _ = try encode(
                .hello(
                    Hello(
                        instanceKey: WireSamples.keyA, schemaFingerprint: WireSamples.fingerprint,
                        tables: [TableDescriptor(name: "t", keyColumns: ["long"], valueColumns: [])])), limits: small)
        }
        for bad: [UInt8] in [
            [0xFF], [0xC0, 0x80], [0xED, 0xA0, 0x80], [0x61, 0xE2, 0x82], [0xF4, 0x90, 0x80, 0x80],
        ] {
            expectWireError(.malformedBody(type: .bye, reason: "reason at body byte 0 is not valid UTF-8")) {
                _ = try FrameDecoder.decode(frame: rawFrame(type: 9, body: uvarintBytes(UInt64(bad.count)) + bad))
            }
        }
    }

    @Test func hello() throws {
        let valid = Array(try encode(.hello(WireSamples.hello))[6...])
        // The version is read first: another version is refused before the rest is read.
        for version: UInt64 in [0, 1, 3, .max] {
            expectWireError(.unsupportedProtocolVersion(version)) {
                _ = try FrameDecoder.decode(frame: rawFrame(type: 1, body: uvarintBytes(version) + [0xFF]))
            }
        }
        let prefix = Array(valid.prefix(1 + 16 + 32 + 1))  // version, key, fingerprint, capabilities (1 byte here)
        let limit = WireLimits.default.maxTables
        #expect(limit == 4_096)
        expectWireError(.tooManyTables(count: UInt64(limit + 1), limit: limit)) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 1, body: prefix + uvarintBytes(UInt64(limit + 1))))
        }
        let tooMany = (0...limit).map { TableDescriptor(name: "t\($0)", keyColumns: ["id"], valueColumns: []) }
        expectWireError(.tooManyTables(count: UInt64(limit + 1), limit: limit)) {
            _ = try encode(
                .hello(
                    Hello(instanceKey: WireSamples.keyA, schemaFingerprint: WireSamples.fingerprint, tables: tooMany)))
        }
        func table(_ name: String, _ keys: [String], _ values: [String]) -> [UInt8] {
            var writer = ByteWriter()
            writer.string(name)
            writer.uvarint(UInt64(keys.count))
            keys.forEach { writer.string($0) }
            writer.uvarint(UInt64(values.count))
            values.forEach { writer.string($0) }
            return writer.bytes
        }
        let cases: [([UInt8], String)] = [
            ([2] + table("a", ["id"], []) + table("a", ["id"], []), "table a is listed twice"),
            ([1] + table("a", [], ["v"]), "table a has no key column"),
            ([1] + table("a", ["id"], ["v", "id"]), "table a lists column id twice"),
        ]
        for (tables, reason) in cases {
            expectWireError(.malformedBody(type: .hello, reason: reason)) {
                _ = try FrameDecoder.decode(frame: rawFrame(type: 1, body: prefix + tables))
            }
        }
        for tables in [
            [WireSamples.tables[0], WireSamples.tables[0]],
            [TableDescriptor(name: "x", keyColumns: [], valueColumns: [])],
        ] {
            expectWireError(case: "invalidMessage") {
                _ = try encode(
                    .hello(
                        Hello(instanceKey: WireSamples.keyA, schemaFingerprint: WireSamples.fingerprint, tables: tables)
                    ))
            }
        }
    }

    @Test func numbers() throws {
        // Sequence numbers stop at 2^63-1; limits start at 1.
        expectWireError(.malformedBody(type: .ack, reason: "through 9223372036854775808 is above 2^63-1")) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 4, body: uvarintBytes(1 << 63)))
        }
        expectWireError(.malformedBody(type: .pull, reason: "maxChanges 0 is not between 1 and \(Int.max)")) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 2, body: [0, 0, 0, 1]))
        }
        expectWireError(.malformedBody(type: .pull, reason: "maxBytes 0 is not between 1 and \(Int.max)")) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 2, body: [0, 0, 1, 0]))
        }
        expectWireError(.malformedBody(type: .pull, reason: "unknown flags 0x80")) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 2, body: [0, 0x80, 1, 1]))
        }
        expectWireError(.malformedBody(type: .pull, reason: "backfill through 5 is before after 9")) {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 2, body: [9, 4, 1, 1, 5, 1, 1, 0x74, 0]))
        }
        // An 11th varint byte, or a 10th above 1, overflows 64 bits.
        expectWireError(case: "malformedBody") {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 5, body: Array(repeating: 0xFF, count: 9) + [2]))
        }
        expectWireError(case: "malformedBody") {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 5, body: Array(repeating: 0x80, count: 10) + [0]))
        }
        // The largest ten-byte varint is fine where 64 bits are.
        #expect(
            try FrameDecoder.decode(frame: rawFrame(type: 6, body: Array(repeating: 0xFF, count: 8))) == .ping(.max))
        #expect(
            try FrameDecoder.decode(frame: rawFrame(type: 4, body: Array(repeating: 0xFF, count: 8) + [0x7F]))
                == .ack(through: .max))
        // Encoding refuses what decoding would.
        for message in [
            WireMessage.ack(through: -1), .changed(latest: .min), .pull(Pull(after: -5, maxChanges: 1, maxBytes: 1)),
            .pull(Pull(after: 0, maxChanges: 0, maxBytes: 1)), .pull(Pull(after: 0, maxChanges: 1, maxBytes: -1)),
        ] {
            expectWireError(case: "invalidMessage") { _ = try encode(message) }
        }
    }

    @Test func batches() throws {
        expectWireError(
            .batch(
                BatchDecodingError.malformed(
                    offset: 3, reason: "not a Tether change batch (bad magic or format version)"))
        ) {
            _ = try FrameDecoder.decode(
                frame: rawFrame(type: 3, body: Array("TB\u{5}".utf8) + Array(repeating: 0, count: 30)))
        }
        expectWireError(case: "batch") {
            _ = try FrameDecoder.decode(
                frame: rawFrame(type: 3, body: BatchCoding.encode(WireSamples.smallBatch) + [0]))
        }
        // A batch whose changes do not match their tables is not sent.
        var batch = WireSamples.smallBatch
        batch.changes[0].values.append(.null)
        expectWireError(case: "invalidMessage") { _ = try encode(.batch(batch)) }
        batch = WireSamples.smallBatch
        batch.changes[2].versions.removeLast()
        expectWireError(case: "invalidMessage") { _ = try encode(.batch(batch)) }
        batch = WireSamples.smallBatch
        batch.changes[1].table = 7
        expectWireError(case: "invalidMessage") { _ = try encode(.batch(batch)) }
        batch = WireSamples.smallBatch
        batch.tables[0].keyColumns = []
        expectWireError(case: "invalidMessage") { _ = try encode(.batch(batch)) }
    }

    @Test func limitsAreClampedToWhatTheFormatExpresses() {
        let limits = WireLimits(
            maxFrameSize: 0, maxDecompressedSize: .max, compressionThreshold: -1, maxStringLength: -1, maxTables: -1)
        #expect(limits.maxFrameSize == 2)
        #expect(limits.maxDecompressedSize == 0x7E00_0000)
        #expect(limits.compressionThreshold == 0 && limits.maxStringLength == 0 && limits.maxTables == 0)
        #expect(WireLimits(maxFrameSize: .max).maxFrameSize == 0x7E00_0000)
    }
}
