import Foundation
import Testing
@testable import Tether

// Converters as columns (learning a model's columns never depends on a
// converter accepting made-up values), what each Swift type reads from each
// storage class, and what STRICT tables really do with a value of another type.

/// The `DatabaseValueConvertible` doc comment's enum, as is: no CaseIterable.
enum ConvColor: String, Codable, DatabaseValueConvertible { case red, green }

/// The same with CaseIterable too (refused before: the converter came first).
enum ConvShade: String, Codable, CaseIterable, DatabaseValueConvertible { case light, dark }

/// An Int-backed enum whose raw values are none of 0, 1, 2.
enum ConvPriority: Int, Codable, DatabaseValueConvertible { case low = 10, high = 20 }

/// The README's `Email`: a struct converter with a strict parser (no placeholder is an address).
extension Email: Equatable {
    static func == (lhs: Email, rhs: Email) -> Bool { lhs.address == rhs.address }
}

/// A converter whose `init(from:)` validates what it decodes: it declares its samples.
struct ConvCode: Codable, Equatable, DatabaseValueConvertible {
    let text: String
    init?(_ text: String) {
        guard text.count == 3, text.allSatisfy(\.isUppercase) else { return nil }
        self.text = text
    }
    init(from decoder: any Decoder) throws {
        let raw = try decoder.singleValueContainer().decode(String.self)
        guard let code = ConvCode(raw) else {
            throw DecodingError.dataCorrupted(
                .init(codingPath: decoder.codingPath, debugDescription: "\(raw) is not a code"))
        }
        self = code
    }
    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(text)
    }
    static var columnType: ColumnType { .text }
    var databaseValue: DatabaseValue { .text(text) }
    static func fromDatabaseValue(_ value: DatabaseValue) -> ConvCode? {
        String.fromDatabaseValue(value).flatMap(ConvCode.init)
    }
    static var sampleValues: [ConvCode] { [ConvCode("AAA"), ConvCode("BBB")].compactMap { $0 } }
}

/// The same validating converter without samples: nothing can be made of it.
struct ConvOpaqueCode: Codable, DatabaseValueConvertible {
    let text: String
    init(from decoder: any Decoder) throws {
        let raw = try decoder.singleValueContainer().decode(String.self)
        guard raw.hasPrefix("#") else {
            throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "no #"))
        }
        text = raw
    }
    func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(text)
    }
    static var columnType: ColumnType { .text }
    var databaseValue: DatabaseValue { .text(text) }
    static func fromDatabaseValue(_ value: DatabaseValue) -> ConvOpaqueCode? { nil }
}

struct ConvPaint: Model, Equatable {
    var id: Int64
    var color: ConvColor
    var shade: ConvShade
    var priority: ConvPriority
    var email: Email
    var code: ConvCode
    var backup: ConvColor?
    static let tableName = "conv_paint"
}

struct ConvOpaque: Model {
    var id: Int64
    var code: ConvOpaqueCode
    static let tableName = "conv_opaque"
}

struct ConvFlag: Model, Equatable {
    var id: Int64
    var on: Bool
    var maybe: Bool?
    static let tableName = "conv_flag"
}

@Suite("ORM converters and value reading") struct ORMConverterTests {
    private func paint(_ id: Int64, _ color: ConvColor, email: String = "a@x") throws -> ConvPaint {
        let email = try #require(Email(email))
        let code = try #require(ConvCode("XYZ"))
        return ConvPaint(id: id, color: color, shade: .dark, priority: .high, email: email, code: code, backup: nil)
    }

    @Test func convertersThatRefusePlaceholdersAreColumns() throws {
        let db = try Database.inMemory()
        try db.createTable(ConvPaint.self)
        // Each column has its converter's storage class.
        let types = try ormTableInfo(db, "conv_paint").map { "\($0.name) \($0.type)" }
        #expect(
            types == [
                "id INTEGER", "color TEXT", "shade TEXT", "priority INTEGER", "email TEXT", "code TEXT", "backup TEXT",
            ])

