import CLZ4

/// LZ4 block format (not the LZ4 frame format): the bytes of
/// LZ4_compress_default, read back by LZ4_decompress_safe.
enum LZ4Block {
    /// The compressed block, or nil when the input is too large for LZ4.
    static func compress(_ input: [UInt8]) -> [UInt8]? {
        guard input.count <= Int(LZ4_MAX_INPUT_SIZE) else { return nil }
        let bound = Int(LZ4_compressBound(Int32(input.count)))
        guard bound > 0 else { return nil }
        let output = input.withUnsafeBytes { source in
            [UInt8](unsafeUninitializedCapacity: bound) { destination, initialized in
                let written = LZ4_compress_default(
                    source.baseAddress?.assumingMemoryBound(to: CChar.self),
                    UnsafeMutableRawPointer(destination.baseAddress)?.assumingMemoryBound(to: CChar.self),
                    Int32(input.count), Int32(bound))
                initialized = max(0, Int(written))
            }
        }
        return output.isEmpty ? nil : output
    }

    /// Decompresses `block`, which must produce exactly `rawLength` bytes
    /// (checked against the limit by the caller, before this allocates it).
    static func decompress(_ block: UnsafeRawBufferPointer, rawLength: Int, type: MessageType) throws(WireError)
        -> [UInt8]
    {
        guard let source = block.baseAddress, block.count >= 1, block.count <= Int(LZ4_MAX_INPUT_SIZE),
            rawLength <= Int(LZ4_MAX_INPUT_SIZE)
        else {
            throw WireError.decompressionFailed(type)
        }
        // Capacity is exactly rawLength: LZ4 fails rather than write past it.
        var produced: Int32 = -1
        let output = [UInt8](unsafeUninitializedCapacity: max(1, rawLength)) { destination, initialized in
            produced = LZ4_decompress_safe(
                source.assumingMemoryBound(to: CChar.self),
                UnsafeMutableRawPointer(destination.baseAddress)?.assumingMemoryBound(to: CChar.self),
                Int32(block.count), Int32(rawLength))
            initialized = max(0, Int(produced))
        }
        guard produced >= 0 else { throw WireError.decompressionFailed(type) }
        guard output.count == rawLength else {
            throw WireError.decompressedSizeMismatch(declared: rawLength, actual: output.count)
        }
        return output
    }
}
