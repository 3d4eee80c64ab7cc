import NIOCore

/// Counts a failed TLS handshake (`tether_sync_tls_handshake_failures_total`): it sits right after
/// the `TLSHandler`, and leaves the pipeline once the handshake has completed.
final class HandshakeFailureCounter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let metrics: SyncMetrics
    private var counted = false

    init(metrics: SyncMetrics) { self.metrics = metrics }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        context.fireUserInboundEventTriggered(event)
        if event is TLSHandshakeCompleted {
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // `TLSHandler` fires one error, then closes; before the handshake completes, that error is its failure.
        if let tls = error as? TLSError, !counted {
            counted = true
            metrics.handshakeFailed(tls)
        }
        context.fireErrorCaught(error)
    }
}
