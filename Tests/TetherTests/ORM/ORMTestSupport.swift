import Foundation
import Testing
@testable import Tether

// Shared models and helpers of the ORM tests. Every top-level name starts
// with `Orm` / `orm` so that it cannot collide with other test files.

// MARK: - Models

/// The workhorse model: a unique email, a CHECK, an index, optional columns.
struct OrmUser: Model, Equatable {
    var id: Int64
    var name: String
    var email: String
    var age: Int
    var score: Int?
    var nickname: String?

    static let tableName = "orm_user"
    static var constraints: [Constraint<OrmUser>] {
        [.unique("email"), .check("age >= 0"), .index(["name"])]
    }
}

/// The query data set (see `ormUserFixture`).
///
///     id name   age score nickname
///     1  Alice  30  10    al
///     2  Bob    25  nil   nil
///     3  Carol  35  50    caz
///     4  Dave   40  20    nil
///     5  Anna   22  5     an
///     6  alan   30  30    AL
let ormUsers: [OrmUser] = [
    OrmUser(id: 1, name: "Alice", email: "alice@x", age: 30, score: 10, nickname: "al"),
    OrmUser(id: 2, name: "Bob", email: "bob@x", age: 25, score: nil, nickname: nil),
    OrmUser(id: 3, name: "Carol", email: "carol@x", age: 35, score: 50, nickname: "caz"),
    OrmUser(id: 4, name: "Dave", email: "dave@x", age: 40, score: 20, nickname: nil),
    OrmUser(id: 5, name: "Anna", email: "anna@x", age: 22, score: 5, nickname: "an"),
    OrmUser(id: 6, name: "alan", email: "alan@x", age: 30, score: 30, nickname: "AL"),
]

/// An in-memory database with `orm_user` filled with `ormUsers`.
func ormUserFixture() throws -> Database {
    let db = try Database.inMemory()
    try db.createTable(OrmUser.self)
    try db.insert(contentsOf: ormUsers)
    return db
}

/// A column renamed through CodingKeys, and a property that is not stored.
struct OrmPerson: Model, Equatable {
    var id: Int64
    var firstName: String
    var lastName: String?
    var cache: String = "not stored"

    enum CodingKeys: String, CodingKey {
        case id
        case firstName = "first_name"
        case lastName = "last_name"
    }
    static let tableName = "orm_person"
}

/// A final class as a model; its table name is the type's name.
final class OrmNote: Model, Equatable {
    let id: Int64
    let title: String
    let body: String?

    init(id: Int64, title: String, body: String?) {
        self.id = id
        self.title = title
        self.body = body
    }

    static func == (lhs: OrmNote, rhs: OrmNote) -> Bool {
        lhs.id == rhs.id && lhs.title == rhs.title && lhs.body == rhs.body
    }
}

/// A composite primary key declared by column names.
struct OrmPair: Model, Equatable {
    var a: Int
    var b: String
    var value: Double
    static let tableName = "orm_pair"
    static var primaryKey: [ColumnRef<OrmPair>] { ["a", "b"] }
}

/// A composite primary key declared by key paths.
struct OrmGridCell: Model, Equatable {
    var row: Int
    var col: Int
    var label: String
    static let tableName = "orm_grid_cell"
    static var primaryKey: [ColumnRef<OrmGridCell>] { [.column(\.row), .column(\.col)] }
}

/// An AUTOINCREMENT key and a secondary key.
struct OrmDevice: Model, Equatable {
    var id: Int64?
    var uid: UUID
    var label: String
    static let tableName = "orm_device"
    static var secondaryKeys: [[ColumnRef<OrmDevice>]] { [["uid"]] }
    static var constraints: [Constraint<OrmDevice>] { [.autoIncrement] }
}

/// Column constraints: NOT NULL on an optional, DEFAULT, CHECK, COLLATE, indexes.
struct OrmTag: Model, Equatable {
    var id: Int64
    var name: String
    var kind: String
    var slug: String
    var weight: Int?
    static let tableName = "orm_tag"
    static var constraints: [Constraint<OrmTag>] {
        [
            .notNull("weight"),
            .default("weight", 7),
            .check("length(slug) > 0"),
            .collate("name", .noCase),
            .unique("name"),
            .index(["kind", "slug"], unique: true, name: "orm_tag_kind_slug"),
            .index([.column(\.kind)]),
        ]
    }
}

/// Foreign keys: a parent and children with each ON DELETE action.
struct OrmAuthor: Model, Equatable {
    var id: Int64
    var name: String
    static let tableName = "orm_author"
}

struct OrmBook: Model, Equatable {
    var id: Int64
    var authorId: Int64
    var title: String
    static let tableName = "orm_book"
    static var constraints: [Constraint<OrmBook>] {
        [.foreignKey("authorId", references: OrmAuthor.self, onDelete: .cascade, onUpdate: .cascade)]
    }
}

