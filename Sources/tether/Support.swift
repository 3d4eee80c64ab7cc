import Foundation
import Tether
import TetherSync

#if canImport(Glibc)
    import Glibc
#endif

/// Opening databases the way every command does.
enum TetherDatabase {
    /// Opens the Tether database at `path` for a command other than `init`:
    /// the file must exist, be a SQLite database and have been initialised by
    /// Tether (it holds an instance key); otherwise nothing is created or
    /// changed and the error says which it is.
    static func openExisting(path: String) throws -> Database {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw CLIError(.noInput, "database \(path) does not exist (create it with: tether init --db \(path))")
        }
        guard !isDirectory.boolValue else { throw CLIError(.noInput, "database \(path) is a directory") }
        guard FileManager.default.isReadableFile(atPath: path) else {
            throw CLIError(.noInput, "database \(path) cannot be read (permission denied)")
        }
        // Checked read-only first, so that a file that is not Tether's is left untouched.
        var readOnly = Database.Configuration()
        readOnly.readOnly = true
        do {
            let probe = try Database(path: path, configuration: readOnly)
            try? probe.close()
        } catch let error as DatabaseError {
            switch error.kind {
            case .corrupt:
                throw CLIError(.dataError, "\(path) is not a SQLite database (\(error.message))")
            case .busy:
                throw CLIError(.temporaryFailure, "database \(path) is locked by another program")
            case .cannotOpen:
                throw CLIError(.noInput, "cannot open database \(path): \(error.message)")
            default:
                throw CLIError(
                    .dataError, "\(path) is not a Tether database (initialise it with: tether init --db \(path))")
            }
        }
        return try open(path: path)
    }

    /// Opens (creating it if needed) the database at `path`, read-write.
    static func open(path: String) throws -> Database {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw CLIError(.noInput, "database \(path) is a directory")
        }
        do {
            return try Database(path: path)
        } catch let error as DatabaseError {
            switch error.kind {
            case .corrupt: throw CLIError(.dataError, "\(path) is not a SQLite database (\(error.message))")
            case .cannotOpen: throw CLIError(.cannotCreate, "cannot open or create database \(path): \(error.message)")
            case .busy: throw CLIError(.temporaryFailure, "database \(path) is locked by another program")
            case .readOnly: throw CLIError(.notPermitted, "database \(path) is read-only: \(error.message)")
            default: throw error
            }
        }
    }
}

/// Files written whole or not at all.
enum AtomicFile {
    /// Writes `contents` to `path` through a temporary file in the same
    /// directory, created with `mode`, then renamed over `path`: readers see
    /// the old file or the new one, never part of it.
    static func write(_ contents: Data, to path: String, mode: mode_t) throws {
        let url = URL(fileURLWithPath: path)
        let directory = url.deletingLastPathComponent().path
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw CLIError(.cannotCreate, "cannot write \(path): it is a directory")
        }
        let temporary = directory + "/.\(url.lastPathComponent).\(UUID().uuidString).partial"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
        guard fd >= 0 else {
            throw CLIError(.cannotCreate, "cannot write \(path): \(String(cString: strerror(errno)))")
        }
        var failure: String?
        if fchmod(fd, mode) != 0 { failure = String(cString: strerror(errno)) }
        if failure == nil {
            failure = contents.withUnsafeBytes { raw -> String? in
                var offset = 0
                while offset < raw.count {
                    let written = Glibc.write(fd, raw.baseAddress.map { $0 + offset }, raw.count - offset)
                    if written < 0 {
                        if errno == EINTR { continue }
                        return String(cString: strerror(errno))
                    }
                    offset += written
                }
                return nil
            }
        }
        if failure == nil, fsync(fd) != 0 { failure = String(cString: strerror(errno)) }
        if close(fd) != 0, failure == nil { failure = String(cString: strerror(errno)) }
        if failure == nil, rename(temporary, path) != 0 { failure = String(cString: strerror(errno)) }
        if let failure {
            unlink(temporary)
            throw CLIError(.ioError, "cannot write \(path): \(failure)")
        }
    }

    /// Creates `path` (and its parents) as a directory if it does not exist.
    static func createDirectory(_ path: String) throws {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw CLIError(.cannotCreate, "\(path) exists and is not a directory") }
            return
        }
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        } catch {
            throw CLIError(.cannotCreate, "cannot create directory \(path): \(error.localizedDescription)")
        }
    }

    /// The contents of a file the user named, or a one-line error saying why not.
    static func read(_ path: String, what: String) throws -> Data {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw CLIError(.noInput, "\(what) \(path) does not exist")
        }
        guard !isDirectory.boolValue else { throw CLIError(.noInput, "\(what) \(path) is a directory") }
        do {
            return try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            throw CLIError(.noInput, "cannot read \(what) \(path)")
        }
    }
}

