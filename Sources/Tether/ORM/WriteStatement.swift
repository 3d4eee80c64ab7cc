/// A write made now and run later, with others, in one transaction: sModel's statements
/// (`createSaveStatement`, `createDeleteStatement`) and its `DBManager.executeStatements`.
///
/// ```swift
/// var statements = players.map { $0.saveStatement() }
/// statements.append(retired.deleteStatement())
/// statements.append(.sql("UPDATE team SET size = size + ?", [players.count]))
/// try db.execute(statements)          // all of them, or none
/// ```
public struct WriteStatement: Sendable, CustomStringConvertible {
    enum Operation: Sendable {
        case insert(any Model)
        case save(any Model)
        case delete(any Model)
        case sql(String, StatementArguments)
    }

    let operation: Operation

    /// Inserts `model`, as `insert(_:)` does.
    public static func insert(_ model: some Model) -> WriteStatement { WriteStatement(operation: .insert(model)) }
    /// Saves `model` (insert, or update of the row with its primary key), as `save(_:)` does.
    public static func save(_ model: some Model) -> WriteStatement { WriteStatement(operation: .save(model)) }
    /// Deletes the row with `model`'s primary key, as `delete(_:)` does (no row is no error).
    public static func delete(_ model: some Model) -> WriteStatement { WriteStatement(operation: .delete(model)) }
    /// Runs SQL with bound arguments.
    public static func sql(_ sql: String, _ arguments: StatementArguments = StatementArguments()) -> WriteStatement {
        WriteStatement(operation: .sql(sql, arguments))
    }

    /// What the statement does: "save Player", "delete Player", or its SQL.
    public var description: String {
        switch operation {
        case let .insert(model): return "insert \(type(of: model))"
        case let .save(model): return "save \(type(of: model))"
        case let .delete(model): return "delete \(type(of: model))"
        case let .sql(sql, _): return sql
        }
    }

    func run(on connection: Connection) throws {
        switch operation {
        case let .insert(model): _ = try connection.insertRow(model)
        case let .save(model): try connection.upsertRow(model)
        case let .delete(model): try connection.delete(model)
        case let .sql(sql, arguments): try connection.execute(sql, arguments)
        }
    }
}

extension Model {
    /// A statement that saves this model when run by `execute(_:)` (sModel's `createSaveStatement`).
    public func saveStatement() -> WriteStatement { .save(self) }
    /// A statement that deletes this model's row when run by `execute(_:)` (sModel's `createDeleteStatement`).
    public func deleteStatement() -> WriteStatement { .delete(self) }
}

extension DatabaseContext {
    /// Runs `statements` in order, in one transaction: all of them, or — when one fails — none
    /// (sModel's `executeStatements`). The failure is thrown as a `BatchFailure` naming the
    /// statement (its position and itself) with the error it met (`ModelError.duplicate`, a
    /// `DatabaseError`, …).
    public func execute(_ statements: [WriteStatement]) throws {
        try withWriteConnection { conn in
            try conn.transaction {
                for (index, statement) in statements.enumerated() {
                    do {
                        try statement.run(on: conn)
                    } catch {
                        throw BatchFailure(index: index, element: statement, error: error)
                    }
                }
            }
        }
    }
}
