import Foundation
import Testing
@testable import Tether
import TetherTestSupport

// Rows that expire (AgileDB's autoDeleteAfter): never returned after their date, deleted
// on open, before reads and writes, and by a timer.

struct ExpSession: Model, Equatable {
    var id: String
    var user: String
    static let tableName = "exp_session"
}

private let past = Date(timeIntervalSinceNow: -60)
private let later = Date(timeIntervalSinceNow: 3600)

/// The keys of `table`'s rows deleted in `db` from now on, as they are committed (the expiry
/// timer's deletions included): the event the tests await instead of polling.
func deletions(in db: Database, of table: String) -> (keys: AsyncStream<PrimaryKey>, token: ObservationToken) {
    let (stream, continuation) = AsyncStream.makeStream(of: PrimaryKey.self)
    let token = db.observe(.delete, in: table) { continuation.yield($0.key) }
    return (stream, token)
}

@Suite struct ORMExpiryTests {
    @Test func anExpiredRowIsReturnedByNoQuery() throws {
        let db = try Database.inMemory()
        try db.createTable(ExpSession.self)
        try db.insert(ExpSession(id: "keep", user: "arthur"))
        try db.insert(ExpSession(id: "s1", user: "arthur"), expiresAt: later)
        try db.save(ExpSession(id: "s2", user: "barbara"), expiresAt: later)
        #expect(try db.count(ExpSession.self) == 3)
        #expect(
            try db.expiry(of: ExpSession.self, key: PrimaryKey("s1"))?.timeIntervalSince1970
                == later.timeIntervalSince1970)
        // The date lives in Tether's table, not in the user's.
        #expect(
            try db.fetchRows("SELECT name FROM pragma_table_info('exp_session')").map { try $0.get(0, as: String.self) }
                == ["id", "user"])
        #expect(try db.fetchValue("SELECT count(*) FROM tether_expiry", as: Int.self) == 2)

        try db.setExpiry(of: ExpSession.self, key: PrimaryKey("s1"), to: past)
        #expect(try db.fetchAll(ExpSession.self).map(\.id) == ["keep", "s2"])
        #expect(
            try db.fetchRows("SELECT id FROM exp_session ORDER BY id").map { try $0.get(0, as: String.self) } == [
                "keep", "s2",
            ])
        #expect(try db.fetch(ExpSession.self, key: PrimaryKey("s1")) == nil)
        #expect(try db.fetchValue("SELECT count(*) FROM tether_expiry", as: Int.self) == 1)

        // A row inserted already expired is gone before anything reads it.
        try db.insert(ExpSession(id: "s3", user: "craig"), expiresAt: past)
        #expect(try db.fetchValue("SELECT count(*) FROM exp_session WHERE id = 's3'", as: Int.self) == 0)
    }

    @Test func anExpiryIsKeptBySavesRemovedOnRequestAndForgottenWithTheRow() throws {
        let db = try Database.inMemory()
        try db.createTable(ExpSession.self)
        try db.insert(ExpSession(id: "s1", user: "arthur"), expiresAt: later)
        try db.save(ExpSession(id: "s1", user: "arthur II"))
        #expect(try db.expiry(of: ExpSession.self, key: PrimaryKey("s1")) != nil)
        try db.setExpiry(of: ExpSession.self, key: PrimaryKey("s1"), to: nil)
        #expect(try db.expiry(of: ExpSession.self, key: PrimaryKey("s1")) == nil)

        // Deleted through the ORM: a row inserted again under the key does not inherit the date.
        try db.setExpiry(of: ExpSession.self, key: PrimaryKey("s1"), to: later)
        try db.delete(ExpSession.self, key: PrimaryKey("s1"))
        try db.insert(ExpSession(id: "s1", user: "again"))
        #expect(try db.expiry(of: ExpSession.self, key: PrimaryKey("s1")) == nil)
        #expect(try db.fetchValue("SELECT count(*) FROM tether_expiry", as: Int.self) == 0)

        let missing = ormExpectModelError(.notFound) {
            try db.setExpiry(of: ExpSession.self, key: PrimaryKey("nobody"), to: later)
        }
        #expect(missing?.description == "no row in exp_session with primary key 'nobody'")
        #expect(try db.deleteExpiredRows() == 0)
    }

    @Test func deleteExpiredRowsCountsTheRowsItDeletes() throws {
        let db = try Database.inMemory()
        // No timer: only the call below may delete the row once its date has passed.
        db.dueWork.stop()
        try db.createTable(ExpSession.self)
        try db.insert(ExpSession(id: "keep", user: "arthur"))
        try db.insert(ExpSession(id: "s1", user: "barbara"), expiresAt: later)
        try db.setExpiry(of: ExpSession.self, key: PrimaryKey("s1"), to: past)
        #expect(try db.deleteExpiredRows() == 1)
        #expect(try db.fetchAll(ExpSession.self).map(\.id) == ["keep"])
        #expect(try db.deleteExpiredRows() == 0)
    }

    @Test func aRowAForeignKeyKeepsStaysAndTheDatabaseStaysUsable() throws {
        let db = try Database.inMemory()
        try db.createTable(ExpSession.self)
        try db.execute(
            """
            CREATE TABLE exp_login (id INTEGER PRIMARY KEY, session TEXT NOT NULL REFERENCES exp_session (id) ON \
            DELETE RESTRICT)
            """)
        try db.insert(ExpSession(id: "held", user: "arthur"), expiresAt: later)
        try db.insert(ExpSession(id: "free", user: "barbara"), expiresAt: later)
        try db.execute("INSERT INTO exp_login (id, session) VALUES (1, 'held')")
        try db.setExpiry(of: ExpSession.self, key: PrimaryKey("held"), to: past)
        try db.setExpiry(of: ExpSession.self, key: PrimaryKey("free"), to: past)
        #expect(try db.fetchAll(ExpSession.self).map(\.id) == ["held"])
        #expect(try db.deleteExpiredRows() == 0)
        try db.execute("DELETE FROM exp_login")
        #expect(try db.deleteExpiredRows() == 1)
        #expect(try db.count(ExpSession.self) == 0)
    }

    @Test func aReadOnlyDatabaseRefusesExpiries() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("read-only.sqlite")
        do {
            let db = try Database(path: path)
            try db.createTable(ExpSession.self)
            try db.insert(ExpSession(id: "s1", user: "arthur"))
            try db.close()
        }
        var configuration = Database.Configuration()
        configuration.readOnly = true
        let db = try Database(path: path, configuration: configuration)
        let error = #expect(throws: DatabaseError.self) {
            try db.setExpiry(of: ExpSession.self, key: PrimaryKey("s1"), to: later)
        }
        #expect(error?.message == "the database is open read-only: rows cannot expire")
        #expect(try db.fetchAll(ExpSession.self).map(\.id) == ["s1"])
    }

    @Test(.timeLimit(.minutes(1))) func expiredRowsAreDeletedOnOpenAndByATimer() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("expiry.sqlite")
        do {
            let db = try Database(path: path)
            try db.createTable(ExpSession.self)
            try db.insert(ExpSession(id: "s1", user: "arthur"), expiresAt: later)
            // Expired behind the database's back: only the next open can know.
            try db.execute("UPDATE tether_expiry SET expires_at = ?", [past.timeIntervalSince1970])
            try db.close()
        }
        let reopened = try Database(path: path)
        // the open deleted it
        #expect(try reopened.fetchValue("SELECT count(*) FROM tether_expiry", as: Int.self) == 0)
        #expect(try reopened.fetchValue("SELECT count(*) FROM exp_session", as: Int.self) == 0)
        // A second database on the file, opened now, knows of no expiry: its reads delete nothing.
        let other = try Database(path: path)

        // The timer: nothing reads `reopened`, yet the row goes at its date.
        let deleted = deletions(in: reopened, of: ExpSession.tableName)
        try reopened.insert(ExpSession(id: "s2", user: "barbara"), expiresAt: Date(timeIntervalSinceNow: 0.3))
        #expect(try other.fetchValue("SELECT count(*) FROM exp_session", as: Int.self) == 1)
        var keys = deleted.keys.makeAsyncIterator()
        #expect(await keys.next() == PrimaryKey("s2"))
        #expect(try other.fetchValue("SELECT count(*) FROM exp_session", as: Int.self) == 0)
        deleted.token.cancel()
        try reopened.close()
        try other.close()
    }
}
