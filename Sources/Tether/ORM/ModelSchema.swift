import Foundation

/// The non-generic part of a model's schema: its table, columns and the SQL
/// Tether runs for it, built once per type.
class SchemaCore: @unchecked Sendable {
    let modelName: String
    let tableName: String
    let quotedTable: String
    let columns: [ColumnInfo]
    let indexByName: [String: Int]
    let primaryKey: [Int]
    let secondaryKeys: [[Int]]

    let insertSQL: String
    let replaceSQL: String
    let upsertSQL: String
    let updateSQL: String
    let selectSQL: String
    /// `WHERE "pk1" = ? AND …`
    let primaryKeyCondition: String
    /// Per column, what its INSERT binds: "?", or a COALESCE with its default.
    let insertPlaceholders: [String]
    /// Per column, its parameter in INSERT / REPLACE / UPSERT (all columns, in order).
    let allColumnParameters: [Int32]
    /// Per column, its parameter in `updateSQL` (non-key columns, then key columns).
    let updateParameters: [Int32]
    /// Per column, its parameter in a statement that binds only the primary key.
    let primaryKeyParameters: [Int32]
    /// Columns that hold the row's sync state (a `SyncableModel`'s `tether_status` and
    /// `tether_in_flight`): not in the table, never written, read from the sync metadata.
    let syncStateColumns: Set<Int>
    /// The other columns: those of the table.
    let storedColumns: [Int]
    /// Keys the model encodes but never decodes (a `let` with an initial
    /// value): columns come from decoding, so these are dropped when encoding.
    fileprivate(set) var encodeOnlyKeys: Set<String> = []
    /// The model's nested properties (other models, stored in their own tables), if any.
    fileprivate(set) var nested: NestedPlan?
    /// The `.mandatory` and `.mandatoryElements` columns, which must not be NULL for a row to
    /// be read, and the `.mandatoryElements` ones, whose arrays must not be empty either
    /// (`requiredRowsCondition()` adds what their children must meet).
    fileprivate(set) var requiredColumns: (notNull: [Int], nonEmpty: [Int]) = ([], [])
    /// `requiredRowsCondition()` once built (the schemas it reads never change).
    let requiredRowsConditionCache = Protected<String??>(nil)
    /// The model's `defaultOrder` as ORDER BY terms; nil when it names none.
    fileprivate(set) var defaultOrderSQL: String?

