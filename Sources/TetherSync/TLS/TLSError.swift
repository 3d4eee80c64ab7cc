import Tether

/// Why a TLS connection failed. ``TLSHandler`` fires one of these into the
/// pipeline (`errorCaught`) and then closes the channel; no application data
/// is delivered once one has been fired.
public enum TLSError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The peer's first bytes are not a TLS record: it speaks plaintext or another protocol.
    case notTLS(firstBytes: [UInt8])
    /// The handshake failed for a reason other than the peer's certificate
    /// (no protocol version or cipher in common, a malformed message…): OpenSSL's reason.
    case handshakeFailed(reason: String)
    /// This side refused the peer's certificate: OpenSSL's verification result,
    /// e.g. "certificate has expired", "unable to get local issuer certificate",
    /// "self-signed certificate".
    case peerCertificateRejected(reason: String)
    /// The peer sent no certificate, and one is required (mutual TLS).
    case peerCertificateMissing
    /// The peer's certificate verified against the CA but is not one of the pinned
    /// fingerprints; `fingerprint` is the certificate's own (SHA-256, hex).
    case pinMismatch(fingerprint: String)
    /// The peer refused the connection with a TLS alert, e.g. "tlsv1 alert unknown ca"
    /// or "tlsv13 alert certificate required" (OpenSSL's text for the alert).
    case peerAlert(reason: String)
    /// The connection closed before the handshake completed, without a TLS alert.
    case closedDuringHandshake
    /// The handshake did not complete within the handler's handshake timeout.
    case handshakeTimedOut(seconds: Double)
    /// After the handshake the connection closed without a close_notify: the
    /// data received may have been cut short.
    case uncleanShutdown
    /// A TLS error on an established connection (a corrupt record, a failed decryption).
    case connectionFailed(reason: String)
    /// Application data was written after the connection failed or was closed.
    case connectionClosed
    /// OpenSSL could not set up the connection (out of memory).
    case openSSLFailure(operation: String, reason: String)

    public var description: String {
        switch self {
        case .notTLS(let firstBytes):
            let hex = firstBytes.map { byte in
                let digits = String(byte, radix: 16)
                return digits.count == 1 ? "0" + digits : digits
            }.joined(separator: " ")
            return "the peer does not speak TLS: its first bytes (\(hex)) are not a TLS record"
        case .handshakeFailed(let reason):
            return "TLS handshake failed: \(reason)"
        case .peerCertificateRejected(let reason):
            return "TLS handshake failed: the peer's certificate was rejected: \(reason)"
        case .peerCertificateMissing:
            return "TLS handshake failed: the peer sent no certificate, and mutual TLS requires one"
        case .pinMismatch(let fingerprint):
            return """
                TLS handshake failed: the peer's certificate (SHA-256 \(fingerprint)) is not one of the pinned \
                certificates
                """
        case .peerAlert(let reason):
            return "the peer refused the TLS connection: \(reason)"
        case .closedDuringHandshake:
            return "the connection closed during the TLS handshake"
        case .handshakeTimedOut(let seconds):
            return "the TLS handshake did not complete within \(seconds) s"
        case .uncleanShutdown:
            return "the connection closed without a TLS close_notify; data may have been cut short"
        case .connectionFailed(let reason):
            return "TLS connection failed: \(reason)"
        case .connectionClosed:
            return "the TLS connection is closed"
        case .openSSLFailure(let operation, let reason):
            return "OpenSSL failed to \(operation): \(reason)"
        }
    }
}

/// Fired as a user inbound event by ``TLSHandler`` once the handshake has completed
/// and the peer is authenticated. Application data follows it, never precedes it.
public struct TLSHandshakeCompleted: Sendable, Hashable {
    /// SHA-256 of the peer certificate's DER encoding, lowercase hex.
    public var peerFingerprint: String
    /// The peer certificate's subject, RFC 2253 (e.g. `CN=node-a`).
    public var peerSubject: String
    /// The common name of the peer certificate's subject (`node-a`), if it has one.
    public var peerCommonName: String?
    /// The negotiated TLS version.
    public var protocolVersion: TLSVersion
    /// OpenSSL's name of the negotiated cipher suite, e.g. `TLS_AES_256_GCM_SHA384`.
    public var cipherSuite: String

    /// The peer as a sync session knows it: its certificate's common name and fingerprint.
    public var peer: PeerIdentity { PeerIdentity(name: peerCommonName, fingerprint: peerFingerprint) }

    /// The event with what the handshake established about the peer and the connection.
    public init(
        peerFingerprint: String, peerSubject: String, peerCommonName: String? = nil, protocolVersion: TLSVersion,
        cipherSuite: String
    ) {
        self.peerFingerprint = peerFingerprint
        self.peerSubject = peerSubject
        self.peerCommonName = peerCommonName
        self.protocolVersion = protocolVersion
        self.cipherSuite = cipherSuite
    }
}

/// Fired as a user inbound event by ``TLSHandler`` when the peer closes the TLS
/// session with close_notify. The handler answers with its own close_notify and
/// closes the channel.
public struct TLSCloseNotifyReceived: Sendable, Hashable {
    /// The event.
    public init() {}
}
