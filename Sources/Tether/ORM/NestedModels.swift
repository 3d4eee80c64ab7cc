import Foundation

/// How far `fetch` follows nested models (properties whose type is another model).
public enum NestedLoading: Sendable, Equatable {
    /// Every level (a cycle of stored links is an error, not a hang).
    case all
    /// At most this many levels below the fetched rows: beyond it, an optional child is nil
    /// and an array of children is empty (a required child there is an error). 0 reads no child.
    case depth(Int)

    var maximumDepth: Int {
        switch self {
        case .all: return Int.max
        case let .depth(levels): return max(0, levels)
        }
    }
}

/// A property whose type is another model (`Child`, `Child?`) or an array of models
/// (`[Child]`): the children are rows of their own table, and the parent's column holds the
/// link — the child's primary key for one child, a JSON array of keys for several.
///
/// The link is a value of the parent's row like any other: it is stored in the parent's
/// table (so `SELECT *` shows it), and on a synced table it syncs with the parent's other
/// columns, while each child syncs as a row of its own table.
class NestedLink: @unchecked Sendable {
    enum Shape { case one, many }
    let shape: Shape
    let childName: String
    let childTable: String
    let childType: ObjectIdentifier
    /// SundeedQLite's `<*>`: a parent whose child is missing is left out of the results.
    var isMandatory = false
    /// SundeedQLite's `<**>`: a parent whose array is empty or misses an element is left out.
    var requiresEveryElement = false
    /// An element whose row is missing is dropped from the array.
    var dropsMissingElements = false

    init(shape: Shape, childName: String, childTable: String, childType: ObjectIdentifier) {
        self.shape = shape
        self.childName = childName
        self.childTable = childTable
        self.childType = childType
    }

    /// The link of `type`, when it is a model or an array of models.
    static func describe<T>(_ type: T.Type) -> NestedLink? {
        if let model = T.self as? any Model.Type { return make(model, .one) }
        if let array = T.self as? any ModelArray.Type { return make(array.modelElement, .many) }
        return nil
    }

    private static func make<C: Model>(_ type: C.Type, _ shape: Shape) -> NestedLink { ChildLink<C>(shape: shape) }

    // Implemented by ChildLink<C>, which knows the child's type.
    func sample<T>(_ type: T.Type, variant: Bool, context: String) throws -> T { throw unimplemented() }
    func keyColumnType(parent: ObjectIdentifier, parentColumns: [ColumnInfo], parentKey: [Int]) throws -> ColumnType { throw unimplemented() }
    func childSchema() throws -> SchemaCore { throw unimplemented() }
    func linkValue(_ value: Any, column: String) throws -> DatabaseValue { throw unimplemented() }
    func save(_ value: Any, _ context: NestedWrite) throws { throw unimplemented() }
    func load<T>(_ type: T.Type, link: DatabaseValue, optional: Bool, loader: NestedLoader, column: String) throws -> T? { throw unimplemented() }
    func reachChildren(link: DatabaseValue, _ context: NestedDelete) throws { throw unimplemented() }
    func createTable(_ connection: Connection, visited: inout Set<ObjectIdentifier>) throws { throw unimplemented() }
    var childModel: (any Model.Type)? { nil }
    func enableSync(_ database: Database, policy: ConflictPolicy) throws { throw unimplemented() }

    func compositeKey() -> ModelError {
        .invalidModel(type: childName, reason: "it has a composite primary key; a nested model needs a single-column key to be linked by")
    }

    private func unimplemented() -> ModelError { .invalidModel(type: childName, reason: "internal: a nested link without its child type") }
}

/// `[C]` for a model `C`, recognized at run time.
protocol ModelArray {
    static var modelElement: any Model.Type { get }
}

extension Array: ModelArray where Element: Model {
    static var modelElement: any Model.Type { Element.self }
}

/// Why a parent is left out of the results (a mandatory child or element is missing).
struct ParentLeftOut: Error {}

