// The encoder that reads a model's primary key and nested values, without encoding its children.

import Foundation

/// Encodes a model only as far as its primary key and its nested properties: what saving
/// its children needs, without encoding the children themselves (a graph of classes may
/// hold a cycle).
final class ModelParts: Encoder {
    let keyNames: [String]
    let nestedColumns: [String: Int]
    var key: [DatabaseValue]
    var nested: [(column: Int, value: any Encodable)] = []
    var failure: (any Error)?

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    init(keyNames: [String], nestedColumns: [String: Int]) {
        self.keyNames = keyNames
        self.nestedColumns = nestedColumns
        key = Array(repeating: .null, count: keyNames.count)
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        KeyedEncodingContainer(ModelPartsContainer<Key>(parts: self))
    }
    func unkeyedContainer() -> any UnkeyedEncodingContainer { DiscardingUnkeyedEncoder() }
    func singleValueContainer() -> any SingleValueEncodingContainer { SingleValueCapture(column: "") }

    /// The primary key and nested values of `model`.
    static func of<M: Model>(_ model: M, keyNames: [String], nestedColumns: [String: Int]) throws -> ModelParts {
        let parts = ModelParts(keyNames: keyNames, nestedColumns: nestedColumns)
        try model.encode(to: parts)
        if let failure = parts.failure { throw failure }
        return parts
    }

    /// The single-column primary key of a nested model.
    static func key<C: Model>(of child: C) throws -> DatabaseValue {
        let names = try keyNames(of: C.self)
        guard names.count == 1 else {
            throw ModelError.invalidModel(
                type: "\(C.self)",
                reason: "it has a composite primary key; a nested model needs a single-column key to be linked by")
        }
        return try of(child, keyNames: names, nestedColumns: [:]).key[0]
    }

    /// The primary key's column names, without deriving the schema when they are given by name.
    static func keyNames<C: Model>(of type: C.Type) throws -> [String] {
        var names: [String] = []
        for ref in C.primaryKey {
            guard case let .named(name) = ref else {
                // A key path needs the schema, which may be the one being derived (a tree).
                guard !SchemaDerivation.inProgress.contains(ObjectIdentifier(C.self)) else {
                    throw ModelError.invalidModel(
                        type: "\(C.self)",
                        reason: "its primary key is declared by key path while its schema is derived; name the column")
                }
                let schema = try ModelSchema<C>.shared()
                return schema.primaryKey.map { schema.columns[$0].name }
            }
            names.append(name)
        }
        return names
    }

    /// A key as a JSON literal, for a JSON array of keys.
    static func jsonLiteral(_ key: DatabaseValue, column: String) throws -> String {
        switch key {
        case let .integer(value): return String(value)
        case let .real(value) where value.isFinite: return "\(value)"
        case let .text(text): return String(decoding: try JSONEncoder().encode(text), as: UTF8.self)
        default:
            throw ModelError.encodingFailed(
                column: column,
                reason: "a nested model's key must be an integer, a finite real or a text, not \(key.storageName)")
        }
    }
}

struct ModelPartsContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let parts: ModelParts
    var codingPath: [any CodingKey] { [] }

    mutating func encodeNil(forKey key: Key) throws {}
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        let name = key.stringValue
        if let index = parts.keyNames.firstIndex(of: name) {
            parts.key[index] = try encodeColumnValue(value, type: nil, column: name)
        } else if let column = parts.nestedColumns[name] {
            parts.nested.append((column, value))
        }
    }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key)
        -> KeyedEncodingContainer<NestedKey>
    {
        KeyedEncodingContainer(DiscardingKeyedEncoder<NestedKey>())
    }
    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer { DiscardingUnkeyedEncoder() }
    mutating func superEncoder() -> any Encoder { parts }
    mutating func superEncoder(forKey key: Key) -> any Encoder { parts }
}
