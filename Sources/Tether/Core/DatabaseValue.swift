import CSQLite
import Foundation

/// One SQLite value: the five storage classes.
public enum DatabaseValue: Sendable, Hashable, CustomStringConvertible {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob(Data)

    public var isNull: Bool { if case .null = self { return true } else { return false } }

    /// The storage class's name, for error messages.
    public var storageName: String {
        switch self {
        case .null: return "NULL"
        case .integer: return "INTEGER"
        case .real: return "REAL"
        case .text: return "TEXT"
        case .blob: return "BLOB"
        }
    }

    public var description: String {
        switch self {
        case .null: return "NULL"
        case let .integer(v): return String(v)
        case let .real(v): return String(v)
        case let .text(v): return "'" + v.replacingOccurrences(of: "'", with: "''") + "'"
        case let .blob(v): return "X'" + v.map { String(format: "%02X", $0) }.joined() + "'"
        }
    }

    /// Reads column `index` of the current row of `statement`.
    init(statement: OpaquePointer, index: Int32) {
        let value = ColumnValue(statement, index)
        switch value.type {
        case SQLITE_INTEGER: self = .integer(value.int64)
        case SQLITE_FLOAT: self = .real(value.double)
        case SQLITE_TEXT: self = .text(value.text)
        case SQLITE_BLOB: self = .blob(value.blob)
        default: self = .null
        }
    }

    /// Binds this value to parameter `index` (1-based) of `statement`.
    func bindValue(to statement: OpaquePointer, at index: Int32) -> Int32 {
        switch self {
        case .null: return sqlite3_bind_null(statement, index)
        case let .integer(v): return sqlite3_bind_int64(statement, index, v)
        case let .real(v): return sqlite3_bind_double(statement, index, v)
        case let .text(v): return bindText(statement, index, v)
        case let .blob(v): return bindBlob(statement, index, v)
        }
    }
}

// MARK: - Low-level column access shared by every reader

/// One column of the current row, fetched once with `sqlite3_column_value`:
/// its `sqlite3_value_*` accessors skip the checks every `sqlite3_column_*`
/// call repeats, so reading a column's type and then its value costs about
/// what one `sqlite3_column_*` call does. SQLite calls the value unprotected
/// because no mutex guards it; Tether opens connections NOMUTEX and uses each
/// from one thread at a time, and reads the value before the next step.
struct ColumnValue {
    let handle: OpaquePointer?

    @inline(__always)
    init(_ statement: OpaquePointer, _ index: Int32) {
        handle = sqlite3_column_value(statement, index)
    }

    /// SQLITE_INTEGER, SQLITE_FLOAT, SQLITE_TEXT, SQLITE_BLOB or SQLITE_NULL.
    var type: Int32 {
        @inline(__always) get { sqlite3_value_type(handle) }
    }
    var int64: Int64 {
        @inline(__always) get { sqlite3_value_int64(handle) }
    }
    var double: Double {
        @inline(__always) get { sqlite3_value_double(handle) }
    }
    var text: String {
        @inline(__always) get {
            guard let bytes = sqlite3_value_text(handle) else { return "" }
            return String(decoding: UnsafeBufferPointer(start: bytes, count: Int(sqlite3_value_bytes(handle))), as: UTF8.self)
        }
    }
    var blob: Data {
        @inline(__always) get {
            guard let bytes = sqlite3_value_blob(handle) else { return Data() }
            return Data(bytes: bytes, count: Int(sqlite3_value_bytes(handle)))
        }
    }
}

@inline(__always)
func bindText(_ statement: OpaquePointer, _ index: Int32, _ value: String) -> Int32 {
    var value = value
    // Native Swift strings are contiguous UTF-8: bind their bytes directly
    // (SQLite copies them), without the strlen of a C string.
    return value.withUTF8 { buffer in
        UnsafeRawPointer(buffer.baseAddress ?? emptyTextPointer).withMemoryRebound(to: CChar.self, capacity: 1) {
            sqlite3_bind_text(statement, index, $0, Int32(buffer.count), tether_sqlite_transient())
        }
    }
}

/// A non-null address for empty text: SQLite binds a null pointer as NULL.
nonisolated(unsafe) private let emptyTextPointer: UnsafePointer<UInt8> = {
    let pointer = UnsafeMutablePointer<UInt8>.allocate(capacity: 1)
    pointer.initialize(to: 0)
    return UnsafePointer(pointer)
}()

@inline(__always)
func bindBlob(_ statement: OpaquePointer, _ index: Int32, _ value: Data) -> Int32 {
    value.withUnsafeBytes { buffer in
        // A zero-length blob must still be a blob, not NULL (SQLite binds a null pointer as NULL).
        if buffer.count == 0 { return sqlite3_bind_zeroblob(statement, index, 0) }
        return sqlite3_bind_blob(statement, index, buffer.baseAddress, Int32(buffer.count), tether_sqlite_transient())
    }
}

func storageName(ofColumnType type: Int32) -> String {
    switch type {
    case SQLITE_INTEGER: return "INTEGER"
    case SQLITE_FLOAT: return "REAL"
    case SQLITE_TEXT: return "TEXT"
    case SQLITE_BLOB: return "BLOB"
    default: return "NULL"
    }
}

/// Encoded with its storage class as the key (`{"integer": 2}`, `{"real": 2.0}`,
/// `{"text": "a"}`, `{"blob": …}`, `{"null": true}`), so that a round trip
/// through JSON keeps 2.0 a REAL and a blob a BLOB.
extension DatabaseValue: Codable {
    private enum StorageKey: String, CodingKey { case null, integer, real, text, blob }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: StorageKey.self)
        guard container.allKeys.count == 1, let key = container.allKeys.first else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath,
                                                    debugDescription: "a DatabaseValue has exactly one of the keys null, integer, real, text, blob"))
        }
        switch key {
        case .null: self = .null
        case .integer: self = .integer(try container.decode(Int64.self, forKey: key))
        case .real: self = .real(try container.decode(Double.self, forKey: key))
        case .text: self = .text(try container.decode(String.self, forKey: key))
        case .blob: self = .blob(try container.decode(Data.self, forKey: key))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: StorageKey.self)
        switch self {
        case .null: try container.encode(true, forKey: .null)
        case let .integer(v): try container.encode(v, forKey: .integer)
        case let .real(v): try container.encode(v, forKey: .real)
        case let .text(v): try container.encode(v, forKey: .text)
        case let .blob(v): try container.encode(v, forKey: .blob)
        }
    }
}

extension DatabaseValue: ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral, ExpressibleByStringLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByNilLiteral {
    public init(integerLiteral value: Int64) { self = .integer(value) }
    public init(floatLiteral value: Double) { self = .real(value) }
    public init(stringLiteral value: String) { self = .text(value) }
    public init(booleanLiteral value: Bool) { self = .integer(value ? 1 : 0) }
    public init(nilLiteral: ()) { self = .null }
}
