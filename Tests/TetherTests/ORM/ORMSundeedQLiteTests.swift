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
}

@Suite("SundeedQLite: children by their parent's key, independent rows, sort marks, nil elements") struct ORMSundeedQLiteTests {
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
        try db.save(NestEmployee(id: "e1", firstName: "Nour S."), linkedTo: \SunEmployer.employees, of: employerKey)  // saved again: not twice
        #expect(try db.fetch(SunEmployer.self, key: employerKey)?.employees.map(\.firstName) == ["Nour S.", "Sami"])
        #expect(try db.fetchRows("SELECT employees FROM sun_employer").first?[0] == .text(#"["e1","e2"]"#))
        // One child: the link is replaced.
        try db.save(NestEmployee(id: "m1", firstName: "Maya"), linkedTo: \SunEmployer.manager, of: employerKey)
        #expect(try db.fetch(SunEmployer.self, key: employerKey)?.manager?.firstName == "Maya")
    }

    @Test func aChildForAParentThatDoesNotExistIsNotSaved() throws {
        let db = try employerDatabase()
        ormExpectModelError(.notFound) {
            try db.save(NestEmployee(id: "e9", firstName: "Lost"), linkedTo: \SunEmployer.employees, of: PrimaryKey("nobody"))
        }
        #expect(try db.count(NestEmployee.self) == 0)
    }
}