struct OrmLoan: Model, Equatable {
    var id: Int64
    var authorId: Int64?
    var note: String
    static let tableName = "orm_loan"
    static var constraints: [Constraint<OrmLoan>] {
        [.foreignKey(.column(\.authorId), references: OrmAuthor.self, onDelete: .setNull)]
    }
}

struct OrmReview: Model, Equatable {
    var id: Int64
    var authorId: Int64
    var stars: Int
    static let tableName = "orm_review"
    static var constraints: [Constraint<OrmReview>] {
        [.foreignKey("authorId", references: OrmAuthor.self, onDelete: .restrict, onUpdate: .restrict)]
    }
}

/// Every supported kind of property.
struct OrmAllTypes: Model, Equatable {
    enum Color: String, Codable, CaseIterable, Sendable { case red, green, blue }
    enum Level: Int, Codable, CaseIterable, Sendable { case low = 1, mid = 5, high = 10 }
    struct Address: Codable, Equatable, Sendable {
        var street: String
        var city: String
        var zip: Int
    }

    var id: Int64
    var int: Int
    var int64: Int64
    var double: Double
    var float: Float
    var bool: Bool
    var string: String
    var data: Data
    var date: Date
    var uuid: UUID
    var optInt: Int?
    var optString: String?
    var optDate: Date?
    var optData: Data?
    var color: Color
    var level: Level
    var optColor: Color?
    var optLevel: Level?
    var address: Address
    var optAddress: Address?
    var tags: [String]
    var scores: [String: Int]

    static let tableName = "orm_all_types"

    static func sample(id: Int64) -> OrmAllTypes {
        OrmAllTypes(
            id: id, int: -42, int64: Int64.max, double: 3.25, float: 1.5, bool: true,
            string: "héllo 🌍 'quoted' \"double\"", data: Data([0, 1, 2, 255]),
            date: Date(timeIntervalSince1970: 1_700_000_000.5),
            uuid: UUID(uuidString: "E621E1F8-C36C-495A-93FC-0C247A3E6E5F")!,
            optInt: 7, optString: "opt", optDate: Date(timeIntervalSince1970: 86_400), optData: Data([9]),
            color: .blue, level: .high, optColor: .green, optLevel: .mid,
            address: Address(street: "1 Main St", city: "Paris", zip: 75001),
            optAddress: Address(street: "2 Side St", city: "Lyon", zip: 69001),
            tags: ["a", "b"], scores: ["x": 1, "y": 2])
    }

    static func sparse(id: Int64) -> OrmAllTypes {
        OrmAllTypes(
            id: id, int: 0, int64: Int64.min, double: -0.5, float: 0, bool: false,
            string: "", data: Data(), date: Date(timeIntervalSince1970: 0),
            uuid: UUID(uuidString: "00000000-0000-0000-0000-000000000001")!,
            optInt: nil, optString: nil, optDate: nil, optData: nil,
            color: .red, level: .low, optColor: nil, optLevel: nil,
            address: Address(street: "", city: "", zip: 0), optAddress: Address(street: "", city: "", zip: 0),
            tags: [], scores: [:])
    }
}

/// Optional JSON columns (a nested struct, an array, a dictionary) holding nil.
struct OrmOptionalJSON: Model, Equatable {
    var id: Int64
    var address: OrmAllTypes.Address?
    var tags: [String]?
    var scores: [String: Int]?
    static let tableName = "orm_optional_json"
}

/// An enum that is neither CaseIterable nor DatabaseValueConvertible: its cases come from its type.
struct OrmMoody: Model {
    enum Mood: String, Codable, Sendable { case happy, sad }
    var id: Int64
    var mood: Mood
    static let tableName = "orm_moody"
}

/// Computed properties and a nested struct, for key paths that are not columns.
struct OrmRect: Model, Equatable {
    struct Origin: Codable, Equatable, Sendable {
        var city: String
        var x: Int
    }
    var id: Int64
    var label: String
    var width: Int
    var height: Int
    var origin: Origin
    var ignored: Int = 0

    /// Depend on two columns.
    var area: Int { width * height }
    var perimeter: Int { 2 * (width + height) }
    /// Depends on one column, but is not a column.
    var doubleWidth: Int { width * 2 }

    enum CodingKeys: String, CodingKey { case id, label, width, height, origin }
    static let tableName = "orm_rect"
}

/// Read from a non-STRICT table created by raw SQL (see `ormLooseFixture`).
struct OrmLoose: Model, Equatable {
    var id: Int64
    var name: String
    var count: Int
    var color: OrmAllTypes.Color
    var address: OrmAllTypes.Address?
    static let tableName = "orm_loose"
}

/// A model whose table is never created.
struct OrmGhost: Model, Equatable {
    var id: Int64
    var value: Int
    static let tableName = "orm_ghost"
}