        let first = try paint(1, .red)
        var second = try paint(2, .green, email: "b@y")
        second.backup = .red
        try db.insert(contentsOf: [first, second])
        // Stored as the converters say: raw values, the address, the code.
        #expect(
            try ormDump(db, "conv_paint") == [
                [.integer(1), .text("red"), .text("dark"), .integer(20), .text("a@x"), .text("XYZ"), .null],
                [.integer(2), .text("green"), .text("dark"), .integer(20), .text("b@y"), .text("XYZ"), .text("red")],
            ])
        #expect(try db.fetchAll(ConvPaint.query.orderBy("id")) == [first, second])
        // Key paths resolve to each converter column (the probe found two values of each).
        #expect(try db.fetchAll(ConvPaint.where(\.color == .green)).map(\.id) == [2])
        #expect(try db.fetchAll(ConvPaint.where(\.priority == .high)).count == 2)
        #expect(try db.fetchAll(ConvPaint.where(\.email == second.email)).map(\.id) == [2])
        #expect(try db.fetchAll(ConvPaint.where(\.backup == ConvColor.red)).map(\.id) == [2])
        #expect(try db.fetchAll(ConvPaint.where(\.shade == .light)).isEmpty)
    }

    @Test func aStoredValueTheConverterRefusesIsATypeMismatch() throws {
        let db = try Database.inMemory()
        try db.createTable(ConvPaint.self)
        try db.insert(try paint(1, .red))
        try db.execute("UPDATE conv_paint SET color = 'purple'")
        let error = ormExpectModelError(.typeMismatch) { try db.fetchAll(ConvPaint.self) }
        #expect(error?.description.contains("color") == true)
        try db.execute("UPDATE conv_paint SET color = 'red', email = 'nobody'")
        let emailError = ormExpectModelError(.typeMismatch) { try db.fetch(ConvPaint.self, key: PrimaryKey(1)) }
        #expect(emailError?.description.contains("email") == true)
    }

    @Test func aConverterNothingCanBeMadeOfIsRefusedSayingWhatToDeclare() throws {
        let db = try Database.inMemory()
        let error = ormExpectModelError(.invalidModel) { try db.createTable(ConvOpaque.self) }
        let message = error?.description ?? ""
        #expect(message.contains("ConvOpaque.code"), "names the property: \(message)")
        #expect(
            message.contains("sampleValues") && message.contains("CaseIterable"), "says what to declare: \(message)")
        #expect(try !db.tableExists("conv_opaque"))
    }

    @Test func enumCasesComeFromTheTypeAlone() {
        #expect(EnumCases.firstCases(ConvColor.self, limit: 2) == [.red, .green])
        #expect(EnumCases.firstCases(ConvPriority.self, limit: 5) == [.low, .high])
        enum Single: String { case only }
        #expect(EnumCases.firstCases(Single.self, limit: 2) == [.only])
        enum WithPayload { case a(Int), b }
        #expect(EnumCases.firstCases(WithPayload.self, limit: 2) == nil)
        #expect(EnumCases.firstCases(Int.self, limit: 2) == nil)
        #expect(EnumCases.firstCases(Optional<ConvColor>.self, limit: 2) == nil)
        #expect(EnumCases.firstCases(String.self, limit: 2) == nil)
    }

    // MARK: Bool from text

    @Test func boolReadsAgileDBsWordsFromText() throws {
        let db = try Database.inMemory()
        // Not STRICT, as a table AgileDB or another program made: the flags are text.
        try db.execute("CREATE TABLE conv_flag (id INTEGER PRIMARY KEY, \"on\", maybe)")
        try db.execute(
            """
            INSERT INTO conv_flag VALUES (1, 'true', 'no'), (2, 'YES', NULL), (3, '1', 'False'), (4, 'no', 'TRUE'),
              (5, 'FALSE', 'yes'), (6, '0', 0), (7, 2, 0.0), (8, 0.5, '1')
            """)
        let flags = try db.fetchAll(ConvFlag.query.orderBy("id"))
        #expect(flags.map(\.on) == [true, true, true, false, false, false, true, true])
        #expect(flags.map(\.maybe) == [false, nil, false, true, true, false, false, true])
        // Raw SQL reads the same way.
        #expect(try db.fetchValue("SELECT 'Yes'", as: Bool.self) == true)
        #expect(try db.fetchRows("SELECT 'no' AS flag").first?.get("flag", as: Bool.self) == false)
        // Other text is not a Bool: refused, naming the column.
        try db.execute("INSERT INTO conv_flag VALUES (9, 'maybe', NULL)")
        let error = ormExpectModelError(.typeMismatch) { try db.fetchAll(ConvFlag.self) }
        #expect(error?.description.contains("on") == true)
        // Raw SQL is the core's: its error is the core's `StatementError`.
        #expect(throws: StatementError.self) { try db.fetchValue("SELECT ''", as: Bool.self) }
        // Written, a Bool is always INTEGER 0 or 1.
        try db.execute("DELETE FROM conv_flag")
        try db.insert(ConvFlag(id: 1, on: true, maybe: false))
        #expect(try ormDump(db, "conv_flag") == [[.integer(1), .integer(1), .integer(0)]])
    }

    // MARK: What each type reads from each storage class (the README's table)

    /// Whether `T` reads `value`, through both paths (a model's column reader
    /// and `fromDatabaseValue`), which must agree.
    private func reads<T: DatabaseValueConvertible & Equatable>(
        _ type: T.Type, _ value: DatabaseValue, _ db: Database,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> T? {
        let converted = T.fromDatabaseValue(value)
        let read = try db.read { conn -> T? in
            let statement = try conn.prepare("SELECT ?")
            try statement.bind(StatementArguments(values: [value]))
            _ = try statement.step()
            return T.read(from: statement.handle, at: 0)
        }
        #expect(
            converted == read, "fromDatabaseValue and read(from:at:) disagree on \(value) as \(T.self)",
            sourceLocation: sourceLocation)
        return converted
    }

    @Test func eachTypeReadsWhatTheREADMESays() throws {
        let db = try Database.inMemory()
        let uuid = UUID(uuidString: "E621E1F8-C36C-495A-93FC-0C247A3E6E5F")
        // Integers: INTEGER in range, REAL holding a whole number; nothing else.
        #expect(try reads(Int.self, .integer(42), db) == 42)
        #expect(try reads(Int8.self, .integer(300), db) == nil)
        #expect(try reads(Int.self, .real(3.0), db) == 3)
        #expect(try reads(Int.self, .real(3.5), db) == nil)
        #expect(try reads(Int.self, .text("77"), db) == nil)
        #expect(try reads(Int.self, .blob(Data([1])), db) == nil)
        #expect(try reads(Int.self, .null, db) == nil)
        // Double: REAL and INTEGER.
        #expect(try reads(Double.self, .real(1.5), db) == 1.5)
        #expect(try reads(Double.self, .integer(2), db) == 2.0)
        #expect(try reads(Double.self, .text("1.5"), db) == nil)
        // Bool: numbers (0 false), and the words.
        #expect(try reads(Bool.self, .integer(7), db) == true)
        #expect(try reads(Bool.self, .real(0), db) == false)
        #expect(try reads(Bool.self, .text("TRUE"), db) == true)
        #expect(try reads(Bool.self, .text("No"), db) == false)
        #expect(try reads(Bool.self, .text("2"), db) == nil)
        #expect(try reads(Bool.self, .blob(Data([1])), db) == nil)
        // String: TEXT only.
        #expect(try reads(String.self, .text("a"), db) == "a")
        #expect(try reads(String.self, .integer(1), db) == nil)
        #expect(try reads(String.self, .blob(Data("a".utf8)), db) == nil)
        // Data: BLOB only.
        #expect(try reads(Data.self, .blob(Data([1, 2])), db) == Data([1, 2]))
        #expect(try reads(Data.self, .text("a"), db) == nil)
        // Date: REAL or INTEGER seconds since 1970, SQLite's date text.
        #expect(try reads(Date.self, .real(1.5), db) == Date(timeIntervalSince1970: 1.5))
        #expect(try reads(Date.self, .integer(86_400), db) == Date(timeIntervalSince1970: 86_400))
        #expect(try reads(Date.self, .text("1970-01-02 00:00:00"), db) == Date(timeIntervalSince1970: 86_400))
        #expect(try reads(Date.self, .text("yesterday"), db) == nil)
        #expect(try reads(Date.self, .blob(Data()), db) == nil)
        // UUID: canonical TEXT, 16-byte BLOB.
        #expect(try reads(UUID.self, .text("E621E1F8-C36C-495A-93FC-0C247A3E6E5F"), db) == uuid)
        #expect(
            try reads(UUID.self, .blob(Data(count: 16)), db) == UUID(uuidString: "00000000-0000-0000-0000-000000000000")
        )
        #expect(try reads(UUID.self, .blob(Data(count: 15)), db) == nil)
        #expect(try reads(UUID.self, .integer(1), db) == nil)
        // URL: TEXT.
        #expect(try reads(URL.self, .text("https://example.com/a"), db) == URL(string: "https://example.com/a"))
        #expect(try reads(URL.self, .integer(1), db) == nil)
        // Enums: as their raw value, which must name a case.
        #expect(try reads(ConvColor.self, .text("green"), db) == .green)
        #expect(try reads(ConvColor.self, .text("blue"), db) == nil)
        #expect(try reads(ConvPriority.self, .integer(10), db) == .low)
        #expect(try reads(ConvPriority.self, .real(20), db) == .high)
        #expect(try reads(ConvPriority.self, .integer(11), db) == nil)
        // Optionals: NULL is nil, another value is the wrapped type's.
        #expect(try reads(Int?.self, .null, db) == .some(nil))
        #expect(try reads(Int?.self, .integer(1), db) == .some(1))
        #expect(try reads(Int?.self, .text("1"), db) == nil)
    }

    @Test func jsonColumnsReadTheirJSONTextOnly() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmOptionalJSON.self)
        try db.execute("INSERT INTO orm_optional_json (id, tags) VALUES (1, '[\"a\"]')")
        #expect(try db.fetch(OrmOptionalJSON.self, key: PrimaryKey(1))?.tags == ["a"])
        // The table's CHECK keeps text that is not JSON out; a table without it lets it in, and reading refuses it.
        ormExpectDatabaseError(.checkViolation) { try db.execute("UPDATE orm_optional_json SET tags = 'a'") }
        try db.execute("CREATE TABLE loose (id INTEGER PRIMARY KEY, address, tags, scores)")
        try db.execute("INSERT INTO loose (id, tags) VALUES (1, 'not json')")
        let error = ormExpectModelError(.typeMismatch) {
            try db.fetchAll(OrmOptionalJSON.self, sql: "SELECT * FROM loose")
        }
        #expect(error?.description.contains("tags") == true)
    }

    // MARK: STRICT tables

    @Test func strictTablesConvertLosslesslyAndRefuseTheRest() throws {
        let db = try ormUserFixture()
        // Text that is an integer, set on an INTEGER column, is stored as that integer (SQLite's
        // STRICT converts a value that converts losslessly), and reads back as one.
        try db.execute("UPDATE orm_user SET age = '77' WHERE id = 1")
        try db.update(OrmUser.self, key: PrimaryKey(2), set: [.set("age", to: "78")])
        try db.execute("UPDATE orm_user SET age = ' 79 ' WHERE id = 5")  // spaces around the number too
        #expect(
            try db.fetchRows("SELECT typeof(age), age FROM orm_user WHERE id IN (1, 2, 5) ORDER BY id").map(\.values)
                == [
                    [.text("integer"), .integer(77)], [.text("integer"), .integer(78)],
                    [.text("integer"), .integer(79)],
                ])
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1))?.age == 77)
        // So does a REAL that is a whole number; an INTEGER set on a TEXT column becomes its text.
        try db.execute("UPDATE orm_user SET age = 40.0, name = 12 WHERE id = 3")
        #expect(
            try db.fetchRows("SELECT typeof(age), age, typeof(name), name FROM orm_user WHERE id = 3").first?.values
                == [.text("integer"), .integer(40), .text("text"), .text("12")])
        // What does not convert losslessly is refused, and nothing changes.
        for bad in ["'abc'", "'7.5'", "7.5", "x'01'", "'77a'", "'0x10'"] {
            let error = ormExpectDatabaseError(.typeMismatch) {
                try db.execute("UPDATE orm_user SET age = \(bad) WHERE id = 4")
            }
            #expect(error?.message.contains("INTEGER column") == true, "\(bad): \(String(describing: error))")
        }
        ormExpectDatabaseError(.typeMismatch) {
            try db.update(OrmUser.self, key: PrimaryKey(4), set: [.set("age", to: "forty")])
        }
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(4))?.age == 40)
        // Comparisons convert the same way (AHDataModel's `.and("age", "<=", "77")`).
        #expect(try db.fetchAll(OrmUser.query("age", ">=", "77").orderBy("id")).map(\.id) == [1, 2, 5])
    }
}
