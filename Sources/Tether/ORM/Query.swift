import Foundation

/// A query on `M`'s table: a condition, an order, a limit. Build it from the
/// model type, in either style, then run it with a `Database` or `Connection`.
///
/// ```swift
/// // key paths (SQLiteORM-Swift's style)
/// let top = try db.fetchAll(Player.where(\.score >= 100).orderBy(\.score, ascending: false).limit(10))
/// // chained column names (AHDataModel's style)
/// let some = try db.fetchAll(Player.query("name", "LIKE", "A%").and("score", "<=", 77).orderBy("score").limit(3,
/// offset: 2))
/// ```
public struct Query<M: Model>: Sendable {
    var condition: Condition<M>.Node?
    var orderings: [(column: Result<String, ModelError>, ascending: Bool)] = []
    var limitCount: Int?
    var offsetCount: Int?
    /// Rows that are some parent's nested model are left out (`excludingNestedChildren()`).
    var excludesNestedChildren = false

    /// Every row of the table, in the model's default order; the same as `M.query`.
    public init() {}

    /// Adds a condition, ANDed with the existing ones.
    public func `where`(_ condition: Condition<M>) -> Query {
        var copy = self
        copy.condition = self.condition.map { .and([$0, condition.node]) } ?? condition.node
        return copy
    }
    /// Adds `column <op> value`, ANDed with the existing conditions.
    public func and<V: Encodable & Sendable>(_ column: String, _ op: String, _ value: V) -> Query {
        self.where(.compare(column, op, value))
    }
    /// Adds `property <op> value`, ANDed with the existing conditions.
    public func and<V: Encodable & Sendable>(_ keyPath: KeyPath<M, V>, _ op: String, _ value: V) -> Query {
        self.where(.compare(keyPath, op, value))
    }
    /// ANDs `column IS [NOT] NULL`: `.and("score", "IS NOT", nil)`.
    public func and(_ column: String, _ op: String, _ value: _OptionalNilComparisonType) -> Query {
        self.where(.compare(column, op, nil))
    }
    /// Adds a condition, ANDed with the existing ones: the same as `where(_:)`.
    public func and(_ condition: Condition<M>) -> Query { self.where(condition) }
    /// ORs a condition with everything so far: `(previous) OR condition`.
    public func or(_ condition: Condition<M>) -> Query {
        var copy = self
        copy.condition = self.condition.map { .or([$0, condition.node]) } ?? condition.node
        return copy
    }
    /// ORs `column <op> value` with everything so far: `(previous) OR column <op> value`.
    public func or<V: Encodable & Sendable>(_ column: String, _ op: String, _ value: V) -> Query {
        or(.compare(column, op, value))
    }
    /// ORs `column IS [NOT] NULL` with everything so far: `.or("team", "IS", nil)`.
    public func or(_ column: String, _ op: String, _ value: _OptionalNilComparisonType) -> Query {
        or(.compare(column, op, nil))
    }

    /// Adds an ordering; several calls order by several columns, in order.
    ///
    /// `sort` is a column name, or a list of them with an optional direction
    /// each, as AgileDB's `sortOrder` takes it: `"name, joined desc"`. A name
    /// with a comma or a space in it is double-quoted (`"\"first name\" desc"`).
    /// `ascending` applies to the columns that give no direction. Each column
    /// must be one of the model's: another name, or a term that is not
    /// `column [ASC|DESC]`, fails the query with `ModelError.unknownColumn` or
    /// `.invalidArgument` (nothing of `sort` reaches the SQL but the model's
    /// own column names, quoted).
    ///
    /// ```swift
    /// let players = try db.fetchAll(Player.query.orderBy("team, score desc"))
    /// ```
    public func orderBy(_ sort: String, ascending: Bool = true) -> Query {
        var copy = self
        do {
            let schema = try ModelSchema<M>.shared()
            // A column whose name is the whole text (even with spaces) is that column.
            if let index = try? schema.column(named: sort) {
                copy.orderings.append((.success(schema.columns[index].name), ascending))
                return copy
            }
            for term in try SortOrder.parse(sort) {
                let name = schema.columns[try schema.column(named: term.column)].name
                copy.orderings.append((.success(name), term.ascending ?? ascending))
            }
        } catch {
            copy.orderings.append((.failure(asModelError(error)), ascending))
        }
        return copy
    }
    /// Adds an ordering by the column of a property; several calls order by several columns, in
    /// order: `.orderBy(\.score, ascending: false)`.
    public func orderBy(_ keyPath: PartialKeyPath<M>, ascending: Bool = true) -> Query {
        var copy = self
        copy.orderings.append(
            (
                Result { () throws -> String in
                    let schema = try ModelSchema<M>.shared()
                    return schema.columns[try schema.column(keyPath)].name
                }.mapError(asModelError), ascending
            ))
        return copy
    }
    /// Leaves out the rows that are some parent's nested model (SundeedQLite's
    /// `excludeIfIsForeign`): a row whose key a parent's nested property links to — one child,
    /// or an element of an array of children — is not selected, by fetches, counts, updates and
    /// deletes alike. The parents are the models whose tables `createTable` or
    /// `updateSchema(toMatch:)` made (Tether records their links then).
    ///
    /// ```swift
    /// let independent = try db.fetchAll(Employee.query.excludingNestedChildren())
    /// ```
    public func excludingNestedChildren() -> Query {
        var copy = self
        copy.excludesNestedChildren = true
        return copy
    }