/// TLS contexts from PEM files, for `sync` and `serve`.
enum TLSFiles {
    /// A TLS context from PEM files: this node's certificate (chain) and key,
    /// and the CA its peers' certificates must chain to. Errors become
    /// `TLSConfigurationError` (mapped to exit codes 66 and 77).
    static func context(
        role: TLSConfiguration.Role, certificate: String, key: String, ca: String,
        pinnedFingerprints: Set<String> = [], expectedServerName: String? = nil
    ) throws -> TLSContext {
        try refuseUnprotectedKey(key)
        try refuseCertificateOutOfDate(certificate)
        let configuration: TLSConfiguration
        switch role {
        case .client:
            configuration = .client(
                certificateChainFile: certificate, privateKeyFile: key, trustedCAFile: ca,
                pinnedPeerFingerprints: pinnedFingerprints, expectedServerName: expectedServerName)
        case .server:
            configuration = .server(
                certificateChainFile: certificate, privateKeyFile: key, trustedCAFile: ca,
                pinnedPeerFingerprints: pinnedFingerprints)
        }
        return try TLSContext(configuration: configuration)
    }

    /// A private key others may read is refused, as sshd refuses one: whoever reads it can be this
    /// node to every peer. (A file that cannot be read is left to the TLS context to report.)
    static func refuseUnprotectedKey(_ path: String) throws {
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
            let mode = (attributes[.posixPermissions] as? NSNumber)?.intValue, mode & 0o077 != 0
        else { return }
        throw CLIError(
            .notPermitted,
            "the private key \(path) may be read by others (mode \(String(mode & 0o777, radix: 8))): "
                + "it would let them be this node to every peer; make it this user's alone: chmod 600 \(path)")
    }

    /// This node's own certificate out of its validity is refused before any peer is met: every
    /// peer would refuse it (a certificate that cannot be read is left to the TLS context to report).
    static func refuseCertificateOutOfDate(_ path: String) throws {
        guard let pem = try? String(contentsOfFile: path, encoding: .utf8),
            let info = try? CertificateAuthority.inspect(certificatePEM: pem)
        else { return }
        let now = Date()
        let format = ISO8601DateFormatter()
        if info.notAfter < now {
            throw CLIError(
                .notPermitted,
                "this node's certificate \(path) (\(info.subject)) expired on \(format.string(from: info.notAfter)): "
                    + "its peers refuse it; issue a new one (tether cert node --ca DIR --name NAME --out DIR)")
        }
        if info.notBefore > now {
            throw CLIError(
                .notPermitted,
                "this node's certificate \(path) (\(info.subject)) is not valid before "
                    + "\(format.string(from: info.notBefore)): "
                    + "check this machine's clock, or the certificate's")
        }
    }
}

extension PeerAddress {
    /// Parses a `HOST:PORT` flag (`[::1]:7000` for IPv6; port 0 only with `allowsAnyPort`).
    init(parsing text: String, allowsAnyPort: Bool = false) throws {
        guard let address = PeerAddress(text, allowsAnyPort: allowsAnyPort) else {
            throw CLIError.usage(
                """
                invalid address \"\(text)\": expected HOST:PORT or [IPv6]:PORT with a port from \
                \(allowsAnyPort ? 0 : 1) to 65535
                """)
        }
        self = address
    }
}

/// Standard output, for results.
enum Output {
    static func line(_ text: String) {
        FileHandle.standardOutput.write(Data((text + "\n").utf8))
    }
}
