import Logging
import Tether

/// The metadata keys of what Tether's sync logs (`SyncOptions.logger`), for a handler or a test
/// that picks lines out: every line of a session carries its id and role, and once known its
/// peer's certificate and instance key.
///
/// ```swift
/// if entry.metadata[SyncLogMetadataKey.peerCertificate] == "north" { … }
/// ```
public enum SyncLogMetadataKey {
    /// A session's id, 8 hex digits drawn at random when the connection opens: every line of
    /// one session carries the same.
    public static let session = "tether.session"
    /// `server` (an accepted connection) or `client` (a connection this side opened).
    public static let role = "tether.role"
    /// The peer's network address.
    public static let remoteAddress = "tether.remote"
    /// The common name of the certificate the peer proved it holds (its fingerprint when it has none).
    public static let peerCertificate = "tether.peer.certificate"
    /// The SHA-256 fingerprint of the peer's certificate, lowercase hex.
    public static let peerFingerprint = "tether.peer.fingerprint"
    /// The instance key the peer declared in its HELLO, 32 hex digits.
    public static let peerInstanceKey = "tether.peer.instance"
    /// The tables of a batch, comma-separated.
    public static let tables = "tether.tables"
    /// The number of changes of a batch.
    public static let changes = "tether.changes"
    /// Why a session failed or ended, or why a link went down.
    public static let reason = "tether.reason"
    /// The peer a `SyncLink` connects to, `host:port`.
    public static let link = "tether.link"
}

/// What one session writes to `SyncOptions.logger`: a line at `info` when the peer's HELLO is
/// accepted and one when the session ends, one at `debug` per batch sent or applied, its failure
/// at `warning` (the peer's doing or the network's) or `error` (this side's database or disk).
/// The session calls one method per event, on its event loop (as `SessionMetrics`).
final class SessionLog {
    private var logger: Logger
    /// The peer's HELLO was accepted: the session's end is worth a line of its own.
    private var opened = false
    private var failureLogged = false

    init(_ logger: Logger, role: SyncSessionHandler.Role, remoteAddress: String?) {
        self.logger = logger
        self.logger[metadataKey: SyncLogMetadataKey.session] = "\(Self.newSessionID())"
        self.logger[metadataKey: SyncLogMetadataKey.role] = "\(role.rawValue)"
        if let remoteAddress { self.logger[metadataKey: SyncLogMetadataKey.remoteAddress] = "\(remoteAddress)" }
    }

    private static func newSessionID() -> String {
        let digits = String(UInt32.random(in: .min ... .max), radix: 16)
        return String(repeating: "0", count: 8 - digits.count) + digits
    }

    /// The TLS handshake told who the peer is.
    func handshakeCompleted(peer: PeerIdentity) {
        logger[metadataKey: SyncLogMetadataKey.peerCertificate] = "\(peer.pin)"
        logger[metadataKey: SyncLogMetadataKey.peerFingerprint] = "\(peer.fingerprint)"
        logger.trace("TLS handshake completed")
    }

    /// The peer's HELLO was accepted.
    func sessionOpened(peer: InstanceKey) {
        guard !opened else { return }
        opened = true
        logger[metadataKey: SyncLogMetadataKey.peerInstanceKey] = "\(peer)"
        logger.info("sync session started")
    }

    /// A batch from the peer was applied and committed.
    func batchApplied(_ batch: ChangeBatch) {
        logger.debug("batch applied", metadata: Self.metadata(of: batch))
    }

    /// A batch of a catch-up was staged, to be applied with its last one.
    func batchStaged(_ batch: ChangeBatch) {
        logger.debug("batch staged", metadata: Self.metadata(of: batch))
    }

    /// A batch goes to the peer.
    func batchSent(_ batch: ChangeBatch) {
        logger.debug("batch sent", metadata: Self.metadata(of: batch))
    }

    /// Its number of changes and the tables they concern (an expiry entry concerns the table of
    /// its row), computed only when `debug` is on: the metadata argument is an autoclosure.
    private static func metadata(of batch: ChangeBatch) -> Logger.Metadata {
        let tables = Set(batch.changes.compactMap { batch.tableConcerned(by: $0) }).sorted()
        return [
            SyncLogMetadataKey.changes: "\(batch.changes.count)",
            SyncLogMetadataKey.tables: "\(tables.joined(separator: ","))",
        ]
    }

    /// The session failed with `error` (its first error).
    func sessionFailed(_ error: SyncSessionError) {
        failureLogged = true
        logger.log(
            level: Self.level(of: error), "sync session failed", metadata: [SyncLogMetadataKey.reason: "\(error)"])
    }

    /// The session is over: its summary after a graceful BYE, or why it failed.
    func finished(_ result: Result<SyncSummary, SyncSessionError>) {
        switch result {
        case let .success(summary):
            guard opened else { return }
            logger.info(
                "sync session ended",
                metadata: [
                    "tether.sent": "\(summary.changesSent)", "tether.received": "\(summary.changesReceived)",
                    "tether.conflicts": "\(summary.conflicts)",
                ])
        case let .failure(error):
            // A failure the state machine did not report (the connection closed under it) is one all the same.
            if !failureLogged { sessionFailed(error) }
            if opened { logger.info("sync session ended", metadata: [SyncLogMetadataKey.reason: "\(error)"]) }
        }
    }

    /// `error` for what went wrong on this side (an operator must act here), `warning` for the
    /// peer's doing or the network's.
    static func level(of error: SyncSessionError) -> Logger.Level {
        switch error {
        case .database, .storage, .internalFailure, .cannotSend: return .error
        case .schemaMismatch, .protocolVersion, .protocolViolation, .malformedFrame, .peerError, .unauthorized,
            .readOnly,
            .batchRejected, .tableNotAllowed, .connectionClosed, .transport, .tls, .timeout:
            return .warning
        }
    }
}