    init(
        modelName: String, tableName: String, columns: [ColumnInfo], primaryKey: [Int], secondaryKeys: [[Int]],
        fillDefaults: [Int: DatabaseValue] = [:]
    ) {
        self.modelName = modelName
        self.tableName = tableName
        self.columns = columns
        self.primaryKey = primaryKey
        self.secondaryKeys = secondaryKeys
        quotedTable = quoteIdentifier(tableName)
        indexByName = Dictionary(columns.enumerated().map { ($1.name, $0) }, uniquingKeysWith: { first, _ in first })

        let names = columns.map { quoteIdentifier($0.name) }
        let syncState = Set(columns.indices.filter { RowMetadataLayout.syncStateColumns.contains(columns[$0].name) })
        syncStateColumns = syncState
        let stored = columns.indices.filter { !syncState.contains($0) }
        storedColumns = stored
        // A NOT NULL column of an optional property with a DEFAULT gets the default for nil.
        let perColumnPlaceholders = columns.indices.map {
            fillDefaults[$0].map { "COALESCE(?, \($0.description))" } ?? "?"
        }
        insertPlaceholders = perColumnPlaceholders
        let placeholders = stored.map { perColumnPlaceholders[$0] }.joined(separator: ", ")
        let nameList = stored.map { names[$0] }.joined(separator: ", ")
        insertSQL = "INSERT INTO \(quotedTable) (\(nameList)) VALUES (\(placeholders))"
        replaceSQL = "INSERT OR REPLACE INTO \(quotedTable) (\(nameList)) VALUES (\(placeholders))"
        let keyNames = primaryKey.map { names[$0] }
        let nonKey = stored.filter { !primaryKey.contains($0) }
        let upsertSet =
            nonKey.isEmpty
            ? "NOTHING" : "UPDATE SET " + nonKey.map { "\(names[$0]) = excluded.\(names[$0])" }.joined(separator: ", ")
        upsertSQL = insertSQL + " ON CONFLICT (\(keyNames.joined(separator: ", "))) DO \(upsertSet)"
        primaryKeyCondition = primaryKey.map { "\(names[$0]) = ?" }.joined(separator: " AND ")
        let setList = nonKey.map { "\(names[$0]) = ?" }.joined(separator: ", ")
        updateSQL = nonKey.isEmpty ? "" : "UPDATE \(quotedTable) SET \(setList) WHERE \(primaryKeyCondition)"
        selectSQL = Self.selectSQL(columns: columns, syncState: syncState, table: tableName, readingAsNull: [])

        var all = Array(repeating: Int32(0), count: columns.count)
        for (position, column) in stored.enumerated() { all[column] = Int32(position + 1) }
        allColumnParameters = all
        var update = Array(repeating: Int32(0), count: columns.count)
        for (position, column) in (nonKey + primaryKey).enumerated() { update[column] = Int32(position + 1) }
        updateParameters = update
        var keyOnly = Array(repeating: Int32(0), count: columns.count)
        for (position, column) in primaryKey.enumerated() { keyOnly[column] = Int32(position + 1) }
        primaryKeyParameters = keyOnly
    }

    /// The model's SELECT. Each column is qualified by the table, so that a column the table
    /// lacks fails to prepare (a bare `"color"` would read as the string 'color'); those in
    /// `readingAsNull` are read as NULL (a model that adds its missing columns, before it has).
    static func selectSQL(columns: [ColumnInfo], syncState: Set<Int>, table: String, readingAsNull: Set<String>)
        -> String
    {
        let quotedTable = quoteIdentifier(table)
        let selectList = columns.indices.map { index in
            let name = quoteIdentifier(columns[index].name)
            if syncState.contains(index) {
                return "\(RowMetadataLayout.syncStateSQL(column: columns[index].name, table: table)) AS \(name)"
            }
            return readingAsNull.contains(columns[index].name) ? "NULL AS \(name)" : "\(quotedTable).\(name)"
        }
        return "SELECT \(selectList.joined(separator: ", ")) FROM \(quotedTable)"
    }

    func selectSQL(readingAsNull missing: Set<String>) -> String {
        Self.selectSQL(columns: columns, syncState: syncStateColumns, table: tableName, readingAsNull: missing)
    }

    func column(named name: String) throws -> Int {
        if let index = indexByName[name] { return index }
        if let index = columns.firstIndex(where: { $0.name.caseInsensitiveCompare(name) == .orderedSame }) {
            return index
        }
        throw ModelError.unknownColumn(table: tableName, column: name)
    }

    /// Throws, naming `operation`, when the model's table has no primary key.
    func requirePrimaryKey(for operation: String) throws {
        guard primaryKey.isEmpty else { return }
        throw ModelError.invalidArgument(
            "\(modelName) has no primary key, so \(operation) cannot find its row; "
                + "select rows by condition instead (fetchAll, update(query, set:), delete(query))")
    }

    /// Describes a primary key for messages.
    func describeKey(_ values: [DatabaseValue]) -> String {
        if values.count == 1 { return values[0].description }
        return "(" + zip(primaryKey, values).map { "\(columns[$0.0].name) = \($0.1)" }.joined(separator: ", ") + ")"
    }
}

