import CSQLite
import Foundation

// Reading and binding a `DatabaseValue` through the SQLite C API: the value itself
// lives in TetherBatch, which knows nothing of SQLite.
extension DatabaseValue {
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
@usableFromInline
struct ColumnValue {
    @usableFromInline let handle: OpaquePointer?

    @inlinable @inline(__always)
    init(_ statement: OpaquePointer, _ index: Int32) {
        handle = sqlite3_column_value(statement, index)
    }

    /// SQLITE_INTEGER, SQLITE_FLOAT, SQLITE_TEXT, SQLITE_BLOB or SQLITE_NULL.
    @inlinable var type: Int32 {
        @inline(__always) get { sqlite3_value_type(handle) }
    }
    @inlinable var int64: Int64 {
        @inline(__always) get { sqlite3_value_int64(handle) }
    }
    @inlinable var double: Double {
        @inline(__always) get { sqlite3_value_double(handle) }
    }
    @inlinable var text: String {
        @inline(__always) get {
            guard let bytes = sqlite3_value_text(handle) else { return "" }
            return String(
                decoding: UnsafeBufferPointer(start: bytes, count: Int(sqlite3_value_bytes(handle))), as: UTF8.self)
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
    return value.withUTF8 { bindText(statement, index, UnsafeRawBufferPointer($0), tether_sqlite_transient()) }
}

/// Binds UTF-8 `bytes` as text; `destructor` says whether SQLite copies them (SQLITE_TRANSIENT)
/// or reads them in place until they are bound again (SQLITE_STATIC).
@inline(__always)
func bindText(
    _ statement: OpaquePointer, _ index: Int32, _ bytes: UnsafeRawBufferPointer, _ destructor: sqlite3_destructor_type?
) -> Int32 {
    (bytes.baseAddress ?? UnsafeRawPointer(emptyTextPointer)).withMemoryRebound(to: CChar.self, capacity: 1) {
        sqlite3_bind_text(statement, index, $0, Int32(bytes.count), destructor)
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
    value.withUnsafeBytes { bindBlob(statement, index, $0, tether_sqlite_transient()) }
}

/// Binds `bytes` as a blob; `destructor` as for `bindText`.
@inline(__always)
func bindBlob(
    _ statement: OpaquePointer, _ index: Int32, _ bytes: UnsafeRawBufferPointer, _ destructor: sqlite3_destructor_type?
) -> Int32 {
    // A zero-length blob must still be a blob, not NULL (SQLite binds a null pointer as NULL).
    guard let start = bytes.baseAddress, bytes.count > 0 else { return sqlite3_bind_zeroblob(statement, index, 0) }
    return sqlite3_bind_blob(statement, index, start, Int32(bytes.count), destructor)
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
