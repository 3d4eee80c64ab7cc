/// Values bound to a statement's parameters: positional (`?`) or named
/// (`:name`, `@name`, `$name`).
///
/// ```swift
/// try db.execute("UPDATE player SET score = ? WHERE id = ?", [10, 1])
/// try db.execute("UPDATE player SET score = :score WHERE id = :id", ["score": 10, "id": 1])
/// ```
public struct StatementArguments: Sendable, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral {
    public var positional: [DatabaseValue]
    public var named: [String: DatabaseValue]

    public init() { positional = []; named = [:] }
    public init(_ values: [(any DatabaseValueConvertible)?]) {
        positional = values.map { $0?.databaseValue ?? .null }
        named = [:]
    }
    public init(values: [DatabaseValue]) { positional = values; named = [:] }
    public init(_ values: [String: (any DatabaseValueConvertible)?]) {
        positional = []
        named = values.mapValues { $0?.databaseValue ?? .null }
    }
    public init(arrayLiteral elements: (any DatabaseValueConvertible)?...) { self.init(elements) }
    public init(dictionaryLiteral elements: (String, (any DatabaseValueConvertible)?)...) {
        positional = []
        named = Dictionary(elements.map { ($0.0, $0.1?.databaseValue ?? .null) }, uniquingKeysWith: { _, last in last })
    }

    public var isEmpty: Bool { positional.isEmpty && named.isEmpty }
}
