import TetherBatch

/// Turns messages into frames: length, type, flags, then the body, compressed
/// when that is on, the body is long enough and compression makes it smaller.
public struct FrameEncoder: Sendable {
    public let limits: WireLimits
    /// Set once both peers' HELLOs announced LZ4. HELLO itself is never compressed.
    public var compression: Bool
    /// Set once both peers' HELLOs announced `columnarBatches`: BATCH bodies are written in batch
    /// format 3, unless a batch decodes to more than `limits.columnarLimits` allow (then in 1 or 2).
    public var columnarBatches: Bool
    /// Set too once both announced `compactColumns`: format 4 instead of 3.
    public var compactColumns: Bool

    public init(
        limits: WireLimits = .default, compression: Bool, columnarBatches: Bool = false, compactColumns: Bool = false
    ) {
        self.limits = limits
        self.compression = compression
        self.columnarBatches = columnarBatches
        self.compactColumns = compactColumns
    }

    public func encode(_ message: WireMessage) throws(WireError) -> [UInt8] {
        var frame: [UInt8] = []
        try encode(message, into: &frame)
        return frame
    }

    /// Appends the frame to `buffer`; on error `buffer` is left as it was.
    public func encode(_ message: WireMessage, into buffer: inout [UInt8]) throws(WireError) {
        var body = ByteWriter()
        try MessageBodyCoding.encode(
            message, into: &body, limits: limits, columnarBatches: columnarBatches, compactColumns: compactColumns)
        let (payload, compressed) = compressedIfSmaller(body.bytes, type: message.type)

        let length = 2 + payload.count
        guard length <= limits.maxFrameSize else {
            throw WireError.frameTooLarge(length: length, limit: limits.maxFrameSize)
        }
        buffer.reserveCapacity(buffer.count + WireProtocol.frameHeaderSize + length)
        for shift in stride(from: 24, through: 0, by: -8) { buffer.append(UInt8(truncatingIfNeeded: length >> shift)) }
        buffer.append(message.type.rawValue)
        buffer.append(compressed ? FrameFlags.compressed : 0)
        buffer.append(contentsOf: payload)
    }

    /// The body to send and whether it is compressed: `uvarint rawLength`
    /// then the LZ4 block, when that is shorter than the raw body.
    private func compressedIfSmaller(_ body: [UInt8], type: MessageType) -> ([UInt8], Bool) {
        guard compression, type != .hello, body.count >= limits.compressionThreshold,
            body.count <= limits.maxDecompressedSize,
            let block = LZ4Block.compress(body)
        else {
            return (body, false)
        }
        var compressed = ByteWriter()
        compressed.uvarint(UInt64(body.count))
        guard compressed.bytes.count + block.count < body.count else { return (body, false) }
        compressed.append(block)
        return (compressed.bytes, true)
    }
}

enum FrameFlags {
    static let compressed: UInt8 = 1
}