/// A row of a model type, by key: what cycles and sharing are told by.
struct NestedNode: Hashable {
    let type: ObjectIdentifier
    let key: [DatabaseValue]
}

final class ChildLink<C: Model>: NestedLink, @unchecked Sendable {
    init(shape: Shape) {
        super.init(shape: shape, childName: "\(C.self)", childTable: C.tableName, childType: ObjectIdentifier(C.self))
    }

    /// A sample child whose nested properties are empty (a variant all through would make
    /// recursive types recurse forever); the variant of one child differs by its key, so that
    /// a key path finds the column. An array is empty, or holds one child for the variant.
    override func sample<T>(_ type: T.Type, variant: Bool, context: String) throws -> T {
        if shape == .many && !variant, let empty = [C]() as? T { return empty }
        let keys = shape == .one && variant ? Set((try? ModelParts.keyNames(of: C.self)) ?? []) : []
        let child: C
        do {
            child = try C(from: SampleDecoder(variant: false, context: context, variantKeys: keys))
        } catch {
            throw ModelError.invalidModel(type: context, reason: "cannot make a sample \(C.self): \(error)")
        }
        let value: Any = shape == .one ? child : (variant ? [child] : [C]())
        guard let typed = value as? T else { throw ModelError.invalidModel(type: context, reason: "internal: a sample \(T.self) could not be made") }
        return typed
    }

    /// One child: its key's type. Several: a JSON array of keys.
    override func keyColumnType(parent: ObjectIdentifier, parentColumns: [ColumnInfo], parentKey: [Int]) throws -> ColumnType {
        let type: ColumnType
        if childType == parent {
            guard parentKey.count == 1 else { throw compositeKey() }
            type = parentColumns[parentKey[0]].type
        } else if SchemaDerivation.inProgress.contains(childType) {
            // Two models that nest each other: the other's key type is not known yet. TEXT
            // holds any key losslessly, and compares equal to an INTEGER key in SQL.
            type = .text
        } else {
            let schema = try ModelSchema<C>.shared()
            guard schema.primaryKey.count == 1 else { throw compositeKey() }
            type = schema.columns[schema.primaryKey[0]].type
        }
        guard type == .integer || type == .text || type == .real else {
            throw ModelError.invalidModel(type: childName, reason: "its primary key is \(type.sqlType); a nested model's key must be an integer, a real or a text to be linked")
        }
        return shape == .one ? type : .json
    }

    override func childSchema() throws -> SchemaCore { try ModelSchema<C>.shared() }

    override func linkValue(_ value: Any, column: String) throws -> DatabaseValue {
        if let stored = value as? DatabaseValue { return stored }
        switch shape {
        case .one:
            guard let child = value as? C else { throw ModelError.encodingFailed(column: column, reason: "\(type(of: value)) is not \(C.self)") }
            return try ModelParts.key(of: child)
        case .many:
            guard let children = value as? [C] else { throw ModelError.encodingFailed(column: column, reason: "\(type(of: value)) is not [\(C.self)]") }
            let keys = try children.map { try ModelParts.jsonLiteral(ModelParts.key(of: $0), column: column) }
            return .text("[" + keys.joined(separator: ",") + "]")
        }
    }

    override func save(_ value: Any, _ context: NestedWrite) throws {
        switch shape {
        case .one: if let child = value as? C { try context.save(child) }
        case .many: for child in value as? [C] ?? [] { try context.save(child) }
        }
    }