/// A model's schema, with the samples that map its key paths to columns.
final class ModelSchema<M: Model>: SchemaCore, @unchecked Sendable {
    private let baseline: M
    private let variants: [M?]
    private let keyPathColumns = Protected<[AnyKeyPath: Int]>([:])
    let constraints: [Constraint<M>]
    /// Set when `M` reads and binds itself column by column (@Model).
    private(set) var columnCoding: ColumnCoding<M>?

    private init(derived: (columns: [ColumnInfo], baseline: M, variants: [M?])) throws {
        baseline = derived.baseline
        variants = derived.variants
        constraints = M.constraints
        let names = Dictionary(derived.columns.enumerated().map { ($1.name, $0) }, uniquingKeysWith: { a, _ in a })
        // Key paths in the declarations are resolved with the samples, before `self` exists.
        func resolve(_ ref: ColumnRef<M>) throws -> Int {
            switch ref {
            case let .named(name):
                guard let index = names[name] else { throw ModelError.unknownColumn(table: M.tableName, column: name) }
                return index
            case let .keyPath(keyPath):
                return try Self.resolve(
                    keyPath, columns: derived.columns, baseline: derived.baseline, variants: derived.variants)
            }
        }
        if M.primaryKey.count == 1, case .named("id") = M.primaryKey[0], names["id"] == nil {
            throw ModelError.invalidModel(type: "\(M.self)", reason: "it has no column 'id'; declare its primaryKey")
        }
        // An empty primary key is a table without one (SQLiteORM-Swift's): rows are
        // written and read by condition; what needs a key says so (`requirePrimaryKey`).
        let primaryKey = try M.primaryKey.map(resolve)
        let secondary = try M.secondaryKeys.map { try $0.map(resolve) }
        var notNull = Set<Int>()
        var defaults: [Int: DatabaseValue] = [:]
        for constraint in M.constraints {
            switch constraint {
            case let .notNull(ref): if let index = try? resolve(ref) { notNull.insert(index) }
            case let .defaultValue(ref, value): if let index = try? resolve(ref) { defaults[index] = value }
            default: break
            }
        }
        var mandatory: [Int] = [], everyElement: [Int] = [], dropping: [Int] = []
        for constraint in M.constraints {
            switch constraint {
            case let .mandatory(ref): mandatory.append(try resolve(ref))
            case let .mandatoryElements(ref): everyElement.append(try resolve(ref))
            case let .dropsMissingElements(ref): dropping.append(try resolve(ref))
            default: break
            }
        }
        let settled = try Self.settleNested(
            derived.columns, primaryKey: primaryKey, mandatory: mandatory, everyElement: everyElement,
            dropping: dropping)
        let fill = defaults.filter { notNull.contains($0.key) && derived.columns[$0.key].isOptional }
        super.init(
            modelName: "\(M.self)", tableName: M.tableName, columns: settled.columns, primaryKey: primaryKey,
            secondaryKeys: secondary, fillDefaults: fill)
        nested = settled.plan
        requiredColumns = settled.required
        let order = try M.defaultOrder.map {
            "\(quoteIdentifier(derived.columns[try resolve($0.column)].name)) \($0.ascending ? "ASC" : "DESC")"
        }
        defaultOrderSQL = order.isEmpty ? nil : order.joined(separator: ", ")
        for (index, key) in primaryKey.enumerated() where primaryKey[..<index].contains(key) {
            throw ModelError.invalidModel(
                type: "\(M.self)", reason: "column \(columns[key].name) appears twice in the primary key")
        }
        encodeOnlyKeys = Self.encodeOnlyKeys(of: derived.baseline, schema: self)
        // Nested models are read with their children, row by row, through Codable.
        columnCoding = nested == nil ? ColumnCoding<M>.make(schema: self) : nil
    }

    private static var cache: Protected<[ObjectIdentifier: AnyObject]> { schemaCache }

