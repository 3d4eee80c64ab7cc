import Foundation
import Testing
@testable import Tether

/// Queries, assignments and rows that cannot work: each throws the documented
/// error, and a failing write changes nothing.
@Suite struct ORMBadInputTests {

    private func expectUnknownColumn<T>(
        _ column: String, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> T
    ) {
        let error = ormExpectModelError(.unknownColumn, sourceLocation: sourceLocation, body)
        if case let .unknownColumn(table, name)? = error {
            #expect(table == "orm_user", sourceLocation: sourceLocation)
            #expect(name == column, sourceLocation: sourceLocation)
        }
    }

    @Test func unknownColumnInAConditionOrderOrAssignment() throws {
        let db = try ormUserFixture()
        let before = try ormDump(db, "orm_user")
        let badWhere = OrmUser.query("nope", "=", 1)
        let badOrder = OrmUser.where(\.age > 0).orderBy("nope")
        // Reads.
        expectUnknownColumn("nope") { try db.fetchAll(badWhere) }
        expectUnknownColumn("nope") { try db.fetchFirst(badWhere) }
        expectUnknownColumn("nope") { try db.count(badWhere) }
        expectUnknownColumn("nope") { try db.exists(badWhere) }
        expectUnknownColumn("nope") { try db.fetchKeys(badWhere) }
        expectUnknownColumn("nope") { try db.fetchAll(badOrder) }
        expectUnknownColumn("nope") { try db.fetchAll(OrmUser.where(.isNull("nope"))) }
        expectUnknownColumn("nope") { try db.fetchAll(OrmUser.where(.in("nope", [1]))) }
        expectUnknownColumn("nope") { try db.fetchAll(OrmUser.where(\.age > 1 || .like("nope", "x"))) }
        expectUnknownColumn("nope") { try db.fetchAll(OrmUser.where(!Condition.between("nope", 1, 2))) }
        expectUnknownColumn("nope") { try db.fetchAll(OrmUser.query("age", ">", 1).or("nope", "=", 2)) }
        expectUnknownColumn("nope") { try db.aggregate(.sum("nope"), of: OrmUser.query, as: Int.self) }
        expectUnknownColumn("nope") { try db.aggregate(.count, of: badOrder, as: Int.self) }
        // Writes.
        expectUnknownColumn("nope") { try db.delete(badWhere) }
        expectUnknownColumn("nope") { try db.delete(OrmUser.where(\.age > 0 || .compare("nope", "=", 1))) }
        expectUnknownColumn("nope") { try db.delete(badOrder.limit(1)) }
        expectUnknownColumn("nope") { try db.update(badWhere, set: [.set("name", to: "x")]) }
        expectUnknownColumn("nope") { try db.update(badOrder.limit(2), set: [.set("name", to: "x")]) }
        expectUnknownColumn("nope") { try db.update(OrmUser.query, set: [.set("name", to: "x"), .set("nope", to: 1)]) }
        expectUnknownColumn("nope") { try db.update(OrmUser.query, set: [.setNull("nope")]) }
        expectUnknownColumn("nope") { try db.update(OrmUser.self, key: PrimaryKey(1), set: [.set("nope", to: 1)]) }
        expectUnknownColumn("nope") { try db.update(ormUsers[0], columns: ["nope"]) }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func swiftPropertyNameOfARenamedColumnIsNotAColumn() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmPerson.self)
        try db.insert(OrmPerson(id: 1, firstName: "Ann", lastName: nil))
        let before = try ormDump(db, "orm_person")
        for error in [
            ormThrownModelError { try db.fetchAll(OrmPerson.query("firstName", "=", "Ann")) },
            ormThrownModelError {
                try db.update(OrmPerson.self, key: PrimaryKey(1), set: [.set("firstName", to: "B")])
            },
            ormThrownModelError { try db.fetchAll(OrmPerson.query.orderBy("cache")) },  // left out of CodingKeys
        ] {
            #expect(error?.ormCase == .unknownColumn, "\(String(describing: error))")
        }
        #expect(try ormDump(db, "orm_person") == before)
    }

    @Test func malformedConditionsAreInvalidArguments() throws {
        let db = try ormUserFixture()
        let before = try ormDump(db, "orm_user")
        let unknownOperator = OrmUser.query("age", "~=", 1)
        let inWithoutArray = OrmUser.query("age", "IN", 30)
        let notInWithoutArray = OrmUser.where(.compare(\.age, "NOT IN", 30))
        let betweenThree = OrmUser.query("age", "BETWEEN", [1, 2, 3])
        let betweenOne = OrmUser.query("age", "between", [1])
        let likeNull = OrmUser.query("name", "LIKE", String?.none)
        let lessThanNull = OrmUser.where(\.score < nil)
        let negativeLimit = OrmUser.query.orderBy(\.id).limit(-1)
        let negativeOffset = OrmUser.query.limit(1, offset: -2)

        for query in [
            unknownOperator, inWithoutArray, notInWithoutArray, betweenThree, betweenOne, likeNull, lessThanNull,
            negativeLimit, negativeOffset,
        ] {
            ormExpectModelError(.invalidArgument) { try db.fetchAll(query) }
            ormExpectModelError(.invalidArgument) { try db.count(query) }
            // The write forms must not fall back to "every row".
            ormExpectModelError(.invalidArgument) { try db.delete(query) }
            ormExpectModelError(.invalidArgument) { try db.update(query, set: [.set("nickname", to: "changed")]) }
        }
        // The messages say what is wrong.
        let op = ormExpectModelError(.invalidArgument) { try db.fetchAll(unknownOperator) }
        #expect(op?.description.contains("~=") == true)
        let between = ormExpectModelError(.invalidArgument) { try db.fetchAll(betweenThree) }
        #expect(between?.description.contains("two values") == true)
        let list = ormExpectModelError(.invalidArgument) { try db.fetchAll(inWithoutArray) }
        #expect(list?.description.contains("array") == true)
        let limit = ormExpectModelError(.invalidArgument) { try db.fetchAll(negativeLimit) }
        #expect(limit?.description.contains("negative") == true)
        #expect(try ormDump(db, "orm_user") == before)
    }

    // MARK: Stored values that do not fit the model

    /// A non-STRICT table made by raw SQL, so that any value can be stored.
    private func looseFixture() throws -> Database {
        let db = try Database.inMemory()
        try db.execute(
            "CREATE TABLE orm_loose (id INTEGER PRIMARY KEY, name TEXT, count INTEGER, color TEXT, address TEXT)")
        try db.execute(
            """
            INSERT INTO orm_loose (id, name, count, color, address) VALUES
                (1, 'ok', 1, 'red', NULL),
                (2, 'ok too', 2, 'blue', '{"street":"s","city":"c","zip":1}')
            """)
        return db
    }

    @Test func wellFormedLooseRowsDecode() throws {
        let db = try looseFixture()
        #expect(
            try db.fetchAll(OrmLoose.query.orderBy(\.id)) == [
                OrmLoose(id: 1, name: "ok", count: 1, color: .red, address: nil),
                OrmLoose(id: 2, name: "ok too", count: 2, color: .blue, address: .init(street: "s", city: "c", zip: 1)),
            ])
    }

    private func expectTypeMismatch<T>(
        _ column: String, found: String? = nil, sourceLocation: SourceLocation = #_sourceLocation,
        _ body: () throws -> T
    ) {
        let error = ormExpectModelError(.typeMismatch, sourceLocation: sourceLocation, body)
        if case let .typeMismatch(name, _, foundValue, sql)? = error {
            #expect(name == column, sourceLocation: sourceLocation)
            if let found { #expect(foundValue.hasPrefix(found), "\(foundValue)", sourceLocation: sourceLocation) }
            #expect(sql?.contains("orm_loose") == true, sourceLocation: sourceLocation)
        }
    }

    @Test func textInAnIntegerPropertyIsATypeMismatch() throws {
        let db = try looseFixture()
        try db.execute("INSERT INTO orm_loose VALUES (3, 'bad', 'many', 'red', NULL)")
        expectTypeMismatch("count", found: "TEXT") { try db.fetchAll(OrmLoose.self) }
        expectTypeMismatch("count", found: "TEXT") { try db.fetch(OrmLoose.self, key: PrimaryKey(3)) }
        expectTypeMismatch("count", found: "TEXT") {
            try db.fetchAll(OrmLoose.self, sql: "SELECT * FROM orm_loose WHERE id = 3")
        }
        // A REAL with a fraction does not fit an Int either.
        try db.execute("UPDATE orm_loose SET count = 2.5 WHERE id = 3")
        expectTypeMismatch("count", found: "REAL") { try db.fetch(OrmLoose.self, key: PrimaryKey(3)) }
        // The good rows still decode.
        #expect(try db.fetchAll(OrmLoose.where(\.id < 3)).count == 2)
    }

    @Test func nullInANonOptionalPropertyIsATypeMismatch() throws {
        let db = try looseFixture()
        try db.execute("INSERT INTO orm_loose VALUES (3, NULL, 3, 'red', NULL)")
        try db.execute("INSERT INTO orm_loose VALUES (4, 'x', NULL, 'red', NULL)")
        try db.execute("INSERT INTO orm_loose VALUES (5, 'x', 5, NULL, NULL)")
        expectTypeMismatch("name", found: "NULL") { try db.fetch(OrmLoose.self, key: PrimaryKey(3)) }
        expectTypeMismatch("count", found: "NULL") { try db.fetch(OrmLoose.self, key: PrimaryKey(4)) }
        expectTypeMismatch("color", found: "NULL") { try db.fetch(OrmLoose.self, key: PrimaryKey(5)) }
    }

    @Test func jsonOfTheWrongShapeIsATypeMismatch() throws {
        let db = try looseFixture()
        try db.execute(#"INSERT INTO orm_loose VALUES (3, 'x', 3, 'red', '{"street":1}')"#)
        try db.execute("INSERT INTO orm_loose VALUES (4, 'x', 4, 'red', 'not json')")
        // a BLOB keeps its class under TEXT affinity
        try db.execute("INSERT INTO orm_loose VALUES (5, 'x', 5, 'red', X'0102')")
        // stored as the TEXT '12': JSON, but not an Address
        try db.execute("INSERT INTO orm_loose VALUES (6, 'x', 6, 'red', 12)")
        expectTypeMismatch("address", found: "TEXT") { try db.fetch(OrmLoose.self, key: PrimaryKey(3)) }
        expectTypeMismatch("address", found: "TEXT") { try db.fetch(OrmLoose.self, key: PrimaryKey(4)) }
        expectTypeMismatch("address", found: "BLOB") { try db.fetch(OrmLoose.self, key: PrimaryKey(5)) }
        expectTypeMismatch("address", found: "TEXT") { try db.fetch(OrmLoose.self, key: PrimaryKey(6)) }
    }

    /// An enum column holding a value that is not one of its raw values does
    /// not fit the Swift type: it should be `typeMismatch` naming the column
    /// (not a bare DecodingError with an empty coding path).
    @Test func unknownEnumRawValueIsATypeMismatchNamingTheColumn() throws {
        let db = try looseFixture()
        try db.execute("INSERT INTO orm_loose VALUES (3, 'x', 3, 'purple', NULL)")
        expectTypeMismatch("color") { try db.fetch(OrmLoose.self, key: PrimaryKey(3)) }
        expectTypeMismatch("color") { try db.fetchAll(OrmLoose.self) }
    }

    @Test func rawSQLWithoutAColumnIsAMissingColumn() throws {
        let db = try ormUserFixture()
        let error = ormExpectModelError(.missingColumn) {
            try db.fetchAll(OrmUser.self, sql: "SELECT id, name FROM orm_user")
        }
        if case let .missingColumn(column, sql)? = error {
            #expect(column == "email")
            #expect(sql == "SELECT id, name FROM orm_user")
        }
        // Optional columns may be left out (they read as nil); extra columns and any order are fine.
        let users = try db.fetchAll(
            OrmUser.self, sql: "SELECT age, email, name, id, 1 AS extra FROM orm_user WHERE id = ?", arguments: [1])
        #expect(users == [OrmUser(id: 1, name: "Alice", email: "alice@x", age: 30, score: nil, nickname: nil)])
        // Column names match case-insensitively, as in SQL.
        #expect(
            try db.fetchAll(
                OrmUser.self, sql: "SELECT ID, NAME, EMAIL, AGE, SCORE, NICKNAME FROM orm_user WHERE id = 3") == [
                    ormUsers[2]
                ])
    }

    @Test func aModelWhoseTableDoesNotExist() throws {
        let db = try Database.inMemory()
        let errors = [
            ormExpectDatabaseError(.sqlError) { try db.fetchAll(OrmGhost.self) },
            ormExpectDatabaseError(.sqlError) { try db.fetch(OrmGhost.self, key: PrimaryKey(1)) },
            ormExpectDatabaseError(.sqlError) { try db.fetchAll(OrmGhost.where(\.value > 1)) },
            ormExpectDatabaseError(.sqlError) { try db.count(OrmGhost.self) },
            ormExpectDatabaseError(.sqlError) { try db.exists(OrmGhost.self, key: PrimaryKey(1)) },
            ormExpectDatabaseError(.sqlError) { try db.insert(OrmGhost(id: 1, value: 1)) },
            ormExpectDatabaseError(.sqlError) { try db.save(OrmGhost(id: 1, value: 1)) },
            ormExpectDatabaseError(.sqlError) { try db.update(OrmGhost(id: 1, value: 1)) },
            ormExpectDatabaseError(.sqlError) { try db.delete(OrmGhost(id: 1, value: 1)) },
            ormExpectDatabaseError(.sqlError) { try db.deleteAll(OrmGhost.self) },
        ]
        for error in errors {
            #expect(error?.message.contains("no such table: orm_ghost") == true, "\(String(describing: error))")
        }
        #expect(try !db.tableExists("orm_ghost"))
        // dropTable of a missing table is fine by default.
        try db.dropTable(OrmGhost.self)
        ormExpectDatabaseError(.sqlError) { try db.dropTable(OrmGhost.self, ifExists: false) }
        try db.createTable(OrmGhost.self)
        try db.insert(OrmGhost(id: 1, value: 1))
        try db.dropTable(OrmGhost.self)
        ormExpectDatabaseError(.sqlError) { try db.fetchAll(OrmGhost.self) }
    }

    // MARK: Model declarations that cannot work

    @Test func invalidModelDeclarations() throws {
        let db = try Database.inMemory()
        let schema = try db.fetchRows("SELECT type, name FROM sqlite_master ORDER BY name").map(\.values)
        let noID = ormExpectModelError(.invalidModel) { try db.createTable(OrmNoID.self) }
        #expect(noID?.description.contains("primaryKey") == true, "\(String(describing: noID))")
        ormExpectModelError(.invalidModel) { try db.createTable(OrmTwiceKey.self) }
        ormExpectModelError(.unknownColumn) { try db.createTable(OrmUnknownKey.self) }
        let auto = ormExpectModelError(.invalidModel) { try db.createTable(OrmTextAutoIncrement.self) }
        #expect(auto?.description.contains("autoIncrement") == true, "\(String(describing: auto))")
        ormExpectModelError(.unknownColumn) { try db.createTable(OrmBadIndex.self) }
        ormExpectModelError(.invalidModel) { try db.createTable(OrmBadForeignKey.self) }
        // Nothing half-created.
        #expect(try db.fetchRows("SELECT type, name FROM sqlite_master ORDER BY name").map(\.values) == schema)
    }
}

struct OrmNoID: Model {
    var code: String
    var name: String
}

struct OrmTwiceKey: Model {
    var id: Int64
    var other: Int
    static var primaryKey: [ColumnRef<OrmTwiceKey>] { ["id", .column(\.id)] }
}

struct OrmUnknownKey: Model {
    var id: Int64
    static var primaryKey: [ColumnRef<OrmUnknownKey>] { ["key"] }
}

struct OrmTextAutoIncrement: Model {
    var id: String
    static var constraints: [Constraint<OrmTextAutoIncrement>] { [.autoIncrement] }
}

struct OrmBadIndex: Model {
    var id: Int64
    var name: String
    static let tableName = "orm_bad_index"
    static var constraints: [Constraint<OrmBadIndex>] { [.index(["name"]), .index(["nope"])] }
}

struct OrmBadForeignKey: Model {
    var id: Int64
    var a: Int
    var b: Int
    static var constraints: [Constraint<OrmBadForeignKey>] {
        [.foreignKey(["a", "b"], table: "orm_author", columns: ["id"], onDelete: .cascade, onUpdate: .noAction)]
    }
}
