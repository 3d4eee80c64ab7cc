import CLZ4
import TetherBatch

/// The version this codec speaks, and sizes fixed by the frame layout.
public enum WireProtocol {
    /// The protocol version sent in HELLO; a peer speaking another one is refused. Version 2
    /// negotiates what two peers whose schemas differ both sync (HELLO's renames, PULL's backfill).
    public static let version: UInt64 = 2
    /// The big-endian length that starts every frame.
    public static let frameHeaderSize = 4
    /// Type and flags: the bytes every frame has after its length.
    public static let minimumFrameLength = 2
}

/// The sizes a peer accepts. Every one is enforced when decoding, before
/// memory is allocated for what it bounds, and when encoding, so this side
/// never sends what a peer with the same limits would refuse.
public struct WireLimits: Sendable, Hashable {
    /// The largest frame length (the u32 after which the frame follows: type, flags and body).
    public let maxFrameSize: Int
    /// The largest raw length a compressed body may declare (a decompression bomb is refused before allocating).
    public let maxDecompressedSize: Int
    /// Bodies at least this long are compressed when compression is on and makes them smaller.
    public let compressionThreshold: Int
    /// The largest text field of a message (names, ERROR message, BYE reason), in UTF-8 bytes.
    public let maxStringLength: Int
    /// The largest number of tables a HELLO may describe.
    public let maxTables: Int
    /// The most values a columnar BATCH (batch format 3) may decode to: one per change, plus one
    /// per key value, value and version. Its bytes do not bound that (a run of equal values takes a
    /// few), so this does; its text and blob bytes are bounded by `maxDecompressedSize`, as a
    /// batch of format 1 or 2 is. A batch above either is sent in format 1 or 2.
    public let maxBatchValues: Int

    /// What a columnar batch may decode to under these limits.
    public var columnarLimits: ColumnarLimits {
        ColumnarLimits(maxValues: maxBatchValues, maxValueBytes: maxDecompressedSize)
    }

    public static let `default` = WireLimits()

    /// Values outside what the format (a u32 length) and LZ4 (blocks below
    /// LZ4_MAX_INPUT_SIZE) can express are clamped into range.
    public init(
        maxFrameSize: Int = 16 << 20, maxDecompressedSize: Int = 64 << 20, compressionThreshold: Int = 512,
        maxStringLength: Int = 64 << 10, maxTables: Int = 4096, maxBatchValues: Int = ColumnarLimits.default.maxValues
    ) {
        let lz4Limit = Int(LZ4_MAX_INPUT_SIZE)
        self.maxFrameSize = min(max(WireProtocol.minimumFrameLength, maxFrameSize), lz4Limit)
        self.maxDecompressedSize = min(max(0, maxDecompressedSize), lz4Limit)
        self.compressionThreshold = max(0, compressionThreshold)
        self.maxStringLength = max(0, maxStringLength)
        self.maxTables = max(0, maxTables)
        self.maxBatchValues = max(0, maxBatchValues)
    }
}