    override func load<T>(_ type: T.Type, link: DatabaseValue, optional: Bool, loader: NestedLoader, column: String) throws -> T? {
        switch shape {
        case .one:
            if link.isNull {
                if optional { return nil }
                throw ModelError.typeMismatch(column: column, expected: "the key of a \(C.self)", found: "NULL", sql: nil)
            }
            guard loader.depth < loader.maximumDepth else {
                if optional { return nil }
                throw ModelError.invalidArgument("\(column) is a required \(C.self), below the depth the fetch loads; load at least one more level")
            }
            if let child = try loader.child(C.self, key: link) { return child as? T }
            if isMandatory { throw ParentLeftOut() }
            if optional { return nil }
            throw ModelError.missingChild(column: column, table: childTable, key: link.description)
        case .many:
            guard loader.depth < loader.maximumDepth else { return [C]() as? T }
            var children: [C] = []
            for key in try loader.keys(in: link, column: column) {
                if let child = try loader.child(C.self, key: key) {
                    children.append(child)
                } else if requiresEveryElement || isMandatory {
                    throw ParentLeftOut()
                } else if !dropsMissingElements {
                    throw ModelError.missingChild(column: column, table: childTable, key: key.description)
                }
            }
            if children.isEmpty && requiresEveryElement { throw ParentLeftOut() }
            return children as? T
        }
    }

    override func reachChildren(link: DatabaseValue, _ context: NestedDelete) throws {
        let keys: [DatabaseValue] = shape == .one ? (link.isNull ? [] : [link]) : try context.connection.keys(inJSON: link)
        for key in keys { try context.reach(C.self, key: [key]) }
    }

    override func createTable(_ connection: Connection, visited: inout Set<ObjectIdentifier>) throws {
        try connection.createTables(C.self, ifNotExists: true, visited: &visited)
    }

    override var childModel: (any Model.Type)? { C.self }

    override func enableSync(_ database: Database, policy: ConflictPolicy) throws {
        guard !database.syncedTables.contains(C.tableName) else { return }
        try database.enableSync(for: C.self, policy: policy)
    }
}

/// Models whose schemas are being derived on this thread: a model nesting one of them
/// cannot ask for its schema (that would derive it again, forever).
enum SchemaDerivation {
    @TaskLocal static var inProgress: Set<ObjectIdentifier> = []
}

// MARK: - The key and the nested values of a model

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
            throw ModelError.invalidModel(type: "\(C.self)", reason: "it has a composite primary key; a nested model needs a single-column key to be linked by")
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
                    throw ModelError.invalidModel(type: "\(C.self)", reason: "its primary key is declared by key path while its schema is derived; name the column")
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
        default: throw ModelError.encodingFailed(column: column, reason: "a nested model's key must be an integer, a finite real or a text, not \(key.storageName)")
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
    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        KeyedEncodingContainer(DiscardingKeyedEncoder<NestedKey>())
    }
    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer { DiscardingUnkeyedEncoder() }
    mutating func superEncoder() -> any Encoder { parts }
    mutating func superEncoder(forKey key: Key) -> any Encoder { parts }
}

// MARK: - The nested columns of a schema

/// The nested properties of a model and what its fetches require, built with its schema.
final class NestedPlan: @unchecked Sendable {
    /// Per nested column (schema index), its link.
    let links: [(column: Int, link: NestedLink)]
    /// Column name → schema index, for `ModelParts`.
    let columnsByName: [String: Int]

    init(links: [(column: Int, link: NestedLink)], columns: [ColumnInfo]) {
        self.links = links
        columnsByName = Dictionary(links.map { (columns[$0.column].name, $0.column) }, uniquingKeysWith: { first, _ in first })
    }
}

extension ModelSchema {
    var keyNames: [String] { primaryKey.map { columns[$0].name } }

