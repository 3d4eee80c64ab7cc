import TetherBatch

/// The code an ERROR frame carries: why the sender is closing the connection.
/// A received code this version does not know is read as `.internal`.
public enum WireErrorCode: UInt64, Sendable, CaseIterable {
    /// The peers speak no common protocol version.
    case protocolVersion = 1
    /// The synced schemas differ (the message names the table and column).
    case schemaMismatch = 2
    /// Unknown instance key or schema fingerprint for this server.
    case unauthorized = 3
    /// The peer may pull but not push.
    case readOnly = 4
    /// The peer sent or asked for a table it may not sync.
    case tableNotAllowed = 5
    /// A frame or message that does not follow the protocol.
    case malformedFrame = 6
    /// A frame above the receiver's size limit.
    case frameTooLarge = 7
    /// A compressed body that could not be decompressed, or declared too large a size.
    case decompressionFailed = 8
    /// A well-formed batch the receiver failed to apply.
    case batchRejected = 9
    /// The peer did not answer in time.
    case timeout = 10
    /// Anything else on the sender's side.
    case `internal` = 11
}

/// Why bytes are not a valid frame (decoding), or a message cannot be sent
/// (encoding). Offsets in field errors count from the start of the message
/// body (after decompression, for a compressed frame).
public enum WireError: Error, Sendable, Equatable, CustomStringConvertible {
    // Framing
    /// The frame's length field is below 2 (every frame has a type and flags byte).
    case frameTooShort(length: Int)
    /// The frame's length field (or, when encoding, the frame) exceeds `maxFrameSize`.
    case frameTooLarge(length: Int, limit: Int)
    /// A single frame given to `FrameDecoder.decode(frame:)` has fewer bytes than its header says.
    case truncatedFrame(expected: Int, available: Int)
    /// Bytes follow a complete frame given alone, or a message body's last field.
    case trailingBytes(after: String, count: Int)
    case unknownMessageType(UInt8)
    /// Flag bits other than bit 0 (compression) are set.
    case unknownFlags(UInt8)
    /// A compressed HELLO, or a compressed frame when LZ4 was not negotiated.
    case compressionNotAllowed(MessageType)

    // Compression
    /// A compressed body declares a raw length above `maxDecompressedSize`.
    case decompressedSizeTooLarge(declared: UInt64, limit: Int)
    /// The LZ4 block is corrupt, or decompresses to more than its declared raw length.
    case decompressionFailed(MessageType)
    /// The LZ4 block decompresses to fewer bytes than its declared raw length.
    case decompressedSizeMismatch(declared: Int, actual: Int)

    // Message fields
    /// The body ends inside `field`, which starts at body byte `offset`.
    case truncated(field: String, offset: Int)
    /// A text field's declared length exceeds `maxStringLength`.
    case stringTooLong(field: String, length: UInt64, limit: Int)
    /// A HELLO describes more than `maxTables` tables.
    case tooManyTables(count: UInt64, limit: Int)
    /// A HELLO from a peer speaking another protocol version.
    case unsupportedProtocolVersion(UInt64)
    /// A field's value is not allowed (bad UTF-8, zero limit, unknown flag bits, …).
    case malformedBody(type: MessageType, reason: String)
    /// A BATCH body that is not a valid change batch.
    case batch(BatchDecodingError)

    // Encoding
    /// A message that cannot be sent: a value out of range or an inconsistent batch.
    case invalidMessage(type: MessageType, reason: String)

    /// The code of the ERROR frame to send before closing because of this error.
    public var code: WireErrorCode {
        switch self {
        case .unsupportedProtocolVersion: return .protocolVersion
        case .frameTooLarge: return .frameTooLarge
        case .decompressedSizeTooLarge, .decompressionFailed, .decompressedSizeMismatch: return .decompressionFailed
        case .invalidMessage: return .internal
        case .frameTooShort, .truncatedFrame, .trailingBytes, .unknownMessageType, .unknownFlags,
            .compressionNotAllowed,
            .truncated, .stringTooLong, .tooManyTables, .malformedBody, .batch:
            return .malformedFrame
        }
    }

    public var description: String {
        switch self {
        case let .frameTooShort(length):
            return "frame length \(length) is below the minimum of \(WireProtocol.minimumFrameLength) (type and flags)"
        case let .frameTooLarge(length, limit):
            return "frame length \(length) exceeds the limit of \(limit) bytes"
        case let .truncatedFrame(expected, available):
            return "truncated frame: \(expected) byte(s) expected, \(available) present"
        case let .trailingBytes(after, count):
            return "\(count) unexpected byte(s) after the \(after)"
        case let .unknownMessageType(type):
            return "unknown message type \(type)"
        case let .unknownFlags(flags):
            return "unknown frame flags 0x\(String(flags, radix: 16)) (only bit 0, compression, is defined)"
        case let .compressionNotAllowed(type):
            return type == .hello
                ? "HELLO must not be compressed" : "compressed \(type) frame, but LZ4 was not negotiated"
        case let .decompressedSizeTooLarge(declared, limit):
            return "compressed body declares \(declared) raw bytes, above the limit of \(limit)"
        case let .decompressionFailed(type):
            return "the LZ4 block of a \(type) frame is corrupt or larger than its declared raw length"
        case let .decompressedSizeMismatch(declared, actual):
            return "compressed body declares \(declared) raw bytes but decompresses to \(actual)"
        case let .truncated(field, offset):
            return "message body ends inside \(field) (starting at body byte \(offset))"
        case let .stringTooLong(field, length, limit):
            return "\(field) is \(length) bytes long, above the limit of \(limit)"
        case let .tooManyTables(count, limit):
            return "HELLO describes \(count) tables, above the limit of \(limit)"
        case let .unsupportedProtocolVersion(version):
            return "protocol version \(version) is not supported (this peer speaks version \(WireProtocol.version))"
        case let .malformedBody(type, reason):
            return "malformed \(type) body: \(reason)"
        case let .batch(error):
            return "malformed BATCH body: \(error)"
        case let .invalidMessage(type, reason):
            return "cannot encode \(type): \(reason)"
        }
    }
}
