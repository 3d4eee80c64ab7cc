import Foundation

/// One SQLite value: the five storage classes.
public enum DatabaseValue: Sendable, Hashable, CustomStringConvertible {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob(Data)

    @inlinable
    public var isNull: Bool { if case .null = self { return true } else { return false } }

    // Written out (as the synthesized one would be) to inline across the module boundary:
    // apply compares a row's values column by column.
    @inlinable
    public static func == (lhs: DatabaseValue, rhs: DatabaseValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): return true
        case let (.integer(a), .integer(b)): return a == b
        case let (.real(a), .real(b)): return a == b
        case let (.text(a), .text(b)): return a == b
        case let (.blob(a), .blob(b)): return a == b
        default: return false
        }
    }

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
}

/// Encoded with its storage class as the key (`{"integer": 2}`, `{"real": 2.0}`,
/// `{"text": "a"}`, `{"blob": …}`, `{"null": true}`), so that a round trip
/// through JSON keeps 2.0 a REAL and a blob a BLOB.
extension DatabaseValue: Codable {
    private enum StorageKey: String, CodingKey { case null, integer, real, text, blob }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: StorageKey.self)
        guard container.allKeys.count == 1, let key = container.allKeys.first else {
            throw DecodingError.dataCorrupted(
                .init(
                    codingPath: decoder.codingPath,
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
    ExpressibleByBooleanLiteral, ExpressibleByNilLiteral
{
    public init(integerLiteral value: Int64) { self = .integer(value) }
    public init(floatLiteral value: Double) { self = .real(value) }
    public init(stringLiteral value: String) { self = .text(value) }
    public init(booleanLiteral value: Bool) { self = .integer(value ? 1 : 0) }
    public init(nilLiteral: ()) { self = .null }
}
