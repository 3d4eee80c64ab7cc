import Foundation
import Testing
@testable import Tether

// AgileDB's `keysInTable(_:sortOrder:conditions:validateObjects:)` with condition sets, from its README.

@Suite("AgileDB: condition sets on values by key") struct ORMAgileDBTests {
    /// AgileDB's example table: transactions by key, each with an account.
    private func accounts() throws -> Database {
        let db = try Database.inMemory()
        try db.setValue(["account": "ACCT1", "amount": 50], inTable: "accounts", forKey: "t1")
        try db.setValue(["account": "ACCT2", "amount": 900], inTable: "accounts", forKey: "t2")
        try db.setValue(["account": "ACCT1", "amount": 120, "memo": "rent"], inTable: "accounts", forKey: "t3")
        return db
    }

    @Test func conditionSetsAreANDInsideAndORAcross() throws {
        let db = try accounts()
        // AgileDB: DBCondition(set: 0, objectKey: "account", conditionOperator: .equal, value: "ACCT1")
        #expect(try db.keys(inTable: "accounts", sortOrder: "key", matching: [[.equal("account", "ACCT1")]]) == [.text("t1"), .text("t3")])
        let sets: [[ValueCondition]] = [[.equal("account", "ACCT1"), .greater("amount", 100)], [.equal("account", "ACCT2")]]
        #expect(try db.keys(inTable: "accounts", sortOrder: "amount desc", matching: sets) == [.text("t2"), .text("t3")])
        #expect(try db.keys(inTable: "accounts", sortOrder: "key", matching: [[.contains("memo", "en")], [.isIn("amount", [50])]]) == [.text("t1"), .text("t3")])
        #expect(try db.keys(inTable: "accounts", sortOrder: "key", matching: [[.equal("memo", DatabaseValue.null)]]) == [.text("t1"), .text("t2")])
        #expect(try db.keys(inTable: "accounts", matching: []).isEmpty)
    }

    @Test func validateObjectsIgnoresSetsNamingAColumnTheTableLacks() throws {
        let db = try accounts()
        let sets: [[ValueCondition]] = [[.equal("account", "ACCT2")], [.equal("category", "food"), .equal("account", "ACCT1")]]
        // Without validateObjects, an unknown column is an error naming it.
        let error = ormExpectModelError(.unknownColumn) { try db.keys(inTable: "accounts", matching: sets) }
        guard case let .unknownColumn(table, column)? = error else { return }
        #expect(table == "accounts" && column == "category")
        // With it (AgileDB's validateObjects: true), the set that names it is left out.
        #expect(try db.keys(inTable: "accounts", matching: sets, ignoringSetsWithUnknownColumns: true) == [.text("t2")])
        // Every set left out: no key matches.
        #expect(try db.keys(inTable: "accounts", matching: [[.equal("category", "food")]], ignoringSetsWithUnknownColumns: true).isEmpty)
        // A column named in another case is the table's column, not an unknown one.
        #expect(try db.keys(inTable: "accounts", matching: [[.equal("ACCOUNT", "ACCT2")]]) == [.text("t2")])
    }
}
