import CSQLite
import Foundation

/// Locates a model's columns by coding key. Synthesized Codable code visits
/// keys in declaration order, which is also the schema's column order, so the
/// next expected column is checked first and the dictionary is the fallback:
/// the hot path does no hashing.
///
/// The position lives in manually allocated memory rather than in a stored
/// `var`: it changes once per property, and a class's stored `var` would pay
/// a dynamic exclusivity check each time.
final class ColumnCursor {
    let columns: [ColumnInfo]
    let names: [String]
    let indexByName: [String: Int]
    private let position: UnsafeMutablePointer<Int>

    init(columns: [ColumnInfo], indexByName: [String: Int]) {
        self.columns = columns
        names = columns.map(\.name)
        self.indexByName = indexByName
        position = .allocate(capacity: 1)
        position.initialize(to: 0)
    }

    deinit { position.deallocate() }

    @inline(__always) func rewind() { position.pointee = 0 }

    @inline(__always)
    func index(of name: String) -> Int? {
        let candidate = position.pointee
        if candidate < names.count, names[candidate] == name {
            position.pointee = candidate + 1
            return candidate
        }
        guard let found = indexByName[name] else { return nil }
        position.pointee = found + 1
        return found
    }
}

/// Codable asks for a keyed container once per row, and wrapping ours costs
/// an allocation and two generic-metadata lookups each time. Our containers
/// hold no per-row state, so the wrapped container of the last key type is
/// kept, in typed raw storage (a cast from `Any` would cost more than it saves).
final class KeyedContainerStore {
    private var keyType: ObjectIdentifier?
    private var storage: UnsafeMutableRawPointer?
    private var destroy: ((UnsafeMutableRawPointer) -> Void)?

    deinit { clear() }

    /// Whether a container for this key type is stored. (Separate from the
    /// read: returning `Container?` would cost a metadata lookup for the Optional.)
    @inline(__always)
    func holds(_ keyType: Any.Type) -> Bool {
        self.keyType == ObjectIdentifier(keyType) && storage != nil
    }

    /// The stored container; call only when `holds` said so, with the type it was stored as.
    @inline(__always)
    func container<Container>(as type: Container.Type) -> Container {
        // `holds` checked the key type, which determines Container.
        storage.unsafelyUnwrapped.assumingMemoryBound(to: Container.self).pointee
    }

    func store<Container>(_ container: Container, for keyType: Any.Type) {
        clear()
        let typed = UnsafeMutablePointer<Container>.allocate(capacity: 1)
        typed.initialize(to: container)
        storage = UnsafeMutableRawPointer(typed)
        destroy = { raw in
            let typed = raw.assumingMemoryBound(to: Container.self)
            typed.deinitialize(count: 1)
            typed.deallocate()
        }
        self.keyType = ObjectIdentifier(keyType)
    }

    private func clear() {
        if let storage, let destroy { destroy(storage) }
        storage = nil
        destroy = nil
        keyType = nil
    }
}

// MARK: - Encoding a model into a statement, or into values

/// Encodes a model either by binding its properties straight into a
/// statement's parameters, or by collecting them as `DatabaseValue`s. One
/// instance is reused for every row of a batch.
final class RowEncoder: Encoder {
    let tableName: String
    let cursor: ColumnCursor
    private let containers = KeyedContainerStore()
    /// Binding mode: the statement and, per column, its parameter (0 = not bound).
    var statement: OpaquePointer?
    var parameters: [Int32] = []
    /// Parameters bound for the current row, as a bit set (parameters 1…64):
    /// a custom encode(to:) may skip a key, and its parameter must then be
    /// NULL, not the previous row's value.
    var boundParameters: UInt64 = 0
    /// Collecting mode (statement == nil).
    var values: [DatabaseValue]
    /// Keys the model encodes but never decodes (a `let` with an initial
    /// value): no column, so their values are dropped.
    var encodeOnlyKeys: Set<String>
    /// Set while finding those keys: an unknown key is noted instead of refused.
    var notesUnknownKeys = false

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    init(schema: SchemaCore) {
        tableName = schema.tableName
        cursor = ColumnCursor(columns: schema.columns, indexByName: schema.indexByName)
        values = Array(repeating: .null, count: schema.columns.count)
        encodeOnlyKeys = schema.encodeOnlyKeys
    }

