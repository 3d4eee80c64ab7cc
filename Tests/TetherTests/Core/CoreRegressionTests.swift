import Foundation
import Testing
@testable import Tether
import TetherTestSupport

@Suite("Core: misuse is an error, not a hang") struct CoreMisuseTests {
    @Test func nestedReadsBeyondThePoolThrowInsteadOfWaiting() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        var configuration = Database.Configuration()
        configuration.maximumReaderCount = 1
        let db = try Database(path: directory.file("db.sqlite"), configuration: configuration)
        let error = #expect(throws: DatabaseError.self) {
            try db.read { _ in try db.read { _ in 1 } }
        }
        #expect(error?.kind == .misuse)
        // The pool is usable afterwards.
        #expect(try db.read { try $0.fetchValue("SELECT 1", as: Int.self) } == 1)
    }

    @Test func closingInsideAWriteThrowsAndLeavesTheWriteIntact() throws {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE t (x INTEGER)")
        let error = #expect(throws: DatabaseError.self) {
            try db.write { conn in
                try conn.execute("INSERT INTO t VALUES (1)")
                try db.close()
            }
        }
        #expect(error?.kind == .misuse)
        #expect(try db.fetchValue("SELECT count(*) FROM t", as: Int.self) == 0)
        try db.execute("INSERT INTO t VALUES (2)")
        #expect(try db.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1)
    }

    @Test func writingInsideAReadOfAnInMemoryDatabaseThrows() throws {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE t (x INTEGER)")
        let error = #expect(throws: DatabaseError.self) {
            try db.read { try $0.execute("INSERT INTO t VALUES (1)") }
        }
        #expect(error?.kind == .readOnly)
        #expect(try db.fetchValue("SELECT count(*) FROM t", as: Int.self) == 0)
        try db.execute("INSERT INTO t VALUES (1)")
        #expect(try db.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1)
    }
}
