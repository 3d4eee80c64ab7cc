import CSQLite
import Foundation
import Testing
@testable import Tether

/// The core's observer seam: what a connection reports, in which order, and how it tells
/// transaction boundaries (from SQLite's authorizer, never from the SQL text).
@Suite struct CoreObserverTests {
    /// Records every event as a line.
    final class Recorder: TransactionObserver {
        var events: [String] = []
        var writesInTransaction: Bool
        var observesStatements: Bool { true }
        init(writesInTransaction: Bool = false) { self.writesInTransaction = writesInTransaction }

        func statementWillExecute(_ statement: Statement, _ connection: Connection) throws {
            events.append("will execute \(statement.sql)")
        }
        func rowWillChange(_ change: PreUpdateChange) {
            let kind =
                change.operation == SQLITE_INSERT ? "insert" : change.operation == SQLITE_DELETE ? "delete" : "update"
            events.append(
                """
                \(kind) \(String(cString: change.tableName)) \
                \(change.operation == SQLITE_DELETE ? change.oldRowid : change.newRowid)
                """)
        }
        func statementDidExecute(_ statement: Statement, _ connection: Connection) throws {
            events.append("did execute")
        }
        func statementDidFail(_ statement: Statement, _ connection: Connection) { events.append("did fail") }
        func transactionWillCommit(_ connection: Connection) throws { events.append("will commit") }
        func transactionShouldCommit() -> Bool { events.append("should commit"); return true }
        func transactionDidCommit(_ connection: Connection) { events.append("did commit") }
        func transactionWillRollBack(_ connection: Connection) { events.append("will roll back") }
        func transactionDidRollBack() { events.append("did roll back") }
    }

    func connection() throws -> Connection {
        let connection = try Connection(path: ":memory:", flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
        try connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
        return connection
    }

    @Test func theAuthorizerTellsWhatAStatementDoesToTransactionsWhateverItsText() throws {
        let connection = try connection()
        let cases: [(String, TransactionEffect)] = [
            ("  begin immediate", .begins), ("SAVEPOINT s", .begins),
            ("/* the end */ COMMIT", .commits), ("END TRANSACTION", .commits), ("release s", .commits),
            ("-- undo\nROLLBACK", .rollsBack), ("ROLLBACK TO s", .rollsBack),
            ("SELECT 'COMMIT'", .none), ("INSERT INTO t (name) VALUES ('rollback')", .none),
        ]
        for (sql, effect) in cases {
            #expect(try connection.prepare(sql).transactionEffect == effect, "\(sql)")
        }
    }

    @Test func aWriteInATransactionReportsItsStatementItsRowsAndTheCommitInOrder() throws {
        let connection = try connection()
        let recorder = Recorder()
        connection.add(recorder)
        try connection.execute("BEGIN")
        try connection.execute("INSERT INTO t (id, name) VALUES (1, 'a'), (2, 'b')")
        try connection.execute("/* done */ COMMIT")
        #expect(
            recorder.events == [
                "will execute INSERT INTO t (id, name) VALUES (1, 'a'), (2, 'b')", "insert t 1", "insert t 2",
                "did execute",
                "will commit", "should commit", "did commit",
            ])
    }

    @Test func anAutocommitWriteRunsInASavepointWhenAnObserverWritesInTheTransaction() throws {
        let connection = try connection()
        let recorder = Recorder(writesInTransaction: true)
        connection.add(recorder)
        try connection.execute("UPDATE t SET name = 'x' WHERE id = 1")
        try connection.execute("INSERT INTO t (id, name) VALUES (3, 'c')")
        #expect(
            recorder.events.suffix(6) == [
                "will execute INSERT INTO t (id, name) VALUES (3, 'c')", "insert t 3", "did execute",
                "will commit", "should commit", "did commit",
            ])
        #expect(!connection.isInTransaction)
    }

    @Test func aFailedStatementAndARollbackAreReportedAndNothingIsCommitted() throws {
        let connection = try connection()
        try connection.execute("INSERT INTO t (id, name) VALUES (1, 'a')")
        let recorder = Recorder()
        connection.add(recorder)
        try connection.execute("BEGIN")
        #expect(throws: DatabaseError.self) { try connection.execute("INSERT INTO t (id, name) VALUES (1, 'again')") }
        try connection.execute("SAVEPOINT s")
        try connection.execute("DELETE FROM t WHERE id = 1")
        try connection.execute("ROLLBACK TO s")
        try connection.execute("ROLLBACK")
        #expect(
            recorder.events == [
                "will execute INSERT INTO t (id, name) VALUES (1, 'again')", "did fail",
                "will execute DELETE FROM t WHERE id = 1", "delete t 1", "did execute",
                "will roll back", "will roll back", "did roll back",
            ])
        #expect(!recorder.events.contains("did commit"))
        #expect(try connection.fetchValue("SELECT name FROM t WHERE id = 1", as: String.self) == "a")
    }

    @Test func withoutObserversStatementsStepUntouched() throws {
        let connection = try connection()
        let recorder = Recorder()
        connection.add(recorder)
        connection.remove(recorder)
        try connection.execute("INSERT INTO t (id, name) VALUES (1, 'a')")
        #expect(recorder.events.isEmpty)
        #expect(connection.activeObservers.isEmpty)
    }

    /// Keyword sniffing took "/* … */ COMMIT" for an ordinary statement: the sync metadata was not
    /// written before it, and the commit hook refused the COMMIT.
    @Test func aSyncedWriteCommitsWhateverTheCommitLooksLike() throws {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT)")
        try db.enableSync(table: "item")
        let before = try db.lastSequence()
        try db.writeWithoutTransaction { conn in
            try conn.execute("BEGIN")
            try conn.execute("INSERT INTO item VALUES (1, 'one')")
            try conn.execute("/* the application's own comment */ COMMIT")
        }
        #expect(try db.lastSequence() > before)
        let batch = try db.extractChanges(for: nil, after: before, markInFlight: false)
        #expect(batch.changes.map(\.key) == [[.integer(1)]])
    }
}
