import Foundation
import Testing
@testable import Tether
import TetherTestSupport

// MARK: - Raw SQL

@Suite("Core: raw SQL")
struct CoreRawSQLTests {
    private static let schema = "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT NOT NULL, age INTEGER)"

    private func names(_ db: Database) throws -> [String] {
        try db.fetchRows("SELECT name FROM person ORDER BY id").map { try $0.get("name", as: String.self) }
    }

    @Test func positionalArguments() throws {
        let db = try makeDatabase(schema: Self.schema)
        try db.execute("INSERT INTO person (id, name, age) VALUES (?, ?, ?)", [1, "Ann", 31])
        try db.execute("INSERT INTO person (id, name, age) VALUES (?, ?, ?)", [2, "Bob", nil])
        try db.execute("INSERT INTO person (id, name, age) VALUES (?3, ?1, ?2)", ["Cid", 40, 3])
        #expect(try names(db) == ["Ann", "Bob", "Cid"])
        #expect(try db.fetchValue("SELECT age FROM person WHERE id = ?", [3], as: Int.self) == 40)
        #expect(try db.fetchValue("SELECT age FROM person WHERE id = ?", [2], as: Int.self) == nil)
        #expect(
            try db.fetchValue("SELECT name FROM person WHERE age > ? AND age < ?", [35, 50], as: String.self) == "Cid")
    }

    @Test func namedArgumentsWithEachPrefix() throws {
        let db = try makeDatabase(schema: Self.schema)
        try db.execute(
            "INSERT INTO person (id, name, age) VALUES (:id, :name, :age)", ["id": 1, "name": "colon", "age": 1])
        try db.execute(
            "INSERT INTO person (id, name, age) VALUES (@id, @name, @age)", ["id": 2, "name": "at", "age": 2])
        try db.execute(
            "INSERT INTO person (id, name, age) VALUES ($id, $name, $age)", ["id": 3, "name": "dollar", "age": 3])
        // The prefix may be given too.
        try db.execute(
            "INSERT INTO person (id, name, age) VALUES (:id, :name, :age)",
            [":id": 4, ":name": "prefixed", ":age": nil])
        #expect(try names(db) == ["colon", "at", "dollar", "prefixed"])
        // A name used twice is bound once.
        #expect(try db.fetchValue("SELECT count(*) FROM person WHERE id = :n OR age = :n", ["n": 2], as: Int.self) == 1)
        #expect(try db.fetchValue("SELECT name FROM person WHERE id = $id", ["id": 3], as: String.self) == "dollar")
        #expect(try db.fetchValue("SELECT age FROM person WHERE id = @id", ["id": 4], as: Int.self) == nil)
    }

    @Test func scriptsOfSeveralStatements() throws {
        let db = try Database.inMemory()
        try db.execute(
            """
            CREATE TABLE a (x INTEGER, y TEXT);
            -- a comment; with a semicolon
            INSERT INTO a (x, y) VALUES (1, 'one;two');
            /* block; comment */
            INSERT INTO a (x, y) VALUES (2, 'two');
            CREATE INDEX a_x ON a (x);
            """)
        #expect(
            try db.fetchRows("SELECT y FROM a ORDER BY x").map { try $0.get(0, as: String.self) } == ["one;two", "two"])
        #expect(try db.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 'a_x'", as: Int.self) == 1)
        // Also on a Connection, and with executeScript directly.
        try db.write { conn in
            try conn.execute("INSERT INTO a (x) VALUES (3); INSERT INTO a (x) VALUES (4)")
            try conn.executeScript("UPDATE a SET y = 'n' WHERE y IS NULL; DELETE FROM a WHERE x = 1;")
        }
        #expect(
            try db.fetchRows("SELECT x, y FROM a ORDER BY x").map {
                try "\($0.get(0, as: Int.self))\($0.get(1, as: String.self))"
            }
                == ["2two", "3n", "4n"])
        // A single statement with a trailing semicolon and comment is not a script.
        try db.execute("INSERT INTO a (x, y) VALUES (?, ?); -- trailing", [5, "five"])
        #expect(try db.fetchValue("SELECT y FROM a WHERE x = 5", as: String.self) == "five")
    }

    @Test func rowsByIndexAndByName() throws {
        let db = try makeDatabase(schema: Self.schema)
        try db.execute("INSERT INTO person (id, name, age) VALUES (1, 'Ann', 31), (2, 'Bob', NULL)")
        let rows = try db.fetchRows("SELECT id, name, age, age * 2 AS double_age FROM person ORDER BY id")
        try #require(rows.count == 2)
        let ann = rows[0]
        #expect(ann.columnNames == ["id", "name", "age", "double_age"])
        #expect(ann.count == 4)
        #expect(ann[0] == .integer(1))
        #expect(ann[1] == .text("Ann"))
        #expect(ann["name"] == .text("Ann"))
        #expect(ann["NAME"] == .text("Ann"))  // case-insensitive, as in SQL
        #expect(ann["double_age"] == .integer(62))
        #expect(ann["missing"] == nil)
        #expect(try ann.get("name", as: String.self) == "Ann")
        #expect(try ann.get(0, as: Int.self) == 1)
        #expect(try ann.get("age", as: Int64.self) == 31)
        #expect(try rows[1].get("age", as: Int?.self) == nil)
        #expect(rows[1]["age"] == .null)
        #expect(Array(ann) == [.integer(1), .text("Ann"), .integer(31), .integer(62)])

        let first = try #require(try db.read { try $0.fetchRow("SELECT name, age FROM person ORDER BY id DESC") })
        #expect(try first.get("name", as: String.self) == "Bob")
        #expect(try db.read { try $0.fetchRow("SELECT * FROM person WHERE id = 99") } == nil)
        #expect(try db.fetchValue("SELECT name FROM person WHERE id = 99", as: String.self) == nil)
        #expect(try db.fetchRows("SELECT * FROM person WHERE id = 99").isEmpty)
        #expect(try db.fetchValue("SELECT count(*) FROM person", as: Int.self) == 2)
    }

    @Test func rowGetErrors() throws {
        let db = try makeDatabase(schema: Self.schema)
        try db.execute("INSERT INTO person (id, name, age) VALUES (1, 'Ann', 31)")
        let row = try #require(try db.fetchRows("SELECT id, name FROM person").first)

        let mismatch = #expect(throws: StatementError.self) { _ = try row.get("name", as: Int.self) }
        guard case let .typeMismatch(column, expected, found, _)? = mismatch else {
            Issue.record("expected typeMismatch, got \(String(describing: mismatch))"); return
        }
        #expect(column == "name")
        #expect(expected == "Int")
        #expect(found == "TEXT")
        #expect("\(mismatch!)".contains("name"))

        let byIndex = #expect(throws: StatementError.self) { _ = try row.get(0, as: String.self) }
        guard case .typeMismatch(column: "id", expected: "String", found: "INTEGER", sql: _)? = byIndex else {
            Issue.record("expected typeMismatch, got \(String(describing: byIndex))"); return
        }

        let missing = #expect(throws: StatementError.self) { _ = try row.get("nope", as: Int.self) }
        guard case let .missingColumn(name, _)? = missing else {
            Issue.record("expected missingColumn, got \(String(describing: missing))"); return
        }
        #expect(name == "nope")

        let outOfRange = #expect(throws: StatementError.self) { _ = try row.get(5, as: Int.self) }
        #expect(coreInvalidArgumentMessage(outOfRange)?.contains("5") == true)
    }

    @Test func argumentMistakesThrowInvalidArgument() throws {
        let db = try makeDatabase(schema: Self.schema)
        let insert = "INSERT INTO person (id, name) VALUES (?, ?)"

        let tooFew = #expect(throws: StatementError.self) { try db.execute(insert, [1]) }
        let tooFewMessage = try #require(coreInvalidArgumentMessage(tooFew))
        #expect(tooFewMessage.contains("2 parameter(s)") && tooFewMessage.contains("1 argument(s)"))
        #expect(tooFewMessage.contains(insert))

        let tooMany = #expect(throws: StatementError.self) { try db.execute(insert, [1, "a", 3]) }
        #expect(coreInvalidArgumentMessage(tooMany)?.contains("3 argument(s)") == true)

        let none = #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT ?", as: Int.self) }
        #expect(coreInvalidArgumentMessage(none)?.contains("0 argument(s)") == true)

        let extra = #expect(throws: StatementError.self) { _ = try db.fetchRows("SELECT 1", [1]) }
        #expect(coreInvalidArgumentMessage(extra)?.contains("0 parameter(s)") == true)

        let named = "INSERT INTO person (id, name) VALUES (:id, :name)"
        let unknown = #expect(throws: StatementError.self) {
            try db.execute(named, ["id": 1, "name": "a", "nmae": "typo"])
        }
        #expect(coreInvalidArgumentMessage(unknown)?.contains("no parameter named nmae") == true)

        let missing = #expect(throws: StatementError.self) { try db.execute(named, ["id": 1]) }
        #expect(coreInvalidArgumentMessage(missing)?.contains("missing value for parameter :name") == true)

        var mixed = StatementArguments([1])
        mixed.named["name"] = .text("a")
        let mix = #expect(throws: StatementError.self) { try db.execute(named, mixed) }
        #expect(coreInvalidArgumentMessage(mix)?.contains("mix") == true)

        let namedForPositional = #expect(throws: StatementError.self) {
            try db.execute(insert, ["id": 1, "name": "a"])
        }
        #expect(coreInvalidArgumentMessage(namedForPositional)?.contains("no parameter named") == true)

        // Nothing was written, and the cached statements still work.
        #expect(try coreCount(db, "person") == 0)
        try db.execute(insert, [1, "ok"])
        try db.execute(named, ["id": 2, "name": "ok too"])
        #expect(try names(db) == ["ok", "ok too"])
    }

    /// Without arguments, SQL containing a semicolon runs as a script; its
    /// parameters must not be silently bound to NULL.
    @Test func missingArgumentsAreAnErrorEvenWhenTheSQLHasASemicolon() throws {
        let db = try makeDatabase(schema: Self.schema)
        // A semicolon inside a string literal does not make the SQL a script
        // whose parameters may go unbound: missing arguments are still an error.
        let semicolon = "INSERT INTO person (id, name, age) VALUES (7, 'semi;colon', ?)"
        let unbound = #expect(throws: StatementError.self) { try db.execute(semicolon) }
        #expect(coreInvalidArgumentMessage(unbound)?.contains("1 parameter(s) but 0 argument(s)") == true)
        // The same for a script: a parameter cannot be silently bound to NULL.
        let scriptWithParameter = #expect(throws: StatementError.self) {
            try db.execute("INSERT INTO person (id, name) VALUES (8, 'script'); UPDATE person SET age = ? WHERE id = 8")
        }
        #expect(coreInvalidArgumentMessage(scriptWithParameter) != nil)

        #expect(try coreCount(db, "person") == 0)
    }

    @Test func lastInsertedRowIDAndChanges() throws {
        let db = try makeDatabase(schema: Self.schema)
        try db.write { conn in
            try conn.execute("INSERT INTO person (name) VALUES ('a')")
            #expect(conn.lastInsertedRowID == 1)
            #expect(conn.changes == 1)
            try conn.execute("INSERT INTO person (id, name) VALUES (?, ?)", [42, "b"])
            #expect(conn.lastInsertedRowID == 42)
            try conn.execute("INSERT INTO person (name) VALUES ('c')")
            #expect(conn.lastInsertedRowID == 43)
            try conn.execute("INSERT INTO person (name, age) VALUES ('d', 1), ('e', 1), ('f', 2)")
            #expect(conn.changes == 3)
            #expect(conn.lastInsertedRowID == 46)
            try conn.execute("UPDATE person SET age = 9 WHERE age = 1")
            #expect(conn.changes == 2)
            try conn.execute("UPDATE person SET age = 9 WHERE id = 1000")
            #expect(conn.changes == 0)
            try conn.execute("DELETE FROM person WHERE id > ?", [42])
            #expect(conn.changes == 4)
        }
        #expect(
            try db.writeWithoutTransaction { conn -> Int64 in
                try conn.execute("INSERT INTO person (name) VALUES ('g')")
                return conn.lastInsertedRowID
            } == 43)
    }
}

