import CSQLite
import Foundation

/// The storage class a Swift type is kept in. `json` values are TEXT holding
/// JSON (nested Codable values, arrays and dictionaries).
public enum ColumnType: String, Sendable {
    /// A 64-bit signed integer.
    case integer = "INTEGER"
    /// An 8-byte IEEE floating-point number.
    case real = "REAL"
    /// UTF-8 text.
    case text = "TEXT"
    /// Bytes, stored as given.
    case blob = "BLOB"
    /// JSON text: a Codable value, array or dictionary encoded whole into one TEXT column.
    case json = "JSON"
    /// Declared type in a STRICT table.
    var sqlType: String { self == .json ? "TEXT" : rawValue }
}

/// A type stored in a single column, read and bound without going through
/// `DatabaseValue` on the hot path.
///
/// Tether's conformances: integers, `Double`, `Float`, `Bool`, `String`,
/// `Data`, `Date` (REAL, seconds since 1970), `UUID` (TEXT), `URL` (TEXT).
/// A `RawRepresentable` type whose raw value conforms gets the conformance by
/// declaring it:
///
/// ```swift
/// enum Color: String, Codable, DatabaseValueConvertible { case red, green }
/// ```
///
/// A type of your own converts as it likes; a model property of that type is
/// stored in a column of its `columnType`:
///
/// ```swift
/// struct Email: Codable, DatabaseValueConvertible {
///     let address: String
///     init?(_ address: String) {
///         guard address.contains("@") else { return nil }
///         self.address = address
///     }
///     static var columnType: ColumnType { .text }
///     var databaseValue: DatabaseValue { .text(address) }
///     static func fromDatabaseValue(_ value: DatabaseValue) -> Email? {
///         String.fromDatabaseValue(value).flatMap(Email.init)
///     }
/// }
/// ```
///
/// What each of Tether's types reads from each storage class is in the README
/// (A tour of the ORM › Stored types); `fromDatabaseValue` and `read(from:at:)`
/// say it for one type.
public protocol DatabaseValueConvertible: Sendable {
    /// The storage class of the column a model property of this type is stored in.
    static var columnType: ColumnType { get }
    /// The value as it is stored; what `fromDatabaseValue(_:)` reads back.
    var databaseValue: DatabaseValue { get }
    /// The value stored as `value`, or nil when `value` has the wrong type.
    static func fromDatabaseValue(_ value: DatabaseValue) -> Self?
    /// Values Tether may decode a model with while it learns the model's columns
    /// (see `Model`); never stored. Give two different ones when the type has
    /// them, so that key paths to the column resolve. The default is none:
    /// Tether then takes an enum's cases, or decodes the type with `init(from:)`
    /// from placeholder values. Declare them for a type that refuses
    /// placeholders (an `init(from:)` that validates what it decodes).
    static var sampleValues: [Self] { get }
    /// Binds directly into a statement parameter (1-based); returns SQLite's result code.
    func bind(to statement: OpaquePointer, at index: Int32) -> Int32
    /// Reads directly from a result column; nil when the stored value has the wrong type or is NULL.
    static func read(from statement: OpaquePointer, at index: Int32) -> Self?
}

extension DatabaseValueConvertible {
    public static var sampleValues: [Self] { [] }
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 {
        databaseValue.bindValue(to: statement, at: index)
    }
    public static func read(from statement: OpaquePointer, at index: Int32) -> Self? {
        fromDatabaseValue(DatabaseValue(statement: statement, index: index))
    }
}

extension DatabaseValue: DatabaseValueConvertible {
    /// A column holding a `DatabaseValue` takes any storage class; it is declared BLOB, which
    /// converts nothing.
    public static var columnType: ColumnType { .blob }
    /// The value itself.
    public var databaseValue: DatabaseValue { self }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> DatabaseValue? { value }
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 { bindValue(to: statement, at: index) }
}

// MARK: - Integers

/// Shared implementation of the fixed-width integer conformances: INTEGER
/// storage, range-checked on the way out, and a REAL that holds an exact
/// integer is accepted on the way in.
public protocol DatabaseInteger: FixedWidthInteger, DatabaseValueConvertible {}

