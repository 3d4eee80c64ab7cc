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
        /// What the peer's instance key is pinned to: its certificate's common name, or
        /// `sha256:FINGERPRINT` for a certificate without one; nil if no session over TLS
        /// authenticated it (see `checkPeer`).
        public let pinnedCertificate: String?
        /// The certificate the peer presented last: its common name and SHA-256 fingerprint (the
        /// pin `--allow sha256:…` takes). Nil without a session over TLS, and for a key pinned
        /// before Tether recorded it (until the peer's next session).
        public let certificate: PeerIdentity?
        /// When the peer was forgotten, not seen within the horizon of garbage collection
        /// (`GarbageCollectionOptions.forgetPeersUnseenFor`): it no longer holds tombstones back.
        /// Nil for a peer remembered; a forgotten peer is remembered again once it acknowledged
        /// the full resync it gets when it returns.
        public let forgotten: Date?
    }
}

extension Database {
    /// Whether the peer presenting `peer` as its instance key with `certificate` may sync under that
    /// key, with nothing to record: true when the key is pinned to that certificate's name (or
    /// fingerprint, for a certificate without a name) and this very certificate is the one recorded;
    /// false when the key is not pinned yet, or a renewed certificate of the same name presents it
    /// (record it with `pinPeer`). A key pinned to another certificate is refused with
    /// `SyncError.instanceKeyPinned` naming both. A certificate may present any number of keys (a
    /// rekeyed or restored database gets a new one). Reads only, so that a known peer costs no write.
    public func checkPeer(_ peer: InstanceKey, certificate: PeerIdentity) throws -> Bool {
        guard let recorded = try read({ try $0.peerStore.certificate(of: peer) }) else { return false }
        guard recorded.pin == certificate.pin else {
            throw SyncError.instanceKeyPinned(instanceKey: peer, pinnedTo: recorded.pin, presentedBy: certificate.pin)
        }
        return recorded.presented == certificate
    }

    /// Pins `peer` to `certificate` unless another certificate pinned it first (then
    /// `SyncError.instanceKeyPinned`), and records `certificate` as the one it presented (its name
    /// and fingerprint, shown by `peers()`). A pin that cannot be written (the disk is full) is
    /// left for a later session: a full node still syncs.
    public func pinPeer(_ peer: InstanceKey, to certificate: PeerIdentity) throws {
        let pinned: String
        do {
            pinned = try write { try $0.peerStore.pin(peer, to: certificate) }
        } catch let error as DatabaseError where error.isStorageFailure {
            return
        }
        guard pinned == certificate.pin else {
            throw SyncError.instanceKeyPinned(instanceKey: peer, pinnedTo: pinned, presentedBy: certificate.pin)
        }
    }

    /// The certificate each known peer's instance key is pinned to.
    public func peerCertificates() throws -> [InstanceKey: String] {
        try read { try $0.peerStore.pinnedCertificates() }
    }
}