    /// The columns of `derived` with each nested column's type settled (a link to one child
    /// holds the child's key type), the nested plan, and the columns rows must fill to be
    /// fetched (`mandatory` columns not NULL, `mandatoryElements` arrays not NULL nor empty).
    static func settleNested(_ columns: [ColumnInfo], primaryKey: [Int], mandatory: [Int], everyElement: [Int], dropping: [Int])
        throws -> (columns: [ColumnInfo], plan: NestedPlan?, required: (notNull: [Int], nonEmpty: [Int])) {
        var settled = columns
        var links: [(column: Int, link: NestedLink)] = []
        for (index, info) in columns.enumerated() {
            guard let link = info.nested else { continue }
            let type = try link.keyColumnType(parent: ObjectIdentifier(M.self), parentColumns: columns, parentKey: primaryKey)
            settled[index] = ColumnInfo(name: info.name, type: type, isOptional: info.isOptional, valueType: info.valueType,
                                        optionalValueType: info.optionalValueType, nested: link)
            link.isMandatory = mandatory.contains(index)
            links.append((index, link))
        }
        for index in everyElement + dropping where columns[index].nested?.shape != .many {
            throw ModelError.invalidModel(type: "\(M.self)", reason: "column \(columns[index].name) is not an array of models: mandatoryElements and dropsMissingElements apply to arrays of models")
        }
        for index in everyElement { columns[index].nested?.requiresEveryElement = true }
        for index in dropping { columns[index].nested?.dropsMissingElements = true }
        return (settled, links.isEmpty ? nil : NestedPlan(links: links, columns: settled), (Set(mandatory + everyElement).sorted(), everyElement))
    }
}

extension SchemaCore {
    /// The SQL condition that holds for exactly the rows every read of the model returns (nil:
    /// every row), so that `fetchAll`, `fetch`, `count`, `exists`, `fetchKeys`, `lazyFetch` and
    /// the aggregates agree, and LIMIT counts only such rows: `.mandatory` columns are not NULL,
    /// `.mandatoryElements` arrays not empty, and the children a mandatory link names exist
    /// and meet their own model's condition — what decoding the row would otherwise find
    /// missing, leaving the row out (`ParentLeftOut`).
    ///
    /// The condition refers to the row by the quoted table name. A model met again below
    /// itself (one that nests itself through mandatory links) is checked for existence there,
    /// not again for its own children: the SQL must end. Built once per model (every read of
    /// a nested child asks for it).
    func requiredRowsCondition() throws -> String? {
        if let cached = requiredRowsConditionCache.withLock({ $0 }) { return cached }
        let condition = try requiredCondition(row: quotedTable, depth: 0, visiting: [tableName])
        requiredRowsConditionCache.withLock { $0 = .some(condition) }
        return condition
    }

    private func requiredCondition(row: String, depth: Int, visiting: Set<String>) throws -> String? {
        let column = { (index: Int) -> String in "\(row).\(quoteIdentifier(self.columns[index].name))" }
        var conditions = requiredColumns.notNull.map { "\(column($0)) IS NOT NULL" }
        conditions += requiredColumns.nonEmpty.map { "json_array_length(\(column($0))) > 0" }
        for (index, link) in nested?.links ?? [] where link.isMandatory || link.requiresEveryElement {
            let child = try link.childSchema()
            guard child.primaryKey.count == 1 else { throw link.compositeKey() }
            let alias = "tether_child\(depth)"
            let key = "\(alias).\(quoteIdentifier(child.columns[child.primaryKey[0]].name))"
            let childCondition = visiting.contains(child.tableName)
                ? nil : try child.requiredCondition(row: alias, depth: depth + 1, visiting: visiting.union([child.tableName]))
            let found = { (linked: String) -> String in
                "SELECT 1 FROM \(child.quotedTable) AS \(alias) WHERE \(key) = \(linked)" + (childCondition.map { " AND \($0)" } ?? "")
            }
            switch link.shape {
            case .one:
                conditions.append("EXISTS (\(found(column(index))))")
            case .many:
                // Every element names a child that is there (a link that is not a JSON array
                // is no element: decoding it reports the error).
                let element = "tether_element\(depth)"
                let array = "CASE WHEN json_valid(\(column(index))) THEN \(column(index)) ELSE '[]' END"
                conditions.append("NOT EXISTS (SELECT 1 FROM json_each(\(array)) AS \(element) WHERE NOT EXISTS (\(found("\(element).value"))))")
            }
        }
        return conditions.isEmpty ? nil : conditions.joined(separator: " AND ")
    }
}

// MARK: - Saving

/// One write of a parent: the children saved so far (a child shared by two parents is
/// written once) and the chain of rows being saved (a row met again on it is a cycle).
final class NestedWrite {
    let connection: Connection
    private var path: [NestedNode] = []
    private var saved: Set<NestedNode> = []

