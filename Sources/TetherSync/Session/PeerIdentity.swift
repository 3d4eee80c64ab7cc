/// Who a peer is: the certificate it proved it holds in the TLS handshake. Every per-peer rule
/// (which peers are accepted, what each may do) names peers this way, never by the instance key
/// a peer declares in its HELLO: anyone the CA vouches for can declare any key.
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
    public var pin: String { name ?? PeerSelector.fingerprint(fingerprint).description }

    /// `north (sha256:3f2a…)`, the fingerprint in full.
    public var description: String {
        let fingerprint = PeerSelector.fingerprint(fingerprint).description
        return name.map { "\($0) (\(fingerprint))" } ?? fingerprint
    }
}

/// How a rule names a peer: by its certificate's common name, or by its certificate's
/// fingerprint (`sha256:` followed by 64 hexadecimal digits, colons allowed).
public enum PeerSelector: Sendable, Hashable, CustomStringConvertible {
    /// The peer whose certificate's common name is this: a renewed certificate keeps matching.
    case name(String)
    /// The peer whose certificate has this SHA-256 fingerprint (64 hex digits, either case, no
    /// colons; `init(parsing:)` reads `sha256:3F:2A:…`): that certificate only.
    case fingerprint(String)

    /// Reads `north` or `sha256:3F:2A:…`; nil for an empty name or a malformed fingerprint.
    public init?(parsing text: String) {
        if text.lowercased().hasPrefix("sha256:") {
            let hex = text.dropFirst("sha256:".count).filter { $0 != ":" }.lowercased()
            guard hex.count == 64, hex.allSatisfy(\.isHexDigit) else { return nil }
            self = .fingerprint(hex)
        } else {
            guard !text.isEmpty, !text.allSatisfy(\.isWhitespace) else { return nil }
            self = .name(text)
        }
    }

    /// Whether `peer`'s certificate is the one this selector names.
    public func matches(_ peer: PeerIdentity) -> Bool {
        switch self {
        case let .name(name): peer.name == name
        case let .fingerprint(fingerprint): peer.fingerprint == fingerprint.lowercased()
        }
    }

    public var description: String {
        switch self {
        case let .name(name): name
        case let .fingerprint(fingerprint): "sha256:\(fingerprint)"
        }
    }
}
