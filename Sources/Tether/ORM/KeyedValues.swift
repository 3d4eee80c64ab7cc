import Foundation

/// AgileDB's low-level API: values by table and key, without a model.
///
/// A table holds one row per key; each member of a value is a column, added
/// (`ALTER TABLE … ADD COLUMN`) the first time a member needs it, typed by the
/// member's storage class: INTEGER for integers and `Bool`, REAL, TEXT, BLOB,
/// TEXT holding JSON (checked with `json_valid`) for arrays and nested
/// objects, ANY for a member first seen as nil. A new table is
/// `"key" TEXT PRIMARY KEY`, STRICT; an existing table is used through its
/// primary key, which must be one column. A model can read the same table.
///
/// ```swift
/// try db.setValue(["name": "Groceries", "budget": 120.5, "tags": ["food"]], inTable: "categories", forKey: "c1")
/// try db.setValue(json: #"{"name": "Rent", "budget": 900}"#, inTable: "categories", forKey: "c2")
/// let value = try db.value(fromTable: "categories", forKey: "c1")   // ["name": .text("Groceries"), …]
/// try db.tableHasAllKeys("categories", keys: ["c1", "c2"])        // true
/// try db.deleteValue(fromTable: "categories", forKey: "c2")        // true
/// ```
extension DatabaseContext {
    /// Stores `values` as the row of `key` in `table` (created, with the columns
    /// it lacks, as needed). The row is exactly `values` afterwards: columns
    /// not in it are set to NULL. A member named like the key column is ignored
    /// (AgileDB ignores "key"). Returns nothing; fails with `ModelError.encodingFailed`
    /// for a value that cannot be encoded, `.invalidArgument` for an empty
    /// member name or a table whose primary key is not one column, and a
    /// `DatabaseError` (`.typeMismatch`) for a value a STRICT column cannot hold.
    public func setValue(_ values: [String: (any Encodable & Sendable)?], inTable table: String, forKey key: String)
        throws
    {
        var stored: [String: DatabaseValue] = [:]
        var isJSON: Set<String> = []
        for (name, value) in values {
            guard !name.isEmpty else {
                throw ModelError.invalidArgument("a value in \(table) has a member with an empty name")
            }
            guard let value else { stored[name] = .null; continue }
            let capture = SingleValueCapture(column: name)
            try value.encode(to: capture)
            if capture.isStructured {
                stored[name] = try JSONColumn.encode(value, column: name)
                isJSON.insert(name)
            } else {
                stored[name] = try encodeColumnValue(value, type: nil, column: name)
            }
        }
        try withWriteConnection { conn in
            try conn.transaction { try conn.setKeyedValue(stored, jsonMembers: isJSON, table: table, key: key) }
        }
    }

    /// Stores a JSON object as the row of `key` in `table` (AgileDB's
    /// `setValueInTable(_:for:to:)`): each member a column, as `setValue(_:inTable:forKey:)`
    /// stores it. Text that is not a JSON object throws `ModelError.invalidArgument`.
    public func setValue(json: String, inTable table: String, forKey key: String) throws {
        let object: [String: JSONMember]
        do {
            object = try JSONDecoder().decode([String: JSONMember].self, from: Data(json.utf8))
        } catch {
            throw ModelError.invalidArgument("the value for \(key) in \(table) is not a JSON object: \(error)")
        }
        var stored: [String: DatabaseValue] = [:]
        var isJSON: Set<String> = []
        for (name, member) in object {
            guard !name.isEmpty else {
                throw ModelError.invalidArgument("a value in \(table) has a member with an empty name")
            }
            switch member {
            case .null: stored[name] = .null
            case let .bool(value): stored[name] = value.databaseValue
            case let .integer(value): stored[name] = .integer(value)
            case let .number(value): stored[name] = .real(value)
            case let .string(value): stored[name] = .text(value)
            case .array, .object:
                stored[name] = try JSONColumn.encode(member, column: name)
                isJSON.insert(name)
            }
        }
        try withWriteConnection { conn in
            try conn.transaction { try conn.setKeyedValue(stored, jsonMembers: isJSON, table: table, key: key) }
        }
    }

    /// The row of `key` in `table`, without its key and NULL columns; nil when
    /// there is no such row or no such table (AgileDB's `dictValueFromTable`).
    public func value(fromTable table: String, forKey key: String) throws -> [String: DatabaseValue]? {
        try withReadConnection { conn in
            guard let keyColumn = try conn.keyColumn(of: table) else { return nil }
            guard
                let row = try conn.fetchRow(
                    "SELECT * FROM \(quoteIdentifier(table)) WHERE \(quoteIdentifier(keyColumn)) = ?", [key])
            else { return nil }
            var value: [String: DatabaseValue] = [:]
            for (name, column) in zip(row.columnNames, row.values) where name != keyColumn && !column.isNull {
                value[name] = column
            }
            return value
        }
    }

