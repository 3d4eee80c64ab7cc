import Foundation

extension Database {
    /// A peer left this database's changes unapplied for a reason time may cure (its clock is
    /// behind their timestamps): they stay pending and go through when it pulls them again.
    public struct PeerDeferral: Sendable, Equatable {
        /// The deferred changes: this database's sequences after `after` through `through`.
        public let after: Int64
        /// The last deferred sequence.
        public let through: Int64
        /// The peer's words (for instance "clock skew: … 7200 s ahead … (limit 3600 s)").
        public let reason: String
        /// When the peer first deferred them, and most recently.
        public let firstDeferred: Date
        /// When the peer most recently deferred them.
        public let lastDeferred: Date
    }

    /// What this database knows of a peer.
    public struct PeerState: Sendable {
        /// The peer's instance key.
        public let instanceKey: InstanceKey
        /// The peer's changes applied here, through this sequence of the peer's.
        public let receivedThrough: Int64
        /// This database's changes the peer acknowledged, through this sequence.
        public let acknowledgedThrough: Int64
        /// This database's changes sent to the peer, through this sequence (acknowledged or not yet).
        public let sentThrough: Int64
        /// When the peer last sent, received or acknowledged changes; nil if it never did.
        public let lastSeen: Date?
        /// Set while the peer defers this database's changes (until it acknowledges them).
        public let deferral: PeerDeferral?
    }
}

extension Database {
    /// Whether the peer presenting `peer` as its instance key, with the certificate `certificate`
    /// (its name, as the TLS layer tells it), may sync under that key: true when the key is pinned
    /// to that certificate, false when to none yet (pin it with `pinPeer`); a key pinned to
    /// another certificate is refused with `SyncError.instanceKeyPinned` naming both. A certificate
    /// may present any number of keys (a rekeyed or restored database gets a new one). Reads only,
    /// so that a known peer costs no write.
    public func checkPeer(_ peer: InstanceKey, certificate: String) throws -> Bool {
        guard let pinned = try read({ try $0.peerStore.pinnedCertificate(of: peer) }) else { return false }
        guard pinned == certificate else {
            throw SyncError.instanceKeyPinned(instanceKey: peer, pinnedTo: pinned, presentedBy: certificate)
        }
        return true
    }

    /// Pins `peer` to `certificate` unless another certificate pinned it first (then
    /// `SyncError.instanceKeyPinned`). A pin that cannot be written (the disk is full) is left
    /// for a later session: a full node still syncs.
    public func pinPeer(_ peer: InstanceKey, to certificate: String) throws {
        let pinned: String
        do {
            pinned = try write { try $0.peerStore.pin(peer, to: certificate) }
        } catch let error as DatabaseError where error.isStorageFailure {
            return
        }
        guard pinned == certificate else {
            throw SyncError.instanceKeyPinned(instanceKey: peer, pinnedTo: pinned, presentedBy: certificate)
        }
    }

    /// The certificate each known peer's instance key is pinned to.
    public func peerCertificates() throws -> [InstanceKey: String] {
        try read { try $0.peerStore.pinnedCertificates() }
    }
}
