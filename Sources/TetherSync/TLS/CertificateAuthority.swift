import COpenSSL
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A certificate and its private key, both PEM.
public struct CertificateAndKey: Sendable, Hashable {
    /// The X.509 certificate, PEM (`-----BEGIN CERTIFICATE-----`).
    public var certificatePEM: String
    /// PKCS#8 (`-----BEGIN PRIVATE KEY-----`), unencrypted.
    public var privateKeyPEM: String

    /// A certificate and its key, both PEM text (read from files, say, to sign with a CA made
    /// earlier).
    public init(certificatePEM: String, privateKeyPEM: String) {
        self.certificatePEM = certificatePEM
        self.privateKeyPEM = privateKeyPEM
    }
}

/// What a certificate says about itself (see ``CertificateAuthority/inspect(certificatePEM:)``).
public struct CertificateInfo: Sendable, Hashable {
    /// SHA-256 of the DER encoding, lowercase hex: what pins and authorization use.
    public var fingerprint: String
    /// RFC 2253, e.g. `CN=node-a`.
    public var subject: String
    /// The issuer's name, RFC 2253 (the subject itself for a self-signed CA).
    public var issuer: String
    /// When the certificate becomes valid.
    public var notBefore: Date
    /// When the certificate expires.
    public var notAfter: Date
    /// Whether it is a CA certificate (basicConstraints CA:TRUE): one that can sign others.
    public var isCertificateAuthority: Bool
}

/// Why a certificate could not be made, read or written.
public enum CertificateError: Error, Sendable, Hashable, CustomStringConvertible {
    /// An argument was refused: `what` names it, `reason` says why.
    case invalidArgument(what: String, reason: String)
    /// A PEM certificate given to sign with or inspect could not be read.
    case invalidCertificate(reason: String)
    /// A PEM private key could not be read (encrypted keys are refused).
    case invalidPrivateKey(reason: String)
    /// The CA's private key is not the key of the CA's certificate.
    case keyDoesNotMatchCertificate(reason: String)
    /// The certificate given as a CA is not a CA certificate (basicConstraints CA:TRUE).
    case notACertificateAuthority(subject: String)
    /// Writing a certificate or key file failed.
    case writeFailed(path: String, reason: String)
    /// OpenSSL failed at `operation`.
    case openSSLFailure(operation: String, reason: String)

    public var description: String {
        switch self {
        case .invalidArgument(let what, let reason): "invalid \(what): \(reason)"
        case .invalidCertificate(let reason): "invalid PEM certificate: \(reason)"
        case .invalidPrivateKey(let reason): "invalid PEM private key: \(reason)"
        case .keyDoesNotMatchCertificate(let reason): "the CA's private key does not match its certificate: \(reason)"
        case .notACertificateAuthority(let subject): "\(subject) is not a CA certificate (no basicConstraints CA:TRUE)"
        case .writeFailed(let path, let reason): "cannot write \(path): \(reason)"
        case .openSSLFailure(let operation, let reason): "OpenSSL failed to \(operation): \(reason)"
        }
    }
}

/// Makes the certificates a Tether deployment needs, with OpenSSL: a CA, and node
/// certificates it signs. Keys are EC P-256, certificates X.509 v3 signed with
/// ECDSA-SHA256, everything PEM.
///
/// ```swift
/// let ca = try CertificateAuthority.create(commonName: "Tether CA", validity: 10 * 365 * 86_400)
/// let north = try CertificateAuthority.issue(commonName: "north", signedBy: ca, validity: 365 * 86_400)
/// try CertificateAuthority.write(north, certificatePath: "north.pem", privateKeyPath: "north.key")
/// ```
public enum CertificateAuthority {
    /// A new self-signed CA certificate (basicConstraints CA:TRUE, keyCertSign) and its key.
    public static func create(
        commonName: String, validity: TimeInterval, notBefore: Date = Date()
    ) throws(CertificateError) -> CertificateAndKey {
        let key = try generateKey()
        defer { EVP_PKEY_free(key) }
        let certificate = try makeCertificate(
            commonName: commonName, subjectKey: key, issuer: nil, issuerKey: key,
            notBefore: notBefore, validity: validity,
            extensions: [
                (NID_basic_constraints, "critical,CA:TRUE"),
                (NID_key_usage, "critical,keyCertSign,cRLSign"),
                (NID_subject_key_identifier, "hash"),
            ])
        defer { X509_free(certificate) }
        return CertificateAndKey(certificatePEM: try pem(certificate: certificate), privateKeyPEM: try pem(key: key))
    }

