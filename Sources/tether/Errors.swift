import Foundation
import Tether
import TetherSync

#if canImport(Glibc)
    import Glibc
#endif

/// The exit codes of `tether` (after BSD sysexits.h). The one place that maps
/// errors to codes is `ErrorReport.classify(_:)`.
///
/// - 0: success
/// - 64: usage: a wrong, missing or conflicting flag or argument; a bad configuration file
/// - 65: bad data: malformed SQL, a constraint violation, a schema mismatch, a file that is not a SQLite or not a
///   Tether database, a damaged or misdirected sync file
/// - 66: cannot open input: a database, schema, sync, configuration or certificate file that does not exist or cannot
///   be read
/// - 69: peer unavailable: connection refused, host unreachable, connection lost, timeout
/// - 70: internal error
/// - 73: cannot create output (the database file, an output file, or its directory)
/// - 74: I/O error while writing a file
/// - 75: temporary failure: the database is locked by another program; a peer's clock is ahead, so changes were
///   deferred
/// - 76: protocol error: the peer broke the sync protocol or speaks another version
/// - 77: not permitted: a bad certificate or key, a TLS failure, a peer that refused us, a read-only file
enum ExitStatus: Int32, Sendable {
    case success = 0
    case usage = 64
    case dataError = 65
    case noInput = 66
    case unavailable = 69
    case software = 70
    case cannotCreate = 73
    case ioError = 74
    case temporaryFailure = 75
    case protocolError = 76
    case notPermitted = 77
}

/// An error `tether` reports as it is: one line, one exit code.
struct CLIError: Error, CustomStringConvertible, Sendable {
    var status: ExitStatus
    var message: String

    init(_ status: ExitStatus, _ message: String) {
        self.status = status
        self.message = message
    }

    var description: String { message }

    static func usage(_ message: String) -> CLIError { CLIError(.usage, message) }
}

/// Turning any error into one line on stderr and an exit code.
enum ErrorReport {
    /// A TLS failure is 77 when a certificate or the handshake was refused (by this side, or by
    /// the peer, as its alert says), 69 when the connection merely ended (no alert, no close_notify).
    static func status(of error: TLSError) -> ExitStatus {
        switch error {
        case .notTLS, .handshakeFailed, .peerCertificateRejected, .peerCertificateMissing, .pinMismatch, .peerAlert:
            .notPermitted
        case .closedDuringHandshake, .handshakeTimedOut, .uncleanShutdown, .connectionFailed, .connectionClosed:
            .unavailable
        case .openSSLFailure: .software
        }
    }

    /// The exit status and the message for `error`.
    static func classify(_ error: any Error) -> CLIError {
        switch error {
        case let error as CLIError:
            return error
        case let error as DatabaseError:
            return classify(error)
        case let error as ModelError:
            return CLIError(.dataError, error.description)
        case let error as StatementError:
            return CLIError(.dataError, error.description)
        case let error as MigrationError:
            return CLIError(.dataError, error.description)
        case let error as SyncError:
            switch error {
            case let .invalidSyncFile(reason) where reason.hasPrefix("cannot read"):
                return CLIError(.noInput, reason)
            case let .invalidSyncFile(reason) where reason.hasPrefix("cannot write"):
                return CLIError(.ioError, reason)
            case .missingMergeFunction:
                return CLIError(.software, error.description)
            default:
                return CLIError(.dataError, error.description)
            }
        case let error as SyncSessionError:
            switch error {
            case .schemaMismatch, .batchRejected, .tableNotAllowed, .readOnly:
                return CLIError(.dataError, error.description)
            case .unauthorized:
                return CLIError(.notPermitted, error.description)
            case let .peerError(code, _):
                return CLIError(
                    code == .unauthorized ? .notPermitted : code == .schemaMismatch ? .dataError : .unavailable,
                    error.description)
            case .protocolVersion, .protocolViolation, .malformedFrame, .cannotSend:
                return CLIError(.protocolError, error.description)
            case .transport, .connectionClosed, .timeout:
                return CLIError(.unavailable, error.description)
            case let .tls(tls):
                return CLIError(status(of: tls), error.description)
            case .database:
                return CLIError(.dataError, error.description)
            case .storage:
                return CLIError(.ioError, error.description)
            case .internalFailure:
                return CLIError(.software, error.description)
            }
        case let error as TLSConfigurationError:
            switch error {
            case .fileNotFound, .fileUnreadable:
                return CLIError(.noInput, error.description)
            case .openSSLFailure:
                return CLIError(.software, error.description)
            default:
                return CLIError(.notPermitted, error.description)
            }
        case let error as TLSError:
            return CLIError(status(of: error), error.description)
        case let error as CertificateError:
            switch error {
            case .writeFailed: return CLIError(.ioError, error.description)
            case .invalidArgument: return CLIError(.usage, error.description)
            case .openSSLFailure: return CLIError(.software, error.description)
            default: return CLIError(.notPermitted, error.description)
            }
        case let error as ConfigFileError:
            return CLIError(error.isMissing ? .noInput : .usage, error.description)
        case let error as CocoaError:
            return classify(cocoa: error)
        case let error as POSIXError:
            return CLIError(.ioError, String(cString: strerror(error.code.rawValue)))
        default:
            return CLIError(.software, "internal error: \(String(describing: error))")
        }
    }