extension DatabaseInteger {
    /// Fixed-width integers are INTEGER (64-bit in SQLite).
    public static var columnType: ColumnType { .integer }
    /// The integer as a 64-bit INTEGER.
    public var databaseValue: DatabaseValue { .integer(Int64(truncatingIfNeeded: self)) }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Self? {
        switch value {
        case let .integer(v): return Self(exactly: v)
        case let .real(v): return Self(exactly: v)
        default: return nil
        }
    }
    @inline(__always)
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 {
        sqlite3_bind_int64(statement, index, Int64(truncatingIfNeeded: self))
    }
    @inlinable @inline(__always)
    public static func read(from statement: OpaquePointer, at index: Int32) -> Self? {
        let value = ColumnValue(statement, index)
        switch value.type {
        case SQLITE_INTEGER: return Self(exactly: value.int64)
        case SQLITE_FLOAT: return Self(exactly: value.double)
        default: return nil
        }
    }
}

extension Int: DatabaseInteger {}
extension Int8: DatabaseInteger {}
extension Int16: DatabaseInteger {}
extension Int32: DatabaseInteger {}
extension Int64: DatabaseInteger {}
extension UInt8: DatabaseInteger {}
extension UInt16: DatabaseInteger {}
extension UInt32: DatabaseInteger {}

// MARK: - Floating point, Bool, String, Data

extension Double: DatabaseValueConvertible {
    public static var columnType: ColumnType { .real }
    public var databaseValue: DatabaseValue { .real(self) }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Double? {
        switch value {
        case let .real(v): return v
        case let .integer(v): return Double(v)
        default: return nil
        }
    }
    @inline(__always)
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 {
        sqlite3_bind_double(statement, index, self)
    }
    @inlinable @inline(__always)
    public static func read(from statement: OpaquePointer, at index: Int32) -> Double? {
        let value = ColumnValue(statement, index)
        switch value.type {
        case SQLITE_FLOAT, SQLITE_INTEGER: return value.double
        default: return nil
        }
    }
}

extension Float: DatabaseValueConvertible {
    public static var columnType: ColumnType { .real }
    public var databaseValue: DatabaseValue { .real(Double(self)) }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Float? {
        Double.fromDatabaseValue(value).map(Float.init)
    }
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 {
        sqlite3_bind_double(statement, index, Double(self))
    }
    public static func read(from statement: OpaquePointer, at index: Int32) -> Float? {
        Double.read(from: statement, at: index).map(Float.init)
    }
}

extension Bool: DatabaseValueConvertible {
    /// Stored as INTEGER 0 or 1. Read from INTEGER or REAL (0 is false, any
    /// other number true) and from TEXT as AgileDB reads it: "1", "true",
    /// "yes" are true and "0", "false", "no" false, in any case; other text
    /// is not a Bool.
    public static var columnType: ColumnType { .integer }
    public var databaseValue: DatabaseValue { .integer(self ? 1 : 0) }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Bool? {
        switch value {
        case let .integer(v): return v != 0
        case let .real(v): return v != 0
        case let .text(v): return Bool(databaseText: v)
        default: return nil
        }
    }
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 {
        sqlite3_bind_int64(statement, index, self ? 1 : 0)
    }
    public static func read(from statement: OpaquePointer, at index: Int32) -> Bool? {
        let value = ColumnValue(statement, index)
        switch value.type {
        case SQLITE_INTEGER: return value.int64 != 0
        case SQLITE_FLOAT: return value.double != 0
        case SQLITE_TEXT: return Bool(databaseText: value.text)
        default: return nil
        }
    }

    /// The words a Bool is read from in TEXT.
    init?(databaseText text: String) {
        switch text.lowercased() {
        case "1", "true", "yes": self = true
        case "0", "false", "no": self = false
        default: return nil
        }
    }
}

extension String: DatabaseValueConvertible {
    public static var columnType: ColumnType { .text }
    public var databaseValue: DatabaseValue { .text(self) }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> String? {
        if case let .text(v) = value { return v }
        return nil
    }
    @inline(__always)
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 {
        bindText(statement, index, self)
    }
    @inlinable @inline(__always)
    public static func read(from statement: OpaquePointer, at index: Int32) -> String? {
        let value = ColumnValue(statement, index)
        return value.type == SQLITE_TEXT ? value.text : nil
    }
}

