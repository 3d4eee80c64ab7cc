import Foundation

/// A condition on the rows of `M`'s table, built from key paths or column
/// names. Values are always bound as parameters, never written into the SQL.
///
/// ```swift
/// \Player.score > 100 && \Player.name != "Arthur"
/// .like(\Player.name, "A%") || .in("team", ["red", "blue"])
/// ```
public struct Condition<M: Model>: Sendable {
    indirect enum Node: Sendable {
        case compare(column: String, op: String, value: DatabaseValue)
        case isNull(column: String, negated: Bool)
        case list(column: String, values: [DatabaseValue], negated: Bool)
        case between(column: String, low: DatabaseValue, high: DatabaseValue, negated: Bool)
        case and([Node])
        case or([Node])
        case not(Node)
        case sql(String, [DatabaseValue])
        case invalid(ModelError)
    }
    let node: Node

    init(_ node: Node) { self.node = node }

    /// A raw SQL condition with bound arguments: `.sql("length(name) > ?", [3])`.
    public static func sql(_ sql: String, _ arguments: [(any DatabaseValueConvertible)?] = []) -> Condition {
        Condition(.sql(sql, arguments.map { $0?.databaseValue ?? .null }))
    }

    /// Every condition holds (AND). An empty list holds for every row.
    public static func all(_ conditions: [Condition]) -> Condition { Condition(.and(conditions.map(\.node))) }
    /// At least one condition holds (OR). An empty list holds for no row.
    public static func any(_ conditions: [Condition]) -> Condition { Condition(.or(conditions.map(\.node))) }
    /// AgileDB's condition sets: AND inside each set, OR across sets.
    public static func sets(_ sets: [[Condition]]) -> Condition { any(sets.map(all)) }

    // MARK: Building blocks, by column name or key path

    /// `column <op> value`, with the operator as SQL text: "=", "!=", "<", "<=",
    /// ">", ">=", "LIKE", "NOT LIKE", "GLOB", "IN", "NOT IN", "BETWEEN", "IS", "IS NOT".
    /// IN takes an array, BETWEEN an array of two values, IS / IS NOT nil.
    public static func compare<V: Encodable & Sendable>(_ column: String, _ op: String, _ value: V) -> Condition {
        build(.named(column), op, value)
    }
    /// `property <op> value`, the column named by a key path; the operators are those of
    /// `compare(_:_:_:)` by column name.
    public static func compare<V: Encodable & Sendable>(_ keyPath: KeyPath<M, V>, _ op: String, _ value: V) -> Condition
    {
        build(.keyPath(keyPath), op, value)
    }
    /// `property IN (…)`, `NOT IN` or `BETWEEN`, the column named by a key path: the operator
    /// takes the array, `[low, high]` for BETWEEN.
    public static func compare<V: Encodable & Sendable>(_ keyPath: KeyPath<M, V>, _ op: String, _ values: [V])
        -> Condition
    {
        build(.keyPath(keyPath), op, values)
    }
    /// `column IS NULL` / `IS NOT NULL`, from `nil` with "IS", "IS NOT", "=" or "!="
    /// (AHDataModel's `query("age", "IS NOT", nil)`); any other operator is an error.
    public static func compare(_ column: String, _ op: String, _ value: _OptionalNilComparisonType) -> Condition {
        build(.named(column), op, DatabaseValue.null)
    }