    private static func classify(_ error: DatabaseError) -> CLIError {
        var message = error.message
        if let sql = error.sql, !sql.isEmpty, error.kind != .corrupt, error.kind != .cannotOpen {
            message += " (in: \(sql.count > 200 ? String(sql.prefix(200)) + "…" : sql))"
        }
        switch error.kind {
        case .corrupt: return CLIError(.dataError, "not a SQLite database, or a damaged one: \(error.message)")
        case .cannotOpen: return CLIError(.noInput, "cannot open the database: \(error.message)")
        case .busy: return CLIError(.temporaryFailure, "the database is locked by another program: \(error.message)")
        case .readOnly: return CLIError(.notPermitted, "the database is read-only: \(error.message)")
        case .other:
            switch error.code {
            case 10, 13: return CLIError(.ioError, message)  // SQLITE_IOERR, SQLITE_FULL
            case 3, 23: return CLIError(.notPermitted, message)  // SQLITE_PERM, SQLITE_AUTH
            default: return CLIError(.dataError, message)
            }
        default:
            return CLIError(.dataError, message)
        }
    }

    private static func classify(cocoa error: CocoaError) -> CLIError {
        let path = (error.userInfo[NSFilePathErrorKey] as? String) ?? error.errorUserInfo[NSFilePathErrorKey] as? String
        let subject = path.map { " \($0)" } ?? ""
        switch error.code {
        case .fileReadNoSuchFile, .fileNoSuchFile:
            return CLIError(.noInput, "no such file\(subject)")
        case .fileReadNoPermission:
            return CLIError(.noInput, "permission denied reading\(subject)")
        case .fileReadCorruptFile, .fileReadUnknown, .fileReadInvalidFileName, .fileReadTooLarge,
            .fileReadUnknownStringEncoding, .fileReadInapplicableStringEncoding:
            return CLIError(.noInput, "cannot read\(subject): \(error.localizedDescription)")
        case .fileWriteNoPermission:
            return CLIError(.notPermitted, "permission denied writing\(subject)")
        default:
            return CLIError(.ioError, "\(error.localizedDescription)\(subject)")
        }
    }

    /// Writes `error` as one line on stderr ("tether: error: …") and returns its exit code.
    static func report(_ error: any Error) -> Int32 {
        let classified = classify(error)
        printError(classified.message)
        return classified.status.rawValue
    }

    /// One line on stderr: "tether: error: <message>", newlines folded.
    static func printError(_ message: String) {
        let line = message.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.joined(
            separator: " ")
        FileHandle.standardError.write(Data("tether: error: \(line)\n".utf8))
    }

    /// One line on stderr: "tether: warning: <message>".
    static func printWarning(_ message: String) {
        FileHandle.standardError.write(Data("tether: warning: \(message)\n".utf8))
    }
}
