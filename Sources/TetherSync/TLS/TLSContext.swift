import COpenSSL

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// An OpenSSL `SSL_CTX` built from a ``TLSConfiguration``: the certificates and key
/// loaded, the trust store filled, the protocol floor and the verification set.
///
/// Make one per configuration and share it: every ``TLSHandler`` (one per
/// connection) creates its `SSL` object from it. It is never changed after `init`,
/// and OpenSSL allows creating `SSL` objects from a configured `SSL_CTX` on any
/// thread, which is why it is `Sendable`.
public final class TLSContext: @unchecked Sendable {
    /// The configuration the context was made from.
    public let configuration: TLSConfiguration
    /// The pinned fingerprints, normalized to lowercase hex without separators.
    public let pinnedPeerFingerprints: Set<String>
    /// The certificate this side presents: SHA-256 fingerprint (hex), nil if none.
    public let ownFingerprint: String?
    let sslContext: OpaquePointer

    /// Reads the configuration's files and builds the context; throws `TLSConfigurationError`
    /// naming the file or the fingerprint that is wrong.
    public init(configuration: TLSConfiguration) throws(TLSConfigurationError) {
        var pins: Set<String> = []
        for pin in configuration.pinnedPeerFingerprints {
            guard let normalized = OpenSSL.normalizeFingerprint(pin) else {
                throw .invalidFingerprint(pin)
            }
            pins.insert(normalized)
        }
        if let name = configuration.expectedServerName {
            guard configuration.role == .client else {
                throw .invalidServerName(name, reason: "only a client checks the server's name")
            }
            guard !name.isEmpty, !name.utf8.contains(0) else {
                throw .invalidServerName(name, reason: "empty, or contains a NUL byte")
            }
        }
        let chainPath = configuration.certificateChainFile
        let keyPath = configuration.privateKeyFile
        switch (chainPath, keyPath) {
        case (nil, nil):
            if configuration.role == .server {
                throw .missingCredentials(role: .server, reason: "a server needs a certificate chain and a private key")
            }
        case (.some, nil):
            throw .missingCredentials(role: configuration.role, reason: "a certificate chain is set but no private key")
        case (nil, .some):
            throw .missingCredentials(role: configuration.role, reason: "a private key is set but no certificate chain")
        case (.some, .some):
            break
        }

        ERR_clear_error()
        guard let ctx = SSL_CTX_new(TLS_method()) else {
            throw .openSSLFailure(
                operation: "create an SSL context", reason: OpenSSL.drainErrorText(fallback: "SSL_CTX_new failed"))
        }
        do throws(TLSConfigurationError) {
            self.ownFingerprint = try Self.configure(ctx, configuration)
        } catch {
            SSL_CTX_free(ctx)
            throw error
        }
        self.sslContext = ctx
        self.configuration = configuration
        self.pinnedPeerFingerprints = pins
    }

    deinit {
        SSL_CTX_free(sslContext)
    }

    /// Sets everything up on `ctx`; returns the fingerprint of this side's certificate.
    private static func configure(
        _ ctx: OpaquePointer, _ configuration: TLSConfiguration
    ) throws(TLSConfigurationError) -> String? {
        let version: Int32
        switch configuration.minimumVersion {
        case .tls12:
            version = TLS1_2_VERSION
            // TLS 1.2 only with forward-secret AEAD suites.
            guard SSL_CTX_set_cipher_list(ctx, "ECDHE+AESGCM:ECDHE+CHACHA20") == 1 else {
                throw .openSSLFailure(
                    operation: "set the TLS 1.2 cipher list",
                    reason: OpenSSL.drainErrorText(fallback: "SSL_CTX_set_cipher_list failed"))
            }
        case .tls13:
            version = TLS1_3_VERSION
        }
        guard tether_ssl_ctx_set_min_proto_version(ctx, version) == 1 else {
            throw .openSSLFailure(
                operation: "set the minimum protocol version to \(configuration.minimumVersion)",
                reason: OpenSSL.drainErrorText(fallback: "SSL_CTX_set_min_proto_version failed"))
        }
        tether_ssl_ctx_harden(ctx)
        _ = tether_ssl_ctx_disable_session_cache(ctx)
        // Tether does not resume sessions: no tickets to send or keep.
        _ = SSL_CTX_set_num_tickets(ctx, 0)

        var mode = SSL_VERIFY_PEER
        if configuration.role == .server { mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT }
        SSL_CTX_set_verify(ctx, mode, tetherVerifyPeer)

        var ownFingerprint: String?
        if let chainPath = configuration.certificateChainFile, let keyPath = configuration.privateKeyFile {
            ownFingerprint = try loadCredentials(ctx, chainPath: chainPath, keyPath: keyPath)
        }
        try loadTrust(ctx, path: configuration.trustedCAFile, role: configuration.role)
        return ownFingerprint
    }

