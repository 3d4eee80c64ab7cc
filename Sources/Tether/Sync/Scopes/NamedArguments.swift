// Statements with named arguments, as scope rules are written (`:peer_name`, `:tether_k0`, …).

import CSQLite

extension SyncEngine {
    /// Runs `sql` with the named `arguments` it uses, calling `row` for each result row.
    static func read(
        _ sql: String, _ arguments: [String: DatabaseValue], _ connection: Connection,
        _ row: (OpaquePointer) throws -> Void
    ) throws {
        let statement = try connection.cachedStatement(sql)
        try bindUsed(statement, arguments)
        defer { statement.reset() }
        while try statement.step() { try row(statement.handle) }
    }

    func read(
        _ sql: String, _ arguments: [String: DatabaseValue], _ connection: Connection,
        _ row: (OpaquePointer) throws -> Void
    ) throws {
        try Self.read(sql, arguments, connection, row)
    }

    /// Binds the named parameters `statement` uses from `arguments` (NULL for one it lacks).
    static func bindUsed(_ statement: Statement, _ arguments: [String: DatabaseValue]) throws {
        var used: [String: DatabaseValue] = [:]
        for index in 0..<Int32(statement.parameterCount) {
            guard let cName = sqlite3_bind_parameter_name(statement.handle, index + 1) else { continue }
            let name = String(cString: cName)
            used[name] = arguments[":" + name.dropFirst()] ?? .null
        }
        try statement.bind(StatementArguments(named: used))
    }

    /// The text of `column` in the current row ("" for NULL).
    static func text(_ handle: OpaquePointer, _ column: Int32) -> String {
        sqlite3_column_text(handle, column).map { String(cString: $0) } ?? ""
    }
}