    init(connection: Connection) { self.connection = connection }

    /// Saves the children of `model` (recursively), before `model` itself is written.
    func saveChildren<M: Model>(of model: M, _ schema: ModelSchema<M>, _ plan: NestedPlan) throws {
        let parts = try ModelParts.of(model, keyNames: schema.keyNames, nestedColumns: plan.columnsByName)
        let node = NestedNode(type: ObjectIdentifier(M.self), key: parts.key)
        path.append(node)
        defer { path.removeLast() }
        for (column, value) in parts.nested {
            try schema.columns[column].nested?.save(value, self)
        }
    }

    /// Saves one child: its own children first, then the child (upsert).
    func save<C: Model>(_ child: C) throws {
        let statements = try connection.statements(for: C.self)
        let schema = statements.schema
        let key = try ModelParts.of(child, keyNames: schema.keyNames, nestedColumns: [:]).key
        let node = NestedNode(type: ObjectIdentifier(C.self), key: key)
        if path.contains(node) {
            throw ModelError.nestedCycle(model: "\(C.self)", key: schema.describeKey(key))
        }
        guard saved.insert(node).inserted else { return }
        if let plan = schema.nested { try saveChildren(of: child, schema, plan) }
        // A child that collides on a unique key is the child's duplicate, not the parent's.
        try connection.reportingDuplicate(of: child, statements) { _ = try statements.run(.upsert, child, savingChildren: false) }
    }
}

// MARK: - Loading

/// One fetch of models with nested properties: how deep it goes, the children read so far
/// (each read once), and those being read (one met again while being read is a cycle).
final class NestedLoader {
    let connection: Connection
    let maximumDepth: Int
    private(set) var depth = 0
    private var reading: Set<NestedNode> = []
    private var read: [NestedNode: Any?] = [:]

    init(connection: Connection, loading: NestedLoading) {
        self.connection = connection
        maximumDepth = loading.maximumDepth
    }

    /// The child of type `C` with this key, or nil when it is missing (or left out).
    func child<C: Model>(_ type: C.Type, key: DatabaseValue) throws -> C? {
        let node = NestedNode(type: ObjectIdentifier(C.self), key: [key])
        if let known = read[node] { return known as? C }
        if reading.contains(node) {
            throw ModelError.nestedCycle(model: "\(C.self)", key: key.description)
        }
        reading.insert(node)
        depth += 1
        defer {
            reading.remove(node)
            depth -= 1
        }
        let schema = try ModelSchema<C>.shared()
        let condition = " WHERE \(schema.primaryKeyCondition)" + (try schema.requiredRowsCondition().map { " AND \($0)" } ?? "")
        let found = try connection.fetchOwnModels(C.self, clause: condition, arguments: StatementArguments(values: [key]), loader: self).first
        read[node] = .some(found)
        return found
    }

    func keys(in link: DatabaseValue, column: String) throws -> [DatabaseValue] {
        if link.isNull { return [] }
        do {
            return try connection.keys(inJSON: link)
        } catch {
            throw ModelError.typeMismatch(column: column, expected: "a JSON array of keys", found: "\(link.storageName) \(String(link.description.prefix(80)))", sql: nil)
        }
    }
}

extension Connection {
    /// The elements of a JSON array, as SQLite reads them (integers stay integers).
    func keys(inJSON link: DatabaseValue) throws -> [DatabaseValue] {
        if link.isNull { return [] }
        return try fetchRows("SELECT value FROM json_each(?)", StatementArguments(values: [link])).map { $0.values[0] }
    }
}

// MARK: - Deleting

/// One delete of a parent with its children, in two passes: first every row the parent's
/// links reach (a child shared twice, or a stored cycle, is met once), then those still
/// linked from a row outside that set are kept — a child another parent shares stays, with
/// everything below it — and the rest are deleted.
final class NestedDelete {
    /// A row met on the way, by table and rowid.
    struct Reached: Hashable {
        let table: String
        let rowid: Int64
    }