    /// Binds `model` into `statement` (parameters per column). The statement
    /// must be reset (it is after every run).
    @inline(__always)
    func bind<M: Encodable>(_ model: M, into statement: OpaquePointer, parameters: [Int32]) throws {
        self.statement = statement
        self.parameters = parameters
        boundParameters = 0
        // Beyond the bit set's reach, clear every binding first instead.
        if parameters.count > 64 { sqlite3_clear_bindings(statement) }
        cursor.rewind()
        try model.encode(to: self)
        if hasFailure { try throwFailure() }
        for parameter in parameters
        where parameter > 0 && parameter <= 64 && boundParameters & (1 << UInt64(parameter - 1)) == 0 {
            let rc = sqlite3_bind_null(statement, parameter)
            if rc != SQLITE_OK { throw bindError(rc) }
        }
    }

    /// The model's column values, in schema order.
    func collect<M: Encodable>(_ model: M) throws -> [DatabaseValue] {
        statement = nil
        for i in values.indices { values[i] = .null }
        cursor.rewind()
        try model.encode(to: self)
        if hasFailure { try throwFailure() }
        return values
    }

    private func throwFailure() throws {
        if let failure {
            self.failure = nil
            throw failure
        }
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        if containers.holds(Key.self) { return containers.container(as: KeyedEncodingContainer<Key>.self) }
        let container = KeyedEncodingContainer(RowKeyedEncoder<Key>(encoder: self))
        containers.store(container, for: Key.self)
        return container
    }
    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        failure = ModelError.invalidModel(
            type: tableName, reason: "a model must encode as a keyed container, not an unkeyed one")
        return DiscardingUnkeyedEncoder()
    }
    func singleValueContainer() -> any SingleValueEncodingContainer {
        failure = ModelError.invalidModel(
            type: tableName, reason: "a model must encode as a keyed container, not a single value")
        return SingleValueCapture(column: "")
    }
    /// Set when the model asks for a container Tether cannot fill; Encoder's API cannot throw there.
    var failure: ModelError? {
        didSet { hasFailure = failure != nil }
    }
    /// `failure != nil`, checked per row without copying the error.
    private(set) var hasFailure = false

    /// The column of `key`, or -1 for a key whose value is dropped.
    @inline(__always)
    func column(_ key: some CodingKey) throws -> Int {
        if let index = cursor.index(of: key.stringValue) { return index }
        return try columnOfUnknownKey(key.stringValue)
    }

    private func columnOfUnknownKey(_ name: String) throws -> Int {
        if notesUnknownKeys { encodeOnlyKeys.insert(name) }
        guard encodeOnlyKeys.contains(name) else { throw ModelError.unknownColumn(table: tableName, column: name) }
        return -1
    }

    @inline(__always)
    func put<V: DatabaseValueConvertible>(_ value: V, at column: Int) throws {
        guard column >= 0 else { return }
        guard let statement else { values[column] = value.databaseValue; return }
        let parameter = parameters[column]
        guard parameter > 0 else { return }
        let rc = value.bind(to: statement, at: parameter)
        if rc != SQLITE_OK { throw bindError(rc) }
        if parameter <= 64 { boundParameters |= 1 << UInt64(parameter - 1) }
    }

    /// Why binding into `statement` (by default the one being bound) failed, with its SQL: read
    /// from the statement only then, so that binding a row costs nothing for the error's sake.
    func bindError(_ rc: Int32, in statement: OpaquePointer? = nil) -> DatabaseError {
        let sql = (statement ?? self.statement).flatMap { sqlite3_sql($0) }.map { String(cString: $0) }
        return DatabaseError(extendedCode: rc, message: String(cString: sqlite3_errstr(rc)), sql: sql)
    }

    func putEncodable<T: Encodable>(_ value: T, at column: Int) throws {
        guard column >= 0 else { return }
        try put(storable(value, column: column), at: column)
    }

    /// What column `column` stores for `value`: the value itself when it binds
    /// itself (and the column is not JSON), else its single value or JSON text.
    private func storable<T: Encodable>(_ value: T, column: Int) throws -> any DatabaseValueConvertible {
        let info = cursor.columns[column]
        if let link = info.nested { return try link.linkValue(value, column: info.name) }
        if info.type != .json, let convertible = value as? any DatabaseValueConvertible { return convertible }
        return try encodeColumnValue(value, type: info.type, column: info.name)
    }

    // MARK: Column by column (ColumnWriter)

    /// Binds a value a `ColumnWriter` does not bind itself, converted as
    /// `putEncodable` converts it.
    func bindEncodable<T: Encodable>(
        _ value: T, column: Int, statement: OpaquePointer, parameters: UnsafeBufferPointer<Int32>
    ) throws {
        let parameter = parameters[column]
        guard parameter > 0 else { return }
        let rc = try storable(value, column: column).bind(to: statement, at: parameter)
        if rc != SQLITE_OK { throw bindError(rc, in: statement) }
    }

    func overwrite(codedCount: Int) -> ModelError {
        .invalidModel(
            type: tableName,
            reason: "its encode(columns:) writes more than the \(codedCount) columns of its codedColumns")
    }
}

