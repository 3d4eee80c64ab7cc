import Foundation

/// Learns a model's columns by decoding sample instances of it.
///
/// Decoding the model from a probe records every key it asks for, with the
/// property's type and whether it is optional. One baseline sample is made,
/// then one sample per column in which only that column differs: comparing a
/// key path's value across them tells which column it reads, so key paths
/// map to columns without any declaration.
enum SchemaProbe {
    static func derive<M: Model>(_ type: M.Type) throws -> (columns: [ColumnInfo], baseline: M, variants: [M?]) {
        let baselineProbe = ModelProbe(model: "\(M.self)", variantColumn: nil)
        let baseline: M
        do {
            baseline = try M(from: baselineProbe)
        } catch let error as ModelError {
            throw error
        } catch {
            throw ModelError.invalidModel(type: "\(M.self)", reason: "decoding a sample failed: \(error)")
        }
        let columns = baselineProbe.columns
        guard !columns.isEmpty else {
            throw ModelError.invalidModel(
                type: "\(M.self)", reason: "it has no stored properties (its CodingKeys are empty)")
        }
        var variants: [M?] = []
        for index in columns.indices {
            let probe = ModelProbe(model: "\(M.self)", variantColumn: index)
            // A model whose init rejects the variant value just cannot be
            // reached by key path on that column; names still work.
            variants.append(try? M(from: probe))
        }
        return (columns, baseline, variants)
    }

    /// A sample value of `T`; `variant` gives a second, different one when `T` has one.
    /// The value comes from `ProbeSamples`; a converter's column is its `columnType`.
    static func sample<T: Decodable>(_ type: T.Type, variant: Bool, context: String) throws -> (
        value: T, columnType: ColumnType
    ) {
        // A model inside a sample (a tree's children) is made without sampling its own
        // nested models again, which would recurse forever.
        if let link = NestedLink.describe(T.self) {
            return (try link.sample(T.self, variant: variant, context: context), link.shape == .one ? .text : .json)
        }
        var decodingFailure: (any Error)?
        var nested: SampleDecoder?
        let values = ProbeSamples.values(T.self) {
            let decoder = SampleDecoder(variant: false, context: context)
            let variantDecoder = SampleDecoder(variant: true, context: context)
            do {
                let first = try T(from: decoder)
                nested = decoder
                return [first] + ((try? T(from: variantDecoder)).map { [$0] } ?? [])
            } catch {
                decodingFailure = error
                return []
            }
        }
        guard let first = values.first else {
            let reason = decodingFailure.map { "\($0)" } ?? "no value could be made"
            throw ModelError.invalidModel(
                type: context,
                reason: "cannot make a sample \(T.self) to learn its column: \(reason). "
                    + "Make it CaseIterable, or conform it to DatabaseValueConvertible and declare its sampleValues")
        }
        let value = variant && values.count > 1 ? values[1] : first
        if let convertible = T.self as? any DatabaseValueConvertible.Type { return (value, convertible.columnType) }
        if let nested {
            if nested.isStructured { return (value, .json) }
            return (value, nested.singleValueType ?? .text)
        }
        return (value, try columnType(of: value, context: context))
    }

    private static func columnType<T>(of value: T, context: String) throws -> ColumnType {
        guard let encodable = value as? any Encodable else { return .text }
        let capture = SingleValueCapture(column: context)
        try encodable.encode(to: capture)
        if capture.isStructured { return .json }
        switch capture.value {
        case .integer: return .integer
        case .real: return .real
        case .blob: return .blob
        default: return .text
        }
    }
}

/// The probe a model decodes from: records columns in the order asked.
final class ModelProbe: Decoder {
    let model: String
    let variantColumn: Int?
    var columns: [ColumnInfo] = []
    var seen: Set<String> = []

