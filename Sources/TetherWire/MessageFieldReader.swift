import Foundation
import TetherBatch

/// Reads the fields of one message body with Tether's `ByteReader`, turning
/// its errors into `WireError`s that name the message and field.
struct MessageFieldReader {
    private var reader: ByteReader
    let type: MessageType
    let limits: WireLimits

    init(_ body: UnsafeRawBufferPointer, type: MessageType, limits: WireLimits) {
        reader = ByteReader(body)
        self.type = type
        self.limits = limits
    }

    var offset: Int { reader.offset }

    func malformed(_ reason: String) -> WireError { .malformedBody(type: type, reason: reason) }

    private func truncated(_ field: String, at offset: Int) -> WireError {
        .truncated(field: "\(type).\(field)", offset: offset)
    }

    mutating func uvarint(_ field: String) throws(WireError) -> UInt64 {
        let start = reader.offset
        do {
            return try reader.uvarint()
        } catch {
            // ByteReader fails at the end of the data for a varint cut short
            // (at most 9 bytes read), and on the 10th byte for an overflow.
            if reader.isAtEnd && reader.offset - start < 10 { throw truncated(field, at: start) }
            throw malformed("\(field): \(error.reason)")
        }
    }

    /// A sequence number: 0 through Int64.max.
    mutating func sequence(_ field: String) throws(WireError) -> Int64 {
        let value = try uvarint(field)
        guard value <= UInt64(Int64.max) else { throw malformed("\(field) \(value) is above 2^63-1") }
        return Int64(value)
    }

    /// A limit: 1 through Int.max.
    mutating func positive(_ field: String) throws(WireError) -> Int {
        let value = try uvarint(field)
        guard value >= 1, value <= UInt64(Int.max) else {
            throw malformed("\(field) \(value) is not between 1 and \(Int.max)")
        }
        return Int(value)
    }

    mutating func byte(_ field: String) throws(WireError) -> UInt8 {
        guard reader.remaining >= 1 else { throw truncated(field, at: reader.offset) }
        return try mapped { (reader: inout ByteReader) throws(BatchDecodingError) in try reader.byte() }
    }

    mutating func bytes(_ count: Int, _ field: String) throws(WireError) -> ArraySlice<UInt8> {
        guard reader.remaining >= count else { throw truncated(field, at: reader.offset) }
        return try mapped { (reader: inout ByteReader) throws(BatchDecodingError) in try reader.bytes(count) }
    }

    mutating func bigEndianUInt64(_ field: String) throws(WireError) -> UInt64 {
        try bytes(8, field).reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// A count of elements that each take at least one byte: a count the rest
    /// of the body cannot hold is refused before anything is allocated for it.
    mutating func count(_ field: String) throws(WireError) -> Int {
        let start = reader.offset
        let value = try uvarint(field)
        guard value <= UInt64(reader.remaining) else { throw truncated(field, at: start) }
        return Int(value)
    }

    /// A count with a limit of its own, checked before the bytes left (like HELLO's table count):
    /// a count above `limit` is malformed (`reason`), then one the body cannot hold is truncated.
    mutating func count(_ field: String, limit: Int, reason: (UInt64, Int) -> String) throws(WireError) -> Int {
        let start = reader.offset
        let value = try uvarint(field)
        guard value <= UInt64(limit) else { throw malformed(reason(value, limit)) }
        guard value <= UInt64(reader.remaining) else { throw truncated(field, at: start) }
        return Int(value)
    }

    /// Length-prefixed UTF-8, at most `limits.maxStringLength` bytes.
    mutating func string(_ field: String) throws(WireError) -> String {
        let start = reader.offset
        let length = try uvarint(field)
        guard length <= UInt64(limits.maxStringLength) else {
            throw WireError.stringTooLong(field: "\(type).\(field)", length: length, limit: limits.maxStringLength)
        }
        let utf8 = try bytes(Int(length), field)
        guard let text = String(validating: utf8, as: UTF8.self) else {
            throw malformed("\(field) at body byte \(start) is not valid UTF-8")
        }
        return text
    }

    /// A value as the change batch encodes it (§7.1): a tag, then what the tag says; a value cut
    /// short is truncated, like any other field.
    mutating func value(_ field: String) throws(WireError) -> DatabaseValue {
        let start = reader.offset
        switch try byte(field) {
        case 0: return .null
        case 1:
            let zigzag = try uvarint(field)
            return .integer(Int64(bitPattern: zigzag >> 1) ^ -Int64(bitPattern: zigzag & 1))
        case 2: return .real(Double(bitPattern: try bytes(8, field).reversed().reduce(0) { $0 << 8 | UInt64($1) }))
        case 3: return .text(try string(field))
        case 4:
            let length = try count(field)
            return .blob(Data(try bytes(length, field)))
        case let tag: throw malformed("\(field) at body byte \(start): unknown value tag \(tag)")
        }
    }

    var isAtEnd: Bool { reader.isAtEnd }

    func expectEnd() throws(WireError) {
        guard reader.isAtEnd else { throw WireError.trailingBytes(after: "\(type) body", count: reader.remaining) }
    }

    /// Runs a ByteReader call whose failure the caller has already ruled out by checking the length.
    private mutating func mapped<T>(_ read: (inout ByteReader) throws(BatchDecodingError) -> T) throws(WireError) -> T {
        do { return try read(&reader) } catch { throw malformed(error.description) }
    }
}

/// Writes message fields with Tether's `ByteWriter`.
extension ByteWriter {
    mutating func bigEndianUInt64(_ value: UInt64) {
        for shift in stride(from: 56, through: 0, by: -8) { byte(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }
}