struct RowKeyedEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    unowned(unsafe) let encoder: RowEncoder
    var codingPath: [any CodingKey] { [] }

    mutating func encodeNil(forKey key: Key) throws { try encoder.put(DatabaseValue.null, at: encoder.column(key)) }
    mutating func encode(_ value: UInt, forKey key: Key) throws {
        let column = try encoder.column(key)
        try encoder.put(checkedInteger(value, column: key.stringValue), at: column)
    }
    mutating func encode(_ value: UInt64, forKey key: Key) throws {
        let column = try encoder.column(key)
        try encoder.put(checkedInteger(value, column: key.stringValue), at: column)
    }
    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        try encoder.putEncodable(value, at: encoder.column(key))
    }
    mutating func encodeIfPresent<T: Encodable>(_ value: T?, forKey key: Key) throws {
        let column = try encoder.column(key)
        if let value {
            try encoder.putEncodable(value, at: column)
        } else {
            try encoder.put(DatabaseValue.null, at: column)
        }
    }
    mutating func encode(_ value: Bool, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: Bool?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: String, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: String?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: Double, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: Double?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: Float, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: Float?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: Int, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: Int?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: Int8, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: Int8?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: Int16, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: Int16?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: Int32, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: Int32?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: Int64, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: Int64?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: UInt8?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: UInt16?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { try encoder.put(value, at: encoder.column(key)) }
    mutating func encodeIfPresent(_ value: UInt32?, forKey key: Key) throws {
        try encoder.put(value, at: encoder.column(key))
    }
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key)
        -> KeyedEncodingContainer<NestedKey>
    {
        encoder.failure = ModelError.invalidModel(
            type: encoder.tableName,
            reason: """
                nested containers are not supported (key \(key.stringValue)); use a Codable property type, stored \
                as JSON
                """)
        return KeyedEncodingContainer(DiscardingKeyedEncoder<NestedKey>())
    }
    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        encoder.failure = ModelError.invalidModel(
            type: encoder.tableName,
            reason:
                "nested containers are not supported (key \(key.stringValue)); use an array property, stored as JSON")
        return DiscardingUnkeyedEncoder()
    }
    mutating func superEncoder() -> any Encoder { encoder }
    mutating func superEncoder(forKey key: Key) -> any Encoder { encoder }
}

// MARK: - Decoding a model from the current row of a statement

/// Decodes models from the current row of a statement, reading each column
/// straight from SQLite. One instance is reused for every row.
final class RowDecoder: Decoder {
    let tableName: String
    let cursor: ColumnCursor
    private let containers = KeyedContainerStore()
    let statement: OpaquePointer
    /// Per schema column, its index in the statement's result (-1 = absent).
    let resultColumns: [Int32]
    let sql: String
    /// Reads the children of nested properties (set for models that have some).
    var nestedLoader: NestedLoader?

    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    init(schema: SchemaCore, statement: Statement) {
        tableName = schema.tableName
        cursor = ColumnCursor(columns: schema.columns, indexByName: schema.indexByName)
        self.statement = statement.handle
        sql = statement.sql
        let names = statement.columnNames
        resultColumns = schema.columns.map { column in
            if let i = names.firstIndex(of: column.name) { return Int32(i) }
            if let i = names.firstIndex(where: { $0.caseInsensitiveCompare(column.name) == .orderedSame }) {
                return Int32(i)
            }
            return -1
        }
    }

