// libFuzzer entry for the wire codec: built by Scripts/fuzz.sh with
// `swiftc -sanitize=fuzzer,address`, together with TetherBatch and TetherWire.
//
// Each input is decoded as one frame and, cut into pieces, as a stream, under
// the default limits and under small ones. The decoder must return or throw
// (never crash, hang or read out of bounds: ASan watches), and what it
// returns must encode again into a frame that decodes to the same encoding.
import TetherWire

private let smallLimits = WireLimits(
    maxFrameSize: 512, maxDecompressedSize: 1_024, compressionThreshold: 16,
    maxStringLength: 40, maxTables: 3)

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrameDecoder(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))
    for limits in [WireLimits.default, smallLimits] {
        if let message = try? FrameDecoder.decode(frame: bytes, limits: limits) {
            checkReencodes(message, limits: limits)
        }
        streamDecode(bytes, limits: limits)
    }
    return 0
}

/// The stream decoder, fed in pieces whose sizes come from the input itself.
private func streamDecode(_ bytes: [UInt8], limits: WireLimits) {
    var decoder = FrameDecoder(limits: limits)
    var index = 0
    var step = Int(bytes[0] % 61) + 1
    while index < bytes.count {
        let end = min(bytes.count, index + step)
        decoder.append(bytes[index..<end])
        step = Int(bytes[end - 1] % 61) + 1
        index = end
        var messages = 0
        do {
            while let message = try decoder.nextMessage() {
                messages += 1
                precondition(messages <= bytes.count, "more messages than bytes")
                checkReencodes(message, limits: limits)
            }
        } catch {
            return
        }
        precondition(
            decoder.bufferedByteCount < limits.maxFrameSize + WireProtocol.frameHeaderSize, "buffered more than a frame"
        )
    }
}

/// A decoded message is sendable again, and its encoding is stable.
private func checkReencodes(_ message: WireMessage, limits: WireLimits) {
    for compression in [false, true] {
        let encoder = FrameEncoder(limits: limits, compression: compression)
        let frame: [UInt8]
        do {
            frame = try encoder.encode(message)
        } catch .frameTooLarge {
            continue  // a compressed input may hold a body that does not fit raw, or that LZ4 packs less tightly
        } catch {
            preconditionFailure("decoded \(message) but cannot encode it: \(error)")
        }
        do {
            let again = try FrameDecoder.decode(frame: frame, limits: limits)
            let reencoded = try encoder.encode(again)
            precondition(reencoded == frame, "re-encoding \(message) is not stable")
        } catch {
            preconditionFailure("the encoding of \(message) does not decode: \(error)")
        }
    }
}
