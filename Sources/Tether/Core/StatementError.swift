/// A misuse of a statement or of its results that SQLite itself does not report: arguments that
/// do not match a statement's parameters, a column a row does not have, a value that cannot be
/// read as the type asked for. SQLite's own failures are `DatabaseError`s.
///
/// The ORM reports these as the `ModelError` of the same name (`ModelError(_:)`), so that ORM
/// users catch one type.
///
/// ```swift
/// do {
///     let id: Int = try row.get("name")
/// } catch let StatementError.typeMismatch(column, expected, found, _) {
///     print("\(column) holds \(found), not \(expected)")
/// }
/// ```
public enum StatementError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The arguments do not fit the statement's parameters (their number, their names, positional
    /// and named mixed), or a row was asked for a column index it does not have; the message
    /// says which, and the SQL.
    case invalidArgument(String)
    /// A value does not fit the Swift type asked for.
    case typeMismatch(column: String, expected: String, found: String, sql: String?)
    /// A row has no column of this name.
    case missingColumn(column: String, sql: String?)

    public var description: String {
        switch self {
        case let .invalidArgument(reason):
            return reason
        case let .typeMismatch(column, expected, found, sql):
            return "column \(column) holds \(found), which cannot be read as \(expected)"
                + (sql.map { " — in: \($0)" } ?? "")
        case let .missingColumn(column, sql):
            return "column \(column) is missing from the selected row" + (sql.map { " — in: \($0)" } ?? "")
        }
    }
}