    private static func loadCredentials(
        _ ctx: OpaquePointer, chainPath: String, keyPath: String
    ) throws(TLSConfigurationError) -> String? {
        let chain = try readCertificates(path: chainPath, kind: .certificateChain)
        defer { chain.forEach { X509_free($0) } }
        guard let leaf = chain.first else {
            throw .invalidPEM(kind: .certificateChain, path: chainPath, reason: "no certificate found")
        }
        ERR_clear_error()
        guard SSL_CTX_use_certificate(ctx, leaf) == 1 else {
            throw .invalidPEM(
                kind: .certificateChain, path: chainPath,
                reason: OpenSSL.drainErrorText(fallback: "OpenSSL refused the certificate"))
        }
        for intermediate in chain.dropFirst() {
            guard tether_ssl_ctx_add1_chain_cert(ctx, intermediate) == 1 else {
                throw .invalidPEM(
                    kind: .certificateChain, path: chainPath,
                    reason: OpenSSL.drainErrorText(fallback: "OpenSSL refused an intermediate certificate"))
            }
        }

        let key = try readPrivateKey(path: keyPath)
        defer { EVP_PKEY_free(key) }
        ERR_clear_error()
        guard SSL_CTX_use_PrivateKey(ctx, key) == 1, SSL_CTX_check_private_key(ctx) == 1 else {
            throw .keyDoesNotMatchCertificate(
                certificatePath: chainPath, privateKeyPath: keyPath,
                reason: OpenSSL.drainErrorText(fallback: "the key is not the certificate's"))
        }
        return OpenSSL.fingerprint(of: leaf)
    }

    private static func loadTrust(
        _ ctx: OpaquePointer, path: String, role: TLSConfiguration.Role
    ) throws(TLSConfigurationError) {
        let authorities = try readCertificates(path: path, kind: .trustedCA)
        defer { authorities.forEach { X509_free($0) } }
        guard !authorities.isEmpty else {
            throw .invalidPEM(kind: .trustedCA, path: path, reason: "no certificate found")
        }
        guard let store = SSL_CTX_get_cert_store(ctx) else {
            throw .openSSLFailure(
                operation: "get the certificate store", reason: "SSL_CTX_get_cert_store returned nothing")
        }
        for authority in authorities {
            ERR_clear_error()
            guard X509_STORE_add_cert(store, authority) == 1 else {
                throw .invalidPEM(
                    kind: .trustedCA, path: path,
                    reason: OpenSSL.drainErrorText(fallback: "OpenSSL refused a CA certificate"))
            }
            // A server names the CAs it accepts in its CertificateRequest.
            if role == .server, SSL_CTX_add_client_CA(ctx, authority) != 1 {
                throw .openSSLFailure(
                    operation: "add \(OpenSSL.subject(of: authority)) to the acceptable client CAs",
                    reason: OpenSSL.drainErrorText(fallback: "SSL_CTX_add_client_CA failed"))
            }
        }
    }

    // MARK: Reading PEM files

    /// The largest file read: PEM certificates and keys are a few KB.
    static let maximumFileSize = 4 << 20

    static func readFile(path: String, kind: TLSFileKind) throws(TLSConfigurationError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 {
            let code = errno
            if code == ENOENT || code == ENOTDIR { throw .fileNotFound(kind: kind, path: path) }
            throw .fileUnreadable(kind: kind, path: path, reason: String(cString: strerror(code)))
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let count = chunk.withUnsafeMutableBytes { raw in read(fd, raw.baseAddress, raw.count) }
            if count < 0 {
                let code = errno
                if code == EINTR { continue }
                throw .fileUnreadable(kind: kind, path: path, reason: String(cString: strerror(code)))
            }
            if count == 0 { break }
            bytes.append(contentsOf: chunk[0..<count])
            if bytes.count > maximumFileSize {
                throw .fileUnreadable(
                    kind: kind, path: path, reason: "larger than \(maximumFileSize >> 20) MiB, not a PEM file")
            }
        }
        return bytes
    }

    /// Every certificate in a PEM file, in order; the caller frees them.
    static func readCertificates(path: String, kind: TLSFileKind) throws(TLSConfigurationError) -> [OpaquePointer] {
        let bytes = try readFile(path: path, kind: kind)
        return try parseCertificates(bytes, path: path, kind: kind)
    }

