import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// A peer's interest is checked as a peer's text (`InterestFilter`): one expression over its own
/// table's row, no parameter, only `SyncScope.interestFunctions`; the operator's own rules keep
/// their subqueries and parameters.
@Suite struct InterestFilterTests {
    static let schema = """
        CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, status TEXT, note TEXT, a INTEGER, b INTEGER, "weird ) \
        name" INTEGER);
        CREATE TABLE other (id INTEGER PRIMARY KEY, secret TEXT);
        """

    static func database() throws -> Database {
        let db = try makeDatabase(schema: schema, syncing: ["item", "other"])
        try db.write { conn in
            for id in 1...10 {
                try conn.execute(
                    "INSERT INTO item (id, name, status, note, a, b, \"weird ) name\") VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        id, id % 2 == 0 ? "apple \(id)" : "pear \(id)", id % 3 == 0 ? "archived" : "open",
                        id == 4 ? ")" : "n\(id)", id, 10 - id, id,
                    ])
            }
            try conn.execute("INSERT INTO other (id, secret) VALUES (1, 'hidden')")
        }
        return db
    }

    /// Why `expression`, as a peer's interest in item, is refused; nil if accepted.
    func refusal(_ expression: String, on db: Database) throws -> ScopeError? {
        do {
            try db.validate(SyncScope(interest: ["item": .filter(expression)]))
            return nil
        } catch let error as ScopeError {
            return error
        }
    }

    /// The ids a peer with this interest is sent (the reading rule: the rows the filter holds).
    func sentIDs(_ expression: String, on db: Database) throws -> [Int64] {
        let peer = InstanceKey.random()
        let batch = try db.extractChanges(
            for: peer, after: 0, scope: SyncScope(interest: ["item": .filter(expression)]))
        return batch.changes.compactMap { change in
            guard batch.tables[change.table].name == "item", case let .integer(id) = change.key.first else {
                return nil
            }
            return id
        }.sorted()
    }

    @Test(
        arguments: [
            ("id > 6", [7, 8, 9, 10]),
            ("status <> 'archived'", [1, 2, 4, 5, 7, 8, 10]),
            ("lower(name) LIKE 'a%'", [2, 4, 6, 8, 10]),
            ("(a > 2) AND (b > 2)", [3, 4, 5, 6, 7]),
            ("note = ')'", [4]),
            ("note <> '(' AND note = ')'", [4]),
            ("note IN ('it''s )', ')')", [4]),
            ("\"weird ) name\" > 8", [9, 10]),
            ("[weird ) name] > 8", [9, 10]),
            ("`weird ) name` > 8", [9, 10]),
            ("id IN (1, 2)\n OR coalesce(a, 0) BETWEEN 9 AND 9", [1, 2, 9]),
            ("CASE WHEN abs(a - 5) < 1 THEN 1 ELSE 0 END", [5]),
            ("x'6E31' = CAST(note AS BLOB)", [1]),
        ] as [(String, [Int64])])
    func acceptedForms(expression: String, expected: [Int64]) throws {
        let db = try Self.database()
        #expect(try refusal(expression, on: db) == nil)
        #expect(try sentIDs(expression, on: db) == expected)
    }

    @Test(arguments: [
        ("1=1) OR (1=1", "the ) at offset 3 closes a parenthesis the interest did not open"),
        ("id > 0) OR status LIKE '%' OR (1", "the ) at offset 6 closes a parenthesis the interest did not open"),
        ("(id > 0", "1 parenthesis(es) opened and never closed"),
        ("note = 'open", "the quote ' at offset 7 is never closed"),
        ("\"weird ) name > 1", "the quote \" at offset 0 is never closed"),
        ("[weird ) name > 1", "the quote [ at offset 0 is never closed"),
        ("id > 0 /* ) OR (1", "a comment at offset 7"),
        ("id > 0 -- ) OR (1", "a comment at offset 7"),
        ("1; DELETE FROM item", "a ; at offset 1"),
        ("id > 0\u{0}) OR (1", "the control character 0 at offset 6"),
    ])
    func notOneExpression(expression: String, found: String) throws {
        let db = try Self.database()
        #expect(try refusal(expression, on: db) == ScopeError(table: "item", reason: .notOneExpression(found)))
    }

    @Test(arguments: [
        "EXISTS (SELECT 1 FROM other WHERE secret LIKE 'h%')",
        "id IN (SELECT id FROM item WHERE status = 'open')",
        "id IN (WITH RECURSIVE forever(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM forever) SELECT n FROM forever)",
        "(SELECT count(*) FROM other) > 0",
    ])
    func subqueriesReadOtherRows(expression: String) throws {
        let db = try Self.database()
        #expect(try refusal(expression, on: db) == ScopeError(table: "item", reason: .interestReadsOtherRows))
    }

    @Test(arguments: [
        ("load_extension('/nonexistent') IS NULL", "load_extension"),
        ("length(randomblob(100000000)) > 0", "randomblob"),
        ("length(zeroblob(100000000)) > 0", "zeroblob"),
        ("random() > 0", "random"),
        ("printf('%.*c', 100000000, 'x') <> ''", "printf"),
        ("replace(note, 'n', note) <> ''", "replace"),
        ("date('now') > '2000'", "date"),
        ("count(*) > 0", "count"),
    ])
    func functionsOutsideTheAllowList(expression: String, function: String) throws {
        let db = try Self.database()
        #expect(try refusal(expression, on: db) == ScopeError(table: "item", reason: .functionNotAllowed(function)))
    }

    @Test(arguments: [("status = :peer_name", "peer_name"), ("id = ?", "?"), ("id = @limit", "limit")])
    func parametersAreRefused(expression: String, name: String) throws {
        let db = try Self.database()
        #expect(try refusal(expression, on: db) == ScopeError(table: "item", reason: .interestParameter(name)))
    }

    @Test func theOperatorsOwnRuleKeepsItsSubqueriesAndParametersBesideAnInterest() throws {
        let db = try Self.database()
        let scope = SyncScope(
            ["item": .filter("id IN (SELECT id FROM other) OR status = :peer_name")],
            parameters: ["peer_name": .text("open")])
        #expect(throws: Never.self) { try db.validate(scope) }
        #expect(throws: Never.self) { try db.validate(scope.intersected(with: ["item": .filter("id < 5")])) }
        #expect(throws: ScopeError(table: "item", reason: .interestReadsOtherRows)) {
            try db.validate(scope.intersected(with: ["item": .filter("id IN (SELECT id FROM other)")]))
        }
    }

    @Test func aPeersReferenceLeadsToARuleCheckedAsThePeersToo() throws {
        let db = try Self.database()
        let interest = SyncScope(interest: [
            "item": .reference(column: "a", parent: "other"), "other": .filter("secret IN (SELECT note FROM item)"),
        ])
        #expect(throws: ScopeError(table: "other", reason: .interestReadsOtherRows)) { try db.validate(interest) }
    }

    @Test func anExtractionPastItsTimeLimitStopsNamingTheTableAndLeavesTheDatabaseAsItWas() throws {
        let db = try Self.database()
        try db.write { conn in
            for id in 11...3_000 {
                try conn.execute("INSERT INTO item (id, name, status) VALUES (?, 'bulk', 'open')", [id])
            }
        }
        let peer = InstanceKey.random()
        let scope = SyncScope(interest: ["item": .filter("lower(name) LIKE '%u%k%'")])
        #expect(throws: ScopeError(table: "item", reason: .evaluationTooLong(.zero))) {
            _ = try db.extractChanges(
                for: peer, after: 0, scope: scope, interestBudget: InterestBudget(timeLimit: .zero))
        }
        // Rolled back whole: the same extraction within the default budget sends every row it holds.
        let batch = try db.extractChanges(
            for: peer, after: 0, limits: BatchLimits(maximumChanges: 10_000, maximumBytes: 1 << 24), scope: scope)
        #expect(batch.changes.filter { batch.tables[$0.table].name == "item" }.count == 2_990)
    }

    @Test func aCancelledBudgetStopsTheExtraction() throws {
        let db = try Self.database()
        let budget = InterestBudget()
        budget.cancel()
        #expect(throws: ScopeError(table: "item", reason: .evaluationCancelled)) {
            _ = try db.extractChanges(
                for: InstanceKey.random(), after: 0, scope: SyncScope(interest: ["item": .filter("id > 0")]),
                interestBudget: budget)
        }
        #expect(throws: ScopeError(table: "item", reason: .evaluationCancelled)) {
            _ = try db.extractScopeBackfill(
                for: InstanceKey.random(), after: 0, scope: SyncScope(interest: ["item": .filter("id > 0")]),
                interestBudget: budget)
        }
    }
}