    /// A new node certificate signed by `ca`, for both TLS server and client use,
    /// with a new key.
    ///
    /// - Parameters:
    ///   - commonName: The subject's common name, which peers see as this node's certificate name.
    ///   - ca: The certificate authority that signs, with its private key.
    ///   - validity: Seconds from `notBefore` until the certificate expires.
    ///   - notBefore: When the certificate becomes valid; may lie in the past (with a short
    ///     `validity`, an expired certificate, for tests).
    ///   - dnsNames: subjectAltName DNS names; nil: the common name, when it is a valid DNS name.
    ///   - ipAddresses: subjectAltName IP addresses.
    public static func issue(
        commonName: String, signedBy ca: CertificateAndKey, validity: TimeInterval, notBefore: Date = Date(),
        dnsNames: [String]? = nil, ipAddresses: [String] = ["127.0.0.1"]
    ) throws(CertificateError) -> CertificateAndKey {
        let caCertificate = try readCertificate(ca.certificatePEM)
        defer { X509_free(caCertificate) }
        let caKey = try readPrivateKey(ca.privateKeyPEM)
        defer { EVP_PKEY_free(caKey) }
        guard X509_check_ca(caCertificate) != 0 else {
            throw .notACertificateAuthority(subject: OpenSSL.subject(of: caCertificate))
        }
        ERR_clear_error()
        guard X509_check_private_key(caCertificate, caKey) == 1 else {
            throw .keyDoesNotMatchCertificate(reason: OpenSSL.drainErrorText(fallback: "key values mismatch"))
        }
        let key = try generateKey()
        defer { EVP_PKEY_free(key) }
        let certificate = try makeCertificate(
            commonName: commonName, subjectKey: key, issuer: caCertificate, issuerKey: caKey,
            notBefore: notBefore, validity: validity,
            extensions: try leafExtensions(commonName: commonName, dnsNames: dnsNames, ipAddresses: ipAddresses)
                + [(NID_authority_key_identifier, "keyid:always")])
        defer { X509_free(certificate) }
        return CertificateAndKey(certificatePEM: try pem(certificate: certificate), privateKeyPEM: try pem(key: key))
    }

    /// A self-signed node certificate (not a CA), which no CA vouches for.
    public static func selfSigned(
        commonName: String, validity: TimeInterval, notBefore: Date = Date(),
        dnsNames: [String]? = nil, ipAddresses: [String] = ["127.0.0.1"]
    ) throws(CertificateError) -> CertificateAndKey {
        let key = try generateKey()
        defer { EVP_PKEY_free(key) }
        let certificate = try makeCertificate(
            commonName: commonName, subjectKey: key, issuer: nil, issuerKey: key,
            notBefore: notBefore, validity: validity,
            extensions: try leafExtensions(commonName: commonName, dnsNames: dnsNames, ipAddresses: ipAddresses))
        defer { X509_free(certificate) }
        return CertificateAndKey(certificatePEM: try pem(certificate: certificate), privateKeyPEM: try pem(key: key))
    }

    /// The fingerprint, names and validity of the first certificate in `certificatePEM`.
    public static func inspect(certificatePEM: String) throws(CertificateError) -> CertificateInfo {
        let certificate = try readCertificate(certificatePEM)
        defer { X509_free(certificate) }
        guard let fingerprint = OpenSSL.fingerprint(of: certificate) else {
            throw .openSSLFailure(
                operation: "compute a SHA-256 fingerprint",
                reason: OpenSSL.drainErrorText(fallback: "X509_digest failed"))
        }
        let issuer = X509_get_issuer_name(certificate).map { OpenSSL.nameText($0) } ?? ""
        return CertificateInfo(
            fingerprint: fingerprint, subject: OpenSSL.subject(of: certificate), issuer: issuer,
            notBefore: try date(X509_get0_notBefore(certificate)), notAfter: try date(X509_get0_notAfter(certificate)),
            isCertificateAuthority: X509_check_ca(certificate) != 0)
    }

