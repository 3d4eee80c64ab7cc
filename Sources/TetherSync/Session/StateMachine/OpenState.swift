import NIOCore
import Tether

extension SyncSessionStateMachine {
    /// What an open session knows: what its handshake settled, and the state of each part of
    /// the protocol. Kept through closing and failing, where the summary and the work still
    /// running need it.
    struct OpenState {
        var negotiated: Negotiated
        var requester: Requester
        var responder: Responder
        /// Partial replication (version 3): what each side sends the other, once the peer's SCOPE is in.
        var scopes = Scopes.whole
    }

    /// What partial replication settles for a session (§8.10).
    enum Scopes {
        /// Version 3: the peer's SCOPE has not arrived yet (no PULL of it may be answered before).
        case awaitingPeer
        /// `sent`: the scope of what this side sends the peer (its policy's scope narrowed by the
        /// peer's interest; nil: every row). `received`: what the peer sends this side in part.
        case settled(sent: SyncScope?, received: ReceivedInPart)

        /// A version 2 session: every table whole both ways.
        static let whole = Scopes.settled(sent: nil, received: ReceivedInPart())
    }

    /// The tables the peer sends this side only part of, as this side's policy lets it claim them
    /// (§8.10): the only tables whose rows it may evict here, and whose changes from here it may refuse.
    struct ReceivedInPart: Equatable {
        /// The tables the peer's SCOPE listed in `scoped` that this side takes its word for: its
        /// policy scopes them (it refuses this side's writes outside), or it holds them in part itself.
        var claimed: Set<String> = []
        /// The tables this side's own interest names: the peer evicts the rows that leave it.
        var asked: Set<String> = []
        /// The tables the peer sent this side only part of until now, and sends whole from this
        /// session (its policy stopped scoping this side, or this side dropped its interest): the
        /// scope backfill brings the rows this side lacks of them, then they are whole here.
        var widened: Set<String> = []

        /// The tables whose rows the peer may evict here.
        var evictable: Set<String> { claimed.union(asked) }
        /// Whether a scope backfill follows each catch-up.
        var isEmpty: Bool { claimed.isEmpty && asked.isEmpty && widened.isEmpty }
    }

    /// What the handshake settled (§8.2), fixed for the rest of the session.
    struct Negotiated {
        let peer: InstanceKey
        /// The peer's certificate, from the TLS handshake.
        let peerIdentity: PeerIdentity?
        /// What the peer may do.
        let peerPolicy: PeerPolicy
        /// What both sides sync (§8.2).
        let shared: SharedSchema
        /// Whether `livePush` was negotiated.
        let live: Bool
        /// Whether `deferrals` was negotiated: a batch too far ahead of this clock is deferred
        /// (DEFERRED), not a reason to end the session.
        let defers: Bool
        /// Whether `histories` was negotiated: each BATCH follows a HISTORY, and the first PULL
        /// shows the mark kept of the peer's history (§8.9).
        let histories: Bool
        /// Whether both speak protocol version 3 (`Capabilities.version3`): SCOPE, evictions, REFUSED.
        let version3: Bool
        /// Whether `parkedPulls` was negotiated (with `livePush`): a caught-up requester parks its next
        /// PULL at the responder, which answers it when it has changes (§8.4).
        let parksPulls: Bool
        /// Whether `quietHeartbeats` was negotiated: a quiet session's heartbeats are far apart (§8.5).
        let quietHeartbeats: Bool
        /// Whether `pullsAhead` was negotiated: follow-on PULLs keep more than one batch coming (§8.3).
        let pullsAhead: Bool
        /// What the peer may write here (its policy's scope; nil: every row): a change outside is refused (REFUSED).
        let writeScope: SyncScope?
        /// Whether `mergeRules` was negotiated (with `version3`): each SCOPE lists its sender's
        /// column rules, checked against this side's (§6.12).
        var mergeRules = false
    }
}

extension SyncSessionStateMachine.State {
    var isHandshaking: Bool { if case .handshaking = self { true } else { false } }
    var isOpen: Bool { if case .open = self { true } else { false } }
    var isFailed: Bool { if case .failed = self { true } else { false } }
    /// Open, or answering the peer's BYE once the work in progress is done: the results of
    /// database work still move the session on.
    var acceptsDatabaseResults: Bool {
        switch self {
        case .open, .closing(.byeReceived, _): true
        case .handshaking, .closing(.byeSent, _), .failed: false
        }
    }

    /// The open session's data, in whatever state keeps it (nil before the peer's HELLO was
    /// accepted). Setting it before then does nothing.
    var session: SyncSessionStateMachine.OpenState? {
        get {
            switch self {
            case let .open(session): session
            case let .closing(_, session), let .failed(_, session): session
            case .handshaking: nil
            }
        }
        set {
            guard let newValue else { return }
            switch self {
            case .open: self = .open(newValue)
            case let .closing(how, .some(_)): self = .closing(how, newValue)
            case let .failed(error, .some(_)): self = .failed(error, newValue)
            case .handshaking, .closing(_, nil), .failed(_, nil): return
            }
        }
    }
}

/// The parts of the open session, as the rules read and write them. Before the peer's HELLO is
/// accepted they read as a session that has done nothing yet, and writes to them are dropped:
/// the rules that run then (timers, the owner's requests) find nothing to do.
extension SyncSessionStateMachine {
    var peerKey: InstanceKey? { state.session?.negotiated.peer }
    var peerPolicy: PeerPolicy { state.session?.negotiated.peerPolicy ?? PeerPolicy() }
    var shared: SharedSchema { state.session?.negotiated.shared ?? .everything }
    var live: Bool { state.session?.negotiated.live ?? false }
    var defers: Bool { state.session?.negotiated.defers ?? false }
    var histories: Bool { state.session?.negotiated.histories ?? false }
    var version3: Bool { state.session?.negotiated.version3 ?? false }
    var mergeRules: Bool { state.session?.negotiated.mergeRules ?? false }
    var parksPulls: Bool { state.session?.negotiated.parksPulls ?? false }
    var quietHeartbeats: Bool { state.session?.negotiated.quietHeartbeats ?? false }
    var pullsAhead: Bool { state.session?.negotiated.pullsAhead ?? false }

    var scopes: Scopes {
        get { state.session?.scopes ?? .whole }
        set { state.session?.scopes = newValue }
    }

    var requester: Requester {
        get { state.session?.requester ?? Requester(configuration) }
        set { state.session?.requester = newValue }
    }

    var responder: Responder {
        get { state.session?.responder ?? Responder() }
        set { state.session?.responder = newValue }
    }

    /// Whether this session stays open once caught up (it is not a `syncOnce`).
    var keptOpen: Bool { configuration.offersLive && !configuration.byeWhenCaughtUp }
}
