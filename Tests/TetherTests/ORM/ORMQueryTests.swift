import Foundation
import Testing
@testable import Tether

/// Conditions, ordering, limits, aggregates and bulk writes, on `ormUsers`:
///
///     id name   age score nickname
///     1  Alice  30  10    al
///     2  Bob    25  nil   nil
///     3  Carol  35  50    caz
///     4  Dave   40  20    nil
///     5  Anna   22  5     an
///     6  alan   30  30    AL
@Suite struct ORMQueryTests {
    let db: Database

    init() throws {
        db = try ormUserFixture()
    }

    /// The ids a condition selects, in id order.
    private func ids(_ condition: Condition<OrmUser>) throws -> [Int64] {
        try db.fetchAll(OrmUser.where(condition).orderBy(\.id)).map(\.id)
    }

    private func ids(_ query: Query<OrmUser>) throws -> [Int64] {
        try db.fetchAll(query).map(\.id)
    }

    @Test func comparisonOperatorsByKeyPath() throws {
        #expect(try ids(\.age == 30) == [1, 6])
        #expect(try ids(\.age != 30) == [2, 3, 4, 5])
        #expect(try ids(\.age < 30) == [2, 5])
        #expect(try ids(\.age <= 30) == [1, 2, 5, 6])
        #expect(try ids(\.age > 30) == [3, 4])
        #expect(try ids(\.age >= 30) == [1, 3, 4, 6])
        #expect(try ids(\.name == "Alice") == [1])
        #expect(try ids(\.name > "B") == [2, 3, 4, 6])  // BINARY collation: "alan" sorts after "Dave"
        // Optional columns: NULL never compares.
        #expect(try ids(\.score > 10) == [3, 4, 6])
        #expect(try ids(\.score != 10) == [3, 4, 5, 6])
        #expect(try ids(.compare(\.age, "=", 30)) == [1, 6])
        #expect(try ids(.compare(\.age, "<>", 30)) == [2, 3, 4, 5])
    }

    @Test func comparisonOperatorsByColumnName() throws {
        #expect(try ids(.compare("age", "=", 30)) == [1, 6])
        #expect(try ids(.compare("age", "==", 30)) == [1, 6])
        #expect(try ids(.compare("age", "!=", 30)) == [2, 3, 4, 5])
        #expect(try ids(.compare("age", "<>", 30)) == [2, 3, 4, 5])
        #expect(try ids(.compare("age", "<", 30)) == [2, 5])
        #expect(try ids(.compare("age", "<=", 30)) == [1, 2, 5, 6])
        #expect(try ids(.compare("age", ">", 30)) == [3, 4])
        #expect(try ids(.compare("age", ">=", 30)) == [1, 3, 4, 6])
        #expect(try ids(.compare("AGE", ">=", 30)) == [1, 3, 4, 6])  // column names are case-insensitive, as in SQL
        #expect(try ids(.compare("score", ">", 10)) == [3, 4, 6])
    }

    @Test func listOperators() throws {
        #expect(try ids(.in(\.age, [25, 40, 99])) == [2, 4])
        #expect(try ids(.in("age", [25, 40, 99])) == [2, 4])
        #expect(try ids(.compare("age", "IN", [25, 40, 99])) == [2, 4])
        #expect(try ids(.compare(\.age, "in", [25, 40, 99])) == [2, 4])
        #expect(try ids(.in(\.name, ["Bob", "Zed"])) == [2])
        #expect(try ids(.notIn(\.age, [25, 40])) == [1, 3, 5, 6])
        #expect(try ids(.notIn("age", [25, 40])) == [1, 3, 5, 6])
        #expect(try ids(.compare("age", "not  in", [25, 40])) == [1, 3, 5, 6])
        // Empty lists: IN selects nothing, NOT IN everything.
        #expect(try ids(.in(\.age, [Int]())) == [])
        #expect(try ids(.notIn("age", [Int]())) == [1, 2, 3, 4, 5, 6])
        // Optional lists may hold nil, which matches nothing (SQL semantics).
        #expect(try ids(.in(\.score, [10, nil])) == [1])
    }

    @Test func patternOperators() throws {
        // LIKE ignores ASCII case; GLOB does not.
        #expect(try ids(.like(\.name, "A%")) == [1, 5, 6])
        #expect(try ids(.like("name", "A%")) == [1, 5, 6])
        #expect(try ids(.compare("name", "like", "_ob")) == [2])
        #expect(try ids(.notLike(\.name, "A%")) == [2, 3, 4])
        #expect(try ids(.notLike("name", "%a%")) == [2])
        #expect(try ids(.compare("name", "NOT LIKE", "%a%")) == [2])
        #expect(try ids(.glob(\.name, "A*")) == [1, 5])
        #expect(try ids(.glob("name", "[ab]*")) == [6])
        #expect(try ids(.compare("name", "GLOB", "*e")) == [1, 4])
        #expect(try ids(.compare("name", "NOT GLOB", "*e")) == [2, 3, 5, 6])
        // Wildcards in the bound value are wildcards of the pattern, not SQL.
        #expect(try ids(.like(\.name, "%'%")) == [])
    }

