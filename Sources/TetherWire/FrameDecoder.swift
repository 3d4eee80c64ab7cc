import TetherBatch

/// Cuts a byte stream into frames and decodes each into a message.
///
/// Feed it whatever arrives (`append`), then call `nextMessage` until it
/// returns nil (more bytes needed). Between those two steps, the bytes it
/// holds unparsed are fewer than `maxFrameSize + 4`: a length above the
/// limit is refused as soon as its 4 bytes arrive, before the body does.
/// After an error the stream cannot be resynchronized: every later call
/// throws the same error, and the connection should be closed (after
/// sending `WireMessage.error(reporting:)`).
public struct FrameDecoder: Sendable {
    public let limits: WireLimits
    /// False until both peers' HELLOs announced LZ4: a compressed frame is then an error.
    public var acceptsCompressedFrames: Bool
    /// False until both peers' HELLOs announced `columnarBatches`: a BATCH in batch format 3 is
    /// then refused by its magic, as a reader of formats 1 and 2 refuses it.
    public var acceptsColumnarBatches: Bool
    /// False until both peers' HELLOs announced `compactColumns` too: a BATCH in batch format 4 is
    /// then refused by its magic.
    public var acceptsCompactColumns: Bool

    private var buffer: [UInt8] = []
    /// Start of the first unparsed byte in `buffer`.
    private var readIndex = 0
    private var failure: WireError?

    public init(
        limits: WireLimits = .default, acceptsCompressedFrames: Bool = true, acceptsColumnarBatches: Bool = true,
        acceptsCompactColumns: Bool = true
    ) {
        self.limits = limits
        self.acceptsCompressedFrames = acceptsCompressedFrames
        self.acceptsColumnarBatches = acceptsColumnarBatches
        self.acceptsCompactColumns = acceptsCompactColumns
    }

    /// The bytes received and not yet decoded.
    public var bufferedByteCount: Int { buffer.count - readIndex }