    /// The SHA-256 fingerprint (lowercase hex) of the first certificate in `certificatePEM`.
    public static func fingerprint(certificatePEM: String) throws(CertificateError) -> String {
        try inspect(certificatePEM: certificatePEM).fingerprint
    }

    /// Writes the certificate (mode 0644) and the private key (mode 0600, also
    /// when the file already existed) to the given paths, replacing them.
    public static func write(
        _ credentials: CertificateAndKey, certificatePath: String, privateKeyPath: String
    ) throws(CertificateError) {
        try writeFile(path: privateKeyPath, contents: credentials.privateKeyPEM, mode: 0o600)
        try writeFile(path: certificatePath, contents: credentials.certificatePEM, mode: 0o644)
    }

    // MARK: Building

    private static func generateKey() throws(CertificateError) -> OpaquePointer {
        ERR_clear_error()
        guard let key = tether_generate_p256_key() else {
            throw .openSSLFailure(
                operation: "generate an EC P-256 key",
                reason: OpenSSL.drainErrorText(fallback: "EVP_PKEY_Q_keygen failed"))
        }
        return key
    }

    /// subjectAltName and the usual extensions of a node certificate.
    private static func leafExtensions(
        commonName: String, dnsNames: [String]?, ipAddresses: [String]
    ) throws(CertificateError) -> [(Int32, String)] {
        var names: [String] = []
        let dns = dnsNames ?? (isDNSName(commonName) ? [commonName] : [])
        for name in dns {
            guard isDNSName(name) else {
                throw .invalidArgument(
                    what: "DNS name \"\(name)\"", reason: "letters, digits, '-', '.' and a leading '*.' only")
            }
            names.append("DNS:" + name)
        }
        for address in ipAddresses {
            guard isIPAddress(address) else {
                throw .invalidArgument(what: "IP address \"\(address)\"", reason: "not an IPv4 or IPv6 address")
            }
            names.append("IP:" + address)
        }
        var extensions: [(Int32, String)] = [
            (NID_basic_constraints, "critical,CA:FALSE"),
            (NID_key_usage, "critical,digitalSignature"),
            (NID_ext_key_usage, "serverAuth,clientAuth"),
            (NID_subject_key_identifier, "hash"),
        ]
        if !names.isEmpty {
            extensions.append((NID_subject_alt_name, names.joined(separator: ",")))
        }
        return extensions
    }