// MARK: - Statement cache

@Suite("Core: statement cache")
struct CoreStatementCacheTests {
    @Test func sameSQLReusesThePreparedStatement() throws {
        let db = try Database.inMemory()
        try db.write { conn in
            try conn.execute("CREATE TABLE t (x INTEGER)")
            let sql = "INSERT INTO t (x) VALUES (?)"
            let first = try conn.cachedStatement(sql)
            #expect(first === (try conn.cachedStatement(sql)))
            try conn.execute(sql, [1])
            try conn.execute(sql, [2])
            #expect(first === (try conn.cachedStatement(sql)))
            _ = try conn.fetchValue("SELECT count(*) FROM t", as: Int.self)
            let count = try conn.cachedStatement("SELECT count(*) FROM t")
            _ = try conn.fetchValue("SELECT count(*) FROM t", as: Int.self)
            #expect(count === (try conn.cachedStatement("SELECT count(*) FROM t")))
            #expect(first !== count)
            // prepare always makes a new one.
            #expect(first !== (try conn.prepare(sql)))
            #expect(first.sql == sql)
            #expect(first.parameterCount == 1)
        }
        #expect(try db.fetchValue("SELECT sum(x) FROM t", as: Int.self) == 3)
    }

    /// SQLite re-prepares a cached statement after a schema change; the rows
    /// it gives must then have the new columns, under their own names.
    @Test func cachedStatementFollowsSchemaChanges() throws {
        let db = try Database.inMemory()
        try db.write { conn in
            try conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")
            try conn.execute("INSERT INTO t (a, b) VALUES (1, 'one')")
            let sql = "SELECT * FROM t"
            #expect(try conn.fetchRows(sql).first?.columnNames == ["a", "b"])

            try conn.execute("ALTER TABLE t ADD COLUMN c INTEGER DEFAULT 9")
            let added = try #require(try conn.fetchRows(sql).first)
            #expect(added.columnNames == ["a", "b", "c"])
            #expect(added.values == [.integer(1), .text("one"), .integer(9)])
            #expect(try conn.fetchRow(sql)?["c"] == .integer(9))

            try conn.execute("ALTER TABLE t DROP COLUMN a")
            let dropped = try #require(try conn.fetchRows(sql).first)
            #expect(dropped.columnNames == ["b", "c"])
            #expect(dropped["b"] == .text("one"))
            #expect(dropped["a"] == nil)
            #expect(try conn.fetchValue(sql, as: String.self) == "one")
        }
    }

