import NIOCore
import TetherWire

/// Frame bytes in and out of one connection, for the session's progress.
/// Confined to the connection's event loop, like the handlers that count.
final class FrameByteCounter {
    var sent = 0
    var received = 0
}

/// Plaintext bytes (after `TLSHandler`) in, `WireMessage`s out.
///
/// A decoding error is final (the stream cannot be resynchronized): the
/// handler sends an ERROR frame with the error's code straight to the TLS
/// layer, fires the `WireError` up the pipeline (so the session can report
/// it) and closes the channel. Bytes arriving after that are dropped.
final class WireMessageDecoderHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = WireMessage

    private var decoder: FrameDecoder
    private var failed = false
    private let counter: FrameByteCounter?

    init(limits: WireLimits = .default, counter: FrameByteCounter? = nil) {
        decoder = FrameDecoder(
            limits: limits, acceptsCompressedFrames: false, acceptsColumnarBatches: false, acceptsCompactColumns: false)
        self.counter = counter
    }

    /// Called by the session once both HELLOs announced LZ4.
    func acceptCompressedFrames() {
        decoder.acceptsCompressedFrames = true
    }

    /// Called by the session once both HELLOs announced `columnarBatches` (and `compactColumns`, `compact`).
    func acceptColumnarBatches(compact: Bool) {
        decoder.acceptsColumnarBatches = true
        decoder.acceptsCompactColumns = compact
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !failed else { return }
        let buffer = unwrapInboundIn(data)
        counter?.received += buffer.readableBytes
        decoder.append(buffer.readableBytesView)
        while !failed, context.channel.isActive {
            let message: WireMessage?
            do {
                message = try decoder.nextMessage()
            } catch {
                fail(context: context, error: error)
                return
            }
            guard let message else { return }
            context.fireChannelRead(wrapInboundOut(message))
        }
    }

    private func fail(context: ChannelHandlerContext, error: WireError) {
        failed = true
        // Sent below the message encoder, so encoded here (uncompressed: always allowed after HELLO, and HELLO may not
        // have come).
        if let frame = try? FrameEncoder(limits: decoder.limits, compression: false).encode(
            WireMessage.error(reporting: error, limits: decoder.limits))
        {
            context.writeAndFlush(NIOAny(ByteBuffer(bytes: frame)), promise: nil)
        }
        context.fireErrorCaught(error)
        context.close(promise: nil)
    }
}

/// `WireMessage`s in, frame bytes out (LZ4 once the session turns it on).
/// A message that cannot be encoded fails its write promise with the `WireError`.
final class WireMessageEncoderHandler: ChannelOutboundHandler {
    typealias OutboundIn = WireMessage
    typealias OutboundOut = ByteBuffer

    private var encoder: FrameEncoder
    private let counter: FrameByteCounter?

    init(limits: WireLimits = .default, counter: FrameByteCounter? = nil) {
        encoder = FrameEncoder(limits: limits, compression: false)
        self.counter = counter
    }

    /// Called by the session once both HELLOs announced LZ4.
    func enableCompression() {
        encoder.compression = true
    }

    /// Called by the session once both HELLOs announced `columnarBatches` (and `compactColumns`, `compact`).
    func enableColumnarBatches(compact: Bool) {
        encoder.columnarBatches = true
        encoder.compactColumns = compact
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let message = unwrapOutboundIn(data)
        do {
            let frame = try encoder.encode(message)
            counter?.sent += frame.count
            context.write(wrapOutboundOut(ByteBuffer(bytes: frame)), promise: promise)
        } catch {
            promise?.fail(error)
        }
    }
}
