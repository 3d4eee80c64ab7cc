import Tether

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
        case let .fingerprint(fingerprint): PeerIdentity.fingerprintLabel(fingerprint)
        }
    }
}