    @Test func betweenOperator() throws {
        #expect(try ids(.between(\.age, 25, 35)) == [1, 2, 3, 6])
        #expect(try ids(.between("age", 25, 35)) == [1, 2, 3, 6])
        #expect(try ids(.compare("age", "BETWEEN", [25, 35])) == [1, 2, 3, 6])
        #expect(try ids(.compare("age", "NOT BETWEEN", [25, 35])) == [4, 5])
        #expect(try ids(.between(\.name, "B", "D")) == [2, 3])
    }

    @Test func nullOperators() throws {
        #expect(try ids(.isNull(\.score)) == [2])
        #expect(try ids(.isNull("score")) == [2])
        #expect(try ids(.isNotNull(\.score)) == [1, 3, 4, 5, 6])
        #expect(try ids(.isNotNull("score")) == [1, 3, 4, 5, 6])
        #expect(try ids(\.score == nil) == [2])  // == nil is IS NULL, not "= NULL"
        #expect(try ids(\.nickname != nil) == [1, 3, 5, 6])
        #expect(try ids(.compare("score", "=", Int?.none)) == [2])
        #expect(try ids(.compare("nickname", "!=", String?.none)) == [1, 3, 5, 6])
        #expect(try ids(.compare("score", "IS", Int?.none)) == [2])
        #expect(try ids(.compare("score", "IS NOT", Int?.none)) == [1, 3, 4, 5, 6])
        #expect(try ids(.compare("nickname", "IS", "al")) == [1])
        #expect(try ids(.compare("nickname", "IS NOT", "al")) == [2, 3, 4, 5, 6])
    }

