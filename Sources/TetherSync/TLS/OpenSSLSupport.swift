import COpenSSL

/// Small helpers over the OpenSSL C API shared by the TLS transport and the
/// certificate tools. Everything here is synchronous and touches only the
/// objects it is given (and the calling thread's OpenSSL error queue).
enum OpenSSL {
    /// One entry of OpenSSL's per-thread error queue.
    struct QueuedError {
        var code: UInt
        var text: String
        var library: Int32 { tether_err_get_lib(UInt(code)) }
        var reason: Int32 { tether_err_get_reason(UInt(code)) }
    }

    /// Empties this thread's OpenSSL error queue, oldest first.
    static func drainErrors() -> [QueuedError] {
        var errors: [QueuedError] = []
        while true {
            var data: UnsafePointer<CChar>?
            var flags: Int32 = 0
            let code = ERR_get_error_all(nil, nil, nil, &data, &flags)
            if code == 0 { break }
            var text: String
            if let reason = ERR_reason_error_string(code) {
                text = String(cString: reason)
            } else {
                text = "OpenSSL error \(String(code, radix: 16))"
            }
            if let data, (flags & ERR_TXT_STRING) != 0 {
                let extra = String(cString: data)
                if !extra.isEmpty { text += " (\(extra))" }
            }
            errors.append(QueuedError(code: code, text: text))
        }
        return errors
    }

    /// The error queue as one sentence; `fallback` when OpenSSL queued nothing.
    static func errorText(_ errors: [QueuedError], fallback: String) -> String {
        var seen: [String] = []
        for error in errors where !seen.contains(error.text) {
            seen.append(error.text)
        }
        return seen.isEmpty ? fallback : seen.joined(separator: "; ")
    }

    /// Drains the error queue into one sentence.
    static func drainErrorText(fallback: String) -> String {
        errorText(drainErrors(), fallback: fallback)
    }

    /// Reads everything a memory BIO holds.
    static func readAll(_ bio: OpaquePointer) -> [UInt8] {
        var result: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { raw in
                BIO_read(bio, raw.baseAddress, Int32(raw.count))
            }
            if count <= 0 { break }
            result.append(contentsOf: chunk[0..<Int(count)])
        }
        return result
    }

    /// A new memory BIO holding `bytes` (read/write, so OpenSSL may consume it).
    static func memoryBIO(_ bytes: [UInt8]) -> OpaquePointer? {
        guard let bio = BIO_new(BIO_s_mem()) else { return nil }
        if !bytes.isEmpty {
            let written = bytes.withUnsafeBytes { raw in
                BIO_write(bio, raw.baseAddress, Int32(raw.count))
            }
            if written != Int32(bytes.count) {
                BIO_free(bio)
                return nil
            }
        }
        return bio
    }

    /// Lowercase hex of `bytes`.
    static func hex<S: Sequence>(_ bytes: S) -> String where S.Element == UInt8 {
        let digits: [Character] = Array("0123456789abcdef")
        var text = ""
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0f)])
        }
        return text
    }

    /// SHA-256 of the certificate's DER encoding, lowercase hex; nil if OpenSSL fails.
    static func fingerprint(of certificate: OpaquePointer) -> String? {
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let ok = digest.withUnsafeMutableBufferPointer { buffer in
            X509_digest(certificate, EVP_sha256(), buffer.baseAddress, &length)
        }
        guard ok == 1, length == 32 else { return nil }
        return hex(digest[0..<Int(length)])
    }

    /// The certificate subject's common name (`CN`), or nil if it has none.
    static func commonName(of certificate: OpaquePointer) -> String? {
        guard let name = X509_get_subject_name(certificate) else { return nil }
        // RFC 5280 caps a common name at 64 characters; the buffer leaves room for multibyte ones.
        var buffer = [CChar](repeating: 0, count: 1024)
        let length = X509_NAME_get_text_by_NID(name, NID_commonName, &buffer, Int32(buffer.count))
        guard length > 0 else { return nil }
        return String(decoding: buffer.prefix(Int(length)).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// The certificate's subject in RFC 2253 form, e.g. `CN=node-a`.
    static func subject(of certificate: OpaquePointer) -> String {
        guard let name = X509_get_subject_name(certificate) else { return "" }
        return nameText(name)
    }

    static func nameText(_ name: OpaquePointer) -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { return "" }
        defer { BIO_free(bio) }
        guard X509_NAME_print_ex(bio, name, 0, tether_xn_flag_rfc2253()) >= 0 else { return "" }
        return String(decoding: readAll(bio), as: UTF8.self)
    }

    /// Normalizes a SHA-256 fingerprint written as hex, with or without colons
    /// or spaces, in either case. Nil unless it is exactly 32 bytes of hex.
    static func normalizeFingerprint(_ text: String) -> String? {
        var normalized = ""
        for character in text.lowercased() {
            if character == ":" || character == " " { continue }
            guard character.isHexDigit, character.isASCII else { return nil }
            normalized.append(character)
        }
        return normalized.count == 64 ? normalized : nil
    }
}

/// A password callback that supplies no password, so that an encrypted
/// private key fails to load with an error instead of prompting on a terminal.
func tetherNoPassword(
    _ buffer: UnsafeMutablePointer<CChar>?, _ size: Int32, _ rwflag: Int32, _ userData: UnsafeMutableRawPointer?
) -> Int32 {
    0
}
