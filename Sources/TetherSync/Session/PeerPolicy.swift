import Tether

/// What this side allows one peer (named by its certificate, see ``PeerSelector``) to do.
public struct PeerPolicy: Sendable, Hashable {
    /// The peer may pull this side's changes, but this side never applies the
    /// peer's: it never PULLs from it, and a BATCH from it is ERROR 4 `readOnly`.
    public var readOnly: Bool
    /// The tables the peer may sync with this side (nil: all of the negotiated
    /// schema). A batch from it holding a change to another table is refused
    /// whole with ERROR 5 `tableNotAllowed`; changes to other tables are not
    /// sent to it.
    public var allowedTables: Set<String>?

    public init(readOnly: Bool = false, allowedTables: Set<String>? = nil) {
        self.readOnly = readOnly
        self.allowedTables = allowedTables
    }
}

/// Which peers this side accepts and what each may do, by certificate.
public struct PeerPolicies: Sendable {
    /// The rules, in the order they are looked up: a rule naming the peer's fingerprint wins
    /// over one naming its common name.
    public var rules: [PeerSelector: PeerPolicy]
    /// Whether a peer no rule names is accepted (with ``others``); false: only the named peers are.
    public var acceptsOthers: Bool
    /// What a peer no rule names may do, when accepted.
    public var others: PeerPolicy

    public init(_ rules: [PeerSelector: PeerPolicy] = [:], acceptsOthers: Bool = true, others: PeerPolicy = PeerPolicy()) {
        self.rules = rules
        self.acceptsOthers = acceptsOthers
        self.others = others
    }

    /// Accepts only the named peers, each with the policy given (default: everything).
    public static func only(_ peers: [PeerSelector: PeerPolicy]) -> PeerPolicies {
        PeerPolicies(peers, acceptsOthers: false)
    }

    public subscript(_ peer: PeerSelector) -> PeerPolicy? {
        get { rules[peer] }
        set { rules[peer] = newValue }
    }

    /// The policy of `peer`, or nil if it is not accepted.
    public func policy(for peer: PeerIdentity) -> PeerPolicy? {
        if let byFingerprint = rules.first(where: { if case .fingerprint = $0.key { $0.key.matches(peer) } else { false } }) {
            return byFingerprint.value
        }
        if let name = peer.name, let byName = rules[.name(name)] { return byName }
        return acceptsOthers ? others : nil
    }
}