    /// The row of `key` in `table` as a JSON object (AgileDB's `valueFromTable`):
    /// JSON columns as nested JSON, BLOBs as base64 text; nil when there is no such row.
    public func jsonValue(fromTable table: String, forKey key: String) throws -> String? {
        try withReadConnection { conn in
            guard let value = try conn.value(fromTable: table, forKey: key) else { return nil }
            let jsonColumns = try conn.jsonColumns(of: table)
            var object: [String: JSONMember] = [:]
            for (name, column) in value {
                object[name] = try JSONMember(column, isJSON: jsonColumns.contains(name), column: name)
            }
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            return String(decoding: try encoder.encode(object), as: UTF8.self)
        }
    }

    /// Deletes the row of `key` in `table`; returns whether there was one
    /// (AgileDB's `deleteFromTable`). A missing table has no row.
    @discardableResult
    public func deleteValue(fromTable table: String, forKey key: String) throws -> Bool {
        try withWriteConnection { conn in
            guard let keyColumn = try conn.keyColumn(of: table) else { return false }
            try conn.execute("DELETE FROM \(quoteIdentifier(table)) WHERE \(quoteIdentifier(keyColumn)) = ?", [key])
            return conn.changes > 0
        }
    }

    /// Whether `table` has a row with primary key `key` (AgileDB's `tableHasKey`).
    public func tableHasKey<K: DatabaseValueConvertible & Hashable>(_ table: String, key: K) throws -> Bool {
        try tableHasAllKeys(table, keys: [key])
    }

    /// Whether `table` has a row for every key of `keys` (AgileDB's `tableHasAllKeys`);
    /// true for no keys, false for a table that does not exist.
    public func tableHasAllKeys<K: DatabaseValueConvertible & Hashable>(_ table: String, keys: [K]) throws -> Bool {
        try withReadConnection { conn in
            guard let keyColumn = try conn.keyColumn(of: table) else { return keys.isEmpty }
            let distinct = Array(Set(keys))
            // Bound in chunks: SQLite limits the parameters of one statement.
            for start in stride(from: 0, to: distinct.count, by: 500) {
                let chunk = distinct[start..<min(start + 500, distinct.count)]
                let sql = """
                    SELECT count(*) FROM \(quoteIdentifier(table)) WHERE \(quoteIdentifier(keyColumn)) IN \
                    (\(Array(repeating: "?", count: chunk.count).joined(separator: ", ")))
                    """
                let found =
                    try conn.fetchValue(sql, StatementArguments(values: chunk.map(\.databaseValue)), as: Int.self) ?? 0
                if found != chunk.count { return false }
            }
            return true
        }
    }

    /// The keys of `table`, ordered by `sortOrder` and narrowed by condition sets
    /// (AgileDB's `keysInTable`).
    ///
    /// `sortOrder` is column names with an optional ASC or DESC each, `"name, budget desc"`.
    /// `conditionSets` are AgileDB's condition sets: AND inside a set, OR across sets; nil
    /// selects every row, an empty list none. Every column named is checked against the
    /// table's columns: an unknown one throws `ModelError.unknownColumn` — or, with
    /// `ignoringSetsWithUnknownColumns` (AgileDB's `validateObjects: true`), the sets that name
    /// it are left out (when every set is left out, no key matches). Empty for a table that
    /// does not exist.
    ///
    /// ```swift
    /// let keys = try db.keys(inTable: "accounts", matching: [[.equal("account", "ACCT1")]],
    ///                        ignoringSetsWithUnknownColumns: true)
    /// ```
    public func keys(
        inTable table: String, sortOrder: String? = nil, matching conditionSets: [[ValueCondition]]? = nil,
        ignoringSetsWithUnknownColumns: Bool = false
    ) throws -> [DatabaseValue] {
        try withReadConnection { conn in
            guard let keyColumn = try conn.keyColumn(of: table) else { return [] }
            let columns = try conn.fetchRows("SELECT name FROM pragma_table_info(?)", [table]).map {
                try $0.get(0, as: String.self)
            }
            // Names matched to the table's columns case-insensitively, as SQL names are.
            func column(_ name: String) -> String? {
                columns.first { $0 == name } ?? columns.first { $0.caseInsensitiveCompare(name) == .orderedSame }
            }
            var sql = "SELECT \(quoteIdentifier(keyColumn)) FROM \(quoteIdentifier(table))"
            var arguments: [DatabaseValue] = []
            if let conditionSets {
                var sets: [String] = []
                for set in conditionSets {
                    if ignoringSetsWithUnknownColumns, set.contains(where: { column($0.column) == nil }) { continue }
                    let terms = try set.map { condition -> String in
                        guard let name = column(condition.column) else {
                            throw ModelError.unknownColumn(table: table, column: condition.column)
                        }
                        return condition.sql(column: quoteIdentifier(name), arguments: &arguments)
                    }
                    sets.append(terms.isEmpty ? "1" : "(" + terms.joined(separator: " AND ") + ")")
                }
                sql += " WHERE " + (sets.isEmpty ? "0" : sets.joined(separator: " OR "))
            }
            if let sortOrder {
                let terms = try SortOrder.parse(sortOrder).map { term -> String in
                    guard let name = column(term.column) else {
                        throw ModelError.unknownColumn(table: table, column: term.column)
                    }
                    return "\(quoteIdentifier(name)) \(term.ascending == false ? "DESC" : "ASC")"
                }
                sql += " ORDER BY " + terms.joined(separator: ", ")
            }
            return try conn.fetchRows(sql, StatementArguments(values: arguments)).map { $0[0] }
        }
    }
}

