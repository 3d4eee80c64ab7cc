import CSQLite

/// A model that reads itself from a row and binds itself into a statement
/// column by column, instead of through `Codable`'s keyed containers.
///
/// You do not usually write this conformance: the ``Model()`` macro writes it
/// from the stored properties and `CodingKeys`, so the columns stay exactly
/// those of the `Codable` conformance.
///
/// ```swift
/// @Model
/// struct Player {
///     var id: Int64
///     var name: String
///     var score: Int?
/// }
/// ```
///
/// Why: `Codable` reaches each property through a container box, a coding
/// key and a generic call, which costs more than reading the column itself.
/// With this conformance, fetching and inserting run at about 0.85× the speed
/// of a hand-written loop on the SQLite C API (see the README's Performance).
///
/// Tether uses the conformance only when ``codedColumns`` names exactly the
/// columns the `Codable` conformance makes; otherwise it keeps using
/// `Codable`. Values go through the same conversions either way.
public protocol ColumnCodable {
    /// The column names, in the order `init(columns:)` reads them and
    /// `encode(columns:)` writes them.
    static var codedColumns: [String] { get }
    /// Reads one value per coded column, in order, with `columns.read()`.
    init(columns: inout ColumnReader) throws
    /// Writes one value per coded column, in order, with `columns.write(_:)`.
    func encode(columns: inout ColumnWriter) throws
    /// Decodes every remaining row. Keep the default implementation: it is
    /// compiled for each conforming type, so the loop runs without the
    /// per-row generic dispatch (type metadata, witness calls, copies) that
    /// code generic over the model pays.
    static func decodeRows(_ rows: inout ColumnRows) throws -> [Self]
    /// Inserts every model, in order, through `inserts`. Keep the default
    /// implementation, for the reason `decodeRows` gives.
    static func insertRows(_ models: [Self], _ inserts: inout ColumnInserts) throws
}

extension ColumnCodable {
    @inlinable
    public static func decodeRows(_ rows: inout ColumnRows) throws -> [Self] {
        var models: [Self] = []
        while try rows.step() {
            var reader = rows.reader
            models.append(try Self(columns: &reader))
        }
        return models
    }

    @inlinable
    public static func insertRows(_ models: [Self], _ inserts: inout ColumnInserts) throws {
        for index in models.indices {
            var writer = inserts.writer
            try models[index].encode(columns: &writer)
            try inserts.insert(writtenBy: writer, row: index)
        }
    }
}

/// The rows of a statement, read by ``ColumnCodable/decodeRows(_:)``.
public struct ColumnRows {
    let statement: Statement
    /// The statement's handle, and whether observers see its steps: both read once per fetch,
    /// not per row (the connection is reached through an unowned reference).
    private let handle: OpaquePointer
    private let isObserved: Bool
    /// A reader at the first column; each row reads a copy.
    @usableFromInline let reader: ColumnReader

    init(statement: Statement, reader: ColumnReader) {
        self.statement = statement
        handle = statement.handle
        isObserved = !statement.connection.activeObservers.isEmpty
        self.reader = reader
    }

    /// Moves to the next row; false after the last one.
    @usableFromInline
    func step() throws -> Bool {
        guard !isObserved else { return try statement.step() }
        let rc = sqlite3_step(handle)
        if rc == SQLITE_ROW { return true }
        if rc == SQLITE_DONE { return false }
        throw statement.stepError(rc)
    }
}

/// The columns of the current row, in a ``ColumnCodable`` model's order.
///
/// Each `read()` returns the next column, converted as `Codable` decoding
/// would: `DatabaseValueConvertible` types directly, other `Decodable` types
/// (enums, JSON values) through their single value or JSON text. An optional
/// is nil for NULL or a column absent from the query.
///
/// A reader is valid only during the `init(columns:)` it is passed to: it
/// points into the statement's current row.
public struct ColumnReader {
    @usableFromInline let statement: OpaquePointer
    /// Per coded column, its index in the statement's result (-1: absent).
    @usableFromInline let resultColumns: UnsafeBufferPointer<Int32>
    /// Per coded column, its column in the model's schema.
    let schemaColumns: UnsafeBufferPointer<Int>
    @usableFromInline var position = 0
    /// Converts what the inlined paths do not, and words their errors.
    unowned(unsafe) let decoder: RowDecoder