    /// Where rows of other tables link to a table's rows.
    struct LinkSource: Hashable {
        let parentTable: String
        let column: String
        let many: Bool
    }

    let connection: Connection
    private var visited: Set<NestedNode> = []
    /// Each row met, with the key its parents' links hold.
    private var reached: [Reached: DatabaseValue] = [:]
    private var sources: [String: Set<LinkSource>] = [:]

    init(connection: Connection) throws {
        self.connection = connection
        for link in try connection.recordedNestedLinks() { sources[link.childTable, default: []].insert(link.source) }
    }

    /// Deletes what the row of `M` with this key links to, recursively, except the rows that
    /// rows outside this delete still link to (the row itself stays, for the caller).
    func deleteChildren<M: Model>(of type: M.Type, key: [DatabaseValue]) throws {
        guard let root = try reach(M.self, key: key) else { return }
        var kept = Set<Reached>()
        while true {
            let linked = try rowsLinkedFromOutside(excluding: root, kept: kept)
            if linked.isEmpty { break }
            kept.formUnion(linked)
        }
        // A kept row links on to its own children, so they were kept in turn.
        for row in reached.keys where row != root && !kept.contains(row) {
            try connection.execute("DELETE FROM \(quoteIdentifier(row.table)) WHERE rowid = ?", [row.rowid])
        }
    }

    /// Records the row of `M` with this key and, recursively, the rows it links to.
    @discardableResult
    func reach<M: Model>(_ type: M.Type, key: [DatabaseValue]) throws -> Reached? {
        guard visited.insert(NestedNode(type: ObjectIdentifier(M.self), key: key)).inserted else { return nil }
        let schema = try ModelSchema<M>.shared()
        let plan = schema.nested
        let columns = (plan?.links ?? []).map { "\(schema.quotedTable).\(quoteIdentifier(schema.columns[$0.column].name))" }
        guard let row = try connection.fetchRows("SELECT \((["rowid"] + columns).joined(separator: ", ")) FROM \(schema.quotedTable) WHERE \(schema.primaryKeyCondition)",
                                                 StatementArguments(values: key)).first else { return nil }
        let me = Reached(table: M.tableName, rowid: try row.get(0, as: Int64.self))
        reached[me] = key.first ?? .null
        for (position, entry) in (plan?.links ?? []).enumerated() {
            sources[entry.link.childTable, default: []].insert(
                LinkSource(parentTable: M.tableName, column: schema.columns[entry.column].name, many: entry.link.shape == .many))
            try entry.link.reachChildren(link: row.values[position + 1], self)
        }
        return me
    }

    /// The rows met (not the root, not kept yet) that a row outside this delete, or a kept
    /// one, links to: one query per table and link into it, whatever the number of children.
    private func rowsLinkedFromOutside(excluding root: Reached, kept: Set<Reached>) throws -> Set<Reached> {
        var byTable: [String: [DatabaseValue: [Reached]]] = [:]
        for (row, key) in reached where row != root && !kept.contains(row) {
            byTable[row.table, default: [:]][key, default: []].append(row)
        }
        var found = Set<Reached>()
        for (table, rowsByKey) in byTable {
            let keys = DatabaseValue.text(try Self.jsonArray(of: Array(rowsByKey.keys)))
            for source in sources[table] ?? [] {
                let parent = quoteIdentifier(source.parentTable), column = quoteIdentifier(source.column)
                // Links are matched against the keys as SQLite reads them from JSON (a blob key
                // cannot be in JSON, nor in a many-link: a one-link to it is compared as is, below).
                let sql = source.many
                    ? "SELECT p.rowid, j.value FROM \(parent) AS p, json_each(CASE WHEN json_valid(p.\(column)) THEN p.\(column) ELSE '[]' END) AS j WHERE j.value IN (SELECT value FROM json_each(?))"
                    : "SELECT rowid, \(column) FROM \(parent) WHERE \(column) IN (SELECT value FROM json_each(?))"
                for link in try connection.fetchRows(sql, [keys]) {
                    let linking = Reached(table: source.parentTable, rowid: try link.get(0, as: Int64.self))
                    guard reached[linking] == nil || kept.contains(linking) else { continue }
                    found.formUnion(rowsByKey[link.values[1]] ?? [])
                }
                for (key, rows) in rowsByKey where !source.many {
                    guard case .blob = key else { continue }
                    for link in try connection.fetchRows("SELECT rowid FROM \(parent) WHERE \(column) = ?", [key]) {
                        let linking = Reached(table: source.parentTable, rowid: try link.get(0, as: Int64.self))
                        if reached[linking] == nil || kept.contains(linking) { found.formUnion(rows) }
                    }
                }
            }
        }
        return found
    }

