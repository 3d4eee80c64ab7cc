import Foundation
import Testing
@testable import Tether

/// Property types and how they are stored; key paths as columns.
@Suite struct ORMValueTests {

    @Test func columnTypesAndNullability() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAllTypes.self)
        let info = try ormTableInfo(db, "orm_all_types")
        let types = Dictionary(uniqueKeysWithValues: info.map { ($0.name, $0.type) })
        let expected: [String: String] = [
            "id": "INTEGER", "int": "INTEGER", "int64": "INTEGER", "double": "REAL", "float": "REAL",
            "bool": "INTEGER", "string": "TEXT", "data": "BLOB", "date": "REAL", "uuid": "TEXT",
            "optInt": "INTEGER", "optString": "TEXT", "optDate": "REAL", "optData": "BLOB",
            "color": "TEXT", "level": "INTEGER", "optColor": "TEXT", "optLevel": "INTEGER",
            "address": "TEXT", "optAddress": "TEXT", "tags": "TEXT", "scores": "TEXT",
        ]
        #expect(types == expected)
        let nullable = Set(info.filter { !$0.notNull }.map(\.name))
        // "id" is the rowid alias: INTEGER PRIMARY KEY, which SQLite never stores as NULL.
        #expect(
            nullable.subtracting(["id"]) == [
                "optInt", "optString", "optDate", "optData", "optColor", "optLevel", "optAddress",
            ])
    }

    @Test func everyValueTypeRoundTrips() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAllTypes.self)
        let full = OrmAllTypes.sample(id: 1)
        let sparse = OrmAllTypes.sparse(id: 2)
        try db.insert(full)
        try db.insert(sparse)
        #expect(try db.fetch(OrmAllTypes.self, key: PrimaryKey(1)) == full)
        #expect(try db.fetch(OrmAllTypes.self, key: PrimaryKey(2)) == sparse)
        #expect(try db.fetchAll(OrmAllTypes.query.orderBy(\.id)) == [full, sparse])

        // nil optionals are stored as NULL.
        let nulls = try #require(
            try db.fetchRows(
                "SELECT optInt, optString, optDate, optData, optColor, optLevel FROM orm_all_types WHERE id = 2"
            ).first)
        let allNull = nulls.values.allSatisfy(\.isNull)
        #expect(allNull)

        // update and save round-trip every type too (swapping the two rows' values).
        var swapped = sparse
        swapped.id = 1
        try db.update(swapped)
        #expect(try db.fetch(OrmAllTypes.self, key: PrimaryKey(1)) == swapped)
        var saved = full
        saved.id = 2
        try db.save(saved)
        #expect(try db.fetch(OrmAllTypes.self, key: PrimaryKey(2)) == saved)
    }

    @Test func storageClassesInTheDatabase() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAllTypes.self)
        try db.insert(OrmAllTypes.sample(id: 1))
        let row = try #require(
            try db.fetchRows(
                """
                SELECT typeof(int), typeof(double), typeof(float), typeof(bool), bool, typeof(data), typeof(date), date,
                       uuid, color, level, typeof(level)
                FROM orm_all_types
                """
            ).first)
        #expect(
            row.values == [
                .text("integer"), .text("real"), .text("real"), .text("integer"), .integer(1), .text("blob"),
                .text("real"), .real(1_700_000_000.5),
                .text("E621E1F8-C36C-495A-93FC-0C247A3E6E5F"), .text("blue"), .integer(10), .text("integer"),
            ])
    }

    @Test func arraysDictionariesAndNestedStructsAreJSONText() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAllTypes.self)
        try db.insert(OrmAllTypes.sample(id: 1))
        try db.insert(OrmAllTypes.sparse(id: 2))
        let row = try #require(
            try db.fetchRows(
                """
                SELECT typeof(tags), tags, json_valid(tags), scores, json_valid(scores), address, optAddress,
                       json_extract(address, '$.city'), json_extract(scores, '$.y'), json_array_length(tags)
                FROM orm_all_types WHERE id = 1
                """
            ).first)
        #expect(
            row.values == [
                .text("text"), .text(#"["a","b"]"#), .integer(1), .text(#"{"x":1,"y":2}"#), .integer(1),
                .text(#"{"city":"Paris","street":"1 Main St","zip":75001}"#),
                .text(#"{"city":"Lyon","street":"2 Side St","zip":69001}"#),
                .text("Paris"), .integer(2), .integer(2),
            ])
        let empty = try #require(try db.fetchRows("SELECT tags, scores FROM orm_all_types WHERE id = 2").first)
        #expect(empty.values == [.text("[]"), .text("{}")])
        // JSON columns refuse text that is not JSON.
        let before = try ormDump(db, "orm_all_types")
        ormExpectDatabaseError(.checkViolation) {
            try db.execute("UPDATE orm_all_types SET tags = 'not json' WHERE id = 1")
        }
        #expect(try ormDump(db, "orm_all_types") == before)
    }

    @Test func queriesOnEveryValueType() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAllTypes.self)
        try db.insert(OrmAllTypes.sample(id: 1))
        try db.insert(OrmAllTypes.sparse(id: 2))
        func ids(_ condition: Condition<OrmAllTypes>) throws -> [Int64] {
            try db.fetchAll(OrmAllTypes.where(condition).orderBy(\.id)).map(\.id)
        }
        let full = OrmAllTypes.sample(id: 1)
        #expect(try ids(\.int == -42) == [1])
        #expect(try ids(\.int64 == Int64.min) == [2])
        #expect(try ids(\.double > 0) == [1])
        #expect(try ids(\.float == 1.5) == [1])
        #expect(try ids(\.bool == true) == [1])
        #expect(try ids(\.bool == false) == [2])
        #expect(try ids(\.string == full.string) == [1])
        #expect(try ids(\.data == Data([0, 1, 2, 255])) == [1])
        #expect(try ids(\.data == Data()) == [2])
        #expect(try ids(\.date > Date(timeIntervalSince1970: 1000)) == [1])
        #expect(try ids(\.uuid == full.uuid) == [1])
        #expect(try ids(\.optInt == nil) == [2])
        #expect(try ids(\.optInt == 7) == [1])
        #expect(try ids(\.optString != nil) == [1])
        #expect(try ids(\.optDate == nil) == [2])
        #expect(try ids(\.color == .blue) == [1])
        #expect(try ids(\.level == .low) == [2])
        #expect(try ids(.in(\.level, [.mid, .high])) == [1])
        #expect(try ids(\.optColor == .green) == [1])
        #expect(try ids(\.optColor == nil) == [2])
        #expect(try ids(\.address == full.address) == [1])
        #expect(try ids(\.optAddress == full.optAddress) == [1])
        #expect(try ids(\.tags == ["a", "b"]) == [1])
        #expect(try ids(\.tags == []) == [2])
        #expect(try ids(\.scores == ["y": 2, "x": 1]) == [1])
    }

    /// Optional nested values are JSON columns with CHECK (json_valid(col));
    /// nil must be storable as NULL (json_valid(NULL) is 0 in SQLite < 3.45,
    /// which fails the CHECK).
    @Test func optionalJSONColumnsRoundTripNil() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmOptionalJSON.self)
        let info = try ormTableInfo(db, "orm_optional_json")
        #expect(info.map(\.notNull) == [false, false, false, false])
        let full = OrmOptionalJSON(id: 1, address: .init(street: "s", city: "c", zip: 1), tags: ["t"], scores: ["k": 2])
        try db.insert(full)
        #expect(try db.fetch(OrmOptionalJSON.self, key: PrimaryKey(1)) == full)

        let empty = OrmOptionalJSON(id: 2, address: nil, tags: nil, scores: nil)
        try db.insert(empty)
        #expect(try db.fetch(OrmOptionalJSON.self, key: PrimaryKey(2)) == empty)
        #expect(
            try db.fetchRows("SELECT address, tags, scores FROM orm_optional_json WHERE id = 2").first?.values == [
                .null, .null, .null,
            ])
        // Setting back to nil by update works too.
        var cleared = full
        cleared.address = nil
        try db.update(cleared)
        #expect(try db.fetch(OrmOptionalJSON.self, key: PrimaryKey(1)) == cleared)
        try db.update(OrmOptionalJSON.self, key: PrimaryKey(1), set: [.setNull(\.tags)])
        #expect(try db.fetch(OrmOptionalJSON.self, key: PrimaryKey(1))?.tags == nil)
        #expect(try db.fetchAll(OrmOptionalJSON.where(\.address == nil).orderBy(\.id)).map(\.id) == [1, 2])
    }

    @Test func enumNeitherCaseIterableNorConvertibleIsAColumn() throws {
        // Its cases come from the type itself: nothing to declare.
        let db = try Database.inMemory()
        try db.createTable(OrmMoody.self)
        #expect(try ormTableInfo(db, "orm_moody").map(\.type) == ["INTEGER", "TEXT"])
        try db.insert(OrmMoody(id: 1, mood: .sad))
        #expect(try ormDump(db, "orm_moody") == [[.integer(1), .text("sad")]])
        #expect(try db.fetchAll(OrmMoody.where(\.mood == .sad)).map(\.id) == [1])
        try db.execute("UPDATE orm_moody SET mood = 'angry'")
        ormExpectModelError(.typeMismatch) { try db.fetchAll(OrmMoody.self) }
    }

    // MARK: Key paths

    @Test func keyPathsMapToColumns() throws {
        let db = try ormUserFixture()
        #expect(try db.fetchAll(OrmUser.where(\.age > 30).orderBy(\.id)).map(\.id) == [3, 4])
        // Optional property: compared with a value, and with nil.
        #expect(try db.fetchAll(OrmUser.where(\.score > 10).orderBy(\.id)).map(\.id) == [3, 4, 6])
        #expect(try db.fetchAll(OrmUser.where(\.score == nil)).map(\.id) == [2])
        #expect(try db.fetchAll(OrmUser.where(\.nickname != nil).orderBy(\.id)).map(\.id) == [1, 3, 5, 6])
        // Order, assignment and aggregate by key path.
        #expect(try db.fetchAll(OrmUser.query.orderBy(\.score, ascending: false).limit(2)).map(\.id) == [3, 6])
        try db.update(OrmUser.self, key: PrimaryKey(2), set: [.set(\.score, to: 1), .set(\.nickname, to: "bobby")])
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(2))?.score == 1)
        #expect(try db.aggregate(.maximum(\.age), of: OrmUser.query, as: Int.self) == 40)
        // Key paths of a final class model.
        try db.createTable(OrmNote.self)
        try db.insert(OrmNote(id: 1, title: "t", body: nil))
        #expect(try db.fetchAll(OrmNote.where(\.body == nil)).map(\.id) == [1])
    }

    @Test func keyPathToComputedPropertyOfTwoColumnsIsAClearErrorWhenTheQueryRuns() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmRect.self)
        try db.insert(OrmRect(id: 1, label: "r", width: 2, height: 3, origin: .init(city: "Oslo", x: 1)))
        let before = try ormDump(db, "orm_rect")
        let query = OrmRect.where(\.area > 4)  // building the query does not throw
        for error in [
            ormThrownModelError { try db.fetchAll(query) },
            ormThrownModelError { try db.count(query) },
            ormThrownModelError { try db.delete(query) },
            ormThrownModelError { try db.fetchAll(OrmRect.query.orderBy(\.area)) },
            ormThrownModelError { try db.update(OrmRect.self, key: PrimaryKey(1), set: [.set(\.area, to: 1)]) },
            ormThrownModelError { try db.fetchAll(OrmRect.where(\.perimeter > 4)) },
            ormThrownModelError { try db.update(OrmRect.where(\.perimeter > 4), set: [.set("label", to: "x")]) },
        ] {
            let message = try #require(error).description
            #expect(message.contains("cannot be used as a column"), "\(message)")
            #expect(message.contains("OrmRect"), "\(message)")
        }
        // The sum reads both columns: the message says so.
        let perimeter = ormThrownModelError { try db.fetchAll(OrmRect.where(\.perimeter > 4)) }
        #expect(
            perimeter?.description.contains("depends on several columns") == true, "\(String(describing: perimeter))")
        #expect(try ormDump(db, "orm_rect") == before)
    }

    @Test func nestedKeyPathIsAClearErrorWhenTheQueryRuns() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmRect.self)
        try db.insert(OrmRect(id: 1, label: "r", width: 2, height: 3, origin: .init(city: "Oslo", x: 1)))
        let before = try ormDump(db, "orm_rect")
        for error in [
            ormThrownModelError { try db.fetchAll(OrmRect.where(\.origin.city == "Oslo")) },
            ormThrownModelError { try db.fetchAll(OrmRect.where(\.origin.x > 0)) },
            ormThrownModelError { try db.delete(OrmRect.where(\.origin.city == "Oslo")) },
            // not stored (left out of CodingKeys)
            ormThrownModelError { try db.fetchAll(OrmRect.where(\.ignored == 0)) },
        ] {
            let message = try #require(error).description
            #expect(message.contains("does not read a stored column"), "\(message)")
        }
        #expect(try ormDump(db, "orm_rect") == before)
        // The whole nested value is a column.
        #expect(try db.fetchAll(OrmRect.where(\.origin == .init(city: "Oslo", x: 1))).map(\.id) == [1])
    }

    /// `doubleWidth` reads only `width`, so the samples cannot tell it from
    /// `width` itself. A query on it must not silently become a query on
    /// `width` (which returns wrong rows): it should be an error like the
    /// two-column computed property.
    @Test func keyPathToComputedPropertyOfOneColumnIsNotSilentlyThatColumn() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmRect.self)
        try db.insert(OrmRect(id: 1, label: "r", width: 2, height: 3, origin: .init(city: "Oslo", x: 1)))
        // doubleWidth is 4; "WHERE width = 4" would find nothing, "WHERE width = 2" would wrongly find it.
        let error = ormThrownModelError { try db.fetchAll(OrmRect.where(\.doubleWidth == 2)) }
        #expect(error != nil, "a key path to a computed property was used as the column it reads")
    }

    /// A stored property whose type has a single value (a one-case enum) is a
    /// column like any other; its key path should reach it.
    @Test func keyPathToASingleCaseEnumColumn() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmVersioned.self)
        try db.insert(OrmVersioned(id: 1, version: .v1, name: "a"))
        #expect(try db.fetchAll(OrmVersioned.where(\.version == .v1)).map(\.id) == [1])
        #expect(try db.fetchAll(OrmVersioned.query("version", "=", OrmVersioned.Version.v1)).map(\.id) == [1])
    }
}

struct OrmVersioned: Model, Equatable {
    enum Version: Int, Codable, CaseIterable, Sendable { case v1 = 1 }
    var id: Int64
    var version: Version
    var name: String
    static let tableName = "orm_versioned"
}

/// The ModelError `body` throws, or nil (with an issue recorded).
func ormThrownModelError<T>(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> T) -> ModelError? {
    do {
        _ = try body()
        Issue.record("expected a ModelError, but nothing was thrown", sourceLocation: sourceLocation)
    } catch let error as ModelError {
        return error
    } catch {
        Issue.record("expected a ModelError, got \(type(of: error)): \(error)", sourceLocation: sourceLocation)
    }
    return nil
}