    init(model: String, variantColumn: Int?) {
        self.model = model
        self.variantColumn = variantColumn
    }

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        KeyedDecodingContainer(ModelProbeContainer<Key>(probe: self))
    }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw ModelError.invalidModel(
            type: model, reason: "a model must decode from a keyed container (one key per column)")
    }
    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        throw ModelError.invalidModel(
            type: model, reason: "a model must decode from a keyed container (one key per column)")
    }

    /// Records the column `name` and returns its sample value.
    func value<T: Decodable>(_ type: T.Type, name: String, optional: Bool) throws -> T? {
        let index = columns.firstIndex { $0.name == name } ?? columns.count
        let variant = index == variantColumn
        if optional && !variant && seen.contains(name) { return nil }
        // A model (or array of models) is stored in its own table and linked by key.
        let link = NestedLink.describe(T.self)
        let sample =
            try link.map {
                (
                    value: try $0.sample(T.self, variant: variant, context: "\(model).\(name)"),
                    columnType: ColumnType.text
                )
            }
            ?? SchemaProbe.sample(T.self, variant: variant, context: "\(model).\(name)")
        if !seen.contains(name) {
            seen.insert(name)
            columns.append(
                ColumnInfo(
                    name: name, type: sample.columnType, isOptional: optional,
                    valueType: T.self, optionalValueType: Optional<T>.self, nested: link))
        }
        // An optional column's baseline is nil; its variant is a value.
        if optional && !variant { return nil }
        return sample.value
    }
}