    /// `keys` as a JSON array (blobs and NULLs left out: JSON cannot hold them).
    private static func jsonArray(of keys: [DatabaseValue]) throws -> String {
        let elements: [Any] = keys.compactMap { key in
            switch key {
            case let .integer(value): return value
            case let .real(value): return value
            case let .text(value): return value
            case .blob, .null: return nil
            }
        }
        return String(decoding: try JSONSerialization.data(withJSONObject: elements), as: UTF8.self)
    }
}

extension Connection {
    /// Records where `M`'s rows link to other models' rows, so that deleting a parent with its
    /// children can tell which children other rows still link to.
    func recordNestedLinks<M: Model>(of type: M.Type) throws {
        let schema = try ModelSchema<M>.shared()
        guard let plan = schema.nested else { return }
        try execute("""
            CREATE TABLE IF NOT EXISTS tether_nested_links (parent_table TEXT NOT NULL, column_name TEXT NOT NULL, \
            child_table TEXT NOT NULL, many INTEGER NOT NULL, PRIMARY KEY (parent_table, column_name)) STRICT
            """)
        for entry in plan.links {
            try execute("INSERT OR REPLACE INTO tether_nested_links (parent_table, column_name, child_table, many) VALUES (?, ?, ?, ?)",
                        [M.tableName, schema.columns[entry.column].name, entry.link.childTable, entry.link.shape == .many])
        }
    }

    /// The links recorded by `recordNestedLinks`.
    func recordedNestedLinks() throws -> [(childTable: String, source: NestedDelete.LinkSource)] {
        guard try tableExists("tether_nested_links") else {
            return []
        }
        return try fetchRows("SELECT child_table, parent_table, column_name, many FROM tether_nested_links").map {
            (try $0.get(0, as: String.self),
             NestedDelete.LinkSource(parentTable: try $0.get(1, as: String.self), column: try $0.get(2, as: String.self), many: try $0.get(3, as: Bool.self)))
        }
    }
}

// MARK: - Public API

