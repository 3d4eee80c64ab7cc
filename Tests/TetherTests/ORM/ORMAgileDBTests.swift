import Foundation
import Testing
@testable import Tether
import TetherTestSupport

// AgileDB's last two features, from its README: `keysInTable(_:sortOrder:conditions:validateObjects:)`
// with condition sets, and `setUnsyncedTables` (everything syncs but a list).

@Suite("AgileDB: condition sets on values by key, sync all but a list") struct ORMAgileDBTests {
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

    @Test func unsyncedTablesStayLocalWhileEveryOtherTableSyncs() throws {
        let schema = """
            CREATE TABLE categories (key TEXT PRIMARY KEY, name TEXT);
            CREATE TABLE accounts (key TEXT PRIMARY KEY, name TEXT);
            CREATE TABLE drafts (key TEXT PRIMARY KEY, body TEXT);
            """
        let a = try makeDatabase(schema: schema)
        let b = try makeDatabase(schema: schema)
        for db in [a, b] {
            // AgileDB: setUnsyncedTables(["drafts"])
            #expect(try db.enableSync(allExcept: ["drafts"]) == ["accounts", "categories"])
            #expect(db.syncedTables == ["accounts", "categories"])
            #expect(try db.unsyncedTables() == ["drafts"])
        }
        try a.execute("INSERT INTO categories VALUES ('c1', 'Food'); INSERT INTO drafts VALUES ('d1', 'secret')")
        try SyncTestKit.sync(a, b)
        #expect(try b.fetchRows("SELECT key FROM categories").map { $0[0] } == [.text("c1")])
        #expect(try b.fetchRows("SELECT key FROM drafts").isEmpty)
        // Called again, it syncs only what is new.
        try a.execute("CREATE TABLE notes (key TEXT PRIMARY KEY)")
        #expect(try a.enableSync(allExcept: ["DRAFTS"]) == ["notes"])
    }

    @Test func aMisspeltExclusionChangesNothing() throws {
        let db = try makeDatabase(schema: "CREATE TABLE categories (key TEXT PRIMARY KEY); CREATE TABLE drafts (key TEXT PRIMARY KEY)")
        let error = SyncTestKit.error { _ = try db.enableSync(allExcept: ["draft"]) }
        guard case let .invalidTable(reason)? = error as? SyncError else {
            Issue.record("expected SyncError.invalidTable, got \(String(describing: error))")
            return
        }
        #expect(reason == "cannot leave draft out of sync: there is no table named draft")
        #expect(db.syncedTables.isEmpty)
    }
}