    @Test func andOrNotAndConditionSets() throws {
        #expect(try ids(\.age >= 30 && \.score < 25) == [1, 4])
        #expect(try ids(\.age < 23 || \.age > 39) == [4, 5])
        #expect(try ids(!(\.age >= 30)) == [2, 5])
        #expect(try ids(!(\.score > 10)) == [1, 5])  // NOT (NULL > 10) is NULL: Bob is not selected
        #expect(try ids((\.age == 30 || \.age == 25) && \.score != nil) == [1, 6])
        #expect(try ids(\.age == 30 || (\.age == 25 && \.score != nil)) == [1, 6])
        #expect(try ids(!(\.age == 30 || \.name == "Bob")) == [3, 4, 5])
        #expect(try ids(.all([\.age > 20, .like(\.name, "a%"), .isNotNull(\.score)])) == [1, 5, 6])
        #expect(try ids(.any([.compare("name", "=", "Bob"), .compare("name", "=", "Dave")])) == [2, 4])
        #expect(try ids(.all([])) == [1, 2, 3, 4, 5, 6])
        #expect(try ids(.any([])) == [])
        // AgileDB's condition sets: AND inside a set, OR across sets.
        #expect(try ids(.sets([[\.age >= 30, \.score < 25], [\.name == "Bob"]])) == [1, 2, 4])
        #expect(
            try ids(.sets([[.compare("age", ">", 30)], [.compare("age", "<", 23), .like("name", "A%")]])) == [3, 4, 5])
        #expect(try ids(.sets([])) == [])
        // Query.where adds with AND, Query.or with OR around everything so far.
        #expect(try ids(OrmUser.where(\.age >= 30).where(\.score < 25).orderBy(\.id)) == [1, 4])
        #expect(try ids(OrmUser.where(\.age >= 35).or(\.name == "Bob").orderBy(\.id)) == [2, 3, 4])
        #expect(try ids(OrmUser.query.or(\.name == "Bob")) == [2])
    }

    @Test func rawSQLCondition() throws {
        #expect(try ids(.sql("length(name) > ?", [4])) == [1, 3])
        #expect(try ids(.sql("age % 2 = 1")) == [2, 3])
        #expect(try ids(.sql("length(name) > ?", [4]) || \.age == 22) == [1, 3, 5])
        #expect(try ids(.sql("nickname IS ?", [nil])) == [2, 4])
        #expect(try ids(OrmUser.where(.sql("upper(nickname) = ?", ["AL"])).orderBy(\.id)) == [1, 6])
    }

    @Test func orderByLimitAndOffset() throws {
        #expect(try ids(OrmUser.query.orderBy(\.age, ascending: false).orderBy(\.name)) == [4, 3, 1, 6, 2, 5])
        #expect(try ids(OrmUser.query.orderBy("age").orderBy("name", ascending: false)) == [5, 2, 6, 1, 3, 4])
        #expect(try ids(OrmUser.query.orderBy(\.age, ascending: false).orderBy(\.name).limit(2, offset: 2)) == [1, 6])
        #expect(try ids(OrmUser.query.orderBy(\.id).limit(2)) == [1, 2])
        #expect(try ids(OrmUser.query.orderBy(\.id).limit(2, offset: 5)) == [6])
        #expect(try ids(OrmUser.query.orderBy(\.id).limit(2, offset: 6)) == [])
        #expect(try ids(OrmUser.query.orderBy(\.id).limit(0)) == [])
        // NULLs sort first ascending.
        #expect(try ids(OrmUser.query.orderBy(\.score).orderBy(\.id)) == [2, 5, 1, 4, 6, 3])
        #expect(try ids(OrmUser.where(\.age == 30).orderBy(\.name)) == [1, 6])
        #expect(try ids(OrmUser.where(\.age == 30).orderBy(\.name, ascending: false)) == [6, 1])
    }

    @Test func chainedColumnNameStyle() throws {
        let query = OrmUser.query("age", ">", 30).and("name", "LIKE", "%a%").or("age", "IN", [22, 25])
            .orderBy("age", ascending: false).limit(2, offset: 1)
        // ((age > 30 AND name LIKE '%a%') OR age IN (22, 25)) → 4, 3, 2, 5 by age desc; skip 1, take 2.
        #expect(try ids(query) == [3, 2])
        #expect(try db.count(query) == 2)
        #expect(try ids(OrmUser.query("age", ">", 30).and(\.score, ">", 30).orderBy("id")) == [3])
        #expect(try ids(OrmUser.query("name", "LIKE", "A%").and(.isNotNull("nickname")).orderBy("id")) == [1, 5, 6])
    }

    @Test func keyPathStyle() throws {
        #expect(try ids(OrmUser.where(\.age > 25 && \.name != "Dave").orderBy(\.age).orderBy(\.id)) == [1, 6, 3])
        #expect(try ids(OrmUser.where(\.age > 25 && \.name != "x").orderBy(\.age, ascending: false).limit(1)) == [4])
    }

    @Test func valuesAreAlwaysBound() throws {
        let evil = "'; DROP TABLE orm_user; --"
        #expect(try ids(\.name == evil) == [])
        #expect(try ids(.like(\.name, evil)) == [])
        #expect(
            try ids(OrmUser.query("name", "=", evil).or("nickname", "IN", [evil, "x' OR '1'='1"]).orderBy("id")) == [])
        #expect(try ids(\.name == "x' OR '1'='1") == [])
        // Column names are checked against the model, never pasted into the SQL.
        // (A sort string that is not `column [ASC|DESC], …` is refused as such.)
        ormExpectModelError(.invalidArgument) {
            try db.fetchAll(OrmUser.query.orderBy("name; DROP TABLE orm_user; --"))
        }
        ormExpectModelError(.unknownColumn) { try db.fetchAll(OrmUser.query.orderBy("name;")) }
        ormExpectModelError(.unknownColumn) { try db.delete(OrmUser.query("name\" = name OR 1 = 1 --", "=", 1)) }
        ormExpectModelError(.unknownColumn) { try db.update(OrmUser.query, set: [.set("name\" = 'x', \"age", to: 1)]) }
        #expect(try db.tableExists("orm_user"))
        #expect(try db.count(OrmUser.self) == 6)

        // Stored, matched, updated and deleted literally.
        let mallory = OrmUser(
            id: 7, name: evil, email: "\"; DELETE FROM orm_user; --", age: 1, score: nil, nickname: "x' OR '1'='1")
        try db.insert(mallory)
        #expect(try ids(\.name == evil) == [7])
        #expect(try ids(.in(\.nickname, ["x' OR '1'='1"])) == [7])
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(7)) == mallory)
        #expect(try db.update(OrmUser.where(\.name == evil), set: [.set("nickname", to: evil)]) == 1)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(7))?.nickname == evil)
        #expect(try db.delete(OrmUser.where(\.email == mallory.email)) == 1)
        #expect(try db.tableExists("orm_user"))
        #expect(try db.fetchAll(OrmUser.query.orderBy(\.id)) == ormUsers)
    }

    @Test func aggregates() throws {
        let all = OrmUser.query
        #expect(try db.aggregate(.count, of: all, as: Int.self) == 6)
        #expect(try db.aggregate(.count, of: OrmUser.where(\.age >= 30), as: Int.self) == 4)
        #expect(try db.aggregate(.sum("score"), of: all, as: Int.self) == 115)
        #expect(try db.aggregate(.sum(\.score), of: all, as: Int.self) == 115)
        #expect(try db.aggregate(.sum(\.score), of: OrmUser.where(\.age > 100), as: Int.self) == nil)
        #expect(try db.aggregate(.average("score"), of: all, as: Double.self) == 23)
        let average = try #require(try db.aggregate(.average(\.age), of: all, as: Double.self))
        #expect(abs(average - 182.0 / 6) < 1e-9)
        #expect(try db.aggregate(.minimum("age"), of: all, as: Int.self) == 22)
        #expect(try db.aggregate(.minimum(\.name), of: all, as: String.self) == "Alice")
        #expect(try db.aggregate(.maximum("name"), of: all, as: String.self) == "alan")
        #expect(try db.aggregate(.maximum(\.age), of: OrmUser.where(\.age < 40), as: Int.self) == 35)
        #expect(
            try db.aggregate(
                .groupConcat("name", separator: "|"), of: OrmUser.where(\.age >= 35).orderBy(\.id), as: String.self)
                == "Carol|Dave")
        #expect(
            try db.aggregate(.groupConcat(\.nickname), of: OrmUser.query.orderBy(\.id), as: String.self)
                == "al,caz,an,AL")
        #expect(try db.aggregate(.countDistinct(\.age), of: all, as: Int.self) == 5)
        #expect(try db.aggregate(.countDistinct("score"), of: all, as: Int.self) == 5)
        // Over a limited query, the aggregate sees only the limited rows.
        #expect(
            try db.aggregate(.sum(\.age), of: OrmUser.query.orderBy(\.age, ascending: false).limit(2), as: Int.self)
                == 75)
        #expect(try db.aggregate(.count, of: OrmUser.query.orderBy(\.id).limit(10, offset: 4), as: Int.self) == 2)
        // The default query is the whole table.
        #expect(try db.aggregate(.maximum(\OrmUser.score), as: Int.self) == 50)
    }

    @Test func bulkUpdate() throws {
        #expect(try db.update(OrmUser.where(\.age >= 30), set: [.set("score", to: 0)]) == 4)
        #expect(try db.fetchAll(OrmUser.where(\.score == 0).orderBy(\.id)).map(\.id) == [1, 3, 4, 6])
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(5))?.score == 5)
        #expect(try db.update(OrmUser.where(\.age > 100), set: [.set("score", to: 1)]) == 0)

        // With ORDER BY + LIMIT only the limited rows change.
        #expect(
            try db.update(OrmUser.query.orderBy(\.age, ascending: false).limit(2), set: [.set(\.nickname, to: "top")])
                == 2)
        #expect(try ids(\.nickname == "top") == [3, 4])
        #expect(
            try db.update(
                OrmUser.query.orderBy("age").limit(1, offset: 1), set: [.setNull("nickname"), .set("score", to: 99)])
                == 1)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(2))?.score == 99)
        #expect(
            try db.update(OrmUser.where(.like(\.name, "A%")).orderBy(\.id).limit(2), set: [.set(\.age, to: 77)]) == 2)
        #expect(try ids(\.age == 77) == [1, 5])

        // Everything, when the query has no condition.
        #expect(try db.update(OrmUser.query, set: [.set("nickname", to: "all")]) == 6)
    }

    @Test func bulkDelete() throws {
        #expect(try db.delete(OrmUser.where(\.age < 25)) == 1)
        // Bob 25, then Alice/alan at 30 by rowid order…
        #expect(try db.delete(OrmUser.query.orderBy("age").limit(2)) == 2)
        let remaining = try db.fetchAll(OrmUser.query.orderBy(\.id)).map(\.id)
        #expect(remaining.count == 3)
        #expect(remaining.contains(3) && remaining.contains(4))
        #expect(try db.delete(OrmUser.query.orderBy(\.age, ascending: false).limit(1, offset: 1)) == 1)  // Carol
        #expect(try ids(OrmUser.query.orderBy(\.id)) == remaining.filter { $0 != 3 })
    }

    @Test func bulkWritesOnACompositeKeyWithLimit() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmPair.self)
        try db.insert(contentsOf: [
            OrmPair(a: 1, b: "a", value: 1), OrmPair(a: 1, b: "b", value: 2), OrmPair(a: 2, b: "a", value: 3),
            OrmPair(a: 2, b: "b", value: 4),
        ])
        #expect(
            try db.update(OrmPair.query.orderBy("value", ascending: false).limit(2), set: [.set("value", to: 0.0)]) == 2
        )
        #expect(try db.fetchAll(OrmPair.query.orderBy("a").orderBy("b")).map(\.value) == [1, 2, 0, 0])
        #expect(try db.delete(OrmPair.where(\.value == 0).orderBy(\.b).limit(1)) == 1)
        #expect(try db.fetchKeys(OrmPair.query.orderBy("a").orderBy("b")) == [[1, "a"], [1, "b"], [2, "b"]])
    }
}
