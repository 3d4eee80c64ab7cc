import COpenSSL
import Foundation
import Testing
import TetherSync

/// Expects `body` to throw a `TLSConfigurationError` and returns it.
private func configurationError(
    sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> TLSContext
) -> TLSConfigurationError? {
    do {
        _ = try body()
        Issue.record("no error thrown", sourceLocation: sourceLocation)
        return nil
    } catch let error as TLSConfigurationError {
        return error
    } catch {
        Issue.record("unexpected error \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

private func serverConfiguration(_ pki: TestPKI, certificate: String? = nil, key: String? = nil, ca: String? = nil)
    -> TLSConfiguration
{
    .server(
        certificateChainFile: certificate ?? pki.server.certificate, privateKeyFile: key ?? pki.server.key,
        trustedCAFile: ca ?? pki.caFile)
}

@Suite("TLS configuration loading")
struct TLSConfigurationTests {
    @Test("a valid configuration loads and knows its own fingerprint")
    func loads() throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let context = try TLSContext(configuration: serverConfiguration(pki))
        #expect(context.ownFingerprint == pki.server.fingerprint)
        #expect(context.configuration.minimumVersion == .tls13)
        let tls12 = try TLSContext(
            configuration: .client(
                certificateChainFile: pki.client.certificate, privateKeyFile: pki.client.key, trustedCAFile: pki.caFile,
                minimumVersion: .tls12))
        #expect(tls12.configuration.minimumVersion == .tls12)
    }

    @Test("a missing file is named")
    func missingFile() throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let missing = pki.directory.file("nowhere.crt")
        let error = configurationError { try TLSContext(configuration: serverConfiguration(pki, certificate: missing)) }
        #expect(error == .fileNotFound(kind: .certificateChain, path: missing))
        #expect(error?.description == "TLS certificate chain file not found: \(missing)")
        let missingCA = pki.directory.file("no-ca.crt")
        #expect(
            configurationError { try TLSContext(configuration: serverConfiguration(pki, ca: missingCA)) }
                == .fileNotFound(kind: .trustedCA, path: missingCA))
    }

    @Test("an unreadable file says why")
    func unreadableFile() throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        // A directory opens but cannot be read, whoever runs the test (root ignores permissions).
        let error = configurationError {
            try TLSContext(configuration: serverConfiguration(pki, key: pki.directory.path))
        }
        #expect(error == .fileUnreadable(kind: .privateKey, path: pki.directory.path, reason: "Is a directory"))
    }

    @Test("a file that is not PEM is refused with OpenSSL's reason")
    func badPEM() throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let garbage = pki.directory.file("garbage.crt")
        try "this is not a certificate\n".write(toFile: garbage, atomically: true, encoding: .utf8)
        let error = configurationError { try TLSContext(configuration: serverConfiguration(pki, certificate: garbage)) }
        #expect(
            error
                == .invalidPEM(
                    kind: .certificateChain, path: garbage,
                    reason: "no certificate found (no \"-----BEGIN CERTIFICATE-----\" block)"))

        let corrupt = pki.directory.file("corrupt.crt")
        try "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n"
            .write(toFile: corrupt, atomically: true, encoding: .utf8)
        guard
            case .invalidPEM(.trustedCA, corrupt, let reason)? = configurationError({
                try TLSContext(configuration: serverConfiguration(pki, ca: corrupt))
            })
        else {
            Issue.record("expected invalidPEM for the corrupt CA file")
            return
        }
        #expect(!reason.isEmpty && !reason.contains("no certificate found"), "\(reason)")

        // A certificate where the key should be.
        #expect(
            configurationError { try TLSContext(configuration: serverConfiguration(pki, key: pki.server.certificate)) }
                == .invalidPEM(
                    kind: .privateKey, path: pki.server.certificate,
                    reason: "no private key found (no \"-----BEGIN PRIVATE KEY-----\" block)"))
    }

    @Test("an encrypted private key is refused without prompting for a password")
    func encryptedKey() throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let encrypted = pki.directory.file("encrypted.key")
        try encryptedPEM(keyFile: pki.server.key).write(toFile: encrypted, atomically: true, encoding: .utf8)
        guard
            case .invalidPEM(.privateKey, encrypted, let reason)? = configurationError({
                try TLSContext(configuration: serverConfiguration(pki, key: encrypted))
            })
        else {
            Issue.record("expected invalidPEM for the encrypted key")
            return
        }
        #expect(!reason.isEmpty)
    }

    @Test("a key that does not match the certificate is refused, naming both files")
    func keyMismatch() throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        guard
            case .keyDoesNotMatchCertificate(pki.server.certificate, pki.client.key, let reason)? = configurationError({
                try TLSContext(configuration: serverConfiguration(pki, key: pki.client.key))
            })
        else {
            Issue.record("expected keyDoesNotMatchCertificate")
            return
        }
        #expect(reason.contains("key values mismatch"), "\(reason)")
    }

    @Test("bad pins, a server without credentials and a server name on a server are refused")
    func badSettings() throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        var pinned = serverConfiguration(pki)
        pinned.pinnedPeerFingerprints = ["abc123"]
        #expect(configurationError { try TLSContext(configuration: pinned) } == .invalidFingerprint("abc123"))

        let anonymousServer = TLSConfiguration(
            role: .server, certificateChainFile: nil, privateKeyFile: nil, trustedCAFile: pki.caFile)
        guard
            case .missingCredentials(.server, _)? = configurationError({
                try TLSContext(configuration: anonymousServer)
            })
        else {
            Issue.record("expected missingCredentials")
            return
        }
        let halfClient = TLSConfiguration.client(
            certificateChainFile: pki.client.certificate, privateKeyFile: nil, trustedCAFile: pki.caFile)
        guard case .missingCredentials(.client, _)? = configurationError({ try TLSContext(configuration: halfClient) })
        else {
            Issue.record("expected missingCredentials")
            return
        }
        var named = serverConfiguration(pki)
        named.expectedServerName = "node"
        guard case .invalidServerName("node", _)? = configurationError({ try TLSContext(configuration: named) }) else {
            Issue.record("expected invalidServerName")
            return
        }
    }
}

