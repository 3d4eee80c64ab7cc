/// Values bound to a statement's parameters: positional (`?`) or named
/// (`:name`, `@name`, `$name`).
///
/// ```swift
/// try db.execute("UPDATE player SET score = ? WHERE id = ?", [10, 1])
/// try db.execute("UPDATE player SET score = :score WHERE id = :id", ["score": 10, "id": 1])
/// ```
public struct StatementArguments: Sendable, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral {
    /// The values of `?` parameters, in order.
    public var positional: [DatabaseValue]
    /// The values of named parameters, by name; mixing them with positional values is refused
    /// when the statement is bound.
    public var named: [String: DatabaseValue]

    /// No arguments, for a statement without parameters.
    public init() { positional = []; named = [:] }
    /// Positional arguments, in order; nil binds NULL.
    public init(_ values: [(any DatabaseValueConvertible)?]) {
        positional = values.map { $0?.databaseValue ?? .null }
        named = [:]
    }
    /// Positional arguments already converted to database values.
    public init(values: [DatabaseValue]) { positional = values; named = [:] }
    /// Named arguments, by parameter name with or without its prefix (`score` binds `:score`);
    /// nil binds NULL.
    public init(_ values: [String: (any DatabaseValueConvertible)?]) {
        positional = []
        named = values.mapValues { $0?.databaseValue ?? .null }
    }
    public init(arrayLiteral elements: (any DatabaseValueConvertible)?...) { self.init(elements) }
    public init(dictionaryLiteral elements: (String, (any DatabaseValueConvertible)?)...) {
        positional = []
        named = Dictionary(elements.map { ($0.0, $0.1?.databaseValue ?? .null) }, uniquingKeysWith: { _, last in last })
    }

    /// Whether there is no argument at all.
    public var isEmpty: Bool { positional.isEmpty && named.isEmpty }
}