    static func parseCertificates(
        _ bytes: [UInt8], path: String, kind: TLSFileKind
    ) throws(TLSConfigurationError) -> [OpaquePointer] {
        guard let bio = OpenSSL.memoryBIO(bytes) else {
            throw .openSSLFailure(
                operation: "make a memory BIO", reason: OpenSSL.drainErrorText(fallback: "BIO_new failed"))
        }
        defer { BIO_free(bio) }
        ERR_clear_error()
        var certificates: [OpaquePointer] = []
        while true {
            if let certificate = PEM_read_bio_X509(bio, nil, tetherNoPassword, nil) {
                certificates.append(certificate)
                continue
            }
            let errors = OpenSSL.drainErrors()
            let endOfInput =
                errors.count == 1 && errors[0].library == ERR_LIB_PEM && errors[0].reason == PEM_R_NO_START_LINE
            if endOfInput && !certificates.isEmpty { break }
            certificates.forEach { X509_free($0) }
            let reason =
                endOfInput
                ? "no certificate found (no \"-----BEGIN CERTIFICATE-----\" block)"
                : OpenSSL.errorText(errors, fallback: "unreadable certificate")
            throw .invalidPEM(kind: kind, path: path, reason: reason)
        }
        return certificates
    }

    /// The private key in a PEM file; the caller frees it. Encrypted keys are refused.
    static func readPrivateKey(path: String) throws(TLSConfigurationError) -> OpaquePointer {
        let bytes = try readFile(path: path, kind: .privateKey)
        guard let bio = OpenSSL.memoryBIO(bytes) else {
            throw .openSSLFailure(
                operation: "make a memory BIO", reason: OpenSSL.drainErrorText(fallback: "BIO_new failed"))
        }
        defer { BIO_free(bio) }
        ERR_clear_error()
        guard let key = PEM_read_bio_PrivateKey(bio, nil, tetherNoPassword, nil) else {
            let errors = OpenSSL.drainErrors()
            // OpenSSL 3's decoders say "unsupported" for a file with no key block at all.
            let noKey = !String(decoding: bytes, as: UTF8.self).contains("PRIVATE KEY-----")
            let reason =
                noKey
                ? "no private key found (no \"-----BEGIN PRIVATE KEY-----\" block)"
                : OpenSSL.errorText(errors, fallback: "unreadable private key")
            throw .invalidPEM(kind: .privateKey, path: path, reason: reason)
        }
        return key
    }
}

/// Per-connection state the verification callback reads and writes. Owned by
/// the ``TLSHandler``; reached from the `SSL` object's app-data slot, and only
/// ever on the connection's event loop (inside `SSL_do_handshake`).
final class TLSVerificationState {
    let pins: Set<String>
    /// The fingerprint of a peer certificate that verified but was not pinned.
    var pinMismatch: String?

    init(pins: Set<String>) {
        self.pins = pins
    }
}

/// OpenSSL's verification callback: called for each certificate in the peer's
/// chain, leaf (depth 0) last. Keeps OpenSSL's verdict and, when the chain is
/// good and pins are set, refuses a leaf whose fingerprint is not pinned.
func tetherVerifyPeer(_ preverified: Int32, _ store: OpaquePointer?) -> Int32 {
    guard preverified == 1, let store, X509_STORE_CTX_get_error_depth(store) == 0 else {
        return preverified
    }
    guard let sslPointer = X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()),
        let statePointer = SSL_get_ex_data(OpaquePointer(sslPointer), 0)
    else {
        // Not one of ours: refuse rather than skip the pin check.
        X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION)
        return 0
    }
    let state = Unmanaged<TLSVerificationState>.fromOpaque(statePointer).takeUnretainedValue()
    guard !state.pins.isEmpty else { return 1 }
    guard let leaf = X509_STORE_CTX_get_current_cert(store), let fingerprint = OpenSSL.fingerprint(of: leaf) else {
        state.pinMismatch = "(no fingerprint)"
        X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION)
        return 0
    }
    guard state.pins.contains(fingerprint) else {
        state.pinMismatch = fingerprint
        X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION)
        return 0
    }
    return 1
}

/// Whether `name` is an IPv4 or IPv6 address (as opposed to a DNS name).
func isIPAddress(_ name: String) -> Bool {
    var v4 = in_addr()
    var v6 = in6_addr()
    return inet_pton(AF_INET, name, &v4) == 1 || inet_pton(AF_INET6, name, &v6) == 1
}