/// The private key in `keyFile`, re-encrypted with AES-256 under a password (PKCS#8).
private func encryptedPEM(keyFile: String) throws -> String {
    let text = try String(contentsOfFile: keyFile, encoding: .utf8)
    let input = Array(text.utf8)
    let inputBIO = BIO_new(BIO_s_mem())
    let outputBIO = BIO_new(BIO_s_mem())
    defer {
        BIO_free(inputBIO)
        BIO_free(outputBIO)
    }
    _ = input.withUnsafeBytes { BIO_write(inputBIO, $0.baseAddress, Int32($0.count)) }
    guard let key = PEM_read_bio_PrivateKey(inputBIO, nil, nil, nil) else {
        throw TestTimeout(what: "a readable key")  // never expected: the key was just written
    }
    defer { EVP_PKEY_free(key) }
    let password = Array("secret".utf8).map { CChar(bitPattern: $0) }
    var mutablePassword = password
    guard
        PEM_write_bio_PKCS8PrivateKey(
            outputBIO, key, EVP_aes_256_cbc(), &mutablePassword, Int32(password.count), nil, nil) == 1
    else {
        throw TestTimeout(what: "an encrypted key")
    }
    var result: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let count = chunk.withUnsafeMutableBytes { BIO_read(outputBIO, $0.baseAddress, Int32($0.count)) }
        if count <= 0 { break }
        result += chunk[0..<Int(count)]
    }
    let pem = String(decoding: result, as: UTF8.self)
    #expect(pem.contains("ENCRYPTED PRIVATE KEY"))
    return pem
}
