import Foundation
import Testing
@testable import Tether

// SundeedQLite's last features, from its README's Employer / Employee example:
// `save(withForeignKey:)`, `retrieve(excludeIfIsForeign:)`, the `<<` / `>>` sort marks,
// and nil elements dropped from arrays of plain values. (Employees are ORMNestedTests' NestEmployee.)

struct SunEmployer: Model, Equatable {
    var id: String
    var fullName: String?
    var employees: [NestEmployee]
    var manager: NestEmployee?
    static let tableName = "sun_employer"
    // fullName <~> map["fullName"]<<
    static var defaultOrder: [Ordering<SunEmployer>] { [.ascending("fullName")] }
}

/// The README's Employer as it declares it: `var employees: [Employee]?`.
struct SunOptionalTeamEmployer: Model, Equatable {
    var id: String
    var fullName: String?
    var employees: [NestEmployee]?
    static let tableName = "sun_optional_team_employer"
}

/// Sorted by two marks: `>>` on score, then `<<` on a key path.
struct SunScore: Model, Equatable {
    var id: Int64
    var name: String
    var score: Int
    static let tableName = "sun_score"
    static var defaultOrder: [Ordering<SunScore>] { [.descending("score"), .ascending(.column(\.name))] }
}

struct SunBadOrder: Model {
    var id: Int64
    static var defaultOrder: [Ordering<SunBadOrder>] { [.ascending("missing")] }
}

struct SunTagged: Model, Equatable {
    var id: Int64
    var tags: [String]
    var scores: [Int]
    var maybe: [String?]
    static let tableName = "sun_tagged"
}

@Suite("SundeedQLite: children by their parent's key, independent rows, sort marks, nil elements")
struct ORMSundeedQLiteTests {
    private let employerKey = PrimaryKey("ABCD-1234-EFGH-5678")

    private func employerDatabase() throws -> Database {
        let db = try Database.inMemory()
        try db.createTable(SunEmployer.self)
        try db.insert(SunEmployer(id: "ABCD-1234-EFGH-5678", fullName: "Nour Sandid", employees: [], manager: nil))
        return db
    }

    @Test func aChildSavedWithItsParentsKeyIsOneOfItsChildren() throws {
        let db = try employerDatabase()
        // employee.save(withForeignKey: "ABCD-1234-EFGH-5678")
        let employee = NestEmployee(id: "e1", firstName: "Nour")
        try db.save(employee, linkedTo: \SunEmployer.employees, of: employerKey)
        try db.save(NestEmployee(id: "e2", firstName: "Sami"), linkedTo: \SunEmployer.employees, of: employerKey)
        // Saved again: not twice.
        try db.save(NestEmployee(id: "e1", firstName: "Nour S."), linkedTo: \SunEmployer.employees, of: employerKey)
        #expect(try db.fetch(SunEmployer.self, key: employerKey)?.employees.map(\.firstName) == ["Nour S.", "Sami"])
        #expect(try db.fetchRows("SELECT employees FROM sun_employer").first?[0] == .text(#"["e1","e2"]"#))
        // One child: the link is replaced.
        try db.save(NestEmployee(id: "m1", firstName: "Maya"), linkedTo: \SunEmployer.manager, of: employerKey)
        #expect(try db.fetch(SunEmployer.self, key: employerKey)?.manager?.firstName == "Maya")
    }