    /// `column LIKE pattern`: `%` matches any run of characters, `_` one; ASCII letters match
    /// either case.
    public static func like(_ column: String, _ pattern: String) -> Condition { compare(column, "LIKE", pattern) }
    /// `property LIKE pattern`: `.like(\Player.name, "A%")`.
    public static func like(_ keyPath: PartialKeyPath<M>, _ pattern: String) -> Condition {
        build(.keyPath(keyPath), "LIKE", pattern)
    }
    /// `column NOT LIKE pattern`.
    public static func notLike(_ column: String, _ pattern: String) -> Condition {
        compare(column, "NOT LIKE", pattern)
    }
    /// `property NOT LIKE pattern`.
    public static func notLike(_ keyPath: PartialKeyPath<M>, _ pattern: String) -> Condition {
        build(.keyPath(keyPath), "NOT LIKE", pattern)
    }
    /// `column GLOB pattern`: Unix wildcards (`*`, `?`, `[…]`), case-sensitive.
    public static func glob(_ column: String, _ pattern: String) -> Condition { compare(column, "GLOB", pattern) }
    /// `property GLOB pattern`: Unix wildcards (`*`, `?`, `[…]`), case-sensitive.
    public static func glob(_ keyPath: PartialKeyPath<M>, _ pattern: String) -> Condition {
        build(.keyPath(keyPath), "GLOB", pattern)
    }
    /// `column IN (values…)`; an empty list holds for no row.
    public static func `in`<V: Encodable & Sendable>(_ column: String, _ values: [V]) -> Condition {
        build(.named(column), "IN", values)
    }
    /// `property IN (values…)`: `.in(\Player.team, ["red", "blue"])`.
    public static func `in`<V: Encodable & Sendable>(_ keyPath: KeyPath<M, V>, _ values: [V]) -> Condition {
        build(.keyPath(keyPath), "IN", values)
    }
    /// `column NOT IN (values…)`; an empty list holds for every row.
    public static func notIn<V: Encodable & Sendable>(_ column: String, _ values: [V]) -> Condition {
        build(.named(column), "NOT IN", values)
    }
    /// `property NOT IN (values…)`.
    public static func notIn<V: Encodable & Sendable>(_ keyPath: KeyPath<M, V>, _ values: [V]) -> Condition {
        build(.keyPath(keyPath), "NOT IN", values)
    }
    /// `column BETWEEN low AND high`, both ends included.
    public static func between<V: Encodable & Sendable>(_ column: String, _ low: V, _ high: V) -> Condition {
        build(.named(column), "BETWEEN", [low, high])
    }
    /// `property BETWEEN low AND high`, both ends included.
    public static func between<V: Encodable & Sendable>(_ keyPath: KeyPath<M, V>, _ low: V, _ high: V) -> Condition {
        build(.keyPath(keyPath), "BETWEEN", [low, high])
    }
    /// `column IS NULL`.
    public static func isNull(_ column: String) -> Condition {
        resolved(.named(column)) { .isNull(column: $0, negated: false) }
    }
    /// `property IS NULL`: `.isNull(\Player.team)`.
    public static func isNull(_ keyPath: PartialKeyPath<M>) -> Condition {
        resolved(.keyPath(keyPath)) { .isNull(column: $0, negated: false) }
    }
    /// `column IS NOT NULL`.
    public static func isNotNull(_ column: String) -> Condition {
        resolved(.named(column)) { .isNull(column: $0, negated: true) }
    }
    /// `property IS NOT NULL`.
    public static func isNotNull(_ keyPath: PartialKeyPath<M>) -> Condition {
        resolved(.keyPath(keyPath)) { .isNull(column: $0, negated: true) }
    }

    // MARK: Resolution

    private static func resolved(_ ref: ColumnRef<M>, _ make: (String) throws -> Node) -> Condition {
        do {
            let schema = try ModelSchema<M>.shared()
            return Condition(try make(schema.columns[try schema.column(ref)].name))
        } catch let error as ModelError {
            return Condition(.invalid(error))
        } catch {
            return Condition(.invalid(.invalidArgument("\(error)")))
        }
    }