    @inline(__always)
    func decode<M: Decodable>(_ type: M.Type) throws -> M {
        cursor.rewind()
        return try M(from: self)
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        if containers.holds(Key.self) { return containers.container(as: KeyedDecodingContainer<Key>.self) }
        let container = KeyedDecodingContainer(RowKeyedDecoder<Key>(decoder: self))
        containers.store(container, for: Key.self)
        return container
    }
    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        throw ModelError.invalidModel(type: tableName, reason: "a model must decode from a keyed container")
    }
    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        throw ModelError.invalidModel(type: tableName, reason: "a model must decode from a keyed container")
    }

    /// The result column of `key`, or -1 when the row lacks it.
    @inline(__always)
    func resultColumn(_ key: some CodingKey) -> (schema: Int, result: Int32) {
        guard let index = cursor.index(of: key.stringValue) else { return (-1, -1) }
        return (index, resultColumns[index])
    }

    @inline(__always)
    func read<V: DatabaseValueConvertible>(_ type: V.Type, _ key: some CodingKey) throws -> V {
        let column = resultColumn(key).result
        guard column >= 0 else { throw ModelError.missingColumn(column: key.stringValue, sql: sql) }
        if let value = V.read(from: statement, at: column) { return value }
        throw mismatch(V.self, key, column)
    }

    @inline(__always)
    func readIfPresent<V: DatabaseValueConvertible>(_ type: V.Type, _ key: some CodingKey) throws -> V? {
        let column = resultColumn(key).result
        guard column >= 0, sqlite3_column_type(statement, column) != SQLITE_NULL else { return nil }
        if let value = V.read(from: statement, at: column) { return value }
        throw mismatch(V.self, key, column)
    }

    func mismatch(_ type: Any.Type, _ key: some CodingKey, _ column: Int32) -> ModelError {
        mismatch(type, name: key.stringValue, column)
    }

    func mismatch(_ type: Any.Type, name: String, _ column: Int32) -> ModelError {
        .typeMismatch(
            column: name, expected: "\(type)", found: storageName(ofColumnType: sqlite3_column_type(statement, column)),
            sql: sql)
    }

    func readDecodable<T: Decodable>(_ type: T.Type, _ key: some CodingKey, optional: Bool) throws -> T? {
        let (index, column) = resultColumn(key)
        return try readDecodable(
            T.self, info: index >= 0 ? cursor.columns[index] : nil, name: key.stringValue, resultColumn: column,
            optional: optional)
    }

    /// A column's value as any Decodable type: nil for NULL or an absent
    /// column when `optional`, an error otherwise.
    private func readDecodable<T: Decodable>(
        _ type: T.Type, info: ColumnInfo?, name: String, resultColumn column: Int32, optional: Bool
    ) throws -> T? {
        guard column >= 0 else {
            if optional { return nil }
            throw ModelError.missingColumn(column: name, sql: sql)
        }
        if optional && sqlite3_column_type(statement, column) == SQLITE_NULL { return nil }
        if info?.type != .json, let convertible = T.self as? any DatabaseValueConvertible.Type {
            if let value = convertible.read(from: statement, at: column) as? T { return value }
            throw mismatch(T.self, name: name, column)
        }
        if let link = info?.nested {
            guard let nestedLoader else {
                throw ModelError.invalidArgument(
                    "\(tableName).\(name) holds a nested model, read by the model's own fetch")
            }
            return try link.load(
                T.self, link: DatabaseValue(statement: statement, index: column), optional: optional,
                loader: nestedLoader, column: name)
        }
        return try decodeColumnValue(
            T.self, from: DatabaseValue(statement: statement, index: column), info: info, column: name, sql: sql)
    }

    // MARK: Column by column (ColumnReader)

    func readDecodable<T: Decodable>(_ type: T.Type, schemaColumn: Int, resultColumn: Int32, optional: Bool) throws
        -> T?
    {
        let info = cursor.columns[schemaColumn]
        return try readDecodable(T.self, info: info, name: info.name, resultColumn: resultColumn, optional: optional)
    }

    func isNull(_ resultColumn: Int32) -> Bool {
        sqlite3_column_type(statement, resultColumn) == SQLITE_NULL
    }

    /// Why a column could not be read as `type`: absent from the row, or
    /// holding another type.
    func readFailure(_ type: Any.Type, schemaColumn: Int, resultColumn: Int32) -> ModelError {
        let name = cursor.columns[schemaColumn].name
        guard resultColumn >= 0 else { return .missingColumn(column: name, sql: sql) }
        return mismatch(type, name: name, resultColumn)
    }

    func overread(codedCount: Int) -> ModelError {
        .invalidModel(
            type: tableName, reason: "its init(columns:) reads more than the \(codedCount) columns of its codedColumns")
    }
}

