import Foundation
import Testing
@testable import Tether

// sModel's batch processing, from its README: statements made by a model's
// `createSaveStatement` / `createDeleteStatement`, run together by
// `DBManager.executeStatements` in one transaction.

/// sModel's example model: `Thing` with the primary key `tid`.
struct SmThing: Model, Equatable {
    var tid: String
    var name: String?
    static let tableName = "Thing"
    static var primaryKey: [ColumnRef<SmThing>] { ["tid"] }
}

@Suite("sModel: statements run together in one transaction") struct ORMsModelStatementTests {
    private func things() throws -> Database {
        let db = try Database.inMemory()
        try db.createTable(SmThing.self)
        try db.insert(SmThing(tid: "tid0", name: "thing 0"))
        return db
    }

    @Test func statementsRunInOrderInOneTransaction() throws {
        let db = try things()
        let statements = [
            SmThing(tid: "tid1", name: "thing 1").saveStatement(),
            SmThing(tid: "tid2", name: "thing 2").saveStatement(),
            SmThing(tid: "tid1", name: "thing 1, renamed").saveStatement(),
            SmThing(tid: "tid0", name: nil).deleteStatement(),
            .sql("UPDATE Thing SET name = name || ? WHERE tid = ?", ["!", "tid2"]),
        ]
        try db.execute(statements)
        #expect(
            try db.fetchAll(SmThing.query.orderBy("tid")) == [
                SmThing(tid: "tid1", name: "thing 1, renamed"), SmThing(tid: "tid2", name: "thing 2!"),
            ])
        #expect(
            statements.map(\.description) == [
                "save SmThing", "save SmThing", "save SmThing", "delete SmThing",
                "UPDATE Thing SET name = name || ? WHERE tid = ?",
            ])
    }

    @Test func aFailingStatementUndoesTheOthersAndSaysWhichFailed() throws {
        let db = try things()
        let statements: [WriteStatement] = [
            SmThing(tid: "tid1", name: "thing 1").saveStatement(),
            .insert(SmThing(tid: "tid0", name: "again")),  // the key is taken
            SmThing(tid: "tid0", name: nil).deleteStatement(),
        ]
        do {
            try db.execute(statements)
            Issue.record("expected the batch to fail")
        } catch let failure as BatchFailure<WriteStatement> {
            #expect(failure.index == 1)
            #expect(failure.element.description == "insert SmThing")
            guard case let .duplicate(existing, _)? = failure.error as? ModelError else {
                Issue.record("expected ModelError.duplicate, got \(failure.error)")
                return
            }
            #expect(existing as? SmThing == SmThing(tid: "tid0", name: "thing 0"))
        }
        #expect(try db.fetchAll(SmThing.self) == [SmThing(tid: "tid0", name: "thing 0")])
    }
}
