import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A scope is checked against the synced tables before use, with SQLite itself: each mistake is a
/// `ScopeError` naming the table and the reason.
@Suite struct ScopeValidationTests {
    typealias F = ScopeFixture

    func reason(_ scope: SyncScope, on db: Database) throws -> ScopeError? {
        do {
            try db.validate(scope)
            return nil
        } catch let error as ScopeError {
            return error
        }
    }

    @Test func aValidScopePassesAndTheFixturesScopeIsValid() throws {
        let db = try F.database()
        #expect(try reason(F.site("north"), on: db) == nil)
        #expect(
            try reason(SyncScope(["orders": .filter("total > 3 AND site IN (SELECT body FROM notice)")]), on: db) == nil
        )
        #expect(try reason(.whole, on: db) == nil)
    }

    @Test func eachMistakeNamesItsTableAndReason() throws {
        let db = try makeDatabase(
            schema: F.schema + "CREATE TABLE local_only (id INTEGER PRIMARY KEY, site TEXT);", syncing: F.tables)
        let cases: [(SyncScope, ScopeError)] = [
            (SyncScope(["nowhere": .filter("1")]), ScopeError(table: "nowhere", reason: .tableNotSynced)),
            (SyncScope(["local_only": .filter("1")]), ScopeError(table: "local_only", reason: .tableNotSynced)),
            (SyncScope(["orders": .filter("'north'")]), ScopeError(table: "orders", reason: .notACondition("text"))),
            (SyncScope(["orders": .filter("site")]), ScopeError(table: "orders", reason: .notACondition("TEXT"))),
            (
                SyncScope(["orders": .filter("site = :peer_name")]),
                ScopeError(table: "orders", reason: .missingParameter("peer_name"))
            ),
            (SyncScope(["orders": .filter("site = ?")]), ScopeError(table: "orders", reason: .missingParameter("?"))),
            (
                SyncScope(["orders": .filter("site IN (SELECT site FROM local_only)")]),
                ScopeError(table: "orders", reason: .readsUnsyncedTable("local_only"))
            ),
            (
                SyncScope(["order_line": .reference(column: "order_ref", parent: "orders"), "orders": .filter("1")]),
                ScopeError(table: "order_line", reason: .unknownColumn(table: "order_line", column: "order_ref"))
            ),
            (
                SyncScope([
                    "order_line": .reference(column: "order_id", parent: "orders", parentColumn: "code"),
                    "orders": .filter("1"),
                ]),
                ScopeError(table: "order_line", reason: .unknownColumn(table: "orders", column: "code"))
            ),
            (
                SyncScope(["order_line": .reference(column: "order_id", parent: "orders")]),
                ScopeError(table: "order_line", reason: .parentNotScoped("orders"))
            ),
            (
                SyncScope([
                    "order_line": .reference(column: "order_id", parent: "line_note"),
                    "line_note": .reference(column: "line_id", parent: "order_line"),
                ]),
                ScopeError(table: "order_line", reason: .referenceCycle(["line_note", "order_line", "line_note"]))
            ),
        ]
        for (scope, expected) in cases {
            #expect(try reason(scope, on: db) == expected, "\(scope.tables)")
        }
    }

    @Test func aTableWithoutRowidIsRefusedUntilScopesCoverIt() throws {
        let db = try makeDatabase(
            schema: "CREATE TABLE tag (name TEXT PRIMARY KEY, site TEXT) WITHOUT ROWID;", syncing: ["tag"])
        #expect(
            try reason(SyncScope(["tag": .filter("site = 'north'")]), on: db)
                == ScopeError(table: "tag", reason: .withoutRowid))
    }

    @Test func unknownColumnsBadSyntaxTrailingStatementsAndReservedNamesAreRefused() throws {
        let db = try F.database()
        for filter in ["colour = 'red'", "site = = 1", "1); DROP TABLE orders; --", "1; DELETE FROM orders"] {
            let error = try #require(try reason(SyncScope(["orders": .filter(filter)]), on: db), "\(filter)")
            #expect(error.table == "orders")
            guard case .invalidExpression = error.reason else {
                Issue.record("\(filter): \(error)")
                continue
            }
        }
        #expect(try db.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 'orders'", as: Int.self) == 1)
        let reserved = try #require(
            try reason(SyncScope(["orders": .filter("1")], parameters: ["tether_peer": .null]), on: db))
        #expect(reserved.reason == .reservedParameter("tether_peer"))
        // An unused parameter is allowed (the identity gives several; a filter uses what it needs).
        #expect(
            try reason(SyncScope(["orders": .filter("1")], parameters: ["peer_fingerprint": .text("ab")]), on: db)
                == nil)
    }

    @Test func anInvalidScopeStopsAnExtractionBeforeAnythingIsSent() throws {
        let hub = try F.database()
        let peer = try F.database()
        try hub.execute("INSERT INTO orders VALUES (1, 'north', 1)")
        #expect(throws: ScopeError.self) {
            _ = try hub.extractChanges(
                for: peer.instanceKey, after: 0, scope: SyncScope(["orders": .filter("colour = 1")]))
        }
        #expect(throws: ScopeError(table: "", reason: .needsPeer)) {
            _ = try hub.extractChanges(for: nil, after: 0, scope: F.site("north"))
        }
    }
}