    private static func isDNSName(_ name: String) -> Bool {
        guard !name.isEmpty, name.utf8.count <= 253 else { return false }
        var labels = name.split(separator: ".", omittingEmptySubsequences: false)
        if labels.first == "*", labels.count > 1 { labels.removeFirst() }
        return labels.allSatisfy { label in
            !label.isEmpty && label.utf8.count <= 63 && label.first != "-" && label.last != "-"
                && label.unicodeScalars.allSatisfy {
                    $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "-")
                }
        }
    }

    private static func makeCertificate(
        commonName: String, subjectKey: OpaquePointer, issuer: OpaquePointer?, issuerKey: OpaquePointer,
        notBefore: Date, validity: TimeInterval, extensions: [(Int32, String)]
    ) throws(CertificateError) -> OpaquePointer {
        guard !commonName.isEmpty, !commonName.utf8.contains(0), commonName.utf8.count <= 64 else {
            throw .invalidArgument(what: "common name \"\(commonName)\"", reason: "must be 1 to 64 bytes, without NUL")
        }
        guard validity.isFinite, validity > 0 else {
            throw .invalidArgument(what: "validity \(validity)", reason: "must be a positive number of seconds")
        }
        let start = notBefore.timeIntervalSince1970
        let end = start + validity
        // ASN1_TIME covers years 0000-9999; keep well inside it and inside time_t.
        let limit: TimeInterval = 253_402_300_799  // 9999-12-31T23:59:59Z
        guard start.isFinite, start >= -62_135_596_800, end <= limit else {
            throw .invalidArgument(what: "validity period", reason: "must lie between the years 1 and 9999")
        }

        ERR_clear_error()
        guard let certificate = X509_new() else {
            throw .openSSLFailure(
                operation: "allocate a certificate", reason: OpenSSL.drainErrorText(fallback: "X509_new failed"))
        }
        do throws(CertificateError) {
            try check(X509_set_version(certificate, Int(X509_VERSION_3)), "set the certificate version")
            try setRandomSerial(certificate)

            guard let name = X509_NAME_new() else {
                throw .openSSLFailure(
                    operation: "allocate a name", reason: OpenSSL.drainErrorText(fallback: "X509_NAME_new failed"))
            }
            defer { X509_NAME_free(name) }
            let bytes = Array(commonName.utf8)
            guard X509_NAME_add_entry_by_txt(name, "CN", tether_mbstring_utf8(), bytes, Int32(bytes.count), -1, 0) == 1
            else {
                throw .invalidArgument(
                    what: "common name \"\(commonName)\"",
                    reason: OpenSSL.drainErrorText(fallback: "OpenSSL refused it"))
            }
            try check(X509_set_subject_name(certificate, name), "set the subject")
            let issuerName = issuer.flatMap { X509_get_subject_name($0) } ?? name
            try check(X509_set_issuer_name(certificate, issuerName), "set the issuer")
            try check(X509_set_pubkey(certificate, subjectKey), "set the public key")

            guard ASN1_TIME_set(X509_getm_notBefore(certificate), time_t(start.rounded(.down))) != nil,
                ASN1_TIME_set(X509_getm_notAfter(certificate), time_t(end.rounded(.down))) != nil
            else {
                throw .openSSLFailure(
                    operation: "set the validity period",
                    reason: OpenSSL.drainErrorText(fallback: "ASN1_TIME_set failed"))
            }

            var v3 = X509V3_CTX()
            X509V3_set_ctx(&v3, issuer ?? certificate, certificate, nil, nil, 0)
            for (nid, value) in extensions {
                guard let ext = X509V3_EXT_conf_nid(nil, &v3, nid, value) else {
                    let name = OBJ_nid2sn(nid).map { String(cString: $0) } ?? "extension \(nid)"
                    throw .openSSLFailure(
                        operation: "make the \(name) extension \"\(value)\"",
                        reason: OpenSSL.drainErrorText(fallback: "X509V3_EXT_conf_nid failed"))
                }
                defer { X509_EXTENSION_free(ext) }
                try check(X509_add_ext(certificate, ext, -1), "add an extension")
            }
            guard X509_sign(certificate, issuerKey, EVP_sha256()) > 0 else {
                throw .openSSLFailure(
                    operation: "sign the certificate", reason: OpenSSL.drainErrorText(fallback: "X509_sign failed"))
            }
        } catch {
            X509_free(certificate)
            throw error
        }
        return certificate
    }

    private static func check(_ result: Int32, _ operation: String) throws(CertificateError) {
        guard result == 1 else {
            throw .openSSLFailure(operation: operation, reason: OpenSSL.drainErrorText(fallback: "failed"))
        }
    }

    /// A random positive 127-bit serial number (RFC 5280: at most 20 octets, positive).
    private static func setRandomSerial(_ certificate: OpaquePointer) throws(CertificateError) {
        var bytes = [UInt8](repeating: 0, count: 16)
        guard RAND_bytes(&bytes, Int32(bytes.count)) == 1 else {
            throw .openSSLFailure(
                operation: "draw a serial number", reason: OpenSSL.drainErrorText(fallback: "RAND_bytes failed"))
        }
        bytes[0] = (bytes[0] & 0x7f) | 0x40  // positive, never zero, always 16 octets
        guard let number = BN_bin2bn(bytes, Int32(bytes.count), nil) else {
            throw .openSSLFailure(
                operation: "make a serial number", reason: OpenSSL.drainErrorText(fallback: "BN_bin2bn failed"))
        }
        defer { BN_free(number) }
        guard BN_to_ASN1_INTEGER(number, X509_get_serialNumber(certificate)) != nil else {
            throw .openSSLFailure(
                operation: "set the serial number",
                reason: OpenSSL.drainErrorText(fallback: "BN_to_ASN1_INTEGER failed"))
        }
    }

    // MARK: PEM

    private static func pem(certificate: OpaquePointer) throws(CertificateError) -> String {
        try pemText("write the certificate as PEM") { PEM_write_bio_X509($0, certificate) }
    }

    private static func pem(key: OpaquePointer) throws(CertificateError) -> String {
        try pemText("write the private key as PEM") { PEM_write_bio_PrivateKey($0, key, nil, nil, 0, nil, nil) }
    }

    private static func pemText(
        _ operation: String, _ write: (OpaquePointer) -> Int32
    ) throws(CertificateError) -> String {
        ERR_clear_error()
        guard let bio = BIO_new(BIO_s_mem()) else {
            throw .openSSLFailure(operation: operation, reason: OpenSSL.drainErrorText(fallback: "BIO_new failed"))
        }
        defer { BIO_free(bio) }
        guard write(bio) == 1 else {
            throw .openSSLFailure(operation: operation, reason: OpenSSL.drainErrorText(fallback: "PEM_write failed"))
        }
        return String(decoding: OpenSSL.readAll(bio), as: UTF8.self)
    }

    private static func readCertificate(_ text: String) throws(CertificateError) -> OpaquePointer {
        try readPEM(
            text, { PEM_read_bio_X509($0, nil, tetherNoPassword, nil) },
            missing: .invalidCertificate(reason: OpenSSL.drainErrorText(fallback: "no certificate found")))
    }

    private static func readPrivateKey(_ text: String) throws(CertificateError) -> OpaquePointer {
        try readPEM(
            text, { PEM_read_bio_PrivateKey($0, nil, tetherNoPassword, nil) },
            missing: .invalidPrivateKey(reason: OpenSSL.drainErrorText(fallback: "no private key found")))
    }

    /// Reads one PEM object from `text` with `read`; `missing` (evaluated only then, once
    /// OpenSSL's error queue holds why) when there is none.
    private static func readPEM(
        _ text: String, _ read: (OpaquePointer) -> OpaquePointer?,
        missing: @autoclosure () -> CertificateError
    ) throws(CertificateError) -> OpaquePointer {
        guard let bio = OpenSSL.memoryBIO(Array(text.utf8)) else {
            throw .openSSLFailure(
                operation: "make a memory BIO", reason: OpenSSL.drainErrorText(fallback: "BIO_new failed"))
        }
        defer { BIO_free(bio) }
        ERR_clear_error()
        guard let object = read(bio) else { throw missing() }
        return object
    }

    private static func date(_ time: UnsafePointer<ASN1_TIME>?) throws(CertificateError) -> Date {
        var parts = tm()
        guard let time, ASN1_TIME_to_tm(time, &parts) == 1 else {
            throw .invalidCertificate(reason: "unreadable validity date")
        }
        return Date(timeIntervalSince1970: TimeInterval(timegm(&parts)))
    }

    // MARK: Files

    private static func writeFile(path: String, contents: String, mode: mode_t) throws(CertificateError) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { throw .writeFailed(path: path, reason: String(cString: strerror(errno))) }
        var closed = false
        defer { if !closed { close(fd) } }
        // O_CREAT's mode applies only to a new file (and is masked by the umask).
        guard fchmod(fd, mode) == 0 else { throw .writeFailed(path: path, reason: String(cString: strerror(errno))) }
        let bytes = Array(contents.utf8)
        var offset = 0
        while offset < bytes.count {
            let written = bytes.withUnsafeBytes { raw in
                systemWrite(fd, raw.baseAddress.map { $0 + offset }, raw.count - offset)
            }
            if written < 0 {
                if errno == EINTR { continue }
                throw .writeFailed(path: path, reason: String(cString: strerror(errno)))
            }
            offset += written
        }
        closed = true
        guard close(fd) == 0 else { throw .writeFailed(path: path, reason: String(cString: strerror(errno))) }
    }
}

/// write(2); a free function, because inside `CertificateAuthority` the name is its own `write`.
private func systemWrite(_ fd: Int32, _ bytes: UnsafeRawPointer?, _ count: Int) -> Int {
    write(fd, bytes, count)
}