    /// At most `count` rows, after skipping `offset`.
    public func limit(_ count: Int, offset: Int = 0) -> Query {
        var copy = self
        copy.limitCount = count
        copy.offsetCount = offset
        return copy
    }

    /// The WHERE / ORDER BY / LIMIT part, with its arguments, for a statement on `connection`.
    /// `requiring`: SQL every row must meet too (the model's `.mandatory` columns).
    /// `defaultOrder`: the ORDER BY terms used when the query names none (the model's `defaultOrder`).
    func clauses(
        on connection: Connection, orderAndLimit: Bool = true, requiring: String? = nil,
        defaultOrder: String? = nil
    ) throws -> (sql: String, arguments: [DatabaseValue]) {
        var sql = ""
        var arguments: [DatabaseValue] = []
        var requiring = requiring
        if excludesNestedChildren, let unlinked = try connection.notNestedChildCondition(of: ModelSchema<M>.shared()) {
            requiring = requiring.map { "\($0) AND \(unlinked)" } ?? unlinked
        }
        if let condition {
            sql += " WHERE " + (requiring.map { "\($0) AND " } ?? "") + (try Self.compile(condition, into: &arguments))
        } else if let requiring {
            sql += " WHERE \(requiring)"
        }
        guard orderAndLimit else { return (sql, arguments) }
        if !orderings.isEmpty {
            sql +=
                " ORDER BY "
                + (try orderings.map { "\(quoteIdentifier(try $0.column.get())) \($0.ascending ? "ASC" : "DESC")" }
                    .joined(separator: ", "))
        } else if let defaultOrder {
            sql += " ORDER BY \(defaultOrder)"
        }
        if let limitCount {
            guard limitCount >= 0, (offsetCount ?? 0) >= 0 else {
                throw ModelError.invalidArgument(
                    "limit and offset must not be negative (limit \(limitCount), offset \(offsetCount ?? 0))")
            }
            sql += " LIMIT ? OFFSET ?"
            arguments += [.integer(Int64(limitCount)), .integer(Int64(offsetCount ?? 0))]
        }
        return (sql, arguments)
    }

    var hasOrderOrLimit: Bool { !orderings.isEmpty || limitCount != nil }

    private static func compile(_ node: Condition<M>.Node, into arguments: inout [DatabaseValue]) throws -> String {
        switch node {
        case let .compare(column, op, value):
            arguments.append(value)
            return "\(quoteIdentifier(column)) \(op) ?"
        case let .isNull(column, negated):
            return "\(quoteIdentifier(column)) IS \(negated ? "NOT " : "")NULL"
        case let .list(column, values, negated):
            arguments += values
            return """
                \(quoteIdentifier(column)) \(negated ? "NOT " : "")IN \
                (\(Array(repeating: "?", count: values.count).joined(separator: ", ")))
                """
        case let .between(column, low, high, negated):
            arguments += [low, high]
            return "\(quoteIdentifier(column)) \(negated ? "NOT " : "")BETWEEN ? AND ?"
        case let .and(nodes):
            if nodes.isEmpty { return "1" }
            return "(" + (try nodes.map { try compile($0, into: &arguments) }.joined(separator: " AND ")) + ")"
        case let .or(nodes):
            if nodes.isEmpty { return "0" }
            return "(" + (try nodes.map { try compile($0, into: &arguments) }.joined(separator: " OR ")) + ")"
        case let .not(node):
            return "NOT (" + (try compile(node, into: &arguments)) + ")"
        case let .sql(sql, values):
            arguments += values
            return "(\(sql))"
        case let .invalid(error):
            throw error
        }
    }
}

