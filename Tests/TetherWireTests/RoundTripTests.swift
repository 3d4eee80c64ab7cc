import Foundation
import Testing
import TetherBatch
@testable import TetherWire

/// Every message survives encoding and decoding, compressed or not.
@Suite struct RoundTripTests {
    @Test(arguments: [false, true])
    func everyMessageRoundTrips(compression: Bool) throws {
        for message in WireSamples.messages {
            let frame = try encode(message, compression: compression)
            #expect(try FrameDecoder.decode(frame: frame) == message, "\(message.type)")
        }
        // Every type is covered.
        #expect(Set(WireSamples.messages.map(\.type)) == Set(MessageType.allCases))
    }

    @Test func frameLayoutIsLengthTypeFlagsBody() throws {
        #expect(try encode(.ping(0x0102_0304_0506_0708)) == [0, 0, 0, 10, 6, 0, 1, 2, 3, 4, 5, 6, 7, 8])
        #expect(try encode(.ack(through: 300)) == [0, 0, 0, 4, 4, 0, 0xac, 0x02])
        #expect(try encode(.bye(reason: "")) == [0, 0, 0, 3, 9, 0, 0])
        #expect(try encode(.error(code: .timeout, message: "slow")) == [0, 0, 0, 8, 8, 0, 10, 4] + Array("slow".utf8))
        #expect(
            try encode(.pull(Pull(after: 1, resumingResync: true, maxChanges: 2, maxBytes: 128)))
                == [0, 0, 0, 7, 2, 0, 1, 1, 2, 0x80, 0x01])
        // A BATCH body is exactly BatchCoding's bytes.
        let body = BatchCoding.encode(WireSamples.smallBatch)
        #expect(try encode(.batch(WireSamples.smallBatch)) == rawFrame(type: 3, body: body))
    }

    @Test func encodeIntoAppendsAndLeavesBufferAloneOnError() throws {
        let encoder = FrameEncoder(compression: true)
        var buffer: [UInt8] = [0xAA]
        try encoder.encode(.ping(1), into: &buffer)
        try encoder.encode(.pong(1), into: &buffer)
        #expect(buffer == [0xAA] + (try encoder.encode(.ping(1))) + (try encoder.encode(.pong(1))))
        let before = buffer
        #expect(throws: WireError.self) { try encoder.encode(.ack(through: -1), into: &buffer) }
        #expect(buffer == before)
    }

    @Test func nanAndNegativeZeroSurviveByBitPattern() throws {
        let batch = ChangeBatch(
            source: WireSamples.keyA, after: 0, through: 1, isLast: true,
            tables: [TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["a", "b"])],
            changes: [
                RowChange(
                    table: 0, key: [.integer(1)], isAlive: true,
                    existence: Version(timestamp: WireSamples.timestamp(0), origin: WireSamples.keyA),
                    values: [.real(.nan), .real(-0.0)], versions: [], sequence: 1)
            ])
        let frame = try encode(.batch(batch))
        guard case let .batch(decoded) = try FrameDecoder.decode(frame: frame) else {
            Issue.record("not a batch"); return
        }
        guard case let .real(nan) = decoded.changes.first?.values[0],
            case let .real(zero) = decoded.changes.first?.values[1]
        else {
            Issue.record("values changed type"); return
        }
        #expect(nan.isNaN && zero.bitPattern == (-0.0 as Double).bitPattern)
        #expect(try encode(.batch(decoded)) == frame)
    }

    @Test func helloWithManyTablesUpToTheLimit() throws {
        let tables = (0..<WireLimits.default.maxTables).map {
            TableDescriptor(name: "table_\($0)", keyColumns: ["id"], valueColumns: ["a", "b"])
        }
        let hello = WireMessage.hello(
            Hello(instanceKey: WireSamples.keyA, schemaFingerprint: WireSamples.fingerprint, tables: tables))
        #expect(try FrameDecoder.decode(frame: encode(hello, compression: true)) == hello)
    }

    @Test func unknownCapabilitiesAreKeptAndDropOutOfNegotiation() throws {
        var hello = WireSamples.hello
        hello.capabilities = Capabilities(rawValue: 0b1000_0000_0001)
        let decoded = try FrameDecoder.decode(frame: encode(.hello(hello)))
        #expect(decoded == .hello(hello))
        #expect(hello.capabilities.negotiated(with: .supported) == .lz4)
        #expect(Capabilities.supported.negotiated(with: [.livePush]) == .livePush)
        #expect(Capabilities.supported.negotiated(with: []) == [])
    }

    @Test func unknownErrorCodesReadAsInternal() throws {
        let frame = rawFrame(type: 8, body: uvarintBytes(999) + [2] + Array("hi".utf8))
        #expect(try FrameDecoder.decode(frame: frame) == .error(code: .internal, message: "hi"))
        #expect(
            try FrameDecoder.decode(frame: rawFrame(type: 8, body: [0, 0])) == .error(code: .internal, message: ""))
        for code in WireErrorCode.allCases {
            #expect(
                try FrameDecoder.decode(frame: encode(.error(code: code, message: "x")))
                    == .error(code: code, message: "x"))
        }
    }

    @Test func errorMessageForAWireErrorFitsTheLimit() throws {
        let limits = WireLimits(maxStringLength: 20)
        let message = WireMessage.error(reporting: .frameTooLarge(length: 99_999_999, limit: 16), limits: limits)
        guard case let .error(code, text) = message else { Issue.record("not an error"); return }
        #expect(code == .frameTooLarge)
        #expect(text == "frame length 9999999")
        #expect(try FrameDecoder.decode(frame: encode(message, limits: limits), limits: limits) == message)
        // Cut at a character boundary, never inside a UTF-8 sequence.
        #expect(WireMessage.truncatedUTF8("aé€👋", maxBytes: 5) == "aé")
        #expect(WireMessage.truncatedUTF8("aé€👋", maxBytes: 6) == "aé€")
    }

    @Test func errorsMapToTheirCodes() {
        let cases: [(WireError, WireErrorCode)] = [
            (.unsupportedProtocolVersion(2), .protocolVersion),
            (.frameTooLarge(length: 1, limit: 0), .frameTooLarge),
            (.decompressedSizeTooLarge(declared: 1, limit: 0), .decompressionFailed),
            (.decompressionFailed(.batch), .decompressionFailed),
            (.decompressedSizeMismatch(declared: 2, actual: 1), .decompressionFailed),
            (.frameTooShort(length: 0), .malformedFrame),
            (.truncatedFrame(expected: 1, available: 0), .malformedFrame),
            (.trailingBytes(after: "frame", count: 1), .malformedFrame),
            (.unknownMessageType(0), .malformedFrame),
            (.unknownFlags(2), .malformedFrame),
            (.compressionNotAllowed(.hello), .malformedFrame),
            (.truncated(field: "ACK.through", offset: 0), .malformedFrame),
            (.stringTooLong(field: "BYE.reason", length: 2, limit: 1), .malformedFrame),
            (.tooManyTables(count: 2, limit: 1), .malformedFrame),
            (.malformedBody(type: .pull, reason: "x"), .malformedFrame),
            (.batch(BatchDecodingError.malformed(offset: 0, reason: "x")), .malformedFrame),
            (.invalidMessage(type: .ack, reason: "x"), .internal),
        ]
        for (error, code) in cases {
            #expect(error.code == code, "\(error)")
            #expect(!error.description.isEmpty)
        }
    }
}
