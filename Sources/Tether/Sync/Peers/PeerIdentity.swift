/// Who a peer is: the certificate it proved it holds in the TLS handshake. Every per-peer rule
/// (which peers are accepted, what each may do) names peers this way, never by the instance key
/// a peer declares in its HELLO: anyone the CA vouches for can declare any key. A database pins
/// each instance key to the certificate that first presented it, and records the certificate
/// each peer presented last (`checkPeer`, `pinPeer`; `PeerState.certificate`).
public struct PeerIdentity: Sendable, Hashable, CustomStringConvertible {
    /// The common name (`CN`) of the certificate's subject, e.g. `north`; nil if it has none.
    public var name: String?
    /// The SHA-256 fingerprint of the certificate's DER encoding, lowercase hex.
    public var fingerprint: String

    /// A peer's identity from its certificate's common name (nil when it has none) and SHA-256
    /// fingerprint in hex (either case; kept lowercase).
    public init(name: String?, fingerprint: String) {
        self.name = name
        self.fingerprint = fingerprint.lowercased()
    }

    /// What an instance key is pinned to: the name, which a renewed certificate keeps (the CA
    /// vouches for names), or the fingerprint of a certificate without one.
    public var pin: String { name ?? Self.fingerprintLabel(fingerprint) }

    /// `north (sha256:3f2a…)`, the fingerprint in full.
    public var description: String {
        name.map { "\($0) (\(Self.fingerprintLabel(fingerprint)))" } ?? Self.fingerprintLabel(fingerprint)
    }

    /// `sha256:3f2a…`: how a fingerprint is written wherever a peer is named by one (the
    /// `--allow` flag, a pin, the log).
    public static func fingerprintLabel(_ fingerprint: String) -> String { "sha256:\(fingerprint)" }
}
