import Foundation

extension Database {
    /// A peer left this database's changes unapplied for a reason time may cure (its clock is
    /// behind their timestamps): they stay pending and go through when it pulls them again.
    public struct PeerDeferral: Sendable, Equatable {
        /// The deferred changes: this database's sequences after `after` through `through`.
        public let after: Int64
        public let through: Int64
        /// The peer's words (for instance "clock skew: … 7200 s ahead … (limit 3600 s)").
        public let reason: String
        /// When the peer first deferred them, and most recently.
        public let firstDeferred: Date
        public let lastDeferred: Date
    }

    /// What this database knows of a peer.
    public struct PeerState: Sendable {
        public let instanceKey: InstanceKey
        /// The peer's changes applied here, through this sequence of the peer's.
        public let receivedThrough: Int64
        /// This database's changes the peer acknowledged, through this sequence.
        public let acknowledgedThrough: Int64
        public let sentThrough: Int64
        public let lastSeen: Date?
        /// Set while the peer defers this database's changes (until it acknowledges them).
        public let deferral: PeerDeferral?
    }
}