/// A condition on one column of a table read by key, without a model (AgileDB's
/// `DBCondition`); `keys(inTable:matching:)` takes them in sets. Values are bound, never
/// written into the SQL.
///
/// ```swift
/// let sets: [[ValueCondition]] = [[.equal("account", "ACCT1"), .greater("amount", 100)], [.contains("memo", "rent")]]
/// ```
public struct ValueCondition: Sendable, Equatable {
    /// How the column is compared.
    public enum Comparison: Sendable, Equatable {
        /// `=` (`IS` for NULL).
        case equal(DatabaseValue)
        /// `!=` (`IS NOT` for NULL).
        case notEqual(DatabaseValue)
        /// `<`.
        case less(DatabaseValue)
        /// `<=`.
        case lessOrEqual(DatabaseValue)
        /// `>`.
        case greater(DatabaseValue)
        /// `>=`.
        case greaterOrEqual(DatabaseValue)
        /// The column's text contains this text, matched literally (AgileDB's `contains`).
        case contains(String)
        /// The column's value is one of these (AgileDB's `inList`).
        case isIn([DatabaseValue])
    }

    /// The column compared, matched to the table's columns case-insensitively.
    public let column: String
    /// The comparison.
    public let comparison: Comparison

    /// `column` compared as `comparison` says.
    public init(_ column: String, _ comparison: Comparison) {
        self.column = column
        self.comparison = comparison
    }

    /// `column = value` (`IS NULL` for a nil optional or `DatabaseValue.null`).
    public static func equal(_ column: String, _ value: some DatabaseValueConvertible) -> ValueCondition {
        ValueCondition(column, .equal(value.databaseValue))
    }
    /// `column != value` (`IS NOT NULL` for a nil optional or `DatabaseValue.null`).
    public static func notEqual(_ column: String, _ value: some DatabaseValueConvertible) -> ValueCondition {
        ValueCondition(column, .notEqual(value.databaseValue))
    }
    /// `column < value`.
    public static func less(_ column: String, _ value: some DatabaseValueConvertible) -> ValueCondition {
        ValueCondition(column, .less(value.databaseValue))
    }
    /// `column <= value`.
    public static func lessOrEqual(_ column: String, _ value: some DatabaseValueConvertible) -> ValueCondition {
        ValueCondition(column, .lessOrEqual(value.databaseValue))
    }
    /// `column > value`.
    public static func greater(_ column: String, _ value: some DatabaseValueConvertible) -> ValueCondition {
        ValueCondition(column, .greater(value.databaseValue))
    }
    /// `column >= value`.
    public static func greaterOrEqual(_ column: String, _ value: some DatabaseValueConvertible) -> ValueCondition {
        ValueCondition(column, .greaterOrEqual(value.databaseValue))
    }
    /// The column's text contains `text`, matched literally.
    public static func contains(_ column: String, _ text: String) -> ValueCondition {
        ValueCondition(column, .contains(text))
    }
    /// The column's value is one of `values`; none matches no row.
    public static func isIn<V: DatabaseValueConvertible>(_ column: String, _ values: [V]) -> ValueCondition {
        ValueCondition(column, .isIn(values.map(\.databaseValue)))
    }

    /// The SQL of this condition on `column` (already quoted), its values appended to `arguments`.
    func sql(column: String, arguments: inout [DatabaseValue]) -> String {
        func compare(_ op: String, _ value: DatabaseValue) -> String {
            arguments.append(value)
            return "\(column) \(op) ?"
        }
        switch comparison {
        case let .equal(value): return compare(value.isNull ? "IS" : "=", value)
        case let .notEqual(value): return compare(value.isNull ? "IS NOT" : "!=", value)
        case let .less(value): return compare("<", value)
        case let .lessOrEqual(value): return compare("<=", value)
        case let .greater(value): return compare(">", value)
        case let .greaterOrEqual(value): return compare(">=", value)
        case let .contains(text):
            arguments.append(.text(text))
            return "instr(\(column), ?) > 0"
        case let .isIn(values):
            if values.isEmpty { return "0" }
            arguments += values
            return "\(column) IN (\(Array(repeating: "?", count: values.count).joined(separator: ", ")))"
        }
    }
}

