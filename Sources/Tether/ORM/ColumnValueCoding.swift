import CSQLite
import Foundation

/// What Tether knows about one column of a model.
// Swift metatypes are immutable and safe to share.
struct ColumnInfo: @unchecked Sendable {
    let name: String
    let type: ColumnType
    /// The property is optional (decoded with `decodeIfPresent`): the column is nullable.
    let isOptional: Bool
    /// The property's type, without Optional.
    let valueType: Any.Type
    /// `Optional<valueType>`, for matching key paths to optional properties.
    let optionalValueType: Any.Type
    /// For a property that is another model or an array of models: its link (see `NestedLink`).
    var nested: NestedLink? = nil
}

/// JSON coders for nested values. Sorted keys make the stored text canonical,
/// so equal values are equal text (which the sync engine compares).
enum JSONColumn {
    static func encode<T: Encodable>(_ value: T, column: String) throws -> DatabaseValue {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .secondsSince1970
        do {
            return .text(String(decoding: try encoder.encode(value), as: UTF8.self))
        } catch {
            throw ModelError.encodingFailed(column: column, reason: "\(error)")
        }
    }

    static func decode<T: Decodable>(_ type: T.Type, from text: String, column: String, sql: String?) throws -> T {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .secondsSince1970
        do {
            return try decoder.decode(T.self, from: Data(text.utf8))
        } catch {
            // SundeedQLite's rule: a null element of an array of plain values (`[String]`, which
            // cannot hold nil; a peer or raw SQL may have stored one) is dropped, not an error.
            // Tried only once decoding failed, so that reading arrays costs nothing more.
            if let withoutNulls = arrayWithoutNulls(text), let decoded = try? decoder.decode(T.self, from: withoutNulls)
            {
                return decoded
            }
            throw ModelError.typeMismatch(
                column: column, expected: "\(T.self) (JSON)",
                found: "TEXT that is not its JSON: \(String(text.prefix(80)))", sql: sql)
        }
    }

    /// `text`, a JSON array with null elements, as JSON without them; nil for anything else.
    private static func arrayWithoutNulls(_ text: String) -> Data? {
        guard case let .array(elements)? = try? JSONDecoder().decode(JSONMember.self, from: Data(text.utf8)),
            elements.contains(where: \.isNull)
        else { return nil }
        return try? JSONEncoder().encode(JSONMember.array(elements.filter { !$0.isNull }))
    }
}

/// Converts one property value to what its column stores.
func encodeColumnValue<T: Encodable>(_ value: T, type: ColumnType?, column: String) throws -> DatabaseValue {
    if type == .json { return try JSONColumn.encode(value, column: column) }
    if let convertible = value as? any DatabaseValueConvertible { return convertible.databaseValue }
    let capture = SingleValueCapture(column: column)
    try value.encode(to: capture)
    if capture.isStructured { return try JSONColumn.encode(value, column: column) }
    return capture.value
}

/// Converts a stored value back to a property value.
func decodeColumnValue<T: Decodable>(
    _ type: T.Type, from value: DatabaseValue, info: ColumnInfo?, column: String, sql: String?
) throws -> T {
    if let convertible = T.self as? any DatabaseValueConvertible.Type {
        if let decoded = convertible.fromDatabaseValue(value) as? T { return decoded }
        throw ModelError.typeMismatch(column: column, expected: "\(T.self)", found: value.storageName, sql: sql)
    }
    if info?.type == .json {
        guard case let .text(text) = value else {
            throw ModelError.typeMismatch(
                column: column, expected: "\(T.self) (JSON text)", found: value.storageName, sql: sql)
        }
        return try JSONColumn.decode(T.self, from: text, column: column, sql: sql)
    }
    do {
        return try T(from: DatabaseValueDecoder(value: value, column: column, sql: sql))
    } catch let error as ModelError {
        throw error
    } catch {
        throw ModelError.typeMismatch(
            column: column, expected: "\(T.self)", found: "\(value.storageName) \(value.description)", sql: sql)
    }
}

// MARK: - Encoding one value through its single-value container

