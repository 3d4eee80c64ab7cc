import Tether
import TetherWire

/// Why a sync session failed: what went wrong, and where.
public enum SyncSessionError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The peers sync different tables or columns; `column` is nil when a whole table differs.
    case schemaMismatch(table: String, column: String?, message: String)
    /// The peer speaks another protocol version.
    case protocolVersion(peerVersion: UInt64)
    /// The peer broke the session rules (§8): an unexpected message, a wrong ACK, …
    case protocolViolation(String)
    /// The peer's bytes were not valid frames.
    case malformedFrame(WireError)
    /// The peer sent ERROR and closed.
    case peerError(code: WireErrorCode, message: String)
    /// The peer is not in this side's allowlist (instance key or certificate fingerprint).
    case unauthorized(String)
    /// The peer sent changes although this side does not accept changes from it.
    case readOnly(String)
    /// A batch from the peer was refused or could not be applied.
    case batchRejected(String)
    /// A batch from the peer names a table this side does not sync.
    case tableNotAllowed(String)
    /// This side could not send a message (a change too large for a frame, …).
    case cannotSend(message: String, WireError)
    /// A database operation of the session failed.
    case database(operation: String, reason: String)
    /// This side's disk is full or failing (SQLITE_FULL, SQLITE_IOERR): the operation wrote
    /// nothing. Batches from the peer are first tried smaller; a `syncOnce` ends with this when
    /// not even one change fits.
    case storage(operation: String, reason: String)
    /// The connection ended before the session finished.
    case connectionClosed(during: String)
    /// The network failed (or the connection could not be set up).
    case transport(String)
    /// TLS failed: a certificate refused (by this side or, as its alert says, by the peer), a
    /// handshake without common ground, a connection closed without a TLS close_notify.
    case tls(TLSError)
    /// The peer sent no HELLO within the HELLO timeout, or nothing at all within the idle timeout.
    case timeout(String)
    /// Anything else on this side.
    case internalFailure(String)

    /// The ERROR code to send the peer when this side fails with this error.
    var code: WireErrorCode {
        switch self {
        case .schemaMismatch: return .schemaMismatch
        case .protocolVersion: return .protocolVersion
        case .protocolViolation: return .malformedFrame
        case let .malformedFrame(error): return error.code
        case let .peerError(code, _): return code
        case .unauthorized: return .unauthorized
        case .readOnly: return .readOnly
        case .batchRejected: return .batchRejected
        case .tableNotAllowed: return .tableNotAllowed
        case .timeout: return .timeout
        case let .cannotSend(_, error): return error.code
        case .database, .storage, .connectionClosed, .transport, .tls, .internalFailure: return .internal
        }
    }

    public var description: String {
        switch self {
        case let .schemaMismatch(_, _, message): return "schema mismatch: \(message)"
        case let .protocolVersion(version):
            return "the peer speaks protocol version \(version); this peer speaks version \(WireProtocol.version)"
        case let .protocolViolation(reason): return "protocol violation: \(reason)"
        case let .malformedFrame(error): return "malformed frame from the peer: \(error)"
        case let .peerError(code, message): return "the peer closed with ERROR \(code.rawValue) (\(code)): \(message)"
        case let .unauthorized(reason): return "unauthorized: \(reason)"
        case let .readOnly(reason): return "read-only peer: \(reason)"
        case let .batchRejected(reason): return "batch rejected: \(reason)"
        case let .tableNotAllowed(reason): return "table not allowed: \(reason)"
        case let .cannotSend(message, error): return "could not send \(message): \(error)"
        case let .database(operation, reason): return "could not \(operation): \(reason)"
        case let .storage(operation, reason): return "could not \(operation), the disk is full or failing: \(reason)"
        case let .connectionClosed(during): return "the connection ended during \(during)"
        case let .transport(reason): return "transport failure: \(reason)"
        case let .tls(error): return "TLS failure: \(error)"
        case let .timeout(reason): return "timeout: \(reason)"
        case let .internalFailure(reason): return "internal failure: \(reason)"
        }
    }
}