    @Test func aStatementBeingIteratedIsNotHandedOutAgain() throws {
        let db = try Database.inMemory()
        try db.write { conn in
            try conn.execute("CREATE TABLE t (x INTEGER)")
            try conn.execute("INSERT INTO t (x) VALUES (1), (2), (3)")
            let sql = "SELECT x FROM t ORDER BY x"
            let outer = try conn.cachedStatement(sql)
            try outer.bind(StatementArguments())
            outer.isBusy = true
            #expect(try outer.step())
            #expect(try Row(statement: outer).get(0, as: Int.self) == 1)

            // A nested use of the same SQL gets another statement...
            let inner = try conn.cachedStatement(sql)
            #expect(inner !== outer)
            // ...and does not disturb the outer iteration.
            #expect(try conn.fetchRows(sql).map { try $0.get(0, as: Int.self) } == [1, 2, 3])
            #expect(try conn.fetchValue(sql, as: Int.self) == 1)
            #expect(try conn.fetchRow(sql)?.get(0, as: Int.self) == 1)
            #expect(try outer.step())
            #expect(try Row(statement: outer).get(0, as: Int.self) == 2)
            #expect(try outer.step())
            #expect(try Row(statement: outer).get(0, as: Int.self) == 3)
            #expect(try !outer.step())
            outer.isBusy = false
            outer.reset()
            // Once free, the cached statement is handed out again.
            #expect(outer === (try conn.cachedStatement(sql)))
        }
    }
}

