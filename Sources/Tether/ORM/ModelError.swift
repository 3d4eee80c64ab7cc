/// Errors of the ORM layer: models that cannot be described, values that cannot
/// be decoded, rows that are missing or collide. The core's `StatementError`s reach ORM users
/// as the cases of the same name (`init(_:)`); SQLite's failures stay `DatabaseError`s.
public enum ModelError: Error, Sendable, CustomStringConvertible {
    /// An insert collided with an existing row on the primary key or a unique
    /// key; `existing` is that row as stored (sModel's `.duplicate`).
    case duplicate(existing: any Model & Sendable, underlying: DatabaseError)
    /// No row has this primary key (update of a model that was never inserted).
    case notFound(table: String, key: String)
    /// The model type cannot be mapped to a table, and why.
    case invalidModel(type: String, reason: String)
    /// A stored value does not fit the Swift type asked for.
    case typeMismatch(column: String, expected: String, found: String, sql: String?)
    /// A column the model needs is absent from the selected row.
    case missingColumn(column: String, sql: String?)
    /// A query names a column the model does not have, or a key path that is not a column.
    case unknownColumn(table: String, column: String)
    /// The model has a column its table lacks (a property added to the model, the table not
    /// migrated yet). Add the column with a migration (`Migration.addColumn`), with
    /// `Database.updateSchema(toMatch:)`, or let the model add it (`addsMissingColumns`).
    case columnNotInTable(model: String, table: String, column: String)
    /// A value could not be encoded for the database.
    case encodingFailed(column: String, reason: String)
    /// A nested model's row contains itself, through its links (a cycle): it cannot be saved
    /// or loaded.
    case nestedCycle(model: String, key: String)
    /// A nested property links to a row that does not exist (deleted or expired); see
    /// `Constraint.mandatory` and `.dropsMissingElements` to leave such rows out instead.
    case missingChild(column: String, table: String, key: String)
    /// A query or API was used in a way that cannot work (for example a primary
    /// key with the wrong number of parts).
    case invalidArgument(String)
    /// The model's table does not exist in the database (it was never created, or was dropped):
    /// thrown where an API needs the table now, such as a typed listener
    /// (`Database.observe(_:of:key:_:)` with a `ModelEvent` listener).
    case tableNotFound(model: String, table: String)

    /// The ORM's face of a core error: the case of the same name, with the same details.
    public init(_ error: StatementError) {
        switch error {
        case let .invalidArgument(reason): self = .invalidArgument(reason)
        case let .typeMismatch(column, expected, found, sql):
            self = .typeMismatch(column: column, expected: expected, found: found, sql: sql)
        case let .missingColumn(column, sql): self = .missingColumn(column: column, sql: sql)
        }
    }

    /// Runs `body`, an ORM operation, reporting a core `StatementError` as a `ModelError`.
    @inline(__always)
    static func wrapping<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as StatementError {
            throw ModelError(error)
        }
    }

    public var description: String {
        switch self {
        case let .duplicate(existing, underlying):
            return "duplicate row in \(type(of: existing).tableName): \(underlying.message)"
        case let .notFound(table, key):
            return "no row in \(table) with primary key \(key)"
        case let .invalidModel(type, reason):
            return "cannot use \(type) as a model: \(reason)"
        case let .typeMismatch(column, expected, found, sql):
            return "column \(column) holds \(found), which cannot be read as \(expected)"
                + (sql.map { " — in: \($0)" } ?? "")
        case let .missingColumn(column, sql):
            return "column \(column) is missing from the selected row" + (sql.map { " — in: \($0)" } ?? "")
        case let .unknownColumn(table, column):
            return "table \(table) has no column \(column)"
        case let .columnNotInTable(model, table, column):
            return "table \(table) has no column \(column), which \(model) reads and writes; add it with a migration "
                + "(Migration.addColumn), "
                + "with Database.updateSchema(toMatch:), or declare addsMissingColumns on \(model)"
        case let .encodingFailed(column, reason):
            return "cannot encode column \(column): \(reason)"
        case let .nestedCycle(model, key):
            return
                "\(model) with key \(key) contains itself through its nested models: a cycle cannot be stored or loaded"
        case let .missingChild(column, table, key):
            return "column \(column) links to the row of \(table) with key \(key), which does not exist; "
                + "declare the column .mandatory (leave the parent out) or .dropsMissingElements (drop the element)"
        case let .invalidArgument(reason):
            return reason
        case let .tableNotFound(model, table):
            return "table \(table) of \(model) does not exist; create it (createTable, a migration) before using it"
        }
    }
}