/// A sort order as text: `column [ASC|DESC], …`.
enum SortOrder {
    static func parse(_ text: String) throws -> [(column: String, ascending: Bool?)] {
        var terms: [(column: String, ascending: Bool?)] = []
        for part in try split(text) {
            var words = try words(of: part, in: text)
            var ascending: Bool?
            if words.count > 1, let last = words.last, !last.quoted {
                switch last.text.uppercased() {
                case "ASC": ascending = true; words.removeLast()
                case "DESC": ascending = false; words.removeLast()
                default: break
                }
            }
            guard words.count == 1, let column = words.first, !column.text.isEmpty else {
                throw ModelError.invalidArgument(
                    """
                    cannot read the sort order \"\(text)\": \"\(part.trimmingCharacters(in: .whitespaces))\" is \
                    not a column name followed by ASC or DESC
                    """)
            }
            terms.append((column.text, ascending))
        }
        return terms
    }

    /// The comma-separated parts of `text`, commas inside double quotes kept.
    private static func split(_ text: String) throws -> [String] {
        var parts: [String] = []
        var current = ""
        var inQuotes = false
        for character in text {
            if character == "\"" { inQuotes.toggle() }
            if character == ",", !inQuotes {
                parts.append(current)
                current = ""
            } else {
                current.append(character)
            }
        }
        guard !inQuotes else {
            throw ModelError.invalidArgument("cannot read the sort order \"\(text)\": a double quote is not closed")
        }
        parts.append(current)
        return parts
    }

    /// The words of one term: bare words split on whitespace, double-quoted
    /// ones kept whole (`""` inside stands for a quote).
    private static func words(of term: String, in text: String) throws -> [(text: String, quoted: Bool)] {
        var words: [(text: String, quoted: Bool)] = []
        var characters = Substring(term)
        while let first = characters.first {
            if first.isWhitespace { characters.removeFirst(); continue }
            if first == "\"" {
                characters.removeFirst()
                var word = ""
                var closed = false
                while let next = characters.popFirst() {
                    if next == "\"" {
                        if characters.first == "\"" { characters.removeFirst(); word.append("\""); continue }
                        closed = true
                        break
                    }
                    word.append(next)
                }
                guard closed, characters.first.map(\.isWhitespace) ?? true else {
                    throw ModelError.invalidArgument(
                        "cannot read the sort order \"\(text)\": a quoted name must stand alone")
                }
                words.append((word, true))
            } else {
                let word = characters.prefix { !$0.isWhitespace && $0 != "\"" }
                characters = characters.dropFirst(word.count)
                words.append((String(word), false))
            }
        }
        return words
    }
}

private func asModelError(_ error: any Error) -> ModelError {
    (error as? ModelError) ?? .invalidArgument("\(error)")
}

extension Model {
    /// Every row of the table, to be narrowed down.
    public static var query: Query<Self> { Query() }
    /// Rows where `condition` holds.
    public static func `where`(_ condition: Condition<Self>) -> Query<Self> { Query().where(condition) }
    /// Rows where `column <op> value` (AHDataModel's `query(col, op, value)`).
    public static func query<V: Encodable & Sendable>(_ column: String, _ op: String, _ value: V) -> Query<Self> {
        Query().where(.compare(column, op, value))
    }
    /// Rows where `column IS [NOT] NULL`: `query("age", "IS NOT", nil)`.
    public static func query(_ column: String, _ op: String, _ value: _OptionalNilComparisonType) -> Query<Self> {
        Query().where(.compare(column, op, nil))
    }
}

/// `SET column = value` in an update.
public struct Assignment<M: Model>: Sendable {
    let column: Result<String, ModelError>
    let value: Result<DatabaseValue, ModelError>