extension DatabaseContext {
    /// The model with this primary key, its nested models read as deep as `loading` says.
    ///
    /// ```swift
    /// let shallow = try db.fetch(Employer.self, key: PrimaryKey("E1"), loading: .depth(1))
    /// ```
    public func fetch<M: Model>(_ type: M.Type, key: PrimaryKey, loading: NestedLoading) throws -> M? {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try keyCondition(schema, key)
            let required = try schema.requiredRowsCondition().map { " AND \($0)" } ?? ""
            return try conn.fetchOwnModels(M.self, clause: clause.sql + required, arguments: StatementArguments(values: clause.arguments),
                                           loader: NestedLoader(connection: conn, loading: loading)).first
        }
    }

    /// The rows a query selects, their nested models read as deep as `loading` says.
    ///
    /// ```swift
    /// let roots = try db.fetchAll(Node.where(\.name == "root"), loading: .depth(2))
    /// ```
    public func fetchAll<M: Model>(_ query: Query<M>, loading: NestedLoading) throws -> [M] {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try query.clauses(on: conn, requiring: try schema.requiredRowsCondition(), defaultOrder: schema.defaultOrderSQL)
            return try conn.fetchOwnModels(M.self, clause: clause.sql, arguments: StatementArguments(values: clause.arguments),
                                           loader: NestedLoader(connection: conn, loading: loading))
        }
    }

    /// The keys a nested property of the row with primary key `key` links to, without reading
    /// the children (AgileDB stores nested objects by key): one key for a model, one per
    /// element for an array of models, none for NULL. Nil when there is no such row.
    ///
    /// ```swift
    /// let keys = try db.linkedKeys(Employer.self, key: PrimaryKey("E1"), column: "employees")
    /// ```
    public func linkedKeys<M: Model>(_ type: M.Type, key: PrimaryKey, column: String) throws -> [PrimaryKey]? {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let index = try schema.column(named: column)
            guard let link = schema.columns[index].nested else {
                throw ModelError.invalidArgument("column \(schema.columns[index].name) of \(schema.modelName) is not a nested model or array of models")
            }
            let clause = try keyCondition(schema, key)
            let sql = "SELECT \(schema.quotedTable).\(quoteIdentifier(schema.columns[index].name)) FROM \(schema.quotedTable)\(clause.sql)"
            guard let row = try conn.fetchRows(sql, StatementArguments(values: clause.arguments)).first else { return nil }
            let value = row.values[0]
            let keys = link.shape == .one ? (value.isNull ? [] : [value]) : try conn.keys(inJSON: value)
            return keys.map { PrimaryKey([$0]) }
        }
    }

    /// Deletes the row with `model`'s primary key; with `deletingChildren`, the rows its nested
    /// properties link to as well, recursively (SundeedQLite's `deleteSubObjects`). Returns
    /// whether the row existed.
    ///
    /// A child that another row still links to (another parent sharing it, of this model or of
    /// one whose table `createTable` or `updateSchema(toMatch:)` made) is kept, with what it
    /// links to.
    ///
    /// ```swift
    /// try db.delete(employer, deletingChildren: true)    // its employees and addresses too
    /// ```
    @discardableResult
    public func delete<M: Model>(_ model: M, deletingChildren: Bool) throws -> Bool {
        try withWriteConnection { conn in
            try conn.transaction {
                let schema = try conn.statements(for: M.self).schema
                let key = try ModelParts.of(model, keyNames: schema.keyNames, nestedColumns: [:]).key
                return try conn.delete(M.self, key: PrimaryKey(key), deletingChildren: deletingChildren)
            }
        }
    }

    /// Deletes the row with this primary key, and with `deletingChildren` its nested models too.
    @discardableResult
    public func delete<M: Model>(_ type: M.Type, key: PrimaryKey, deletingChildren: Bool) throws -> Bool {
        try withWriteConnection { conn in
            try conn.transaction { try conn.delete(M.self, key: key, deletingChildren: deletingChildren) }
        }
    }
}

extension Connection {
    fileprivate func delete<M: Model>(_ type: M.Type, key: PrimaryKey, deletingChildren: Bool) throws -> Bool {
        let schema = try ModelSchema<M>.shared()
        let clause = try keyCondition(schema, key)
        if deletingChildren { try NestedDelete(connection: self).deleteChildren(of: M.self, key: key.values) }
        try execute("DELETE FROM \(schema.quotedTable)\(clause.sql)", StatementArguments(values: clause.arguments))
        return changes > 0
    }

    /// Creates `M`'s table and, first, the tables of its nested models.
    func createTables<M: Model>(_ type: M.Type, ifNotExists: Bool, visited: inout Set<ObjectIdentifier>) throws {
        guard visited.insert(ObjectIdentifier(M.self)).inserted else { return }
        let schema = try ModelSchema<M>.shared()
        for entry in schema.nested?.links ?? [] { try entry.link.createTable(self, visited: &visited) }
        for sql in try schema.createStatements(ifNotExists: ifNotExists) { try execute(sql) }
        try recordNestedLinks(of: M.self)
    }
}
