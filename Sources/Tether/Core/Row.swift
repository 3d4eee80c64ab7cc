import CSQLite
import Foundation

/// One row of a query result, copied out of SQLite: values by index and by
/// column name.
///
/// ```swift
/// for row in try db.fetchRows("SELECT id, name FROM player") {
///     let id: Int = try row.get(0)
///     let name: String = try row.get("name")
/// }
/// ```
public struct Row: Sendable, RandomAccessCollection {
    /// The result's column names, in the order of `values`.
    public let columnNames: [String]
    /// The row's values, one per column.
    public let values: [DatabaseValue]

    /// A row of these values, named by `columnNames` (one name per value), for tests and for
    /// code that builds results of its own.
    public init(columnNames: [String], values: [DatabaseValue]) {
        self.columnNames = columnNames
        self.values = values
    }

    init(statement: Statement) {
        columnNames = statement.columnNames
        values = (0..<Int32(columnNames.count)).map { DatabaseValue(statement: statement.handle, index: $0) }
    }

    public var startIndex: Int { 0 }
    public var endIndex: Int { values.count }
    public subscript(index: Int) -> DatabaseValue { values[index] }

    /// The value of the first column with this name (case-insensitive, as in
    /// SQL), or nil when there is none.
    public subscript(column: String) -> DatabaseValue? {
        index(ofColumn: column).map { values[$0] }
    }

    /// The index of the first column with this name (an exact match first, then
    /// case-insensitive, as in SQL), or nil when there is none.
    public func index(ofColumn column: String) -> Int? {
        columnNames.firstIndex(of: column)
            ?? columnNames.firstIndex { $0.caseInsensitiveCompare(column) == .orderedSame }
    }

    /// The value at `index` as `V`; throws when it is absent or of another type.
    public func get<V: DatabaseValueConvertible>(_ index: Int, as type: V.Type = V.self) throws -> V {
        guard values.indices.contains(index) else {
            throw StatementError.invalidArgument("row has \(values.count) column(s); there is no column \(index)")
        }
        return try convert(values[index], column: columnNames[index])
    }

    /// The value of column `column` as `V`; throws when it is absent or of another type.
    public func get<V: DatabaseValueConvertible>(_ column: String, as type: V.Type = V.self) throws -> V {
        guard let index = index(ofColumn: column) else { throw StatementError.missingColumn(column: column, sql: nil) }
        return try convert(values[index], column: column)
    }

    private func convert<V: DatabaseValueConvertible>(_ value: DatabaseValue, column: String) throws -> V {
        guard let converted = V.fromDatabaseValue(value) else {
            throw StatementError.typeMismatch(column: column, expected: "\(V.self)", found: value.storageName, sql: nil)
        }
        return converted
    }
}