    public mutating func append(_ bytes: some Sequence<UInt8>) {
        guard failure == nil else { return }
        if readIndex > 0 {
            buffer.removeFirst(readIndex)
            readIndex = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// The next complete message, or nil until more bytes arrive.
    public mutating func nextMessage() throws(WireError) -> WireMessage? {
        if let failure { throw failure }
        do {
            guard bufferedByteCount >= WireProtocol.frameHeaderSize else { return nil }
            let length = try Self.frameLength(
                buffer[readIndex..<readIndex + WireProtocol.frameHeaderSize], limits: limits)
            let end = readIndex + WireProtocol.frameHeaderSize + length
            guard buffer.count >= end else { return nil }
            let start = readIndex + WireProtocol.frameHeaderSize
            let message = try buffer.withBytes { (bytes) throws(WireError) in
                try Self.decodePayload(
                    UnsafeRawBufferPointer(rebasing: bytes[start..<end]), limits: limits,
                    acceptsCompressedFrames: acceptsCompressedFrames, acceptsColumnarBatches: acceptsColumnarBatches,
                    acceptsCompactColumns: acceptsCompactColumns)
            }
            consume(through: end)
            return message
        } catch {
            failure = error as WireError
            buffer = []
            readIndex = 0
            throw error
        }
    }

    private mutating func consume(through end: Int) {
        readIndex = end
        guard readIndex == buffer.count else { return }
        // Keep a small buffer's storage for the next frame; give back a large one.
        if buffer.capacity > 1 << 20 { buffer = [] } else { buffer.removeAll(keepingCapacity: true) }
        readIndex = 0
    }

    /// Decodes exactly one complete frame: no more, no fewer bytes.
    public static func decode(
        frame: [UInt8], limits: WireLimits = .default, acceptsCompressedFrames: Bool = true,
        acceptsColumnarBatches: Bool = true, acceptsCompactColumns: Bool = true
    ) throws(WireError) -> WireMessage {
        let header = WireProtocol.frameHeaderSize
        guard frame.count >= header else { throw WireError.truncatedFrame(expected: header, available: frame.count) }
        let length = try frameLength(frame[0..<header], limits: limits)
        guard frame.count >= header + length else {
            throw WireError.truncatedFrame(expected: header + length, available: frame.count)
        }
        guard frame.count == header + length else {
            throw WireError.trailingBytes(after: "frame", count: frame.count - header - length)
        }
        return try frame.withBytes { (bytes) throws(WireError) in
            try decodePayload(
                UnsafeRawBufferPointer(rebasing: bytes[header...]), limits: limits,
                acceptsCompressedFrames: acceptsCompressedFrames,
                acceptsColumnarBatches: acceptsColumnarBatches, acceptsCompactColumns: acceptsCompactColumns)
        }
    }

    /// The big-endian length field, refused outside 2...maxFrameSize.
    private static func frameLength(_ header: ArraySlice<UInt8>, limits: WireLimits) throws(WireError) -> Int {
        let length = header.reduce(0) { $0 << 8 | Int($1) }
        guard length >= WireProtocol.minimumFrameLength else { throw WireError.frameTooShort(length: length) }
        guard length <= limits.maxFrameSize else {
            throw WireError.frameTooLarge(length: length, limit: limits.maxFrameSize)
        }
        return length
    }

    /// Type, flags and body (the bytes the length counts).
    private static func decodePayload(
        _ payload: UnsafeRawBufferPointer, limits: WireLimits, acceptsCompressedFrames: Bool,
        acceptsColumnarBatches: Bool, acceptsCompactColumns: Bool
    ) throws(WireError) -> WireMessage {
        guard let type = MessageType(rawValue: payload[0]) else { throw WireError.unknownMessageType(payload[0]) }
        let flags = payload[1]
        guard flags & ~FrameFlags.compressed == 0 else { throw WireError.unknownFlags(flags) }
        let body = UnsafeRawBufferPointer(rebasing: payload[2...])
        guard flags & FrameFlags.compressed != 0 else {
            return try MessageBodyCoding.decode(
                type, body: body, limits: limits, columnarBatches: acceptsColumnarBatches,
                compactColumns: acceptsCompactColumns)
        }

        guard acceptsCompressedFrames, type != .hello else { throw WireError.compressionNotAllowed(type) }
        let raw = try decompress(body, type: type, limits: limits)
        return try raw.withBytes { (bytes) throws(WireError) in
            try MessageBodyCoding.decode(
                type, body: bytes, limits: limits, columnarBatches: acceptsColumnarBatches,
                compactColumns: acceptsCompactColumns)
        }
    }

    /// `uvarint rawLength` then an LZ4 block producing exactly rawLength bytes.
    private static func decompress(_ body: UnsafeRawBufferPointer, type: MessageType, limits: WireLimits)
        throws(WireError) -> [UInt8]
    {
        var fields = MessageFieldReader(body, type: type, limits: limits)
        let rawLength = try fields.uvarint("rawLength")
        // Checked before allocating: a small frame must not make us reserve gigabytes.
        guard rawLength <= UInt64(limits.maxDecompressedSize) else {
            throw WireError.decompressedSizeTooLarge(declared: rawLength, limit: limits.maxDecompressedSize)
        }
        return try LZ4Block.decompress(
            UnsafeRawBufferPointer(rebasing: body[fields.offset...]), rawLength: Int(rawLength), type: type)
    }
}

private extension Array where Element == UInt8 {
    /// withUnsafeBytes for a typed-throwing body (withUnsafeBytes itself rethrows untyped errors).
    func withBytes<Result>(_ body: (UnsafeRawBufferPointer) throws(WireError) -> Result) throws(WireError) -> Result {
        let outcome = withUnsafeBytes { bytes -> Swift.Result<Result, WireError> in
            do throws(WireError) { return .success(try body(bytes)) } catch { return .failure(error) }
        }
        return try outcome.get()
    }
}
