import Foundation
import Testing
@testable import Tether

// Helpers shared by the Core*Tests files. Every top-level name starts with
// `core`/`Core` so that it cannot collide with the ORM tests' helpers.

/// SQLite's (extended) result codes used by the assertions, spelled out so that
/// the tests do not depend on importing CSQLite.
enum CoreCode {
    static let error: Int32 = 1  // SQLITE_ERROR
    static let busy: Int32 = 5  // SQLITE_BUSY
    static let readOnly: Int32 = 8  // SQLITE_READONLY
    static let cannotOpen: Int32 = 14  // SQLITE_CANTOPEN
    static let constraint: Int32 = 19  // SQLITE_CONSTRAINT
    static let misuse: Int32 = 21  // SQLITE_MISUSE
    static let notADatabase: Int32 = 26  // SQLITE_NOTADB
    static let check: Int32 = 275  // SQLITE_CONSTRAINT_CHECK
    static let foreignKey: Int32 = 787  // SQLITE_CONSTRAINT_FOREIGNKEY
    static let notNull: Int32 = 1299  // SQLITE_CONSTRAINT_NOTNULL
    static let primaryKey: Int32 = 1555  // SQLITE_CONSTRAINT_PRIMARYKEY
    static let unique: Int32 = 2067  // SQLITE_CONSTRAINT_UNIQUE
    static let dataType: Int32 = 3091  // SQLITE_CONSTRAINT_DATATYPE
}

/// An error thrown on purpose by test closures.
struct CoreTestError: Error, Equatable {}

/// The message of a `StatementError.invalidArgument`, or nil for any other error.
func coreInvalidArgumentMessage(_ error: StatementError?) -> String? {
    if case let .invalidArgument(message)? = error { return message }
    return nil
}

/// Every row of `table`, ordered by rowid, as raw values: used to check that a
/// failed operation left the data unchanged.
func coreDump(_ conn: Connection, _ table: String) throws -> [[DatabaseValue]] {
    try conn.fetchRows("SELECT * FROM \(table) ORDER BY rowid").map(\.values)
}

func coreDump(_ db: Database, _ table: String) throws -> [[DatabaseValue]] {
    try db.read { try coreDump($0, table) }
}

func coreCount(_ db: Database, _ table: String) throws -> Int {
    try db.fetchValue("SELECT count(*) FROM \(table)", as: Int.self) ?? -1
}

/// Runs each body on its own thread (not a pool, so that they really run at
/// the same time even when some block or spin) and waits for all of them.
func coreRunOnThreads(_ bodies: [@Sendable () -> Void]) {
    let group = DispatchGroup()
    for body in bodies {
        group.enter()
        let thread = Thread {
            body()
            group.leave()
        }
        thread.start()
    }
    group.wait()
}