// MARK: - Helpers

/// All rows of a table as raw values, in rowid order: compared before and
/// after a failing write to prove nothing changed.
func ormDump(_ db: Database, _ table: String) throws -> [[DatabaseValue]] {
    try db.fetchRows("SELECT * FROM \(quoteIdentifier(table)) ORDER BY rowid").map(\.values)
}

/// The rows of `PRAGMA table_info`.
func ormTableInfo(_ db: Database, _ table: String) throws -> [(
    name: String, type: String, notNull: Bool, defaultValue: DatabaseValue, pk: Int
)] {
    try db.fetchRows("SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?)", [table]).map { row in
        (
            try row.get("name"), try row.get("type"), try row.get("notnull", as: Int.self) != 0,
            row["dflt_value"] ?? .null, try row.get("pk")
        )
    }
}

/// The rows of `PRAGMA index_list`, with each index's columns.
func ormIndexList(_ db: Database, _ table: String) throws -> [(
    name: String, unique: Bool, origin: String, columns: [String]
)] {
    try db.fetchRows("SELECT name, \"unique\", origin FROM pragma_index_list(?)", [table]).map { row in
        let name: String = try row.get("name")
        let columns = try db.fetchRows("SELECT name FROM pragma_index_info(?) ORDER BY seqno", [name]).map {
            try $0.get("name", as: String.self)
        }
        return (name, try row.get("unique", as: Int.self) != 0, try row.get("origin"), columns)
    }
}

/// The names of ModelError's cases, to say which one is expected.
enum OrmErrorCase: String {
    case duplicate, notFound, invalidModel, typeMismatch, missingColumn, unknownColumn, columnNotInTable,
        encodingFailed, invalidArgument, nestedCycle, missingChild, tableNotFound
}

extension ModelError {
    var ormCase: OrmErrorCase {
        switch self {
        case .duplicate: return .duplicate
        case .notFound: return .notFound
        case .invalidModel: return .invalidModel
        case .typeMismatch: return .typeMismatch
        case .missingColumn: return .missingColumn
        case .unknownColumn: return .unknownColumn
        case .columnNotInTable: return .columnNotInTable
        case .encodingFailed: return .encodingFailed
        case .invalidArgument: return .invalidArgument
        case .nestedCycle: return .nestedCycle
        case .missingChild: return .missingChild
        case .tableNotFound: return .tableNotFound
        }
    }
}

/// Runs `body`, expecting a `ModelError` of the given case; returns it for
/// further checks (nil, with an issue recorded, otherwise).
@discardableResult
func ormExpectModelError<T>(
    _ expected: OrmErrorCase, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> T
) -> ModelError? {
    do {
        let value = try body()
        Issue.record(
            "expected ModelError.\(expected.rawValue), but nothing was thrown (result: \(value))",
            sourceLocation: sourceLocation)
    } catch let error as ModelError {
        if error.ormCase == expected { return error }
        Issue.record(
            "expected ModelError.\(expected.rawValue), got ModelError.\(error.ormCase.rawValue): \(error)",
            sourceLocation: sourceLocation)
    } catch {
        Issue.record(
            "expected ModelError.\(expected.rawValue), got \(type(of: error)): \(error)", sourceLocation: sourceLocation
        )
    }
    return nil
}

/// Runs `body`, expecting a `DatabaseError` of the given kind; returns it.
@discardableResult
func ormExpectDatabaseError<T>(
    _ kind: DatabaseError.Kind, sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> T
) -> DatabaseError? {
    do {
        let value = try body()
        Issue.record(
            "expected DatabaseError \(kind), but nothing was thrown (result: \(value))", sourceLocation: sourceLocation)
    } catch let error as DatabaseError {
        if error.kind == kind { return error }
        Issue.record("expected DatabaseError \(kind), got \(error.kind): \(error)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("expected DatabaseError \(kind), got \(type(of: error)): \(error)", sourceLocation: sourceLocation)
    }
    return nil
}

/// Runs `body`, expecting a foreign key violation (any constraint violation
/// whose message says FOREIGN KEY: see `ORMSchemaTests.restrictViolationKind`
/// for the kind).
@discardableResult
func ormExpectForeignKeyFailure<T>(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> T)
    -> DatabaseError?
{
    do {
        let value = try body()
        Issue.record(
            "expected a FOREIGN KEY constraint failure, but nothing was thrown (result: \(value))",
            sourceLocation: sourceLocation)
    } catch let error as DatabaseError {
        if error.isConstraintViolation && error.message.contains("FOREIGN KEY") { return error }
        Issue.record("expected a FOREIGN KEY constraint failure, got \(error)", sourceLocation: sourceLocation)
    } catch {
        Issue.record(
            "expected a FOREIGN KEY constraint failure, got \(type(of: error)): \(error)",
            sourceLocation: sourceLocation)
    }
    return nil
}