struct RowKeyedDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    unowned(unsafe) let decoder: RowDecoder
    var codingPath: [any CodingKey] { [] }

    var allKeys: [Key] {
        decoder.cursor.columns.indices.compactMap { i in
            decoder.resultColumns[i] >= 0 ? Key(stringValue: decoder.cursor.columns[i].name) : nil
        }
    }
    func contains(_ key: Key) -> Bool {
        guard let index = decoder.cursor.indexByName[key.stringValue] else { return false }
        return decoder.resultColumns[index] >= 0
    }
    func decodeNil(forKey key: Key) throws -> Bool {
        guard let index = decoder.cursor.indexByName[key.stringValue], decoder.resultColumns[index] >= 0 else {
            return true
        }
        return sqlite3_column_type(decoder.statement, decoder.resultColumns[index]) == SQLITE_NULL
    }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try decodeUnsigned(UInt.self, key) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try decodeUnsigned(UInt64.self, key) }
    func decodeIfPresent(_ type: UInt.Type, forKey key: Key) throws -> UInt? {
        try decodeNil(forKey: key) ? nil : decodeUnsigned(UInt.self, key)
    }
    func decodeIfPresent(_ type: UInt64.Type, forKey key: Key) throws -> UInt64? {
        try decodeNil(forKey: key) ? nil : decodeUnsigned(UInt64.self, key)
    }
    private func decodeUnsigned<I: FixedWidthInteger>(_ type: I.Type, _ key: Key) throws -> I {
        let value = try decoder.read(Int64.self, key)
        guard let exact = I(exactly: value) else {
            throw ModelError.typeMismatch(
                column: key.stringValue, expected: "\(I.self)", found: "INTEGER \(value)", sql: decoder.sql)
        }
        return exact
    }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        guard let value = try decoder.readDecodable(T.self, key, optional: false) else {
            throw ModelError.missingColumn(column: key.stringValue, sql: decoder.sql)
        }
        return value
    }
    func decodeIfPresent<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T? {
        try decoder.readDecodable(T.self, key, optional: true)
    }
    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try decoder.read(Bool.self, key) }
    func decodeIfPresent(_ type: Bool.Type, forKey key: Key) throws -> Bool? {
        try decoder.readIfPresent(Bool.self, key)
    }
    func decode(_ type: String.Type, forKey key: Key) throws -> String { try decoder.read(String.self, key) }
    func decodeIfPresent(_ type: String.Type, forKey key: Key) throws -> String? {
        try decoder.readIfPresent(String.self, key)
    }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try decoder.read(Double.self, key) }
    func decodeIfPresent(_ type: Double.Type, forKey key: Key) throws -> Double? {
        try decoder.readIfPresent(Double.self, key)
    }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { try decoder.read(Float.self, key) }
    func decodeIfPresent(_ type: Float.Type, forKey key: Key) throws -> Float? {
        try decoder.readIfPresent(Float.self, key)
    }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try decoder.read(Int.self, key) }
    func decodeIfPresent(_ type: Int.Type, forKey key: Key) throws -> Int? { try decoder.readIfPresent(Int.self, key) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try decoder.read(Int8.self, key) }
    func decodeIfPresent(_ type: Int8.Type, forKey key: Key) throws -> Int8? {
        try decoder.readIfPresent(Int8.self, key)
    }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try decoder.read(Int16.self, key) }
    func decodeIfPresent(_ type: Int16.Type, forKey key: Key) throws -> Int16? {
        try decoder.readIfPresent(Int16.self, key)
    }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try decoder.read(Int32.self, key) }
    func decodeIfPresent(_ type: Int32.Type, forKey key: Key) throws -> Int32? {
        try decoder.readIfPresent(Int32.self, key)
    }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try decoder.read(Int64.self, key) }
    func decodeIfPresent(_ type: Int64.Type, forKey key: Key) throws -> Int64? {
        try decoder.readIfPresent(Int64.self, key)
    }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try decoder.read(UInt8.self, key) }
    func decodeIfPresent(_ type: UInt8.Type, forKey key: Key) throws -> UInt8? {
        try decoder.readIfPresent(UInt8.self, key)
    }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try decoder.read(UInt16.self, key) }
    func decodeIfPresent(_ type: UInt16.Type, forKey key: Key) throws -> UInt16? {
        try decoder.readIfPresent(UInt16.self, key)
    }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try decoder.read(UInt32.self, key) }
    func decodeIfPresent(_ type: UInt32.Type, forKey key: Key) throws -> UInt32? {
        try decoder.readIfPresent(UInt32.self, key)
    }
    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws
        -> KeyedDecodingContainer<NestedKey>
    {
        throw ModelError.invalidModel(
            type: decoder.tableName,
            reason: """
                nested containers are not supported (key \(key.stringValue)); use a Codable property type, stored \
                as JSON
                """)
    }
    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        throw ModelError.invalidModel(
            type: decoder.tableName,
            reason:
                "nested containers are not supported (key \(key.stringValue)); use an array property, stored as JSON")
    }
    func superDecoder() throws -> any Decoder { decoder }
    func superDecoder(forKey key: Key) throws -> any Decoder { decoder }
}