    /// Sets a column by name; `nil` sets NULL.
    public static func set<V: Encodable & Sendable>(_ column: String, to value: V) -> Assignment {
        Assignment(
            column: Result { () throws -> String in
                let schema = try ModelSchema<M>.shared()
                return schema.columns[try schema.column(named: column)].name
            }.mapError(asModelError),
            value: Result { try Condition<M>.storedValue(value, column: column) }.mapError(asModelError))
    }
    /// Sets the column a key path reads.
    public static func set<V: Encodable & Sendable>(_ keyPath: KeyPath<M, V>, to value: V) -> Assignment {
        let column = Result { () throws -> String in
            let schema = try ModelSchema<M>.shared()
            return schema.columns[try schema.column(keyPath)].name
        }.mapError(asModelError)
        return Assignment(
            column: column,
            value: Result { try Condition<M>.storedValue(value, column: (try? column.get()) ?? "?") }.mapError(
                asModelError))
    }
    /// Sets a column to NULL.
    public static func setNull(_ column: String) -> Assignment { set(column, to: DatabaseValue.null) }
    /// Sets the column a key path reads to NULL.
    public static func setNull(_ keyPath: PartialKeyPath<M>) -> Assignment {
        Assignment(
            column: Result { () throws -> String in
                let schema = try ModelSchema<M>.shared()
                return schema.columns[try schema.column(keyPath)].name
            }.mapError(asModelError), value: .success(.null))
    }
}

/// Aggregate functions over a column (or over the rows, for `count`), by
/// column name or key path.
public struct Aggregate<M: Model>: Sendable {
    let function: String
    let column: Result<String, ModelError>?
    let separator: String?

    private static func make(_ function: String, _ ref: ColumnRef<M>, separator: String? = nil) -> Aggregate {
        Aggregate(
            function: function,
            column: Result { () throws -> String in
                let schema = try ModelSchema<M>.shared()
                return schema.columns[try schema.column(ref)].name
            }.mapError(asModelError), separator: separator)
    }

    /// The number of rows: `count(*)`.
    public static var count: Aggregate { Aggregate(function: "count", column: nil, separator: nil) }
    /// The number of distinct non-NULL values of a column.
    public static func countDistinct(_ column: String) -> Aggregate { make("count(DISTINCT", .named(column)) }
    /// The number of distinct non-NULL values of a property.
    public static func countDistinct(_ keyPath: PartialKeyPath<M>) -> Aggregate {
        make("count(DISTINCT", .keyPath(keyPath))
    }
    /// The sum of a column's non-NULL values (NULL when there is none).
    public static func sum(_ column: String) -> Aggregate { make("sum", .named(column)) }
    /// The sum of a property's non-NULL values (NULL when there is none).
    public static func sum(_ keyPath: PartialKeyPath<M>) -> Aggregate { make("sum", .keyPath(keyPath)) }
    /// The mean of a column's non-NULL values, as a REAL (NULL when there is none).
    public static func average(_ column: String) -> Aggregate { make("avg", .named(column)) }
    /// The mean of a property's non-NULL values, as a REAL (NULL when there is none).
    public static func average(_ keyPath: PartialKeyPath<M>) -> Aggregate { make("avg", .keyPath(keyPath)) }
    /// The smallest non-NULL value of a column.
    public static func minimum(_ column: String) -> Aggregate { make("min", .named(column)) }
    /// The smallest non-NULL value of a property.
    public static func minimum(_ keyPath: PartialKeyPath<M>) -> Aggregate { make("min", .keyPath(keyPath)) }
    /// The largest non-NULL value of a column.
    public static func maximum(_ column: String) -> Aggregate { make("max", .named(column)) }
    /// The largest non-NULL value of a property.
    public static func maximum(_ keyPath: PartialKeyPath<M>) -> Aggregate { make("max", .keyPath(keyPath)) }
    /// A column's non-NULL values joined into one text by `separator`, in no guaranteed order.
    public static func groupConcat(_ column: String, separator: String = ",") -> Aggregate {
        make("group_concat", .named(column), separator: separator)
    }
    /// A property's non-NULL values joined into one text by `separator`, in no guaranteed order.
    public static func groupConcat(_ keyPath: PartialKeyPath<M>, separator: String = ",") -> Aggregate {
        make("group_concat", .keyPath(keyPath), separator: separator)
    }

    /// The SQL expression; the separator, if any, is bound as a parameter.
    func sql(arguments: inout [DatabaseValue]) throws -> String {
        guard let column else { return "count(*)" }
        let name = quoteIdentifier(try column.get())
        if function == "count(DISTINCT" { return "count(DISTINCT \(name))" }
        if let separator {
            arguments.append(.text(separator))
            return "\(function)(\(name), ?)"
        }
        return "\(function)(\(name))"
    }
}