    /// The README's `employees: [Employee]?`: a child saved with its employer's key joins the
    /// optional array (a nil one becomes an array of it), once.
    @Test func aChildSavedWithItsParentsKeyJoinsAnOptionalArray() throws {
        let db = try Database.inMemory()
        try db.createTable(SunOptionalTeamEmployer.self)
        try db.insert(SunOptionalTeamEmployer(id: "ABCD-1234-EFGH-5678", fullName: "Nour Sandid", employees: nil))
        // employee.save(withForeignKey: "ABCD-1234-EFGH-5678")
        try db.save(
            NestEmployee(id: "e1", firstName: "Nour"), linkedTo: \SunOptionalTeamEmployer.employees, of: employerKey)
        #expect(
            try db.fetch(SunOptionalTeamEmployer.self, key: employerKey)?.employees == [
                NestEmployee(id: "e1", firstName: "Nour")
            ])
        try db.save(
            NestEmployee(id: "e2", firstName: "Sami"), linkedTo: \SunOptionalTeamEmployer.employees, of: employerKey)
        // Saved again: not twice.
        try db.save(
            NestEmployee(id: "e1", firstName: "Nour S."), linkedTo: \SunOptionalTeamEmployer.employees, of: employerKey)
        #expect(
            try db.fetch(SunOptionalTeamEmployer.self, key: employerKey)?.employees?.map(\.firstName) == [
                "Nour S.", "Sami",
            ])
        #expect(
            try db.fetchRows("SELECT employees FROM sun_optional_team_employer").first?[0] == .text(#"["e1","e2"]"#))
        ormExpectModelError(.notFound) {
            try db.save(
                NestEmployee(id: "e9", firstName: "Lost"), linkedTo: \SunOptionalTeamEmployer.employees,
                of: PrimaryKey("nobody"))
        }
        #expect(try db.fetch(NestEmployee.self, key: PrimaryKey("e9")) == nil)
    }

    @Test func aChildForAParentThatDoesNotExistIsNotSaved() throws {
        let db = try employerDatabase()
        ormExpectModelError(.notFound) {
            try db.save(
                NestEmployee(id: "e9", firstName: "Lost"), linkedTo: \SunEmployer.employees, of: PrimaryKey("nobody"))
        }
        #expect(try db.count(NestEmployee.self) == 0)
    }

    @Test func excludingNestedChildrenLeavesOutEveryParentsChildren() throws {
        let db = try employerDatabase()
        let employee = NestEmployee(id: "e1", firstName: "Nour")
        try db.save(
            SunEmployer(
                id: "ABCD-1234-EFGH-5678", fullName: "Nour Sandid", employees: [employee],
                manager: NestEmployee(id: "m1", firstName: "Maya")))
        // Employee.retrieve(): every employee; retrieve(excludeIfIsForeign: true): none of the employer's.
        #expect(try db.fetchAll(NestEmployee.self).count == 2)
        #expect(try db.fetchAll(NestEmployee.query.excludingNestedChildren()).isEmpty)
        // An employee saved on its own is independent.
        try db.insert(NestEmployee(id: "e2", firstName: "Nour"))
        let independent = NestEmployee.where(\.firstName == "Nour").excludingNestedChildren()
        #expect(try db.fetchAll(independent) == [NestEmployee(id: "e2", firstName: "Nour")])
        #expect(try db.count(NestEmployee.query.excludingNestedChildren()) == 1)
        #expect(try db.fetchKeys(NestEmployee.query.excludingNestedChildren().limit(5)) == [PrimaryKey("e2")])
        // Deleting with it spares the children.
        #expect(try db.delete(NestEmployee.query.excludingNestedChildren()) == 1)
        #expect(try db.fetchAll(NestEmployee.self).map(\.id).sorted() == ["e1", "m1"])
        // A model no other model nests has no rows to leave out.
        #expect(try db.count(SunEmployer.query.excludingNestedChildren()) == 1)
    }

    @Test func theDefaultOrderSortsWhenAQueryNamesNone() throws {
        let db = try Database.inMemory()
        try db.createTable(SunEmployer.self)
        for (id, name) in [("3", "Test Employer"), ("1", "Nour Sandid"), ("2", "Adam")] {
            try db.insert(SunEmployer(id: id, fullName: name, employees: [], manager: nil))
        }
        #expect(try db.fetchAll(SunEmployer.self).compactMap(\.fullName) == ["Adam", "Nour Sandid", "Test Employer"])
        #expect(try db.fetchFirst(SunEmployer.query)?.fullName == "Adam")
        #expect(try db.fetchKeys(SunEmployer.query) == [PrimaryKey("2"), PrimaryKey("1"), PrimaryKey("3")])
        // A query's own order wins.
        #expect(try db.fetchAll(SunEmployer.query.orderBy("id")).map(\.id) == ["1", "2", "3"])

        try db.createTable(SunScore.self)
        try db.insert(contentsOf: [
            SunScore(id: 1, name: "b", score: 5), SunScore(id: 2, name: "a", score: 5),
            SunScore(id: 3, name: "c", score: 9),
        ])
        #expect(try db.fetchAll(SunScore.self).map(\.id) == [3, 2, 1])
        #expect(try db.fetchAll(SunScore.query.limit(1, offset: 1)).map(\.id) == [2])
    }

    @Test func aDefaultOrderOnAnUnknownColumnIsAnError() throws {
        let db = try Database.inMemory()
        ormExpectModelError(.unknownColumn) { try db.createTable(SunBadOrder.self) }
    }

    @Test func nilElementsAreDroppedFromArraysOfPlainValues() throws {
        let db = try Database.inMemory()
        try db.createTable(SunTagged.self)
        try db.execute(
            #"""
            INSERT INTO sun_tagged (id, tags, scores, maybe) VALUES (1, '["a",null,"b"]', '[null,1,null,2]', \#
            '["x",null]')
            """#)
        let tagged = try db.fetch(SunTagged.self, key: PrimaryKey(1))
        // an array of optionals keeps them
        #expect(tagged == SunTagged(id: 1, tags: ["a", "b"], scores: [1, 2], maybe: ["x", nil]))
        // What is not an array of the element type is still a type mismatch.
        try db.execute(#"INSERT INTO sun_tagged (id, tags, scores, maybe) VALUES (2, '["a",3]', '[]', '[]')"#)
        ormExpectModelError(.typeMismatch) { try db.fetch(SunTagged.self, key: PrimaryKey(2)) }
    }
}
