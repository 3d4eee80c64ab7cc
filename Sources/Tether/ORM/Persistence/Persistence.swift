// Where ORM operations run (`DatabaseContext`), primary keys, best-effort batches, creating and dropping tables.

/// Where ORM operations run: a `Database` (each call is its own transaction
/// on the writer, or a snapshot read) or a `Connection` inside one (the calls
/// join the enclosing transaction). The operations are written once, here.
public protocol DatabaseContext {
    /// Runs `body` with a connection to read through: a snapshot read on a `Database`, the
    /// connection itself (inside its transaction) on a `Connection`.
    func withReadConnection<T>(_ body: (Connection) throws -> T) throws -> T
    /// Runs `body` with a connection to write through: a transaction of its own on a `Database`'s
    /// writer, the enclosing transaction on a `Connection`.
    func withWriteConnection<T>(_ body: (Connection) throws -> T) throws -> T
}

// The ORM's entry points: a core `StatementError` becomes the `ModelError` ORM users catch.

extension Database: DatabaseContext {
    /// Runs `body` in a read (see `Database.read(_:)`); a core failure is thrown as `ModelError`.
    public func withReadConnection<T>(_ body: (Connection) throws -> T) throws -> T {
        try ModelError.wrapping { try read(body) }
    }
    /// Runs `body` in a write transaction of its own (see `Database.write(_:)`); a core failure is
    /// thrown as `ModelError`.
    public func withWriteConnection<T>(_ body: (Connection) throws -> T) throws -> T {
        try ModelError.wrapping { try write(body) }
    }
}

extension Connection: DatabaseContext {
    /// Runs `body` on this connection, within its current transaction; a core failure is thrown as
    /// `ModelError`.
    public func withReadConnection<T>(_ body: (Connection) throws -> T) throws -> T {
        try ModelError.wrapping { try body(self) }
    }
    /// Runs `body` on this connection, within its current transaction; a core failure is thrown as
    /// `ModelError`.
    public func withWriteConnection<T>(_ body: (Connection) throws -> T) throws -> T {
        try ModelError.wrapping { try body(self) }
    }
}

/// One element of a best-effort batch that failed, and why.
public struct BatchFailure<Element: Sendable>: Error, Sendable {
    /// Position of the element in the batch.
    public let index: Int
    /// The element that failed; the rest of the batch went on.
    public let element: Element
    /// Why it failed (a `ModelError`, usually).
    public let error: any Error
}

/// A primary key value: one value, or one per column for a composite key.
public struct PrimaryKey: Sendable, Hashable, ExpressibleByArrayLiteral {
    /// The key's values, in the order of the model's primary key columns.
    public let values: [DatabaseValue]
    /// A key of several columns, values in the order of the primary key's columns.
    public init(_ values: [DatabaseValue]) { self.values = values }
    /// A key of one column: `PrimaryKey(42)`.
    public init(_ value: some DatabaseValueConvertible) { values = [value.databaseValue] }
    public init(arrayLiteral elements: DatabaseValue...) { values = elements }
}

// MARK: - Tables

extension DatabaseContext {
    /// Creates `M`'s table and indexes from its description.
    public func createTable<M: Model>(_ type: M.Type, ifNotExists: Bool = true) throws {
        try withWriteConnection { conn in
            try conn.transaction {
                // The tables of nested models too (they are rows of their own tables).
                var visited = Set<ObjectIdentifier>()
                try conn.createTables(M.self, ifNotExists: ifNotExists, visited: &visited)
            }
        }
    }

    /// Drops `M`'s table.
    public func dropTable<M: Model>(_ type: M.Type, ifExists: Bool = true) throws {
        try withWriteConnection { conn in
            try conn.execute("DROP TABLE \(ifExists ? "IF EXISTS " : "")\(quoteIdentifier(M.tableName))")
            conn.setAttachment(nil, as: ModelStatements<M>.self)
        }
    }

    /// Whether a table (or view) with this name exists.
    public func tableExists(_ name: String) throws -> Bool {
        try withReadConnection { conn in
            try conn.fetchValue(
                "SELECT 1 FROM sqlite_master WHERE type IN ('table', 'view') AND name = ?", [name],
                as: Int.self) != nil
        }
    }
}

// MARK: - Batches

extension DatabaseContext {
    /// Runs `operation` on each element inside one transaction; a failing
    /// element is undone alone (SQLite undoes a failed statement) and reported.
    func eachInBatch<Element: Sendable>(
        _ elements: [Element], _ operation: (Connection, Element) throws -> Void
    ) throws -> [BatchFailure<Element>] {
        try withWriteConnection { conn in
            try conn.transaction {
                var failures: [BatchFailure<Element>] = []
                for (index, element) in elements.enumerated() {
                    do {
                        try conn.savepoint { try operation(conn, element) }
                    } catch {
                        // A failure that ended the transaction (I/O, full disk) ends the batch.
                        if !conn.isInTransaction { throw error }
                        failures.append(BatchFailure(index: index, element: element, error: error))
                    }
                }
                return failures
            }
        }
    }
}

/// ` WHERE pk = ?` for a key given by value.
func keyCondition(_ schema: SchemaCore, _ key: PrimaryKey) throws -> (sql: String, arguments: [DatabaseValue]) {
    try schema.requirePrimaryKey(for: "a lookup by primary key")
    guard key.values.count == schema.primaryKey.count else {
        throw ModelError.invalidArgument(
            "the primary key of \(schema.tableName) has \(schema.primaryKey.count) column(s); "
                + "\(key.values.count) value(s) were given")
    }
    return (" WHERE \(schema.primaryKeyCondition)", key.values)
}
