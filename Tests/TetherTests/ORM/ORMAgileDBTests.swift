import CSQLite
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
        #expect(
            try db.keys(inTable: "accounts", sortOrder: "key", matching: [[.equal("account", "ACCT1")]]) == [
                .text("t1"), .text("t3"),
            ])
        let sets: [[ValueCondition]] = [
            [.equal("account", "ACCT1"), .greater("amount", 100)], [.equal("account", "ACCT2")],
        ]
        #expect(
            try db.keys(inTable: "accounts", sortOrder: "amount desc", matching: sets) == [.text("t2"), .text("t3")])
        #expect(
            try db.keys(
                inTable: "accounts", sortOrder: "key", matching: [[.contains("memo", "en")], [.isIn("amount", [50])]])
                == [.text("t1"), .text("t3")])
        #expect(
            try db.keys(inTable: "accounts", sortOrder: "key", matching: [[.equal("memo", DatabaseValue.null)]]) == [
                .text("t1"), .text("t2"),
            ])
        #expect(try db.keys(inTable: "accounts", matching: []).isEmpty)
    }

    @Test func validateObjectsIgnoresSetsNamingAColumnTheTableLacks() throws {
        let db = try accounts()
        let sets: [[ValueCondition]] = [
            [.equal("account", "ACCT2")], [.equal("category", "food"), .equal("account", "ACCT1")],
        ]
        // Without validateObjects, an unknown column is an error naming it.
        let error = ormExpectModelError(.unknownColumn) { try db.keys(inTable: "accounts", matching: sets) }
        guard case let .unknownColumn(table, column)? = error else { return }
        #expect(table == "accounts" && column == "category")
        // With it (AgileDB's validateObjects: true), the set that names it is left out.
        #expect(try db.keys(inTable: "accounts", matching: sets, ignoringSetsWithUnknownColumns: true) == [.text("t2")])
        // Every set left out: no key matches.
        #expect(
            try db.keys(
                inTable: "accounts", matching: [[.equal("category", "food")]], ignoringSetsWithUnknownColumns: true
            ).isEmpty)
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
        // A table made later syncs as it is made; called again (the names in any case), nothing is left to turn on.
        try a.execute("CREATE TABLE notes (key TEXT PRIMARY KEY)")
        #expect(a.syncedTables == ["accounts", "categories", "notes"])
        #expect(try a.enableSync(allExcept: ["DRAFTS"]).isEmpty)
        #expect(try a.unsyncedTables() == ["drafts"])
    }

    /// AgileDB's "Any tables not in this array will be synced" is a standing rule: a table made
    /// after `enableSync(allExcept:)` syncs as it appears (AgileDB makes a table on its first
    /// write), the listed ones stay local, and the rule is the database's, kept across openings.
    @Test func tablesMadeAfterTheCallSyncUnlessListedAndTheRuleOutlivesTheOpening() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("agile.sqlite")
        var db = try Database(path: path)
        try db.execute("CREATE TABLE a (key TEXT PRIMARY KEY, body TEXT)")
        // AgileDB: setUnsyncedTables(["a"])
        #expect(try db.enableSync(allExcept: ["a"]) == [])
        try db.execute("CREATE TABLE b (key TEXT PRIMARY KEY, body TEXT)")
        try db.execute("INSERT INTO a VALUES ('a1', 'local'); INSERT INTO b VALUES ('b1', 'shared')")
        try db.setValue(["amount": 5], inTable: "c", forKey: "c1")
        #expect(db.syncedTables == ["b", "c"])
        #expect(try db.unsyncedTables() == ["a"])
        #expect(try db.pendingChangeCount(tables: ["b", "c"]) == 2)

        let peer = try Database.inMemory()
        try peer.execute(
            "CREATE TABLE a (key TEXT PRIMARY KEY, body TEXT); CREATE TABLE b (key TEXT PRIMARY KEY, body TEXT)")
        try peer.setValue(["amount": 0], inTable: "c", forKey: "c0")
        try peer.enableSync(allExcept: [])
        try SyncTestKit.sync(db, peer)
        #expect(try SyncTestKit.dump(peer, "SELECT key, body FROM b") == ["'b1'|'shared'"])
        #expect(try SyncTestKit.dump(peer, "SELECT key, amount FROM c ORDER BY key") == ["'c0'|0", "'c1'|5"])
        #expect(try SyncTestKit.dump(peer, "SELECT key FROM a").isEmpty)

        // Another program makes a table while the database is closed: it syncs from the next opening.
        try db.close()
        var other: OpaquePointer?
        try #require(sqlite3_open_v2(path, &other, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK)
        let made = sqlite3_exec(
            other, "CREATE TABLE e (key TEXT PRIMARY KEY, body TEXT); INSERT INTO e VALUES ('e1', 'by the shell')", nil,
            nil, nil)
        sqlite3_close_v2(other)
        try #require(made == SQLITE_OK)
        db = try Database(path: path)
        #expect(db.syncedTables == ["b", "c", "e"])
        try db.execute(
            "CREATE TABLE d (key TEXT PRIMARY KEY, body TEXT); INSERT INTO d VALUES ('d1', 'after reopening')")
        try db.execute("INSERT INTO a VALUES ('a2', 'still local')")
        #expect(db.syncedTables == ["b", "c", "d", "e"])
        #expect(try db.unsyncedTables() == ["a"])
        try peer.execute(
            "CREATE TABLE d (key TEXT PRIMARY KEY, body TEXT); CREATE TABLE e (key TEXT PRIMARY KEY, body TEXT)")
        try SyncTestKit.sync(db, peer)
        #expect(
            try SyncTestKit.dump(peer, "SELECT key, body FROM d UNION ALL SELECT key, body FROM e") == [
                "'d1'|'after reopening'", "'e1'|'by the shell'",
            ])
        #expect(try SyncTestKit.dump(peer, "SELECT key FROM a").isEmpty)
    }

    /// A custom policy's function cannot be recorded: in this opening, a table the rule syncs
    /// merges with it; after reopening, a new table is recorded as custom and refuses peers'
    /// changes until it is given its function again (as every custom table does).
    @Test func underACustomPolicyATableMadeAfterReopeningWaitsForItsFunction() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("agile.sqlite")
        var db = try Database(path: path)
        let keepLocal: MergeFunction = { local, _ in local }
        #expect(try db.enableSync(allExcept: [], policy: .custom(keepLocal)).isEmpty)
        try db.execute("CREATE TABLE now (key TEXT PRIMARY KEY, body TEXT)")
        try db.close()
        db = try Database(path: path)
        try db.execute("CREATE TABLE later (key TEXT PRIMARY KEY, body TEXT)")
        #expect(try db.syncedTableRecords().map { "\($0.name) \($0.policyName)" } == ["later custom", "now custom"])

        let peer = try makeDatabase(schema: "CREATE TABLE later (key TEXT PRIMARY KEY, body TEXT)", syncing: ["later"])
        try peer.execute("INSERT INTO later VALUES ('l1', 'from the peer')")
        #expect(SyncTestKit.syncErrorCase { try SyncTestKit.sync(peer, db) } == "missingMergeFunction")
        try db.setConflictPolicy(.custom(keepLocal), for: "later")
        try SyncTestKit.sync(peer, db)
        #expect(try SyncTestKit.dump(db, "SELECT key, body FROM later") == ["'l1'|'from the peer'"])
    }

    /// A listed name need not be a table yet (AgileDB makes a table on its first write): that
    /// table stays local when it is made. A table the rule cannot sync (no primary key) is made
    /// all the same and stays local; a table made in a transaction that rolls back is not synced;
    /// one whose sync is turned off joins the list, across openings.
    @Test func theListNamesTablesToComeAndTablesTheRuleCannotSyncStayLocal() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("agile.sqlite")
        var db = try Database(path: path)
        try db.execute("CREATE TABLE categories (key TEXT PRIMARY KEY, name TEXT)")
        #expect(try db.enableSync(allExcept: ["drafts"], policy: .localWins) == ["categories"])
        try db.setValue(["body": "secret"], inTable: "drafts", forKey: "d1")
        try db.setValue(["body": "shared"], inTable: "notes", forKey: "n1")
        try db.execute("CREATE TABLE log_line (message TEXT); INSERT INTO log_line VALUES ('kept')")
        #expect(db.syncedTables == ["categories", "notes"])
        #expect(try db.unsyncedTables() == ["drafts", "log_line"])
        #expect(try db.syncedTableRecords().map(\.policyName) == ["localWins", "localWins"])
        #expect(try db.pendingChangeCount(tables: ["notes"]) == 1)
        #expect(try db.fetchValue("SELECT count(*) FROM log_line", as: Int.self) == 1)

        struct Undo: Error {}
        #expect(throws: Undo.self) {
            try db.write { conn in
                try conn.execute("CREATE TABLE gone (key TEXT PRIMARY KEY)")
                throw Undo()
            }
        }
        #expect(try !db.tableExists("gone"))
        try db.execute("CREATE TABLE gone (key TEXT PRIMARY KEY); INSERT INTO gone VALUES ('g1')")
        #expect(db.syncedTables == ["categories", "gone", "notes"])
        #expect(try db.pendingChangeCount(tables: ["gone"]) == 1)

        try db.disableSync(table: "notes")
        try db.close()
        db = try Database(path: path)
        #expect(db.syncedTables == ["categories", "gone"])
        #expect(try db.unsyncedTables() == ["drafts", "log_line", "notes"])
    }
}
