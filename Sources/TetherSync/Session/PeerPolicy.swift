import Tether

/// What this side allows one peer (named by its certificate, see ``PeerSelector``) to do.
///
/// ```swift
/// var options = SyncOptions()
/// options.peers[.name("kiosk")] = PeerPolicy(readOnly: true)              // pulls only
/// options.peers[.name("north")] = PeerPolicy(allowedTables: ["orders"], scopes: [
///     "orders": .filter("site = :peer_name"),                           // its own orders only
/// ])
/// ```
public struct PeerPolicy: Sendable, Hashable {
    /// The peer may pull this side's changes, but this side never applies the
    /// peer's: it never PULLs from it, and a BATCH from it is ERROR 4 `readOnly`.
    public var readOnly: Bool
    /// The tables the peer may sync with this side (nil: all of the negotiated
    /// schema). A batch from it holding a change to another table is refused
    /// whole with ERROR 5 `tableNotAllowed`; changes to other tables are not
    /// sent to it.
    public var allowedTables: Set<String>?
    /// Partial replication: per table, the rows the peer holds and may write (a table not named
    /// is whole). Filters may use `:peer_name` (the common name of the peer's certificate, NULL
    /// without one) and `:peer_fingerprint` (its SHA-256 fingerprint, 64 lowercase hex digits):
    /// `["orders": .filter("site = :peer_name")]`. Only a peer speaking protocol version 3 can hold
    /// part of a table; a version 2 peer with a scope is refused (ERROR 1).
    public var scopes: [String: SyncScope.Rule]

    /// A policy; the defaults allow everything: changes both ways, every table, every row.
    public init(readOnly: Bool = false, allowedTables: Set<String>? = nil, scopes: [String: SyncScope.Rule] = [:]) {
        self.readOnly = readOnly
        self.allowedTables = allowedTables
        self.scopes = scopes
    }

    /// The scope of `peer`: `scopes` with the parameters its certificate gives.
    public func scope(for peer: PeerIdentity?) -> SyncScope {
        SyncScope(scopes, parameters: Self.parameters(of: peer))
    }

    /// `:peer_name` and `:peer_fingerprint` for `peer` (NULL for what it lacks).
    static func parameters(of peer: PeerIdentity?) -> [String: DatabaseValue] {
        [
            "peer_name": peer?.name.map(DatabaseValue.text) ?? .null,
            "peer_fingerprint": peer.map { .text($0.fingerprint) } ?? .null,
        ]
    }
}

/// Which peers this side accepts and what each may do, by certificate.
///
/// ```swift
/// let peers = PeerPolicies.only([
///     .name("north"): PeerPolicy(),
///     .fingerprint("3f2a…"): PeerPolicy(readOnly: true),
/// ])
/// try peers.validate(against: db)   // checks the scopes before any session starts
/// ```
public struct PeerPolicies: Sendable {
    /// The rules, in the order they are looked up: a rule naming the peer's fingerprint wins
    /// over one naming its common name.
    public var rules: [PeerSelector: PeerPolicy]
    /// Whether a peer no rule names is accepted (with ``others``); false: only the named peers are.
    public var acceptsOthers: Bool
    /// What a peer no rule names may do, when accepted.
    public var others: PeerPolicy

    /// Policies of the peers `rules` names; a peer it does not name is accepted with `others` when
    /// `acceptsOthers`, refused otherwise. The default accepts every peer, allowed everything.
    public init(
        _ rules: [PeerSelector: PeerPolicy] = [:], acceptsOthers: Bool = true, others: PeerPolicy = PeerPolicy()
    ) {
        self.rules = rules
        self.acceptsOthers = acceptsOthers
        self.others = others
    }

    /// Accepts only the named peers, each with the policy given (default: everything).
    public static func only(_ peers: [PeerSelector: PeerPolicy]) -> PeerPolicies {
        PeerPolicies(peers, acceptsOthers: false)
    }

    /// The rule for exactly this selector (nil: none); setting nil removes it. Unlike
    /// `policy(for:)`, it does not fall back on `others`.
    public subscript(_ peer: PeerSelector) -> PeerPolicy? {
        get { rules[peer] }
        set { rules[peer] = newValue }
    }

    /// Checks every scope against `database` as a session would use it (unknown tables or columns,
    /// a filter that is not a condition, a subquery into a table not synced…), before any session
    /// starts. Throws `ScopeError` naming the peer's table and the reason.
    public func validate(against database: Database) throws {
        let policies =
            rules.map { ($0.key.description, $0.value) } + (acceptsOthers ? [("every other peer", others)] : [])
        for (peer, policy) in policies where !policy.scopes.isEmpty {
            do {
                try database.validate(
                    policy.scope(for: PeerIdentity(name: "", fingerprint: String(repeating: "0", count: 64))))
            } catch let error as ScopeError {
                throw PeerPolicyError(peer: peer, scopeError: error)
            }
        }
    }

    /// The policy of `peer`, or nil if it is not accepted.
    public func policy(for peer: PeerIdentity) -> PeerPolicy? {
        if let byFingerprint = rules.first(where: {
            if case .fingerprint = $0.key { $0.key.matches(peer) } else { false }
        }) {
            return byFingerprint.value
        }
        if let name = peer.name, let byName = rules[.name(name)] { return byName }
        return acceptsOthers ? others : nil
    }
}

/// A peer's scope that cannot be used: which peer's policy, and why.
public struct PeerPolicyError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The peer whose policy it is, as its rule names it (`north`, `sha256:…`), or
    /// "every other peer".
    public var peer: String
    /// What is wrong with the scope, naming the table.
    public var scopeError: ScopeError

    public var description: String { "the policy of peer \(peer): \(scopeError)" }
}
