import Foundation
import Testing
@testable import Tether
import TetherTestSupport

enum CoreTestColor: String, Codable, DatabaseValueConvertible { case red, green }
enum CoreTestLevel: Int, DatabaseValueConvertible { case low = 1, high = 10 }

@Suite("Core: values")
struct CoreValueTests {
    /// A table whose column has no declared type, so values keep their storage class.
    private static let schema = "CREATE TABLE v (x)"

    /// Stores `value` with a bound argument, and reads it back three ways:
    /// `fetchValue`, `Row.get` by index and by name. Returns what came back and
    /// SQLite's storage class for it.
    private func roundTrip<V: DatabaseValueConvertible>(_ value: V, in db: Database) throws -> (
        value: V?, fromRow: V, byName: V, storage: String
    ) {
        try db.write { conn in
            try conn.execute("DELETE FROM v")
            try conn.execute("INSERT INTO v (x) VALUES (?)", [value])
            let fetched = try conn.fetchValue("SELECT x FROM v", as: V.self)
            let rows = try conn.fetchRows("SELECT x FROM v")
            try #require(rows.count == 1)
            let storage = try conn.fetchValue("SELECT typeof(x) FROM v", as: String.self) ?? "?"
            return (fetched, try rows[0].get(0, as: V.self), try rows[0].get("x", as: V.self), storage)
        }
    }

    private func check<V: DatabaseValueConvertible & Equatable>(
        _ value: V, storage: String, in db: Database,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let result = try roundTrip(value, in: db)
        #expect(result.value == value, "fetchValue", sourceLocation: sourceLocation)
        #expect(result.fromRow == value, "Row.get(index)", sourceLocation: sourceLocation)
        #expect(result.byName == value, "Row.get(name)", sourceLocation: sourceLocation)
        #expect(result.storage == storage, "storage of \(value)", sourceLocation: sourceLocation)
    }

    @Test func integersRoundTrip() throws {
        let db = try makeDatabase(schema: Self.schema)
        for value in [0, 1, -1, Int.max, Int.min] { try check(value, storage: "integer", in: db) }
        for value in [Int8.min, 0, Int8.max] { try check(value, storage: "integer", in: db) }
        for value in [Int16.min, Int16.max] { try check(value, storage: "integer", in: db) }
        for value in [Int32.min, Int32.max] { try check(value, storage: "integer", in: db) }
        for value in [Int64.min, -42, Int64.max] { try check(value, storage: "integer", in: db) }
        for value in [UInt8.min, UInt8.max] { try check(value, storage: "integer", in: db) }
        for value in [UInt16.min, UInt16.max] { try check(value, storage: "integer", in: db) }
        for value in [UInt32.min, UInt32.max] { try check(value, storage: "integer", in: db) }
        // UInt32.max is stored as the positive integer, not wrapped.
        try db.execute("DELETE FROM v")
        try db.execute("INSERT INTO v (x) VALUES (?)", [UInt32.max])
        #expect(try db.fetchValue("SELECT x = 4294967295 FROM v", as: Bool.self) == true)
        // An integer too large for the type is a type mismatch, not a wrapped value.
        try db.execute("DELETE FROM v")
        try db.execute("INSERT INTO v (x) VALUES (300)")
        let error = #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT x FROM v", as: Int8.self) }
        guard case let .typeMismatch(_, expected, found, sql)? = error else {
            Issue.record("expected typeMismatch, got \(String(describing: error))"); return
        }
        #expect(expected == "Int8")
        #expect(found == "INTEGER")
        #expect(sql == "SELECT x FROM v")
        #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT -1", as: UInt8.self) }
        // A REAL holding an exact integer is accepted; one with a fraction is not.
        #expect(try db.fetchValue("SELECT 3.0", as: Int.self) == 3)
        #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT 3.5", as: Int.self) }
    }

    @Test func floatingPointAndBoolRoundTrip() throws {
        let db = try makeDatabase(schema: Self.schema)
        for value in [0.0, 3.141592653589793, -2.5e-300, 1.7976931348623157e308, Double.infinity] {
            try check(value, storage: "real", in: db)
        }
        for value in [Float(1.5), Float.pi, Float(-0.1), Float.greatestFiniteMagnitude] {
            try check(value, storage: "real", in: db)
        }
        try check(true, storage: "integer", in: db)
        try check(false, storage: "integer", in: db)
        #expect(try db.fetchValue("SELECT x FROM v", as: Int.self) == 0)
        try db.execute("UPDATE v SET x = 1")
        #expect(try db.fetchValue("SELECT x FROM v", as: Bool.self) == true)
        #expect(try db.fetchValue("SELECT 7", as: Double.self) == 7.0)
        // Text reads as AgileDB reads it (see ORMConverterTests): the words, and nothing else.
        #expect(try db.fetchValue("SELECT 'yes'", as: Bool.self) == true)
        #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT 'maybe'", as: Bool.self) }
    }

