import COpenSSL
import NIOCore

/// TLS for one channel, put first in its pipeline: ciphertext below, plaintext above.
///
/// It owns an OpenSSL `SSL` object that talks to two memory BIOs: bytes from the
/// network are written into the read BIO and `SSL_read` turns them into plaintext
/// for the next handler; plaintext written by the handlers above goes through
/// `SSL_write`, and whatever OpenSSL put in the write BIO is sent to the network.
///
/// - The handshake starts when the channel becomes active (a client sends its
///   ClientHello; a server waits for one). Application writes made before it
///   completes are held and sent, in order, once it has.
/// - On success it fires ``TLSHandshakeCompleted`` (the peer's fingerprint and
///   subject) before any application data.
/// - On failure it fires a ``TLSError`` (`errorCaught`), sends the TLS alert
///   OpenSSL produced, if any, and closes the channel. No application data is
///   delivered after that.
/// - `close()` sends close_notify and waits (at most `shutdownTimeout`) for the
///   peer's before closing the socket. A close_notify from the peer fires
///   ``TLSCloseNotifyReceived``, is answered, and the channel is closed.
///
/// Not thread-safe, like every channel handler: it is used on its channel's event loop only.
public final class TLSHandler: ChannelDuplexHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    private enum State {
        /// Not yet active.
        case idle
        case handshaking
        case active
        /// close(mode: .output) sent close_notify; reading goes on.
        case outputClosed
        /// close() sent close_notify and waits for the peer's.
        case closing
        /// Closed, failed or closing the socket: nothing more goes through.
        case closed
    }

    /// The most plaintext handed to `SSL_write` in one call.
    private static let writeChunk = 1 << 16
    private static let readChunk = 1 << 14

    private let tlsContext: TLSContext
    private let ssl: OpaquePointer
    private let readBIO: OpaquePointer
    private let writeBIO: OpaquePointer
    private let verification: TLSVerificationState
    private let handshakeTimeout: TimeAmount
    private let shutdownTimeout: TimeAmount

    private var state: State = .idle
    private var sawFirstBytes = false
    private var heldWrites: [(ByteBuffer, EventLoopPromise<Void>?)] = []
    private var heldFlush = false
    private var closePromise: EventLoopPromise<Void>?
    private var timer: Scheduled<Void>?

    /// What the handshake established; nil until it completes.
    public private(set) var handshake: TLSHandshakeCompleted?

    /// - Parameters:
    ///   - context: the shared context; its configuration's role decides client or server.
    ///   - handshakeTimeout: how long the handshake may take before the connection is dropped.
    ///   - shutdownTimeout: how long `close()` waits for the peer's close_notify.
    public init(
        context: TLSContext, handshakeTimeout: TimeAmount = .seconds(10), shutdownTimeout: TimeAmount = .seconds(5)
    ) throws(TLSError) {
        ERR_clear_error()
        guard let ssl = SSL_new(context.sslContext) else {
            throw .openSSLFailure(
                operation: "create an SSL connection", reason: OpenSSL.drainErrorText(fallback: "SSL_new failed"))
        }
        guard let readBIO = BIO_new(BIO_s_mem()) else {
            SSL_free(ssl)
            throw .openSSLFailure(
                operation: "create a memory BIO", reason: OpenSSL.drainErrorText(fallback: "BIO_new failed"))
        }
        guard let writeBIO = BIO_new(BIO_s_mem()) else {
            BIO_free(readBIO)
            SSL_free(ssl)
            throw .openSSLFailure(
                operation: "create a memory BIO", reason: OpenSSL.drainErrorText(fallback: "BIO_new failed"))
        }
        // An empty BIO means "wait for more", not end of file.
        _ = tether_bio_set_mem_eof_return(readBIO, -1)
        _ = tether_bio_set_mem_eof_return(writeBIO, -1)
        SSL_set_bio(ssl, readBIO, writeBIO)  // the SSL object owns both BIOs now

        let configuration = context.configuration
        switch configuration.role {
        case .server:
            SSL_set_accept_state(ssl)
        case .client:
            SSL_set_connect_state(ssl)
            if let name = configuration.expectedServerName {
                let ok: Bool
                if isIPAddress(name) {
                    ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1
                } else {
                    ok = SSL_set1_host(ssl, name) == 1 && tether_ssl_set_tlsext_host_name(ssl, name) == 1
                }
                guard ok else {
                    SSL_free(ssl)
                    throw .openSSLFailure(
                        operation: "set the expected server name \"\(name)\"",
                        reason: OpenSSL.drainErrorText(fallback: "OpenSSL refused the name"))
                }
            }
        }

        let verification = TLSVerificationState(pins: context.pinnedPeerFingerprints)
        guard SSL_set_ex_data(ssl, 0, Unmanaged.passUnretained(verification).toOpaque()) == 1 else {
            SSL_free(ssl)
            throw .openSSLFailure(
                operation: "attach the verification state",
                reason: OpenSSL.drainErrorText(fallback: "SSL_set_ex_data failed"))
        }
        self.tlsContext = context
        self.ssl = ssl
        self.readBIO = readBIO
        self.writeBIO = writeBIO
        self.verification = verification
        self.handshakeTimeout = handshakeTimeout
        self.shutdownTimeout = shutdownTimeout
    }

    deinit {
        SSL_free(ssl)  // frees both BIOs
    }

    // MARK: Lifecycle

    public func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { startHandshake(context: context) }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        cancelTimer()
        failHeldWrites(TLSError.connectionClosed)
    }

    public func channelActive(context: ChannelHandlerContext) {
        context.fireChannelActive()
        startHandshake(context: context)
    }

    public func channelInactive(context: ChannelHandlerContext) {
        cancelTimer()
        let previous = state
        state = .closed
        switch previous {
        case .handshaking:
            context.fireErrorCaught(TLSError.closedDuringHandshake)
        case .active, .outputClosed:
            context.fireErrorCaught(TLSError.uncleanShutdown)
        case .closing:
            // The peer closed the socket instead of answering close_notify: closed all the same.
            closePromise?.succeed(())
            closePromise = nil
        case .idle, .closed:
            break
        }
        failHeldWrites(TLSError.connectionClosed)
        context.fireChannelInactive()
    }

    private func startHandshake(context: ChannelHandlerContext) {
        guard state == .idle else { return }
        state = .handshaking
        let timeout = handshakeTimeout
        timer = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) { [weak self] in
            guard let self, self.state == .handshaking else { return }
            self.fail(context: context, error: .handshakeTimedOut(seconds: Double(timeout.nanoseconds) / 1e9))
        }
        if tlsContext.configuration.role == .client {
            doHandshake(context: context)
        }
    }

    // MARK: Inbound

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        switch state {
        case .closed:
            return
        case .idle:
            startHandshake(context: context)
        case .handshaking, .active, .outputClosed, .closing:
            break
        }
        guard buffer.readableBytes > 0 else { return }
        if !sawFirstBytes {
            sawFirstBytes = true
            if !looksLikeTLS(buffer) {
                let firstBytes = buffer.getBytes(at: buffer.readerIndex, length: min(8, buffer.readableBytes)) ?? []
                fail(context: context, error: .notTLS(firstBytes: firstBytes))
                return
            }
        }
        let buffered = buffer.withUnsafeReadableBytes { raw -> Bool in
            guard let base = raw.baseAddress else { return true }
            var offset = 0
            while offset < raw.count {
                let length = min(raw.count - offset, Self.writeChunk)
                let written = BIO_write(readBIO, base + offset, Int32(length))
                guard written > 0 else { return false }
                offset += Int(written)
            }
            return true
        }
        guard buffered else {
            fail(
                context: context,
                error: .openSSLFailure(
                    operation: "buffer received bytes", reason: OpenSSL.drainErrorText(fallback: "BIO_write failed")))
            return
        }
        switch state {
        case .handshaking:
            doHandshake(context: context)
        case .active, .outputClosed, .closing:
            readPlaintext(context: context)
        case .idle, .closed:
            break
        }
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        context.fireChannelReadComplete()
    }

    /// A TLS record starts with its content type (handshake 22 or alert 21) and
    /// the major version 3. A client's first record is a handshake (ClientHello).
    private func looksLikeTLS(_ buffer: ByteBuffer) -> Bool {
        guard let type = buffer.getInteger(at: buffer.readerIndex, as: UInt8.self) else { return true }
        let allowed: [UInt8] = tlsContext.configuration.role == .server ? [22] : [21, 22]
        guard allowed.contains(type) else { return false }
        if let major = buffer.getInteger(at: buffer.readerIndex + 1, as: UInt8.self) {
            return major == 3
        }
        return true
    }

    private func doHandshake(context: ChannelHandlerContext) {
        ERR_clear_error()
        let result = SSL_do_handshake(ssl)
        if result == 1 {
            sendNetworkOutput(context: context)
            handshakeCompleted(context: context)
            return
        }
        let error = SSL_get_error(ssl, result)
        switch error {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
            sendNetworkOutput(context: context)
        default:
            fail(context: context, error: handshakeFailure(), lingering: true)
        }
    }

    /// Why `SSL_do_handshake` failed, from the verification state, the verify
    /// result and the error queue (drained).
    private func handshakeFailure() -> TLSError {
        let errors = OpenSSL.drainErrors()
        if let fingerprint = verification.pinMismatch {
            return .pinMismatch(fingerprint: fingerprint)
        }
        let sslErrors = errors.filter { $0.library == ERR_LIB_SSL }
        if sslErrors.contains(where: { $0.reason == SSL_R_CERTIFICATE_VERIFY_FAILED }) {
            let result = SSL_get_verify_result(ssl)
            if result != Int(X509_V_OK), let text = X509_verify_cert_error_string(result) {
                return .peerCertificateRejected(reason: String(cString: text))
            }
            return .peerCertificateRejected(reason: OpenSSL.errorText(errors, fallback: "certificate verify failed"))
        }
        if sslErrors.contains(where: { $0.reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE }) {
            return .peerCertificateMissing
        }
        if let alert = sslErrors.first(where: { Self.isAlert($0) }) {
            return .peerAlert(reason: alert.text)
        }
        return .handshakeFailed(reason: OpenSSL.errorText(errors, fallback: "the handshake failed"))
    }

    /// OpenSSL reports a received alert as SSL reason 1000 + the alert's code.
    private static func isAlert(_ error: OpenSSL.QueuedError) -> Bool {
        error.library == ERR_LIB_SSL && error.reason >= SSL_AD_REASON_OFFSET
            && error.reason < SSL_AD_REASON_OFFSET + 256
    }

    private func handshakeCompleted(context: ChannelHandlerContext) {
        cancelTimer()
        guard let peer = SSL_get0_peer_certificate(ssl) else {
            // Verification requires a certificate on both sides; never expected.
            fail(context: context, error: .peerCertificateMissing)
            return
        }
        guard let fingerprint = OpenSSL.fingerprint(of: peer) else {
            fail(
                context: context,
                error: .handshakeFailed(
                    reason: OpenSSL.drainErrorText(fallback: "cannot compute the peer certificate's fingerprint")))
            return
        }
        let version: TLSVersion
        switch SSL_version(ssl) {
        case TLS1_3_VERSION: version = .tls13
        case TLS1_2_VERSION: version = .tls12
        default:
            let name = SSL_get_version(ssl).map { String(cString: $0) } ?? "unknown"
            fail(
                context: context,
                error: .handshakeFailed(reason: "negotiated an unsupported protocol version (\(name))"))
            return
        }
        let cipher = SSL_get_current_cipher(ssl).flatMap { SSL_CIPHER_get_name($0) }.map { String(cString: $0) } ?? ""
        let completed = TLSHandshakeCompleted(
            peerFingerprint: fingerprint, peerSubject: OpenSSL.subject(of: peer),
            peerCommonName: OpenSSL.commonName(of: peer),
            protocolVersion: version, cipherSuite: cipher)
        handshake = completed
        state = .active

        // Send what the application wrote during the handshake, in order, ahead of
        // anything written in answer to the event below.
        let held = heldWrites
        heldWrites = []
        for (buffer, promise) in held {
            write(context: context, data: wrapOutboundOut(buffer), promise: promise)
        }
        if heldFlush {
            heldFlush = false
            flush(context: context)
        }
        guard state == .active else { return }  // a write failed, and the connection with it
        context.fireUserInboundEventTriggered(completed)

        // Application data may have arrived with the handshake's last flight.
        switch state {
        case .active, .outputClosed, .closing:
            readPlaintext(context: context)
        case .idle, .handshaking, .closed:
            break
        }
    }

    /// Decrypts everything the read BIO holds and passes it on as one buffer.
    private func readPlaintext(context: ChannelHandlerContext) {
        var plaintext = context.channel.allocator.buffer(capacity: Self.readChunk)
        var failure: TLSError?
        var closeNotify = false
        reading: while true {
            ERR_clear_error()
            var result: Int32 = 0
            plaintext.writeWithUnsafeMutableBytes(minimumWritableBytes: Self.readChunk) { raw in
                result = SSL_read(ssl, raw.baseAddress, Int32(min(raw.count, Int(Int32.max))))
                return result > 0 ? Int(result) : 0
            }
            if result > 0 { continue }
            switch SSL_get_error(ssl, result) {
            case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
                break reading
            case SSL_ERROR_ZERO_RETURN:
                closeNotify = true
                break reading
            default:
                let errors = OpenSSL.drainErrors()
                if let alert = errors.first(where: { Self.isAlert($0) }) {
                    failure = .peerAlert(reason: alert.text)
                } else {
                    failure = .connectionFailed(reason: OpenSSL.errorText(errors, fallback: "SSL_read failed"))
                }
                break reading
            }
        }
        // Post-handshake messages (a key update) may need an answer.
        sendNetworkOutput(context: context)
        if plaintext.readableBytes > 0 {
            context.fireChannelRead(wrapInboundOut(plaintext))
        }
        if let failure {
            fail(context: context, error: failure)
        } else if closeNotify {
            peerSentCloseNotify(context: context)
        }
    }

    private func peerSentCloseNotify(context: ChannelHandlerContext) {
        switch state {
        case .active, .outputClosed:
            state = .closed
            cancelTimer()
            ERR_clear_error()
            _ = SSL_shutdown(ssl)  // our close_notify in answer
            context.fireUserInboundEventTriggered(TLSCloseNotifyReceived())
            failHeldWrites(TLSError.connectionClosed)
            closeAfterSending(context: context, promise: nil)
        case .closing:
            state = .closed
            cancelTimer()
            let promise = closePromise
            closePromise = nil
            context.fireUserInboundEventTriggered(TLSCloseNotifyReceived())
            closeAfterSending(context: context, promise: promise)
        case .idle, .handshaking, .closed:
            break
        }
    }

    // MARK: Outbound

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let buffer = unwrapOutboundIn(data)
        switch state {
        case .idle, .handshaking:
            heldWrites.append((buffer, promise))
        case .active:
            encryptAndWrite(context: context, buffer: buffer, promise: promise)
        case .outputClosed, .closing, .closed:
            promise?.fail(TLSError.connectionClosed)
        }
    }

    public func flush(context: ChannelHandlerContext) {
        switch state {
        case .idle, .handshaking:
            heldFlush = true
        case .active, .outputClosed, .closing, .closed:
            context.flush()
        }
    }

    private func encryptAndWrite(context: ChannelHandlerContext, buffer: ByteBuffer, promise: EventLoopPromise<Void>?) {
        var failure: TLSError?
        buffer.withUnsafeReadableBytes { raw in
            guard let base = raw.baseAddress else { return }
            var offset = 0
            while offset < raw.count {
                let length = min(raw.count - offset, Self.writeChunk)
                ERR_clear_error()
                let written = SSL_write(ssl, base + offset, Int32(length))
                guard written > 0 else {
                    failure = .connectionFailed(reason: OpenSSL.drainErrorText(fallback: "SSL_write failed"))
                    return
                }
                offset += Int(written)
            }
        }
        if let failure {
            promise?.fail(failure)
            fail(context: context, error: failure)
            return
        }
        let ciphertext = takeNetworkOutput(context: context) ?? context.channel.allocator.buffer(capacity: 0)
        context.write(wrapOutboundOut(ciphertext), promise: promise)
    }

    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        switch (state, mode) {
        case (_, .input):
            context.close(mode: .input, promise: promise)
        case (.idle, _), (.handshaking, _):
            // Nothing to protect yet: no close_notify before the handshake is done.
            state = .closed
            cancelTimer()
            failHeldWrites(TLSError.connectionClosed)
            context.close(mode: .all, promise: promise)
        case (.active, .output):
            state = .outputClosed
            ERR_clear_error()
            _ = SSL_shutdown(ssl)
            if let sent = sendNetworkOutput(context: context) {
                sent.assumeIsolated().whenComplete { _ in context.close(mode: .output, promise: promise) }
            } else {
                context.close(mode: .output, promise: promise)
            }
        case (.outputClosed, .output):
            context.close(mode: .output, promise: promise)
        case (.active, _), (.outputClosed, _):
            let alreadySent = state == .outputClosed
            state = .closing
            closePromise = promise
            if !alreadySent {
                ERR_clear_error()
                _ = SSL_shutdown(ssl)
                sendNetworkOutput(context: context)
            }
            let timeout = shutdownTimeout
            timer = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) { [weak self] in
                guard let self, self.state == .closing else { return }
                // No close_notify came back in time: close the socket anyway.
                self.state = .closed
                let promise = self.closePromise
                self.closePromise = nil
                self.closeAfterSending(context: context, promise: promise)
            }
        case (.closing, _):
            if let promise {
                if let closePromise {
                    closePromise.futureResult.cascade(to: promise)
                } else {
                    closePromise = promise
                }
            }
        case (.closed, _) where lingering:
            // The alert of a refused handshake goes first; the channel closes once the peer read it.
            if let promise { context.channel.closeFuture.cascade(to: promise) }
        case (.closed, _):
            context.close(mode: mode, promise: promise)
        }
    }

    // MARK: Failure and closing

    /// Fires `error`, sends any alert OpenSSL produced, and closes the channel. `lingering`: a
    /// handshake this side refused (the peer's certificate, most often): see `closeAfterSending`.
    private func fail(context: ChannelHandlerContext, error: TLSError, lingering: Bool = false) {
        guard state != .closed else { return }
        state = .closed
        cancelTimer()
        let promise = closePromise
        closePromise = nil
        failHeldWrites(error)
        // Set before the error goes up: the handlers above close the channel as they hear of it.
        self.lingering = lingering
        context.fireErrorCaught(error)
        closeAfterSending(context: context, promise: promise)
    }

    /// Sends what the write BIO holds (an alert, a close_notify), then closes the
    /// channel; `promise` completes when the channel is closed. When `lingering`, the alert is
    /// followed by a FIN, and the socket stays open (what arrives discarded) until the peer
    /// closes or `Self.linger` passes. Closed at once, a socket with the peer's next bytes
    /// still arriving answers them with a reset, which can reach the peer before the alert is
    /// read: it then learns "connection reset" instead of why its certificate was refused.
    private func closeAfterSending(context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        if let promise { context.channel.closeFuture.cascade(to: promise) }
        let sent = sendNetworkOutput(context: context) ?? context.eventLoop.makeSucceededVoidFuture()
        guard lingering else {
            sent.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
            return
        }
        sent.assumeIsolated().whenComplete { _ in
            context.close(mode: .output, promise: nil)
            let deadline = context.eventLoop.assumeIsolated().scheduleTask(in: Self.linger) {
                context.close(promise: nil)
            }
            context.channel.closeFuture.whenComplete { _ in deadline.cancel() }
        }
    }

    /// Whether the channel waits, after a refused handshake's alert, for the peer to close (see
    /// `closeAfterSending`): a close asked meanwhile waits too.
    private var lingering = false

    /// How long a refused handshake's socket waits for the peer to close after the alert.
    static let linger: TimeAmount = .seconds(2)

    /// Moves the write BIO's contents into a buffer; nil when it is empty.
    private func takeNetworkOutput(context: ChannelHandlerContext) -> ByteBuffer? {
        let pending = tether_bio_pending(writeBIO)
        guard pending > 0, pending <= Int(Int32.max) else { return nil }
        let count = Int(pending)
        var buffer = context.channel.allocator.buffer(capacity: count)
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: count) { raw in
            let read = BIO_read(writeBIO, raw.baseAddress, Int32(count))
            return read > 0 ? Int(read) : 0
        }
        return buffer.readableBytes > 0 ? buffer : nil
    }

    /// Writes and flushes the write BIO's contents; the write's future, or nil if there was nothing.
    @discardableResult
    private func sendNetworkOutput(context: ChannelHandlerContext) -> EventLoopFuture<Void>? {
        guard let buffer = takeNetworkOutput(context: context) else { return nil }
        let promise = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(wrapOutboundOut(buffer), promise: promise)
        return promise.futureResult
    }

    private func failHeldWrites(_ error: Error) {
        let held = heldWrites
        heldWrites = []
        heldFlush = false
        for (_, promise) in held { promise?.fail(error) }
    }

    private func cancelTimer() {
        timer?.cancel()
        timer = nil
    }
}