    init(
        statement: OpaquePointer, resultColumns: UnsafeBufferPointer<Int32>, schemaColumns: UnsafeBufferPointer<Int>,
        decoder: RowDecoder
    ) {
        self.statement = statement
        self.resultColumns = resultColumns
        self.schemaColumns = schemaColumns
        self.decoder = decoder
    }

    /// The next column's position, or an error when the model reads more
    /// columns than it codes.
    @inlinable @inline(__always)
    mutating func advance() throws -> Int {
        let current = position
        guard current < resultColumns.count else { throw overread() }
        position = current + 1
        return current
    }

    /// The next column as a value that reads itself (optionals included: nil
    /// for NULL or a column absent from the query).
    @inlinable @inline(__always)
    public mutating func read<V: DatabaseValueConvertible & Decodable>() throws -> V {
        let coded = try advance()
        let column = resultColumns[coded]
        if V.columnType != .json, column >= 0, let value = V.read(from: statement, at: column) { return value }
        return try decoded(V.self, coded: coded)
    }

    /// The next column as any other `Decodable` value: an enum, a JSON value,
    /// or an optional of one.
    public mutating func read<T: Decodable>() throws -> T {
        try decoded(T.self, coded: advance())
    }

    /// Column `coded` converted as `Codable` decoding converts it (optionals
    /// as by `decodeIfPresent`), or the error saying why it cannot be.
    @usableFromInline
    func decoded<T: Decodable>(_ type: T.Type, coded: Int) throws -> T {
        if let optional = T.self as? any OptionalColumn.Type,
            let value = try optional.decodedIfPresent(from: self, coded: coded) as? T
        {
            return value
        }
        let column = resultColumns[coded]
        if let value = try decoder.readDecodable(
            T.self, schemaColumn: schemaColumns[coded], resultColumn: column, optional: false)
        {
            return value
        }
        throw decoder.readFailure(T.self, schemaColumn: schemaColumns[coded], resultColumn: column)
    }

    func decodedIfPresent<T: Decodable>(_ type: T.Type, coded: Int) throws -> T? {
        try decoder.readDecodable(
            T.self, schemaColumn: schemaColumns[coded], resultColumn: resultColumns[coded], optional: true)
    }

    @usableFromInline
    func isNull(_ column: Int32) -> Bool { decoder.isNull(column) }

    @usableFromInline
    func overread() -> ModelError { decoder.overread(codedCount: resultColumns.count) }
}

/// An optional property: read as `Codable`'s `decodeIfPresent` reads it.
protocol OptionalColumn {
    static func decodedIfPresent(from reader: ColumnReader, coded: Int) throws -> Self
}

extension Optional: OptionalColumn where Wrapped: Decodable {
    static func decodedIfPresent(from reader: ColumnReader, coded: Int) throws -> Wrapped? {
        try reader.decodedIfPresent(Wrapped.self, coded: coded)
    }
}

/// The parameters of a statement, in a ``ColumnCodable`` model's column order.
///
/// Each `write(_:)` binds the next column, converted as `Codable` encoding
/// would. Columns the statement does not use (a DELETE binds only the
/// primary key) are skipped. A writer is valid only during the
/// `encode(columns:)` it is passed to.
public struct ColumnWriter {
    @usableFromInline let statement: OpaquePointer
    /// Per schema column, its parameter (0: not bound by this statement).
    @usableFromInline let parameters: UnsafeBufferPointer<Int32>
    /// Per coded column, its column in the model's schema.
    @usableFromInline let schemaColumns: UnsafeBufferPointer<Int>
    @usableFromInline var position = 0
    /// Converts what the inlined paths do not, and words their errors.
    unowned(unsafe) let encoder: RowEncoder

