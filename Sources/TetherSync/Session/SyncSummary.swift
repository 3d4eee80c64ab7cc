import Tether
import TetherWire

/// What one sync session did.
public struct SyncSummary: Sendable, Equatable {
    /// The peer's instance key (nil if the handshake did not get that far).
    public var peer: InstanceKey?
    /// Changes sent to the peer, in how many batches.
    public var changesSent = 0
    /// The batches those changes were sent in.
    public var batchesSent = 0
    /// Changes received from the peer, in how many batches.
    public var changesReceived = 0
    /// The batches those changes came in.
    public var batchesReceived = 0
    /// Received changes that changed this database, and those that changed nothing.
    public var applied = 0
    /// Received changes that changed nothing (already known here, or older than what is here).
    public var unchanged = 0
    /// Received changes kept aside (they could not be applied yet).
    public var keptAside = 0
    /// Conflicts met applying the peer's changes.
    public var conflicts = 0
    /// The peer's changes this side refused (outside the peer's scope here, §8.10): not written,
    /// and told to the peer with REFUSED.
    public var refused = 0
    /// This side's changes the peer refused (outside this side's scope there): recorded, listed by
    /// `Database.refusedChanges()`.
    public var refusedByPeer = 0
    /// Frame bytes (after LZ4, before TLS) sent to and received from the peer, every message included.
    public var bytesSent = 0
    /// Frame bytes received from the peer, counted like `bytesSent`.
    public var bytesReceived = 0
    /// Set when this side could not apply the peer's changes yet and deferred them (the peer's
    /// clock is too far ahead, Protocol/README.md §8.3): they stay pending on the peer, and a
    /// session kept open pulls them again by itself. Why, in words.
    public var deferredFromPeer: String?
    /// Set when the peer deferred this side's changes: they stay pending here (`tether status`
    /// shows the peer's reason) until it applies them. Why, in the peer's words.
    public var deferredByPeer: String?

    /// The summary of a session that has done nothing yet: every count 0, no peer.
    public init() {}
}