// MARK: - Errors

@Suite("Core: errors")
struct CoreErrorTests {
    private static let schema = """
        CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT);
        CREATE TABLE child (
            id INTEGER PRIMARY KEY,
            parent_id INTEGER NOT NULL REFERENCES parent (id),
            name TEXT NOT NULL UNIQUE,
            quantity INTEGER CHECK (quantity >= 0)
        );
        CREATE TABLE strict_table (id INTEGER PRIMARY KEY, number INTEGER, label TEXT) STRICT;
        INSERT INTO parent (id, name) VALUES (1, 'p1');
        INSERT INTO child (id, parent_id, name, quantity) VALUES (1, 1, 'c1', 5);
        INSERT INTO strict_table (id, number, label) VALUES (1, 10, 'ten');
        """

    private func snapshot(_ db: Database) throws -> [[[DatabaseValue]]] {
        try ["parent", "child", "strict_table"].map { try coreDump(db, $0) }
    }

    /// Runs `sql` (one statement), expecting a `DatabaseError` of `kind` with
    /// the given extended code, message and SQL, and no change to the data.
    private func expectFailure(
        _ sql: String, _ arguments: StatementArguments = StatementArguments(),
        kind: DatabaseError.Kind, code: Int32, message: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let db = try makeDatabase(schema: Self.schema)
        let before = try snapshot(db)
        let error = #expect(throws: DatabaseError.self, sourceLocation: sourceLocation) {
            try db.execute(sql, arguments)
        }
        #expect(error?.kind == kind, sourceLocation: sourceLocation)
        #expect(error?.extendedCode == code, sourceLocation: sourceLocation)
        #expect(
            error?.message.contains(message) == true, "message: \(error?.message ?? "-")",
            sourceLocation: sourceLocation)
        #expect(error?.sql == sql, sourceLocation: sourceLocation)
        #expect(error.map { "\($0)" }?.contains(sql) == true, sourceLocation: sourceLocation)
        #expect(try snapshot(db) == before, "data changed", sourceLocation: sourceLocation)
        // The connection is usable afterwards.
        try db.execute("INSERT INTO parent (name) VALUES ('after')")
        #expect(try coreCount(db, "parent") == 2, sourceLocation: sourceLocation)
    }

    @Test func malformedSQL() throws {
        try expectFailure(
            "INSERT INTO parent VALUES (", kind: .sqlError, code: CoreCode.error, message: "incomplete input")
        try expectFailure(
            "INSERT INTO parent VALUES (1, 'a'),", kind: .sqlError, code: CoreCode.error, message: "incomplete input")
        try expectFailure("SELEKT * FROM parent", kind: .sqlError, code: CoreCode.error, message: "syntax error")
    }

    @Test func unknownTableAndColumn() throws {
        try expectFailure(
            "INSERT INTO nowhere (x) VALUES (1)", kind: .sqlError, code: CoreCode.error,
            message: "no such table: nowhere")
        try expectFailure(
            "UPDATE parent SET nope = 1", kind: .sqlError, code: CoreCode.error, message: "no such column: nope")
        try expectFailure(
            "INSERT INTO parent (id, nope) VALUES (?, ?)", [5, 1], kind: .sqlError, code: CoreCode.error,
            message: "nope")
    }

    @Test func notNullViolation() throws {
        try expectFailure(
            "INSERT INTO child (id, parent_id, name) VALUES (?, ?, ?)", [2, 1, nil],
            kind: .notNullViolation, code: CoreCode.notNull, message: "NOT NULL constraint failed: child.name")
    }

    @Test func uniqueViolation() throws {
        try expectFailure(
            "INSERT INTO child (id, parent_id, name) VALUES (?, ?, ?)", [2, 1, "c1"],
            kind: .uniqueViolation, code: CoreCode.unique, message: "UNIQUE constraint failed: child.name")
        try expectFailure(
            "INSERT INTO parent (id, name) VALUES (1, 'again')",
            kind: .uniqueViolation, code: CoreCode.primaryKey, message: "UNIQUE constraint failed: parent.id")
    }

    @Test func checkViolation() throws {
        try expectFailure(
            "UPDATE child SET quantity = ? WHERE id = 1", [-1],
            kind: .checkViolation, code: CoreCode.check, message: "CHECK constraint failed")
    }

    @Test func foreignKeyViolation() throws {
        try expectFailure(
            "INSERT INTO child (id, parent_id, name) VALUES (?, ?, ?)", [2, 99, "orphan"],
            kind: .foreignKeyViolation, code: CoreCode.foreignKey, message: "FOREIGN KEY constraint failed")
        try expectFailure(
            "DELETE FROM parent WHERE id = 1",
            kind: .foreignKeyViolation, code: CoreCode.foreignKey, message: "FOREIGN KEY constraint failed")
    }

    @Test func wrongTypeInAStrictTable() throws {
        try expectFailure(
            "INSERT INTO strict_table (id, number) VALUES (?, ?)", [2, "not a number"],
            kind: .typeMismatch, code: CoreCode.dataType,
            message: "cannot store TEXT value in INTEGER column strict_table.number")
    }

    @Test func errorsAreConstraintViolationsOrNot() throws {
        let db = try makeDatabase(schema: Self.schema)
        let unique = #expect(throws: DatabaseError.self) { try db.execute("INSERT INTO parent (id) VALUES (1)") }
        #expect(unique?.isConstraintViolation == true)
        #expect(unique?.code == CoreCode.constraint)
        let syntax = #expect(throws: DatabaseError.self) { try db.execute("NOT SQL") }
        #expect(syntax?.isConstraintViolation == false)
        #expect(syntax?.description.contains("NOT SQL") == true)
    }

    @Test func preparingTwoStatementsThrows() throws {
        let db = try Database.inMemory()
        try db.write { conn in
            let error = #expect(throws: DatabaseError.self) { _ = try conn.prepare("SELECT 1; SELECT 2") }
            #expect(error?.kind == .misuse)
            #expect(error?.message.contains("SELECT 2") == true)
            #expect(error?.sql == "SELECT 1; SELECT 2")
            // With arguments, execute prepares one statement too.
            let withArguments = #expect(throws: DatabaseError.self) {
                try conn.execute("CREATE TABLE a (x); INSERT INTO a VALUES (?)", [1])
            }
            #expect(withArguments?.message.contains("INSERT INTO a") == true)
            #expect(try conn.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 'a'", as: Int.self) == 0)
            // Trailing semicolons and comments are fine.
            _ = try conn.prepare("SELECT 1; -- done\n ; /* really */")
            let empty = #expect(throws: DatabaseError.self) { _ = try conn.prepare("  -- nothing") }
            #expect(empty?.kind == .misuse)
        }
    }

    /// In a script, the error names the statement that failed.
    @Test func anErrorInAScriptNamesTheFailingStatement() throws {
        let db = try makeDatabase(schema: Self.schema)
        let before = try snapshot(db)
        let syntax = #expect(throws: DatabaseError.self) {
            try db.execute(
                "INSERT INTO parent (id) VALUES (10); SELEKT name FROM parent; INSERT INTO parent (id) VALUES (11)")
        }
        #expect(syntax?.kind == .sqlError)
        #expect(syntax?.message.contains("syntax error") == true)
        #expect(syntax?.sql?.contains("SELEKT name FROM parent") == true, "sql: \(syntax?.sql ?? "nil")")
        #expect(syntax?.sql?.contains("VALUES (10)") == false)

        let unknown = #expect(throws: DatabaseError.self) {
            try db.execute(
                """
                INSERT INTO parent (id) VALUES (10); INSERT INTO nowhere VALUES (1); INSERT INTO parent (id) \
                VALUES (11)
                """)
        }
        #expect(unknown?.message.contains("no such table: nowhere") == true)
        #expect(unknown?.sql?.contains("INSERT INTO nowhere VALUES (1)") == true)
        #expect(unknown?.sql?.contains("VALUES (11)") == false)
        #expect(try snapshot(db) == before)
    }

    @Test func aFailingStatementRollsBackTheWholeWrite() throws {
        let db = try makeDatabase(schema: Self.schema)
        let before = try snapshot(db)
        let error = #expect(throws: DatabaseError.self) {
            try db.write { conn in
                try conn.execute("INSERT INTO parent (id, name) VALUES (2, 'p2')")
                try conn.execute("UPDATE child SET quantity = 100")
                try conn.execute("INSERT INTO strict_table (id, number) VALUES (2, 20)")
                try conn.execute("INSERT INTO child (id, parent_id, name) VALUES (?, ?, ?)", [3, 2, nil])
                try conn.execute("INSERT INTO parent (id, name) VALUES (3, 'never')")
            }
        }
        #expect(error?.kind == .notNullViolation)
        #expect(try snapshot(db) == before)

        // The same for a script: its earlier statements are undone.
        let script = #expect(throws: DatabaseError.self) {
            try db.execute(
                """
                INSERT INTO parent (id, name) VALUES (5, 'p5');
                DELETE FROM child;
                INSERT INTO child (id, parent_id, name) VALUES (9, 77, 'dangling');
                INSERT INTO parent (id, name) VALUES (6, 'p6');
                """)
        }
        #expect(script?.kind == .foreignKeyViolation)
        #expect(script?.sql?.contains("dangling") == true)
        #expect(try snapshot(db) == before)
        #expect(try db.writeWithoutTransaction { $0.isInTransaction } == false)
    }
}

