// The link from a parent's column to its child models, and what it does for each child type.

import Foundation

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
    func keyColumnType(parent: ObjectIdentifier, parentColumns: [ColumnInfo], parentKey: [Int]) throws -> ColumnType {
        throw unimplemented()
    }
    func childSchema() throws -> SchemaCore { throw unimplemented() }
    func linkValue(_ value: Any, column: String) throws -> DatabaseValue { throw unimplemented() }
    func save(_ value: Any, _ context: NestedWrite) throws { throw unimplemented() }
    func load<T>(_ type: T.Type, link: DatabaseValue, optional: Bool, loader: NestedLoader, column: String)
        throws -> T?
    {
        throw unimplemented()
    }
    func reachChildren(link: DatabaseValue, _ context: NestedDelete) throws { throw unimplemented() }
    func createTable(_ connection: Connection, visited: inout Set<ObjectIdentifier>) throws { throw unimplemented() }
    var childModel: (any Model.Type)? { nil }
    func enableSync(_ database: Database, policy: ConflictPolicy) throws { throw unimplemented() }

    func compositeKey() -> ModelError {
        .invalidModel(
            type: childName,
            reason: "it has a composite primary key; a nested model needs a single-column key to be linked by")
    }

    private func unimplemented() -> ModelError {
        .invalidModel(type: childName, reason: "internal: a nested link without its child type")
    }
}

/// `[C]` for a model `C`, recognized at run time.
protocol ModelArray {
    static var modelElement: any Model.Type { get }
}

extension Array: ModelArray where Element: Model {
    static var modelElement: any Model.Type { Element.self }
}

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
        guard let typed = value as? T else {
            throw ModelError.invalidModel(type: context, reason: "internal: a sample \(T.self) could not be made")
        }
        return typed
    }

    /// One child: its key's type. Several: a JSON array of keys.
    override func keyColumnType(parent: ObjectIdentifier, parentColumns: [ColumnInfo], parentKey: [Int]) throws
        -> ColumnType
    {
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
            throw ModelError.invalidModel(
                type: childName,
                reason: "its primary key is \(type.sqlType); a nested model's key must be an integer, a real or a text "
                    + "to be linked")
        }
        return shape == .one ? type : .json
    }

    override func childSchema() throws -> SchemaCore { try ModelSchema<C>.shared() }

    override func linkValue(_ value: Any, column: String) throws -> DatabaseValue {
        if let stored = value as? DatabaseValue { return stored }
        switch shape {
        case .one:
            guard let child = value as? C else {
                throw ModelError.encodingFailed(column: column, reason: "\(type(of: value)) is not \(C.self)")
            }
            return try ModelParts.key(of: child)
        case .many:
            guard let children = value as? [C] else {
                throw ModelError.encodingFailed(column: column, reason: "\(type(of: value)) is not [\(C.self)]")
            }
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

    override func load<T>(_ type: T.Type, link: DatabaseValue, optional: Bool, loader: NestedLoader, column: String)
        throws -> T?
    {
        switch shape {
        case .one:
            if link.isNull {
                if optional { return nil }
                throw ModelError.typeMismatch(
                    column: column, expected: "the key of a \(C.self)", found: "NULL", sql: nil)
            }
            guard loader.depth < loader.maximumDepth else {
                if optional { return nil }
                throw ModelError.invalidArgument(
                    "\(column) is a required \(C.self), below the depth the fetch loads; load at least one more level")
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
        let keys: [DatabaseValue] =
            shape == .one ? (link.isNull ? [] : [link]) : try context.connection.keys(inJSON: link)
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