    /// The schema of `M`, derived on first use and shared.
    static func shared() throws -> ModelSchema<M> {
        let id = ObjectIdentifier(M.self)
        if let schema = schemaCache.withLock({ $0[id] }) as? ModelSchema<M> { return schema }
        let schema = try SchemaDerivation.$inProgress.withValue(SchemaDerivation.inProgress.union([id])) {
            try ModelSchema(derived: SchemaProbe.derive(M.self))
        }
        schemaCache.withLock { $0[id] = schema }
        return schema
    }

    /// The column a declaration names.
    func column(_ ref: ColumnRef<M>) throws -> Int {
        switch ref {
        case let .named(name): return try column(named: name)
        case let .keyPath(keyPath): return try column(keyPath)
        }
    }

    /// The column a key path reads.
    func column(_ keyPath: AnyKeyPath) throws -> Int {
        if let cached = keyPathColumns.withLock({ $0[keyPath] }) { return cached }
        let index = try Self.resolve(keyPath, columns: columns, baseline: baseline, variants: variants)
        keyPathColumns.withLock { $0[keyPath] = index }
        return index
    }

    /// The keys `model` encodes that decoding never asked for.
    private static func encodeOnlyKeys(of model: M, schema: SchemaCore) -> Set<String> {
        let encoder = RowEncoder(schema: schema)
        encoder.notesUnknownKeys = true
        _ = try? encoder.collect(model)
        return encoder.encodeOnlyKeys
    }

    private static func resolve(_ keyPath: AnyKeyPath, columns: [ColumnInfo], baseline: M, variants: [M?]) throws -> Int
    {
        let valueType = type(of: keyPath).valueType
        let base = baseline[keyPath: keyPath]
        let baseFingerprint = fingerprint(base)
        var matches: [Int] = []
        for (index, column) in columns.enumerated()
        where column.valueType == valueType || column.optionalValueType == valueType {
            guard let variant = variants[index] else { continue }
            if fingerprint(variant[keyPath: keyPath]) != baseFingerprint { matches.append(index) }
        }
        // The samples' stored values, to tell reading a column from computing from it.
        let encoder = RowEncoder(
            schema: SchemaCore(
                modelName: "\(M.self)", tableName: M.tableName, columns: columns, primaryKey: [], secondaryKeys: []))
        encoder.notesUnknownKeys = true
        if matches.isEmpty, let base = try? encoder.collect(baseline) {
            // A column whose type has a single value (a one-case enum) cannot be
            // varied; a key path of that exact type that reads its value is it.
            let fixed = columns.indices.filter { index in
                guard columns[index].valueType == valueType || columns[index].optionalValueType == valueType,
                    let variant = variants[index], let values = try? encoder.collect(variant)
                else { return false }
                return values[index] == base[index] && base[index] == baseFingerprint
            }
            if fixed.count == 1 { matches = fixed }
        }
        guard matches.count == 1 else {
            let reason = matches.isEmpty ? "it does not read a stored column" : "it depends on several columns"
            throw ModelError.invalidArgument("key path \(keyPath) of \(M.self) cannot be used as a column: \(reason)")
        }
        // A computed property of one column changes with it, but is not its value.
        if let variant = variants[matches[0]], let encoded = try? encoder.collect(variant),
            fingerprint(variant[keyPath: keyPath], link: columns[matches[0]].nested) != encoded[matches[0]]
        {
            throw ModelError.invalidArgument(
                """
                key path \(keyPath) of \(M.self) cannot be used as a column: it computes a value from column \
                \(columns[matches[0]].name) instead of reading it
                """)
        }
        return matches[0]
    }

    /// `link`: the value's column holds nested models, which it stores as keys.
    private static func fingerprint(_ value: Any?, link: NestedLink? = nil) -> DatabaseValue? {
        guard let value, let encodable = value as? any Encodable else { return nil }
        if let link { return try? link.linkValue(encodable, column: "") }
        return try? encodeColumnValue(encodable, type: nil, column: "")
    }
}

private let schemaCache = Protected<[ObjectIdentifier: AnyObject]>([:])