// MARK: - Transactions

@Suite("Core: transactions")
struct CoreTransactionTests {
    private static let schema = "CREATE TABLE t (x INTEGER)"

    private func values(_ db: Database) throws -> [Int] {
        try db.fetchRows("SELECT x FROM t ORDER BY rowid").map { try $0.get(0, as: Int.self) }
    }

    @Test(arguments: [TransactionKind.deferred, .immediate, .exclusive])
    func transactionCommitsOnReturn(_ kind: TransactionKind) throws {
        let db = try makeDatabase(schema: Self.schema)
        let result = try db.transaction(kind) { conn -> String in
            #expect(conn.isInTransaction)
            try conn.execute("INSERT INTO t (x) VALUES (1)")
            try conn.execute("INSERT INTO t (x) VALUES (2)")
            return "done"
        }
        #expect(result == "done")
        #expect(try values(db) == [1, 2])
        #expect(try db.writeWithoutTransaction { $0.isInTransaction } == false)
    }

    @Test(arguments: [TransactionKind.deferred, .immediate, .exclusive])
    func transactionRollsBackWhenTheClosureThrows(_ kind: TransactionKind) throws {
        let db = try makeDatabase(schema: Self.schema)
        try db.execute("INSERT INTO t (x) VALUES (0)")
        #expect(throws: CoreTestError()) {
            try db.transaction(kind) { conn in
                try conn.execute("INSERT INTO t (x) VALUES (1)")
                try conn.execute("DELETE FROM t WHERE x = 0")
                throw CoreTestError()
            }
        }
        #expect(try values(db) == [0])
        #expect(try db.writeWithoutTransaction { $0.isInTransaction } == false)
    }

    /// IMMEDIATE and EXCLUSIVE take the write lock at BEGIN; DEFERRED does not
    /// until it writes. Observed from a second connection that does not wait.
    @Test(arguments: [(TransactionKind.deferred, false), (.immediate, true), (.exclusive, true)])
    func transactionKindDecidesWhenTheWriteLockIsTaken(_ kind: TransactionKind, locksAtBegin: Bool) throws {
        try withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("db.sqlite").path
            let db = try Database(path: path)
            defer { try? db.close() }
            var impatient = Database.Configuration()
            impatient.busyTimeout = .zero
            let other = try Database(path: path, configuration: impatient)
            defer { try? other.close() }
            try db.execute("CREATE TABLE t (x INTEGER)")
            try db.transaction(kind) { conn in
                _ = try conn.fetchValue("SELECT count(*) FROM t", as: Int.self)
                if locksAtBegin {
                    let error = #expect(throws: DatabaseError.self) {
                        try other.execute("INSERT INTO t (x) VALUES (1)")
                    }
                    #expect(error?.kind == .busy)
                } else {
                    try other.execute("INSERT INTO t (x) VALUES (1)")
                }
            }
            #expect(try coreCount(db, "t") == (locksAtBegin ? 0 : 1))
            // Database.write is IMMEDIATE.
            try db.write { _ in
                let error = #expect(throws: DatabaseError.self) { try other.execute("INSERT INTO t (x) VALUES (2)") }
                #expect(error?.kind == .busy)
            }
        }
    }

    @Test func nestedTransactionIsASavepoint() throws {
        let db = try makeDatabase(schema: Self.schema)
        try db.write { conn in
            try conn.execute("INSERT INTO t (x) VALUES (1)")
            // A caught inner failure undoes only the inner part.
            #expect(throws: CoreTestError()) {
                try conn.transaction(.immediate) {
                    try conn.execute("INSERT INTO t (x) VALUES (2)")
                    try conn.execute("DELETE FROM t WHERE x = 1")
                    throw CoreTestError()
                }
            }
            #expect(conn.isInTransaction)
            #expect(try conn.fetchRows("SELECT x FROM t").map { try $0.get(0, as: Int.self) } == [1])
            // A successful inner transaction joins the outer one.
            try conn.transaction {
                try conn.execute("INSERT INTO t (x) VALUES (3)")
                // Deeper nesting: failure in the innermost only.
                try? conn.transaction {
                    try conn.execute("INSERT INTO t (x) VALUES (4)")
                    throw CoreTestError()
                }
                try conn.execute("INSERT INTO t (x) VALUES (5)")
            }
            #expect(conn.isInTransaction)
            // An inner SQL error caught by the caller also undoes only the inner part.
            let error = #expect(throws: DatabaseError.self) {
                try conn.transaction {
                    try conn.execute("INSERT INTO t (x) VALUES (6)")
                    try conn.execute("INSERT INTO nowhere VALUES (1)")
                }
            }
            #expect(error?.kind == .sqlError)
        }
        #expect(try values(db) == [1, 3, 5])
    }

    @Test func outerRollbackUndoesCommittedInnerTransactions() throws {
        let db = try makeDatabase(schema: Self.schema)
        #expect(throws: CoreTestError()) {
            try db.write { conn in
                try conn.execute("INSERT INTO t (x) VALUES (1)")
                try conn.transaction { try conn.execute("INSERT INTO t (x) VALUES (2)") }
                try conn.savepoint { try conn.execute("INSERT INTO t (x) VALUES (3)") }
                throw CoreTestError()
            }
        }
        #expect(try values(db) == [])
    }

    @Test func savepoints() throws {
        let db = try makeDatabase(schema: Self.schema)
        try db.write { conn in
            try conn.savepoint { try conn.execute("INSERT INTO t (x) VALUES (1)") }
            try? conn.savepoint {
                try conn.execute("INSERT INTO t (x) VALUES (2)")
                try conn.savepoint { try conn.execute("INSERT INTO t (x) VALUES (3)") }
                throw CoreTestError()
            }
            let value = try conn.savepoint { () -> Int in
                try conn.execute("INSERT INTO t (x) VALUES (4)")
                return 4
            }
            #expect(value == 4)
            #expect(conn.isInTransaction)
        }
        #expect(try values(db) == [1, 4])

        // Outside a transaction a savepoint is a transaction of its own.
        try db.writeWithoutTransaction { conn in
            #expect(!conn.isInTransaction)
            try conn.savepoint {
                #expect(conn.isInTransaction)
                try conn.execute("INSERT INTO t (x) VALUES (5)")
            }
            #expect(!conn.isInTransaction)
            #expect(throws: CoreTestError()) {
                try conn.savepoint {
                    try conn.execute("INSERT INTO t (x) VALUES (6)")
                    throw CoreTestError()
                }
            }
            #expect(!conn.isInTransaction)
        }
        #expect(try values(db) == [1, 4, 5])
    }

    @Test func isInTransaction() throws {
        let db = try makeDatabase(schema: Self.schema)
        #expect(try db.writeWithoutTransaction { $0.isInTransaction } == false)
        #expect(try db.write { $0.isInTransaction })
        #expect(try db.read { $0.isInTransaction })
        #expect(try db.transaction(.deferred) { $0.isInTransaction })
        try db.writeWithoutTransaction { conn in
            try conn.execute("BEGIN")
            #expect(conn.isInTransaction)
            try conn.execute("ROLLBACK")
            #expect(!conn.isInTransaction)
        }
    }

    @Test func asyncFormsCommitAndRollBack() async throws {
        let db = try Database.inMemory()
        try await db.write { try $0.execute("CREATE TABLE t (x INTEGER)") }
        let id = try await db.write { conn -> Int64 in
            try conn.execute("INSERT INTO t (x) VALUES (1)")
            return conn.lastInsertedRowID
        }
        #expect(id == 1)
        try await db.transaction(.immediate) { conn in
            #expect(conn.isInTransaction)
            try conn.execute("INSERT INTO t (x) VALUES (2)")
        }
        #expect(try await db.read { try $0.fetchValue("SELECT sum(x) FROM t", as: Int.self) } == 3)

        await #expect(throws: CoreTestError()) {
            try await db.write { conn in
                try conn.execute("INSERT INTO t (x) VALUES (10)")
                throw CoreTestError()
            }
        }
        await #expect(throws: CoreTestError()) {
            try await db.transaction(.immediate) { conn in
                try conn.execute("DELETE FROM t")
                throw CoreTestError()
            }
        }
        await #expect(throws: CoreTestError()) {
            try await db.read { _ in throw CoreTestError() }
        }
        let failing = await #expect(throws: DatabaseError.self) {
            try await db.write { conn in
                try conn.execute("INSERT INTO t (x) VALUES (20)")
                try conn.execute("INSERT INTO t (x) VALUES ('a', 'b')")
            }
        }
        #expect(failing?.kind == .sqlError)
        #expect(
            try await db.read { try $0.fetchRows("SELECT x FROM t ORDER BY x").map { try $0.get(0, as: Int.self) } }
                == [1, 2])
    }

    @Test func asyncReadOnAFileDatabase() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            try await db.write { conn in
                try conn.execute("CREATE TABLE t (x INTEGER)")
                try conn.execute("INSERT INTO t (x) VALUES (1), (2)")
            }
            #expect(try await db.read { try $0.fetchValue("SELECT sum(x) FROM t", as: Int.self) } == 3)
            let error = await #expect(throws: DatabaseError.self) {
                try await db.read { try $0.execute("DELETE FROM t") }
            }
            #expect(error?.kind == .readOnly)
            #expect(try await db.read { try $0.fetchValue("SELECT count(*) FROM t", as: Int.self) } == 2)
            try db.close()
        }
    }

    /// A deferred foreign key makes COMMIT itself fail: the transaction must be
    /// rolled back (not left open) and the error thrown.
    @Test func failedCommitRollsBackAndThrows() throws {
        let db = try Database.inMemory()
        try db.execute(
            """
            CREATE TABLE parent (id INTEGER PRIMARY KEY);
            CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent (id));
            INSERT INTO parent (id) VALUES (1);
            INSERT INTO child (id, parent_id) VALUES (1, 1);
            """)
        let before = try [coreDump(db, "parent"), coreDump(db, "child")]
        let error = #expect(throws: DatabaseError.self) {
            try db.write { conn in
                try conn.execute("PRAGMA defer_foreign_keys = ON")
                try conn.execute("INSERT INTO parent (id) VALUES (2)")
                try conn.execute("INSERT INTO child (id, parent_id) VALUES (2, 99)")  // dangling, checked at COMMIT
                try conn.execute("INSERT INTO child (id, parent_id) VALUES (3, 2)")
            }
        }
        #expect(error?.kind == .foreignKeyViolation)
        #expect(error?.extendedCode == CoreCode.foreignKey)
        #expect(error?.message.contains("FOREIGN KEY constraint failed") == true)
        #expect(error?.sql?.uppercased().hasPrefix("COMMIT") == true)
        #expect(try [coreDump(db, "parent"), coreDump(db, "child")] == before)
        #expect(try db.writeWithoutTransaction { $0.isInTransaction } == false)
        // The writer is usable: the next write commits.
        try db.write { conn in try conn.execute("INSERT INTO child (id, parent_id) VALUES (4, 1)") }
        #expect(try coreCount(db, "child") == 2)

        // The same through the outermost savepoint's RELEASE.
        let released = #expect(throws: DatabaseError.self) {
            try db.writeWithoutTransaction { conn in
                try conn.savepoint {
                    try conn.execute("PRAGMA defer_foreign_keys = ON")
                    try conn.execute("INSERT INTO child (id, parent_id) VALUES (5, 98)")
                }
            }
        }
        #expect(released?.kind == .foreignKeyViolation)
        #expect(try coreCount(db, "child") == 2)
        #expect(try db.writeWithoutTransaction { $0.isInTransaction } == false)
    }
}