struct ModelProbeContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let probe: ModelProbe
    var codingPath: [any CodingKey] { [] }
    var allKeys: [Key] { [] }
    func contains(_ key: Key) -> Bool { true }
    func decodeNil(forKey key: Key) throws -> Bool {
        // Custom decoders check decodeNil before decoding an optional; answer
        // "not nil" so that the value's type gets recorded.
        false
    }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try decode(type, key) }
    private func decode<T: Decodable>(_ type: T.Type, _ key: Key) throws -> T {
        guard let value = try probe.value(T.self, name: key.stringValue, optional: false) else {
            throw ModelError.invalidModel(type: probe.model, reason: "no sample for \(key.stringValue)")
        }
        return value
    }
    func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
        try probe.value(T.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try decode(type as Bool.Type, key) }
    func decodeIfPresent(_ type: Bool.Type, forKey key: Key) throws -> Bool? {
        try probe.value(Bool.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: String.Type, forKey key: Key) throws -> String { try decode(type as String.Type, key) }
    func decodeIfPresent(_ type: String.Type, forKey key: Key) throws -> String? {
        try probe.value(String.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try decode(type as Double.Type, key) }
    func decodeIfPresent(_ type: Double.Type, forKey key: Key) throws -> Double? {
        try probe.value(Double.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { try decode(type as Float.Type, key) }
    func decodeIfPresent(_ type: Float.Type, forKey key: Key) throws -> Float? {
        try probe.value(Float.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try decode(type as Int.Type, key) }
    func decodeIfPresent(_ type: Int.Type, forKey key: Key) throws -> Int? {
        try probe.value(Int.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try decode(type as Int8.Type, key) }
    func decodeIfPresent(_ type: Int8.Type, forKey key: Key) throws -> Int8? {
        try probe.value(Int8.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try decode(type as Int16.Type, key) }
    func decodeIfPresent(_ type: Int16.Type, forKey key: Key) throws -> Int16? {
        try probe.value(Int16.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try decode(type as Int32.Type, key) }
    func decodeIfPresent(_ type: Int32.Type, forKey key: Key) throws -> Int32? {
        try probe.value(Int32.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try decode(type as Int64.Type, key) }
    func decodeIfPresent(_ type: Int64.Type, forKey key: Key) throws -> Int64? {
        try probe.value(Int64.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try decode(type as UInt.Type, key) }
    func decodeIfPresent(_ type: UInt.Type, forKey key: Key) throws -> UInt? {
        try probe.value(UInt.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try decode(type as UInt8.Type, key) }
    func decodeIfPresent(_ type: UInt8.Type, forKey key: Key) throws -> UInt8? {
        try probe.value(UInt8.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try decode(type as UInt16.Type, key) }
    func decodeIfPresent(_ type: UInt16.Type, forKey key: Key) throws -> UInt16? {
        try probe.value(UInt16.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try decode(type as UInt32.Type, key) }
    func decodeIfPresent(_ type: UInt32.Type, forKey key: Key) throws -> UInt32? {
        try probe.value(UInt32.self, name: key.stringValue, optional: true)
    }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try decode(type as UInt64.Type, key) }
    func decodeIfPresent(_ type: UInt64.Type, forKey key: Key) throws -> UInt64? {
        try probe.value(UInt64.self, name: key.stringValue, optional: true)
    }
    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws
        -> KeyedDecodingContainer<NestedKey>
    {
        throw ModelError.invalidModel(
            type: probe.model,
            reason: """
                nested containers are not supported (key \(key.stringValue)); use a Codable property type, stored \
                as JSON
                """)
    }
    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        throw ModelError.invalidModel(
            type: probe.model,
            reason:
                "nested containers are not supported (key \(key.stringValue)); use an array property, stored as JSON")
    }
    func superDecoder() throws -> any Decoder { probe }
    func superDecoder(forKey key: Key) throws -> any Decoder { probe }
}

/// Makes sample values of nested types: zero-like (or, for the variant, a
/// different value) for every primitive, empty (or one-element) collections.
final class SampleDecoder: Decoder, SingleValueDecodingContainer {
    let variant: Bool
    let context: String
    var isStructured = false
    var singleValueType: ColumnType?

    /// Keys whose values vary although `variant` is false (a nested model's key).
    let variantKeys: Set<String>

    init(variant: Bool, context: String, variantKeys: Set<String> = []) {
        self.variant = variant
        self.context = context
        self.variantKeys = variantKeys
    }

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        isStructured = true
        return KeyedDecodingContainer(SampleKeyedContainer<Key>(decoder: self))
    }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        isStructured = true
        return SampleUnkeyedContainer(decoder: self, count: variant ? 1 : 0)
    }
    func singleValueContainer() throws -> any SingleValueDecodingContainer { self }

    func decodeNil() -> Bool { false }
    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let sample = try SchemaProbe.sample(T.self, variant: variant, context: context)
        if singleValueType == nil { singleValueType = sample.columnType }
        return sample.value
    }
    func nested<T: Decodable>(_ type: T.Type) throws -> T {
        try SchemaProbe.sample(T.self, variant: variant, context: context).value
    }
}

struct SampleKeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let decoder: SampleDecoder
    var codingPath: [any CodingKey] { [] }
    // Dictionaries decode their entries from allKeys: none for the baseline, one for the variant.
    var allKeys: [Key] { decoder.variant ? [Key(stringValue: "1")].compactMap { $0 } : [] }
    func contains(_ key: Key) -> Bool { true }
    func decodeNil(forKey key: Key) throws -> Bool { !decoder.variant }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        if decoder.variantKeys.contains(key.stringValue) {
            return try SchemaProbe.sample(T.self, variant: true, context: decoder.context).value
        }
        return try decoder.nested(T.self)
    }
    func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
        decoder.variant ? try decoder.nested(T.self) : nil
    }
    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws
        -> KeyedDecodingContainer<NestedKey>
    {
        KeyedDecodingContainer(SampleKeyedContainer<NestedKey>(decoder: decoder))
    }
    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        SampleUnkeyedContainer(decoder: decoder, count: decoder.variant ? 1 : 0)
    }
    func superDecoder() throws -> any Decoder { decoder }
    func superDecoder(forKey key: Key) throws -> any Decoder { decoder }
}

struct SampleUnkeyedContainer: UnkeyedDecodingContainer {
    let decoder: SampleDecoder
    var count: Int?
    var currentIndex = 0
    var codingPath: [any CodingKey] { [] }
    var isAtEnd: Bool { currentIndex >= (count ?? 0) }

    init(decoder: SampleDecoder, count: Int) {
        self.decoder = decoder
        self.count = count
    }
    mutating func decodeNil() throws -> Bool { false }
    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        currentIndex += 1
        return try decoder.nested(T.self)
    }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<
        NestedKey
    > {
        currentIndex += 1
        return KeyedDecodingContainer(SampleKeyedContainer<NestedKey>(decoder: decoder))
    }
    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        currentIndex += 1
        return SampleUnkeyedContainer(decoder: decoder, count: 0)
    }
    mutating func superDecoder() throws -> any Decoder { decoder }
}
