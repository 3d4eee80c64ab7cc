import Foundation

/// A JSON value: what a configuration file holds (`ConfigFile`), and what the reports of
/// `--json` are built from (`OutputFormatOption`). Unlike a `Codable` struct's, its `null`s are
/// written out: a report always has the same keys, a script can rely on each being there.
enum JSONValue: Codable, Equatable {
    case null, bool(Bool), integer(Int64), real(Double), string(String), array([JSONValue]), object([String: JSONValue])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let bool = try? container.decode(Bool.self) {
            self = .bool(bool)
        } else if let integer = try? container.decode(Int64.self) {
            self = .integer(integer)
        } else if let real = try? container.decode(Double.self) {
            self = .real(real)
        } else if let string = try? container.decode(String.self) {
            self = .string(string)
        } else if let array = try? container.decode([JSONValue].self) {
            self = .array(array)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case let .bool(bool): try container.encode(bool)
        case let .integer(integer): try container.encode(integer)
        case let .real(real): try container.encode(real)
        case let .string(string): try container.encode(string)
        case let .array(array): try container.encode(array)
        case let .object(object): try container.encode(object)
        }
    }

    /// The value as compact JSON on one line, keys sorted (a non-finite number is written `null`).
    var json: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? encoder.encode(self.finite)).map { String(decoding: $0, as: UTF8.self) } ?? "null"
    }

    /// The value with infinities and NaNs (which JSON cannot write) replaced by `null`.
    private var finite: JSONValue {
        switch self {
        case let .real(real) where !real.isFinite: return .null
        case let .array(array): return .array(array.map(\.finite))
        case let .object(object): return .object(object.mapValues(\.finite))
        default: return self
        }
    }

    // Shorthands for building reports.
    static func int(_ value: Int) -> JSONValue { .integer(Int64(value)) }
    static func strings(_ values: [String]) -> JSONValue { .array(values.map(JSONValue.string)) }
    static func string(orNull value: String?) -> JSONValue { value.map(JSONValue.string) ?? .null }
}