    init(
        statement: OpaquePointer, parameters: UnsafeBufferPointer<Int32>, schemaColumns: UnsafeBufferPointer<Int>,
        encoder: RowEncoder
    ) {
        self.statement = statement
        self.parameters = parameters
        self.schemaColumns = schemaColumns
        self.encoder = encoder
    }

    /// The schema column of the next coded column, or an error when the model
    /// writes more columns than it codes.
    @inlinable @inline(__always)
    mutating func advance() throws -> Int {
        let current = position
        guard current < schemaColumns.count else { throw overwrite() }
        position = current + 1
        return schemaColumns[current]
    }

    /// Binds a value that binds itself.
    @inlinable
    public mutating func write<V: DatabaseValueConvertible & Encodable>(_ value: V) throws {
        let column = try advance()
        guard V.columnType != .json else { return try encoded(value, column: column) }
        let parameter = parameters[column]
        guard parameter > 0 else { return }
        let rc = value.bind(to: statement, at: parameter)
        if rc != 0 { throw bindError(rc) }
    }

    /// Binds any other `Encodable` value (an enum, a JSON value).
    public mutating func write<T: Encodable>(_ value: T) throws {
        try encoded(value, column: advance())
    }

    /// Binds any other optional `Encodable` value: NULL for nil.
    public mutating func write<T: Encodable>(_ value: T?) throws {
        let column = try advance()
        guard let value else { return try encoded(DatabaseValue.null, column: column) }
        try encoded(value, column: column)
    }

    /// Binds `value` converted as `Codable` encoding converts it.
    @usableFromInline
    func encoded<T: Encodable>(_ value: T, column: Int) throws {
        try encoder.bindEncodable(value, column: column, statement: statement, parameters: parameters)
    }

    @usableFromInline
    func bindError(_ rc: Int32) -> DatabaseError { encoder.bindError(rc, in: statement) }

    @usableFromInline
    func overwrite() -> ModelError { encoder.overwrite(codedCount: schemaColumns.count) }

    /// Throws unless every coded column was written.
    func checkComplete() throws {
        guard position == schemaColumns.count else {
            throw ModelError.invalidModel(
                type: encoder.tableName,
                reason:
                    "its encode(columns:) wrote \(position) of the \(schemaColumns.count) columns of its codedColumns")
        }
    }
}

/// An INSERT run once per model by ``ColumnCodable/insertRows(_:_:)``.
public struct ColumnInserts {
    /// A writer at the first column; each model writes a copy.
    @usableFromInline let writer: ColumnWriter
    let statement: Statement
    /// Whether each inserted rowid is noted for the observers of a bulk insert.
    let recordsRows: Bool
    /// Throws the error a unique violation by model `row` is reported as.
    let duplicate: (_ row: Int, DatabaseError) throws -> Void

    init(
        writer: ColumnWriter, statement: Statement, recordsRows: Bool,
        duplicate: @escaping (_ row: Int, DatabaseError) throws -> Void
    ) {
        self.writer = writer
        self.statement = statement
        self.recordsRows = recordsRows
        self.duplicate = duplicate
    }

    /// Runs the INSERT with what `writer` bound for model `row`.
    @usableFromInline
    func insert(writtenBy writer: ColumnWriter, row: Int) throws {
        // A column left unwritten would keep the previous row's value.
        try writer.checkComplete()
        do {
            defer { statement.reset() }
            while try statement.step() {}
        } catch let error as DatabaseError where error.kind == .uniqueViolation {
            try duplicate(row, error)
        }
        if recordsRows { try statement.connection.noteBulkInsertedRow() }
    }
}