extension Data: DatabaseValueConvertible {
    public static var columnType: ColumnType { .blob }
    public var databaseValue: DatabaseValue { .blob(self) }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Data? {
        if case let .blob(v) = value { return v }
        return nil
    }
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 {
        bindBlob(statement, index, self)
    }
    public static func read(from statement: OpaquePointer, at index: Int32) -> Data? {
        let value = ColumnValue(statement, index)
        return value.type == SQLITE_BLOB ? value.blob : nil
    }
}

// MARK: - Foundation types

extension Date: DatabaseValueConvertible {
    /// Dates are REAL seconds since 1970: they sort and compare in SQL, and
    /// SQLite's date functions read them with the 'unixepoch' modifier.
    public static var columnType: ColumnType { .real }
    public var databaseValue: DatabaseValue { .real(timeIntervalSince1970) }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Date? {
        switch value {
        case let .real(v): return Date(timeIntervalSince1970: v)
        case let .integer(v): return Date(timeIntervalSince1970: Double(v))
        case let .text(v): return parseSQLiteDate(v)
        default: return nil
        }
    }
}

/// Parses the text forms SQLite's date functions and the sqlite3 shell produce
/// ("YYYY-MM-DD HH:MM:SS[.SSS]", optionally with "T" and "Z"), in UTC.
func parseSQLiteDate(_ text: String) -> Date? {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [
        .withFullDate, .withTime, .withColonSeparatorInTime, .withDashSeparatorInDate, .withFractionalSeconds,
    ]
    var normalized = text.replacingOccurrences(of: " ", with: "T")
    if normalized.hasSuffix("Z") { normalized.removeLast() }
    if let date = formatter.date(from: normalized) { return date }
    formatter.formatOptions = [.withFullDate, .withTime, .withColonSeparatorInTime, .withDashSeparatorInDate]
    if let date = formatter.date(from: normalized) { return date }
    formatter.formatOptions = [.withFullDate, .withDashSeparatorInDate]
    return formatter.date(from: normalized)
}

extension UUID: DatabaseValueConvertible {
    /// UUIDs are TEXT in their canonical uppercase form, readable in the shell;
    /// a 16-byte BLOB is accepted on the way in.
    public static var columnType: ColumnType { .text }
    public var databaseValue: DatabaseValue { .text(uuidString) }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> UUID? {
        switch value {
        case let .text(v): return UUID(uuidString: v)
        case let .blob(v) where v.count == 16:
            let b = [UInt8](v)
            return UUID(
                uuid: (
                    b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
                ))
        default: return nil
        }
    }
}

extension URL: DatabaseValueConvertible {
    public static var columnType: ColumnType { .text }
    public var databaseValue: DatabaseValue { .text(absoluteString) }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> URL? {
        if case let .text(v) = value { return URL(string: v) }
        return nil
    }
}

// MARK: - Optionals and raw-representable types

extension Optional: DatabaseValueConvertible where Wrapped: DatabaseValueConvertible {
    public static var columnType: ColumnType { Wrapped.columnType }
    public var databaseValue: DatabaseValue { self?.databaseValue ?? .null }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Wrapped?? {
        if value.isNull { return .some(nil) }
        return Wrapped.fromDatabaseValue(value).map { .some($0) }
    }
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 {
        switch self {
        case .none: return sqlite3_bind_null(statement, index)
        case let .some(value): return value.bind(to: statement, at: index)
        }
    }
    public static func read(from statement: OpaquePointer, at index: Int32) -> Wrapped?? {
        if sqlite3_column_type(statement, index) == SQLITE_NULL { return .some(nil) }
        return Wrapped.read(from: statement, at: index).map { .some($0) }
    }
}

extension DatabaseValueConvertible where Self: RawRepresentable, RawValue: DatabaseValueConvertible {
    /// A raw-representable type is stored as its raw value.
    public static var columnType: ColumnType { RawValue.columnType }
    /// The raw value, stored as its own type stores it.
    public var databaseValue: DatabaseValue { rawValue.databaseValue }
    public static func fromDatabaseValue(_ value: DatabaseValue) -> Self? {
        RawValue.fromDatabaseValue(value).flatMap(Self.init(rawValue:))
    }
    public func bind(to statement: OpaquePointer, at index: Int32) -> Int32 {
        rawValue.bind(to: statement, at: index)
    }
    public static func read(from statement: OpaquePointer, at index: Int32) -> Self? {
        RawValue.read(from: statement, at: index).flatMap(Self.init(rawValue:))
    }
}