extension Connection {
    /// The single primary-key column of `table`, or nil when the table does not exist.
    func keyColumn(of table: String) throws -> String? {
        let key = try fetchRows("SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", [table]).map {
            try $0.get(0, as: String.self)
        }
        if key.count == 1 { return key[0] }
        guard try tableExists(table) else { return nil }
        throw ModelError.invalidArgument(
            """
            table \(table) has \(key.isEmpty ? "no primary key" : "a primary key of \(key.count) columns"); \
            values by key need a primary key of one column
            """)
    }

    /// Columns of `table` declared as JSON (as Tether declares them: a `json_valid` CHECK).
    func jsonColumns(of table: String) throws -> Set<String> {
        let sql = try tableDefinition(table) ?? ""
        let columns = try fetchRows("SELECT name FROM pragma_table_info(?)", [table]).map {
            try $0.get(0, as: String.self)
        }
        return Set(columns.filter { sql.contains("json_valid(\(quoteIdentifier($0)))") })
    }

    func setKeyedValue(_ values: [String: DatabaseValue], jsonMembers: Set<String>, table: String, key: String) throws {
        let quotedTable = quoteIdentifier(table)
        let existingKey = try keyColumn(of: table)
        let keyColumn = existingKey ?? "key"
        if existingKey == nil {
            try execute("CREATE TABLE \(quotedTable) (\"key\" TEXT PRIMARY KEY NOT NULL) STRICT")
        }
        let existing = try fetchRows("SELECT name FROM pragma_table_info(?)", [table]).map {
            try $0.get(0, as: String.self)
        }
        var columns = existing.filter { $0 != keyColumn }
        let members = values.filter { $0.key.caseInsensitiveCompare(keyColumn) != .orderedSame }
        for name in members.keys.sorted()
        where !existing.contains(where: { $0.caseInsensitiveCompare(name) == .orderedSame }) {
            let quoted = quoteIdentifier(name)
            let type: String
            switch members[name] ?? .null {
            case .integer: type = "INTEGER"
            case .real: type = "REAL"
            case .text:
                type = jsonMembers.contains(name) ? "TEXT CHECK (\(quoted) IS NULL OR json_valid(\(quoted)))" : "TEXT"
            case .blob: type = "BLOB"
            case .null: type = "ANY"
            }
            try execute("ALTER TABLE \(quotedTable) ADD COLUMN \(quoted) \(type)")
            columns.append(name)
        }
        // Members matched to the table's columns case-insensitively, as SQL names are.
        func member(_ column: String) -> DatabaseValue {
            members[column] ?? members.first { $0.key.caseInsensitiveCompare(column) == .orderedSame }?.value ?? .null
        }
        let names = [keyColumn] + columns
        let placeholders = Array(repeating: "?", count: names.count).joined(separator: ", ")
        let update =
            columns.isEmpty
            ? "NOTHING"
            : "UPDATE SET "
                + columns.map { "\(quoteIdentifier($0)) = excluded.\(quoteIdentifier($0))" }.joined(separator: ", ")
        let sql =
            "INSERT INTO \(quotedTable) (\(names.map(quoteIdentifier).joined(separator: ", "))) VALUES "
            + "(\(placeholders)) "
            + "ON CONFLICT (\(quoteIdentifier(keyColumn))) DO \(update)"
        try execute(sql, StatementArguments(values: [.text(key)] + columns.map(member)))
    }
}

/// A member of a JSON object, for values given or returned as JSON text.
enum JSONMember: Codable, Sendable {
    case null, bool(Bool), integer(Int64), number(Double), string(String)
    case array([JSONMember]), object([String: JSONMember])

    var isNull: Bool { if case .null = self { return true } else { return false } }

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int64.self) {
            self = .integer(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONMember].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONMember].self))
        }
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case let .bool(value): try container.encode(value)
        case let .integer(value): try container.encode(value)
        case let .number(value): try container.encode(value)
        case let .string(value): try container.encode(value)
        case let .array(value): try container.encode(value)
        case let .object(value): try container.encode(value)
        }
    }

    /// A stored column as a JSON member; `isJSON` columns hold JSON text.
    init(_ value: DatabaseValue, isJSON: Bool, column: String) throws {
        switch value {
        case .null: self = .null
        case let .integer(v): self = .integer(v)
        case let .real(v): self = .number(v)
        case let .blob(v): self = .string(v.base64EncodedString())
        case let .text(v):
            self = isJSON ? try JSONColumn.decode(JSONMember.self, from: v, column: column, sql: nil) : .string(v)
        }
    }
}
