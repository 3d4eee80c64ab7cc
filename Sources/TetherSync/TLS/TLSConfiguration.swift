/// How one side of a Tether TLS connection authenticates itself and its peer.
///
/// Both sides present a certificate and verify the other's against `trustedCAFile`:
/// a server always requests a client certificate and refuses a client that sends
/// none or one that does not verify (mutual TLS). On top of the CA check, a set of
/// pinned SHA-256 fingerprints may restrict which peer certificates are accepted.
///
/// All files are PEM. They are read when a ``TLSContext`` is made from the
/// configuration, and problems are reported then as ``TLSConfigurationError``.
///
/// ```swift
/// let server = try TLSContext(configuration: .server(
///     certificateChainFile: "hub.pem", privateKeyFile: "hub.key", trustedCAFile: "ca.pem"))
/// let client = try TLSContext(configuration: .client(
///     certificateChainFile: "north.pem", privateKeyFile: "north.key", trustedCAFile: "ca.pem",
///     expectedServerName: "hub.example.com"))
/// ```
public struct TLSConfiguration: Sendable, Hashable {
    /// Which end of the connection this configuration is for.
    public enum Role: String, Sendable, Hashable {
        /// The side that listens and accepts connections.
        case server
        /// The side that connects.
        case client
    }

    /// Which end of the connection this configuration is for.
    public var role: Role
    /// PEM file with this side's certificate first, then any intermediates.
    /// Required for a server; a client without one is refused by every Tether
    /// server (it exists so that refusal can be tested).
    public var certificateChainFile: String?
    /// PEM file with the private key of the first certificate in `certificateChainFile`.
    public var privateKeyFile: String?
    /// PEM file with the certificate authorities the peer's certificate must chain to.
    public var trustedCAFile: String
    /// The lowest protocol version accepted. TLS 1.3 unless set to `.tls12` on purpose.
    public var minimumVersion: TLSVersion
    /// SHA-256 fingerprints (hex; colons, spaces and case are ignored) of the only
    /// peer certificates accepted. Empty: any certificate the CA vouches for.
    public var pinnedPeerFingerprints: Set<String>
    /// Client only: the name (DNS name or IP address) the server's certificate must
    /// carry in its subjectAltName; also sent as SNI when it is a DNS name.
    /// Nil: the server is authenticated by its CA (and pins) alone.
    public var expectedServerName: String?

    /// A configuration of every field; `server(…)` and `client(…)` are the usual ways to make one.
    public init(
        role: Role,
        certificateChainFile: String?,
        privateKeyFile: String?,
        trustedCAFile: String,
        minimumVersion: TLSVersion = .tls13,
        pinnedPeerFingerprints: Set<String> = [],
        expectedServerName: String? = nil
    ) {
        self.role = role
        self.certificateChainFile = certificateChainFile
        self.privateKeyFile = privateKeyFile
        self.trustedCAFile = trustedCAFile
        self.minimumVersion = minimumVersion
        self.pinnedPeerFingerprints = pinnedPeerFingerprints
        self.expectedServerName = expectedServerName
    }

    /// A server: presents `certificateChainFile`, requires and verifies client certificates.
    public static func server(
        certificateChainFile: String, privateKeyFile: String, trustedCAFile: String,
        minimumVersion: TLSVersion = .tls13, pinnedPeerFingerprints: Set<String> = []
    ) -> TLSConfiguration {
        TLSConfiguration(
            role: .server, certificateChainFile: certificateChainFile, privateKeyFile: privateKeyFile,
            trustedCAFile: trustedCAFile, minimumVersion: minimumVersion,
            pinnedPeerFingerprints: pinnedPeerFingerprints)
    }

    /// A client: presents `certificateChainFile` and verifies the server's certificate.
    public static func client(
        certificateChainFile: String?, privateKeyFile: String?, trustedCAFile: String,
        minimumVersion: TLSVersion = .tls13, pinnedPeerFingerprints: Set<String> = [],
        expectedServerName: String? = nil
    ) -> TLSConfiguration {
        TLSConfiguration(
            role: .client, certificateChainFile: certificateChainFile, privateKeyFile: privateKeyFile,
            trustedCAFile: trustedCAFile, minimumVersion: minimumVersion,
            pinnedPeerFingerprints: pinnedPeerFingerprints, expectedServerName: expectedServerName)
    }
}

/// A TLS protocol version.
public enum TLSVersion: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// TLS 1.2, accepted only when `minimumVersion` is set to it.
    case tls12
    /// TLS 1.3, the default floor.
    case tls13

    /// OpenSSL's name for it, e.g. `TLSv1.3`.
    public var description: String {
        switch self {
        case .tls12: "TLSv1.2"
        case .tls13: "TLSv1.3"
        }
    }
}

/// Which of a configuration's files a ``TLSConfigurationError`` is about.
public enum TLSFileKind: String, Sendable, Hashable {
    /// `certificateChainFile`.
    case certificateChain = "certificate chain"
    /// `privateKeyFile`.
    case privateKey = "private key"
    /// `trustedCAFile`.
    case trustedCA = "trusted CA"
}

/// Why a ``TLSConfiguration`` could not be turned into a ``TLSContext``.
public enum TLSConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The file does not exist.
    case fileNotFound(kind: TLSFileKind, path: String)
    /// The file exists but could not be read (permissions, a directory, an I/O error).
    case fileUnreadable(kind: TLSFileKind, path: String, reason: String)
    /// The file is not PEM of the expected kind, or OpenSSL could not parse it.
    case invalidPEM(kind: TLSFileKind, path: String, reason: String)
    /// The private key is not the key of the chain's first certificate.
    case keyDoesNotMatchCertificate(certificatePath: String, privateKeyPath: String, reason: String)
    /// A server configuration has no certificate or no private key; or only one of the two is set.
    case missingCredentials(role: TLSConfiguration.Role, reason: String)
    /// A pinned fingerprint is not 64 hex digits.
    case invalidFingerprint(String)
    /// `expectedServerName` on a server, or a name OpenSSL refused.
    case invalidServerName(String, reason: String)
    /// OpenSSL failed to set something up (out of memory, a missing algorithm).
    case openSSLFailure(operation: String, reason: String)

    public var description: String {
        switch self {
        case .fileNotFound(let kind, let path):
            "TLS \(kind.rawValue) file not found: \(path)"
        case .fileUnreadable(let kind, let path, let reason):
            "cannot read TLS \(kind.rawValue) file \(path): \(reason)"
        case .invalidPEM(let kind, let path, let reason):
            "TLS \(kind.rawValue) file \(path) is not valid PEM: \(reason)"
        case .keyDoesNotMatchCertificate(let certificatePath, let privateKeyPath, let reason):
            "private key \(privateKeyPath) does not match certificate \(certificatePath): \(reason)"
        case .missingCredentials(let role, let reason):
            "TLS \(role.rawValue) configuration: \(reason)"
        case .invalidFingerprint(let text):
            "pinned fingerprint \"\(text)\" is not a SHA-256 fingerprint (64 hex digits)"
        case .invalidServerName(let name, let reason):
            "expected server name \"\(name)\": \(reason)"
        case .openSSLFailure(let operation, let reason):
            "OpenSSL failed to \(operation): \(reason)"
        }
    }
}
