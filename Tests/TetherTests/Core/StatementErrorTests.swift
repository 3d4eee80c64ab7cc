import Testing
@testable import Tether

/// The core reports a misuse SQLite does not see as its own `StatementError`; the ORM reports
/// the same as the `ModelError` of the same name, so that ORM users catch one type.
@Suite struct StatementErrorTests {
    @Test func theCoreThrowsItsOwnErrorAndTheORMWrapsIt() throws {
        let db = try ormUserFixture()
        // Raw SQL: the core's error.
        let raw = #expect(throws: StatementError.self) {
            _ = try db.fetchValue("SELECT name FROM orm_user WHERE id = 1", as: Int.self)
        }
        guard case .typeMismatch(column: "name", expected: "Int", found: "TEXT", sql: _)? = raw else {
            Issue.record("expected typeMismatch, got \(String(describing: raw))"); return
        }
        // The same mistake through the ORM: a ModelError, with the same details and message.
        let orm = ormExpectModelError(.typeMismatch) {
            try db.aggregate(.maximum("name"), of: OrmUser.self, as: Int.self)
        }
        guard case .typeMismatch(column: _, expected: "Int", found: "TEXT", sql: _)? = orm else {
            Issue.record("expected typeMismatch, got \(String(describing: orm))"); return
        }
        #expect(orm?.description.contains("holds TEXT, which cannot be read as Int") == true)
        #expect(
            ModelError(StatementError.invalidArgument("no parameter named x")).description == "no parameter named x")
    }
}