/// An Encoder that captures what a value writes to its single-value container
/// (enums with raw values, wrappers), or notes that it is structured (keyed or
/// unkeyed), in which case the caller stores it as JSON.
final class SingleValueCapture: Encoder, SingleValueEncodingContainer {
    let column: String
    var value: DatabaseValue = .null
    var isStructured = false
    init(column: String) { self.column = column }

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        isStructured = true
        return KeyedEncodingContainer(DiscardingKeyedEncoder<Key>())
    }
    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        isStructured = true
        return DiscardingUnkeyedEncoder()
    }
    func singleValueContainer() -> any SingleValueEncodingContainer { self }

    func encodeNil() throws { value = .null }
    func encode(_ value: UInt) throws { self.value = try checkedInteger(value, column: column) }
    func encode(_ value: UInt64) throws { self.value = try checkedInteger(value, column: column) }
    func encode<T: Encodable>(_ value: T) throws {
        self.value = try encodeColumnValue(value, type: nil, column: column)
    }
    func encode(_ value: Bool) throws { self.value = value.databaseValue }
    func encode(_ value: String) throws { self.value = value.databaseValue }
    func encode(_ value: Double) throws { self.value = value.databaseValue }
    func encode(_ value: Float) throws { self.value = value.databaseValue }
    func encode(_ value: Int) throws { self.value = value.databaseValue }
    func encode(_ value: Int8) throws { self.value = value.databaseValue }
    func encode(_ value: Int16) throws { self.value = value.databaseValue }
    func encode(_ value: Int32) throws { self.value = value.databaseValue }
    func encode(_ value: Int64) throws { self.value = value.databaseValue }
    func encode(_ value: UInt8) throws { self.value = value.databaseValue }
    func encode(_ value: UInt16) throws { self.value = value.databaseValue }
    func encode(_ value: UInt32) throws { self.value = value.databaseValue }
}

func checkedInteger<I: BinaryInteger>(_ value: I, column: String) throws -> DatabaseValue {
    guard let exact = Int64(exactly: value) else {
        throw ModelError.encodingFailed(column: column, reason: "\(value) does not fit in a 64-bit signed integer")
    }
    return .integer(exact)
}

/// Containers that accept and drop everything: used while finding out that a
/// value is structured.
struct DiscardingKeyedEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    var codingPath: [any CodingKey] { [] }
    mutating func encodeNil(forKey key: Key) throws {}
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {}
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key)
        -> KeyedEncodingContainer<NestedKey>
    {
        KeyedEncodingContainer(DiscardingKeyedEncoder<NestedKey>())
    }
    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer { DiscardingUnkeyedEncoder() }
    mutating func superEncoder() -> any Encoder { SingleValueCapture(column: "") }
    mutating func superEncoder(forKey key: Key) -> any Encoder { SingleValueCapture(column: "") }
}

struct DiscardingUnkeyedEncoder: UnkeyedEncodingContainer {
    var codingPath: [any CodingKey] { [] }
    var count = 0
    mutating func encodeNil() throws { count += 1 }
    mutating func encode<T: Encodable>(_ value: T) throws { count += 1 }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<
        NestedKey
    > {
        KeyedEncodingContainer(DiscardingKeyedEncoder<NestedKey>())
    }
    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer { DiscardingUnkeyedEncoder() }
    mutating func superEncoder() -> any Encoder { SingleValueCapture(column: "") }
}

// MARK: - Decoding one value through its single-value container

/// A Decoder over one stored value, for types that decode from a single value
/// (enums with raw values, wrappers).
struct DatabaseValueDecoder: Decoder, SingleValueDecodingContainer {
    let value: DatabaseValue
    let column: String
    let sql: String?

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> { throw structured() }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer { throw structured() }
    func singleValueContainer() throws -> any SingleValueDecodingContainer { self }

    private func structured() -> ModelError {
        .typeMismatch(column: column, expected: "a structured value", found: value.storageName, sql: sql)
    }

    func decodeNil() -> Bool { value.isNull }
    func decode(_ type: UInt.Type) throws -> UInt { try decodeUnsigned(UInt.self) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try decodeUnsigned(UInt64.self) }
    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try decodeColumnValue(T.self, from: value, info: nil, column: column, sql: sql)
    }
    private func decodeUnsigned<I: FixedWidthInteger>(_ type: I.Type) throws -> I {
        if case let .integer(v) = value, let exact = I(exactly: v) { return exact }
        throw ModelError.typeMismatch(column: column, expected: "\(I.self)", found: value.storageName, sql: sql)
    }
    private func decodePrimitive<V: DatabaseValueConvertible>(_ type: V.Type) throws -> V {
        if let decoded = V.fromDatabaseValue(value) { return decoded }
        throw ModelError.typeMismatch(column: column, expected: "\(V.self)", found: value.storageName, sql: sql)
    }
    func decode(_ type: Bool.Type) throws -> Bool { try decodePrimitive(Bool.self) }
    func decode(_ type: String.Type) throws -> String { try decodePrimitive(String.self) }
    func decode(_ type: Double.Type) throws -> Double { try decodePrimitive(Double.self) }
    func decode(_ type: Float.Type) throws -> Float { try decodePrimitive(Float.self) }
    func decode(_ type: Int.Type) throws -> Int { try decodePrimitive(Int.self) }
    func decode(_ type: Int8.Type) throws -> Int8 { try decodePrimitive(Int8.self) }
    func decode(_ type: Int16.Type) throws -> Int16 { try decodePrimitive(Int16.self) }
    func decode(_ type: Int32.Type) throws -> Int32 { try decodePrimitive(Int32.self) }
    func decode(_ type: Int64.Type) throws -> Int64 { try decodePrimitive(Int64.self) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try decodePrimitive(UInt8.self) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try decodePrimitive(UInt16.self) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try decodePrimitive(UInt32.self) }
}