    static func build<V: Encodable>(_ ref: ColumnRef<M>, _ op: String, _ value: V) -> Condition {
        resolved(ref) { column in
            let normalized = op.uppercased().split(whereSeparator: \.isWhitespace).joined(separator: " ")
            switch normalized {
            case "=", "==", "!=", "<>", "<", "<=", ">", ">=", "LIKE", "NOT LIKE", "GLOB", "NOT GLOB":
                let bound = try storedValue(value, column: column)
                if bound.isNull {
                    // `= NULL` is never true in SQL; what the caller means is IS NULL.
                    switch normalized {
                    case "=", "==": return .isNull(column: column, negated: false)
                    case "!=", "<>": return .isNull(column: column, negated: true)
                    default: throw ModelError.invalidArgument("\(op) cannot compare \(column) with NULL")
                    }
                }
                let sqlOp = normalized == "==" ? "=" : (normalized == "<>" ? "!=" : normalized)
                return .compare(column: column, op: sqlOp, value: bound)
            case "IS", "IS NOT":
                let bound = try storedValue(value, column: column)
                if bound.isNull { return .isNull(column: column, negated: normalized == "IS NOT") }
                return .compare(column: column, op: normalized, value: bound)
            case "IN", "NOT IN":
                return .list(
                    column: column, values: try listValues(value, column: column, op: op),
                    negated: normalized == "NOT IN")
            case "BETWEEN", "NOT BETWEEN":
                let values = try listValues(value, column: column, op: op)
                guard values.count == 2 else {
                    throw ModelError.invalidArgument("BETWEEN on \(column) needs two values, got \(values.count)")
                }
                return .between(column: column, low: values[0], high: values[1], negated: normalized == "NOT BETWEEN")
            default:
                throw ModelError.invalidArgument(
                    """
                    unknown operator \(op) on \(column); use =, !=, <, <=, >, >=, LIKE, NOT LIKE, GLOB, IN, NOT \
                    IN, BETWEEN, IS, IS NOT
                    """)
            }
        }
    }

    /// What `column` stores for `value`: for a nested model, its key (a JSON array of keys for
    /// an array of models), so that `\Employer.headquarters == address` compares links.
    static func storedValue<V: Encodable>(_ value: V, column: String) throws -> DatabaseValue {
        let schema = try ModelSchema<M>.shared()
        if let index = schema.indexByName[column], let link = schema.columns[index].nested {
            return try link.linkValue(value, column: column)
        }
        return try encodeColumnValue(value, type: nil, column: column)
    }

    private static func listValues<V: Encodable>(_ value: V, column: String, op: String) throws -> [DatabaseValue] {
        guard let elements = value as? [any Encodable] else {
            throw ModelError.invalidArgument("\(op) on \(column) needs an array of values")
        }
        return try elements.map { try encodeColumnValue($0, type: nil, column: column) }
    }
}

// MARK: Operators

/// Both conditions hold: `\Player.score > 100 && \Player.team == "red"`.
public func && <M>(lhs: Condition<M>, rhs: Condition<M>) -> Condition<M> { Condition(.and([lhs.node, rhs.node])) }
/// At least one of the conditions holds.
public func || <M>(lhs: Condition<M>, rhs: Condition<M>) -> Condition<M> { Condition(.or([lhs.node, rhs.node])) }
/// The condition does not hold (NOT); a row where it is NULL (a comparison with NULL) matches
/// neither the condition nor its negation, as in SQL.
public prefix func ! <M>(condition: Condition<M>) -> Condition<M> { Condition(.not(condition.node)) }

/// The property equals `rhs`: `\Player.name == "Arthur"`; `== nil` means IS NULL.
public func == <M: Model, V: Encodable & Sendable>(lhs: KeyPath<M, V>, rhs: V) -> Condition<M> {
    .build(.keyPath(lhs), "=", rhs)
}
/// The property differs from `rhs`; `!= nil` means IS NOT NULL. A NULL column matches no
/// `!=` against a value, as in SQL.
public func != <M: Model, V: Encodable & Sendable>(lhs: KeyPath<M, V>, rhs: V) -> Condition<M> {
    .build(.keyPath(lhs), "!=", rhs)
}
/// The property is less than `rhs`, as SQLite compares the stored values (text by the
/// column's collation).
public func < <M: Model, V: Encodable & Sendable>(lhs: KeyPath<M, V>, rhs: V) -> Condition<M> {
    .build(.keyPath(lhs), "<", rhs)
}
/// The property is less than or equal to `rhs`.
public func <= <M: Model, V: Encodable & Sendable>(lhs: KeyPath<M, V>, rhs: V) -> Condition<M> {
    .build(.keyPath(lhs), "<=", rhs)
}
/// The property is greater than `rhs`: `\Player.score > 100`.
public func > <M: Model, V: Encodable & Sendable>(lhs: KeyPath<M, V>, rhs: V) -> Condition<M> {
    .build(.keyPath(lhs), ">", rhs)
}
/// The property is greater than or equal to `rhs`.
public func >= <M: Model, V: Encodable & Sendable>(lhs: KeyPath<M, V>, rhs: V) -> Condition<M> {
    .build(.keyPath(lhs), ">=", rhs)
}