/// How Tether reads and binds a ``ColumnCodable`` model: its coded columns
/// mapped onto the schema `Codable` made. Built once per model type.
final class ColumnCoding<M>: @unchecked Sendable {
    /// Per coded column, its column in the schema.
    let schemaColumns: [Int]
    let decodeRows: (inout ColumnRows) throws -> [M]
    let encode: (M, inout ColumnWriter) throws -> Void
    let insertRows: ([M], inout ColumnInserts) throws -> Void

    private init(
        schemaColumns: [Int], decodeRows: @escaping (inout ColumnRows) throws -> [M],
        encode: @escaping (M, inout ColumnWriter) throws -> Void,
        insertRows: @escaping ([M], inout ColumnInserts) throws -> Void
    ) {
        self.schemaColumns = schemaColumns
        self.decodeRows = decodeRows
        self.encode = encode
        self.insertRows = insertRows
    }

    /// The column coding of `M`, or nil when `M` is not `ColumnCodable` or its
    /// coded columns are not exactly the schema's (then `Codable` is used).
    static func make(schema: SchemaCore) -> ColumnCoding<M>? {
        guard let codable = M.self as? any ColumnCodable.Type else { return nil }
        return make(codable, schema: schema)
    }

    private static func make<C: ColumnCodable>(_ type: C.Type, schema: SchemaCore) -> ColumnCoding<M>? {
        let names = C.codedColumns
        guard names.count == schema.columns.count else { return nil }
        var columns: [Int] = []
        for name in names {
            guard let index = schema.indexByName[name], !columns.contains(index) else { return nil }
            columns.append(index)
        }
        // C is M itself (opened from M.self), so the casts only restate the type.
        return ColumnCoding(
            schemaColumns: columns,
            decodeRows: { rows in unsafeBitCast(try C.decodeRows(&rows), to: [M].self) },
            encode: { model, writer in try unsafeBitCast(model, to: C.self).encode(columns: &writer) },
            insertRows: { models, inserts in try C.insertRows(unsafeBitCast(models, to: [C].self), &inserts) })
    }

    /// Binds `model` into `statement` (parameters per schema column).
    @inline(__always)
    func bind(_ model: M, into statement: Statement, parameters: [Int32], encoder: RowEncoder) throws {
        try parameters.withUnsafeBufferPointer { parameters in
            try schemaColumns.withUnsafeBufferPointer { columns in
                var writer = ColumnWriter(
                    statement: statement.handle, parameters: parameters, schemaColumns: columns, encoder: encoder)
                try encode(model, &writer)
                // A column left unwritten would keep the previous row's value.
                try writer.checkComplete()
            }
        }
    }

    /// Inserts every model with `statement` (parameters per schema column), each row's
    /// duplicate reported by `duplicate`; the loop is `M`'s own (``ColumnCodable/insertRows(_:_:)``).
    func insertAll(
        _ models: [M], with statement: Statement, parameters: [Int32], encoder: RowEncoder, recordsRows: Bool,
        duplicate: @escaping (_ row: Int, DatabaseError) throws -> Void
    ) throws {
        try parameters.withUnsafeBufferPointer { parameters in
            try schemaColumns.withUnsafeBufferPointer { columns in
                var inserts = ColumnInserts(
                    writer: ColumnWriter(
                        statement: statement.handle, parameters: parameters, schemaColumns: columns, encoder: encoder),
                    statement: statement, recordsRows: recordsRows, duplicate: duplicate)
                try insertRows(models, &inserts)
            }
        }
    }

    /// Every row of `statement`, decoded.
    func decodeAll(_ statement: Statement, decoder: RowDecoder) throws -> [M] {
        let resultColumns = schemaColumns.map { decoder.resultColumns[$0] }
        return try resultColumns.withUnsafeBufferPointer { resultColumns in
            try schemaColumns.withUnsafeBufferPointer { schemaColumns in
                var rows = ColumnRows(
                    statement: statement,
                    reader: ColumnReader(
                        statement: statement.handle, resultColumns: resultColumns, schemaColumns: schemaColumns,
                        decoder: decoder))
                return try decodeRows(&rows)
            }
        }
    }
}