    @Test func stringsRoundTrip() throws {
        let db = try makeDatabase(schema: Self.schema)
        let samples = [
            "", "plain", "it's \"quoted\"", "héllo wörld — 日本語 🌍👩‍👩‍👧", "a\u{0}b", "\u{0}", "line\nbreak\ttab",
            String(repeating: "long ", count: 10_000),
        ]
        for value in samples { try check(value, storage: "text", in: db) }
        // The empty string is TEXT, not NULL.
        try db.execute("DELETE FROM v")
        try db.execute("INSERT INTO v (x) VALUES (?)", [""])
        #expect(try db.fetchValue("SELECT x IS NULL FROM v", as: Bool.self) == false)
        #expect(try db.fetchValue("SELECT length(x) FROM v", as: Int.self) == 0)
        // Embedded NUL: every byte is stored.
        try db.execute("DELETE FROM v")
        try db.execute("INSERT INTO v (x) VALUES (?)", ["a\u{0}b"])
        #expect(try db.fetchValue("SELECT length(CAST(x AS BLOB)) FROM v", as: Int.self) == 3)
        #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT 1", as: String.self) }
    }

    @Test func dataRoundTripsIncludingEmpty() throws {
        let db = try makeDatabase(schema: Self.schema)
        let samples = [Data(), Data([0]), Data([0, 1, 2, 0xFE, 0xFF]), Data((0..<70_000).map { UInt8($0 % 251) })]
        for value in samples { try check(value, storage: "blob", in: db) }
        // The empty Data is an empty BLOB, not NULL.
        try db.execute("DELETE FROM v")
        try db.execute("INSERT INTO v (x) VALUES (?)", [Data()])
        #expect(try db.fetchValue("SELECT x IS NULL FROM v", as: Bool.self) == false)
        #expect(try db.fetchValue("SELECT typeof(x) FROM v", as: String.self) == "blob")
        #expect(try db.fetchValue("SELECT x FROM v", as: Data.self) == Data())
        #expect(try db.fetchRows("SELECT x FROM v").first?[0] == .blob(Data()))
        // Through DatabaseValue and named arguments too.
        try db.execute("DELETE FROM v")
        try db.execute("INSERT INTO v (x) VALUES (:x)", ["x": DatabaseValue.blob(Data())])
        #expect(try db.fetchValue("SELECT typeof(x) FROM v", as: String.self) == "blob")
        #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT 'text'", as: Data.self) }
    }

    @Test func datesAreRealSecondsSince1970() throws {
        let db = try makeDatabase(schema: Self.schema)
        for value in [
            Date(timeIntervalSince1970: 0), Date(timeIntervalSince1970: 1_704_164_645.25),
            Date(timeIntervalSince1970: -86_400.5),
        ] {
            try check(value, storage: "real", in: db)
        }
        let date = Date(timeIntervalSince1970: 1_704_164_645.5)
        try db.execute("DELETE FROM v")
        try db.execute("INSERT INTO v (x) VALUES (?)", [date])
        #expect(try db.fetchValue("SELECT x FROM v", as: Double.self) == 1_704_164_645.5)
        #expect(try db.fetchValue("SELECT datetime(x, 'unixepoch') FROM v", as: String.self) == "2024-01-02 03:04:05")
        // Now: within the precision of a Double.
        let now = Date()
        let back = try #require(try roundTrip(now, in: db).value)
        #expect(abs(back.timeIntervalSince(now)) < 0.000_01)
        // An INTEGER is accepted too.
        #expect(try db.fetchValue("SELECT 86400", as: Date.self) == Date(timeIntervalSince1970: 86_400))
    }

    @Test func textDatesWrittenBySQLAreRead() throws {
        let db = try makeDatabase(schema: Self.schema)
        let expected = Date(timeIntervalSince1970: 1_704_164_645)  // 2024-01-02 03:04:05 UTC
        try db.execute("INSERT INTO v (x) VALUES ('2024-01-02 03:04:05')")
        #expect(try db.fetchValue("SELECT typeof(x) FROM v", as: String.self) == "text")
        #expect(try db.fetchValue("SELECT x FROM v", as: Date.self) == expected)
        #expect(try db.fetchRows("SELECT x FROM v")[0].get("x", as: Date.self) == expected)
        #expect(try db.fetchValue("SELECT datetime(1704164645, 'unixepoch')", as: Date.self) == expected)
        #expect(try db.fetchValue("SELECT '2024-01-02T03:04:05Z'", as: Date.self) == expected)
        #expect(
            try db.fetchValue("SELECT '2024-01-02 03:04:05.250'", as: Date.self) == expected.addingTimeInterval(0.25))
        #expect(
            try db.fetchValue("SELECT strftime('%Y-%m-%d %H:%M:%f', 1704164645.5, 'unixepoch')", as: Date.self)
                == expected.addingTimeInterval(0.5))
        #expect(
            try db.fetchValue("SELECT date(1704164645, 'unixepoch')", as: Date.self)
                == Date(timeIntervalSince1970: 1_704_153_600))
        #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT 'not a date'", as: Date.self) }
    }

    @Test func uuidAndURLAreText() throws {
        let db = try makeDatabase(schema: Self.schema)
        let uuid = UUID()
        try check(uuid, storage: "text", in: db)
        #expect(try db.fetchValue("SELECT x FROM v", as: String.self) == uuid.uuidString)
        // A 16-byte BLOB is accepted on the way in.
        let bytes = withUnsafeBytes(of: uuid.uuid) { Data($0) }
        #expect(try db.fetchValue("SELECT ?", [bytes], as: UUID.self) == uuid)
        #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT 'not-a-uuid'", as: UUID.self) }

        for url in [
            URL(string: "https://example.com/a/b?q=1&r=%20#frag")!, URL(fileURLWithPath: "/tmp/with space/ü.txt"),
        ] {
            try check(url, storage: "text", in: db)
            #expect(try db.fetchValue("SELECT x FROM v", as: String.self) == url.absoluteString)
        }
    }

    @Test func optionalsBindNilAsNull() throws {
        let db = try makeDatabase(schema: Self.schema)
        let none: Int? = nil
        try db.execute("INSERT INTO v (x) VALUES (?)", [none])
        try db.execute("INSERT INTO v (x) VALUES (?)", [nil])
        try db.execute("INSERT INTO v (x) VALUES (:x)", ["x": none])
        try db.execute("INSERT INTO v (x) VALUES (?)", [Optional<String>.some("set")])
        #expect(
            try db.fetchRows("SELECT typeof(x) FROM v ORDER BY rowid").map { try $0.get(0, as: String.self) }
                == ["null", "null", "null", "text"])
        #expect(try db.fetchValue("SELECT x FROM v WHERE rowid = 1", as: Int.self) == nil)
        let rows = try db.fetchRows("SELECT x FROM v ORDER BY rowid")
        #expect(rows[0][0] == .null)
        #expect(try rows[0].get(0, as: Int?.self) == nil)
        #expect(try rows[3].get(0, as: String?.self) == "set")
        // A NULL read as a non-optional type is a mismatch.
        let error = #expect(throws: StatementError.self) { _ = try rows[0].get("x", as: Int.self) }
        guard case let .typeMismatch(column, _, found, _)? = error else {
            Issue.record("got \(String(describing: error))"); return
        }
        #expect(column == "x")
        #expect(found == "NULL")
    }

    @Test func rawRepresentableEnumsUseTheirRawValue() throws {
        let db = try makeDatabase(schema: Self.schema)
        try check(CoreTestColor.green, storage: "text", in: db)
        #expect(try db.fetchValue("SELECT x FROM v", as: String.self) == "green")
        try check(CoreTestLevel.high, storage: "integer", in: db)
        #expect(try db.fetchValue("SELECT x FROM v", as: Int.self) == 10)
        #expect(CoreTestColor.columnType == .text)
        #expect(CoreTestLevel.columnType == .integer)
        let error = #expect(throws: StatementError.self) {
            _ = try db.fetchValue("SELECT 'purple'", as: CoreTestColor.self)
        }
        guard case let .typeMismatch(_, expected, found, _)? = error else {
            Issue.record("got \(String(describing: error))"); return
        }
        #expect(expected.contains("CoreTestColor"))
        #expect(found == "TEXT")
        #expect(throws: StatementError.self) { _ = try db.fetchValue("SELECT 5", as: CoreTestLevel.self) }
    }

    /// The direct `bind(to:)` / `read(from:)` path the ORM uses agrees with
    /// the `DatabaseValue` path the raw SQL API uses.
    private func checkDirect<V: DatabaseValueConvertible & Equatable>(
        _ value: V, _ conn: Connection,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let statement = try conn.prepare("SELECT ?")
        #expect(value.bind(to: statement.handle, at: 1) == 0, sourceLocation: sourceLocation)
        #expect(try statement.step(), sourceLocation: sourceLocation)
        #expect(
            DatabaseValue(statement: statement.handle, index: 0) == value.databaseValue, "stored \(value)",
            sourceLocation: sourceLocation)
        #expect(V.read(from: statement.handle, at: 0) == value, "read \(value)", sourceLocation: sourceLocation)
        #expect(V.fromDatabaseValue(value.databaseValue) == value, sourceLocation: sourceLocation)
    }

    @Test func directBindAndReadAgreeWithDatabaseValues() throws {
        let db = try Database.inMemory()
        try db.write { conn in
            try checkDirect(Int.min, conn)
            try checkDirect(Int8.max, conn)
            try checkDirect(Int16.min, conn)
            try checkDirect(Int32.max, conn)
            try checkDirect(Int64.max, conn)
            try checkDirect(UInt8.max, conn)
            try checkDirect(UInt16.max, conn)
            try checkDirect(UInt32.max, conn)
            try checkDirect(-0.5, conn)
            try checkDirect(Float(0.1), conn)
            try checkDirect(true, conn)
            try checkDirect(false, conn)
            try checkDirect("", conn)
            try checkDirect("a\u{0}é🌍", conn)
            try checkDirect(Data(), conn)
            try checkDirect(Data([0, 1, 255]), conn)
            try checkDirect(Date(timeIntervalSince1970: 1_704_164_645.25), conn)
            try checkDirect(UUID(), conn)
            try checkDirect(URL(string: "https://example.com/x?y=1")!, conn)
            try checkDirect(CoreTestColor.red, conn)
            try checkDirect(CoreTestLevel.low, conn)
            try checkDirect(Int?.none, conn)
            try checkDirect(Int?.some(3), conn)
            try checkDirect(String?.none, conn)
            try checkDirect(DatabaseValue.blob(Data()), conn)
            try checkDirect(DatabaseValue.real(2.5), conn)
        }
    }

    @Test func databaseValueLiteralsAndStorage() throws {
        let values: [DatabaseValue] = [42, -1.5, "text", true, false, nil, .blob(Data([1, 2, 3]))]
        #expect(
            values == [
                .integer(42), .real(-1.5), .text("text"), .integer(1), .integer(0), .null, .blob(Data([1, 2, 3])),
            ])
        #expect(values.map(\.storageName) == ["INTEGER", "REAL", "TEXT", "INTEGER", "INTEGER", "NULL", "BLOB"])
        #expect(values.map(\.isNull) == [false, false, false, false, false, true, false])
        #expect(DatabaseValue.text("it's").description == "'it''s'")
        #expect(DatabaseValue.blob(Data([0xAB, 0x01])).description == "X'AB01'")

        let db = try makeDatabase(schema: Self.schema)
        for value in values {
            try db.write { conn in
                try conn.execute("DELETE FROM v")
                try conn.execute("INSERT INTO v (x) VALUES (?)", StatementArguments(values: [value]))
                #expect(
                    try conn.fetchValue("SELECT typeof(x) FROM v", as: String.self) == value.storageName.lowercased())
                #expect(try conn.fetchRows("SELECT x FROM v")[0][0] == value)
                #expect(
                    try conn.fetchValue("SELECT x FROM v", as: DatabaseValue.self)
                        == (value.isNull ? DatabaseValue?.none : value))
            }
        }
    }

    /// Encoding a DatabaseValue and decoding it must give the same value back
    /// (a model with a `[DatabaseValue]` property stores it this way, as JSON).
    @Test(arguments: [
        DatabaseValue.null, .integer(42), .integer(-7), .real(1.5), .text("hello"), .text("42"), .text(""),
    ])
    func databaseValueCodableRoundTrip(_ value: DatabaseValue) throws {
        let data = try JSONEncoder().encode([value])
        #expect(try JSONDecoder().decode([DatabaseValue].self, from: data) == [value])
    }

    @Test(arguments: [DatabaseValue.real(2.0), .real(0), .blob(Data([1, 2, 3])), .blob(Data())])
    func databaseValueCodableRoundTripKeepsTheStorageClass(_ value: DatabaseValue) throws {
        let data = try JSONEncoder().encode([value])
        let decoded = try JSONDecoder().decode([DatabaseValue].self, from: data)
        #expect(decoded == [value], "encoded as \(String(decoding: data, as: UTF8.self))")
    }
}
