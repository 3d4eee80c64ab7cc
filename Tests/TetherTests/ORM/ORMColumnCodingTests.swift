import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Models that read and bind themselves column by column (`ColumnCodable`)
/// must store and read exactly what their `Codable` conformance would.
/// Serialized: two tests switch `ColumnMiscounted`'s shared flags.
@Suite(.serialized) struct ORMColumnCodingTests {

    /// Every kind of value, written through each ORM path, leaves the same
    /// rows as the same values written through `Codable` (`OrmAllTypes`).
    @Test func storesWhatCodableStores() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAllTypes.self)
        try db.createTable(ColumnAllTypes.self)
        #expect(try ModelSchema<ColumnAllTypes>.shared().columnCoding != nil)
        #expect(try ModelSchema<OrmAllTypes>.shared().columnCoding == nil)
        #expect(try ormTableInfo(db, "column_all_types").map(\.type) == ormTableInfo(db, "orm_all_types").map(\.type))

        for model in [OrmAllTypes.sample(id: 1), OrmAllTypes.sparse(id: 6)] {
            try db.insert(model)
            try db.insert(ColumnAllTypes(model))
        }
        try db.insert(contentsOf: (2...4).map { OrmAllTypes.sample(id: $0) })
        try db.insert(contentsOf: (2...4).map { ColumnAllTypes(OrmAllTypes.sample(id: $0)) })
        var swapped = OrmAllTypes.sparse(id: 2)
        try db.update(swapped)
        try db.update(ColumnAllTypes(swapped))
        swapped.optColor = .red
        swapped.tags = ["changed"]
        try db.update(swapped, columns: ["optColor", "tags"])
        try db.update(ColumnAllTypes(swapped), columns: ["optColor", "tags"])
        try db.save(OrmAllTypes.sample(id: 5))
        try db.save(ColumnAllTypes(OrmAllTypes.sample(id: 5)))
        try db.delete(OrmAllTypes.sample(id: 3))
        try db.delete(ColumnAllTypes(OrmAllTypes.sample(id: 3)))

        #expect(try ormDump(db, "column_all_types") == ormDump(db, "orm_all_types"))
        let viaCodable = try db.fetchAll(OrmAllTypes.query.orderBy(\.id))
        let viaColumns = try db.fetchAll(ColumnAllTypes.query.orderBy("id"))
        #expect(viaColumns.map(\.plain) == viaCodable)
        #expect(viaCodable.count == 5)
    }

    /// Columns are found by name: a query selecting them in another order,
    /// or leaving out an optional one, still decodes.
    @Test func readsColumnsByName() throws {
        let db = try Database.inMemory()
        try db.createTable(ColumnPlayer.self)
        try db.insert(ColumnPlayer(id: 1, name: "ann", score: 5, team: .blue))
        let reordered = try db.fetchAll(ColumnPlayer.self, sql: "SELECT team, score, name, id FROM column_player")
        #expect(reordered == [ColumnPlayer(id: 1, name: "ann", score: 5, team: .blue)])
        let withoutScore = try db.fetchAll(ColumnPlayer.self, sql: "SELECT id, name, team FROM column_player")
        #expect(withoutScore == [ColumnPlayer(id: 1, name: "ann", score: nil, team: .blue)])
    }

    /// @Model generates the columns and values of the synthesized Codable:
    /// the same declaration without the macro stores the same rows.
    @Test func macroFollowsCodable() throws {
        let db = try Database.inMemory()
        try db.createTable(ColumnRenamed.self)
        try db.createTable(CodableRenamed.self)
        #expect(try ModelSchema<ColumnRenamed>.shared().columnCoding != nil)
        #expect(try ormTableInfo(db, "column_renamed").map(\.name) == ["id", "headline", "when", "tags", "color"])
        #expect(try ormTableInfo(db, "codable_renamed").map(\.name) == ["id", "headline", "when", "tags", "color"])
        let first = ColumnRenamed(
            id: 1, title: "one", draft: false, when: Date(timeIntervalSince1970: 5), tags: ["a"], color: .green)
        let second = ColumnRenamed(id: 2, title: "two", when: Date(timeIntervalSince1970: 6), tags: [], color: nil)
        try db.insert(contentsOf: [first, second])
        try db.insert(contentsOf: [first, second].map(CodableRenamed.init))
        let stored = try ormDump(db, "column_renamed")
        #expect(
            stored == [
                [.integer(1), .text("one"), .real(5), .text(#"["a"]"#), .text("green")],
                [.integer(2), .text("two"), .real(6), .text("[]"), .null],
            ])
        #expect(try ormDump(db, "codable_renamed") == stored)
        // `draft` is not stored: it reads back as its initial value.
        var expected = first
        expected.draft = true
        #expect(try db.fetchAll(ColumnRenamed.query.orderBy(\.id)) == [expected, second])
        #expect(try db.fetchAll(CodableRenamed.query.orderBy(\.id)) == [expected, second].map(CodableRenamed.init))
    }

    /// What the macro must also compile: a generic struct, a property named
    /// by a keyword, a constant left out of the columns, observers.
    @Test func macroHandlesUnusualDeclarations() throws {
        let db = try Database.inMemory()
        try db.createTable(ColumnBox<String>.self)
        #expect(try ModelSchema<ColumnBox<String>>.shared().columnCoding != nil)
        try db.insert(ColumnBox(id: 1, default: "kept", content: "inside"))
        #expect(try ormTableInfo(db, "column_box").map(\.name) == ["id", "default", "content"])
        #expect(try db.fetchAll(ColumnBox<String>.self) == [ColumnBox(id: 1, default: "kept", content: "inside")])
    }

    /// The errors of reading are those of `Codable` decoding.
    @Test func readErrorsNameTheColumn() throws {
        let db = try Database.inMemory()
        try db.createTable(ColumnPlayer.self)
        try db.insert(ColumnPlayer(id: 1, name: "ann", score: 5, team: .blue))
        let failures: [(sql: String, error: OrmErrorCase, column: String)] = [
            ("SELECT id, score, team FROM column_player", .missingColumn, "name"),
            ("SELECT id, NULL AS name, score, team FROM column_player", .typeMismatch, "name"),
            ("SELECT id, name, 'many' AS score, team FROM column_player", .typeMismatch, "score"),
            ("SELECT id, name, score, 'green' AS team FROM column_player", .typeMismatch, "team"),
        ]
        for failure in failures {
            let error = ormExpectModelError(failure.error) { try db.fetchAll(ColumnPlayer.self, sql: failure.sql) }
            #expect(error.map { "\($0)".contains("column \(failure.column) ") } == true, "\(String(describing: error))")
        }
    }

    /// A conformance that reads or writes more or fewer columns than it
    /// declares is refused with an error, not a stale or foreign value.
    @Test func miscountedConformancesAreRefused() throws {
        let db = try Database.inMemory()
        try db.createTable(ColumnMiscounted.self)
        ColumnMiscounted.extraWrite.withLock { $0 = true }
        ormExpectModelError(.invalidModel) { try db.insert(ColumnMiscounted(id: 1, name: "a")) }
        ColumnMiscounted.extraWrite.withLock { $0 = false }
        ColumnMiscounted.skipsName.withLock { $0 = true }
        ormExpectModelError(.invalidModel) { try db.insert(ColumnMiscounted(id: 2, name: "b")) }
        ColumnMiscounted.skipsName.withLock { $0 = false }
        #expect(try ormDump(db, "column_miscounted").isEmpty)

        try db.insert(ColumnMiscounted(id: 3, name: "c"))
        ColumnMiscounted.extraRead.withLock { $0 = true }
        defer { ColumnMiscounted.extraRead.withLock { $0 = false } }
        ormExpectModelError(.invalidModel) { try db.fetchAll(ColumnMiscounted.self) }
    }

    /// A bulk insert of a column-coded model runs the model's own loop
    /// (`ColumnCodable.insertRows`): each row is reported to observers, a
    /// duplicate names the stored row, and a failure leaves nothing inserted.
    @Test func bulkInsertsRunTheModelsOwnLoop() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("bulk.sqlite").path)
            try db.createTable(ColumnPlayer.self)
            let events = ObservedEvents()
            let token = db.observe(.changes, of: ColumnPlayer.self) { events.add($0) }
            defer { token.cancel() }
            let players = (1...3).map { ColumnPlayer(id: $0, name: "p\($0)", score: Int($0), team: .red) }
            try db.insert(contentsOf: players)
            #expect(try await events.next(3).map(\.key) == (1...3).map { PrimaryKey(Int64($0)) })

            let error = ormExpectModelError(.duplicate) {
                try db.insert(contentsOf: [
                    ColumnPlayer(id: 4, name: "p4", score: nil, team: .blue),
                    ColumnPlayer(id: 2, name: "again", score: nil, team: .blue),
                ])
            }
            if case let .duplicate(existing, _)? = error { #expect(existing as? ColumnPlayer == players[1]) }
            #expect(try db.fetchAll(ColumnPlayer.query.orderBy("id")) == players)

            try db.createTable(ColumnMiscounted.self)
            ColumnMiscounted.skipsName.withLock { $0 = true }
            ormExpectModelError(.invalidModel) { try db.insert(contentsOf: [ColumnMiscounted(id: 1, name: "a")]) }
            ColumnMiscounted.skipsName.withLock { $0 = false }
            #expect(try ormDump(db, "column_miscounted").isEmpty)
        }
    }

    /// Coded columns that are not exactly the `Codable` ones leave the model
    /// to `Codable`.
    @Test func mismatchedCodedColumnsFallBackToCodable() throws {
        let db = try Database.inMemory()
        try db.createTable(ColumnMisnamed.self)
        #expect(try ModelSchema<ColumnMisnamed>.shared().columnCoding == nil)
        try db.insert(ColumnMisnamed(id: 1, name: "kept"))
        #expect(try db.fetchAll(ColumnMisnamed.self) == [ColumnMisnamed(id: 1, name: "kept")])
    }
}

// MARK: - Models

/// `OrmAllTypes`'s properties, coded column by column by hand, as @Model would.
struct ColumnAllTypes: Model, ColumnCodable, Equatable {
    var plain: OrmAllTypes
    init(_ plain: OrmAllTypes) { self.plain = plain }

    static let tableName = "column_all_types"
    static var primaryKey: [ColumnRef<ColumnAllTypes>] { ["id"] }

    // Codable through the plain struct, so the columns are the same.
    init(from decoder: any Decoder) throws { plain = try OrmAllTypes(from: decoder) }
    func encode(to encoder: any Encoder) throws { try plain.encode(to: encoder) }

    static let codedColumns = [
        "id", "int", "int64", "double", "float", "bool", "string", "data", "date", "uuid",
        "optInt", "optString", "optDate", "optData", "color", "level", "optColor", "optLevel",
        "address", "optAddress", "tags", "scores",
    ]
    init(columns: inout ColumnReader) throws {
        plain = try OrmAllTypes(
            id: columns.read(), int: columns.read(), int64: columns.read(), double: columns.read(),
            float: columns.read(),
            bool: columns.read(), string: columns.read(), data: columns.read(), date: columns.read(),
            uuid: columns.read(),
            optInt: columns.read(), optString: columns.read(), optDate: columns.read(), optData: columns.read(),
            color: columns.read(), level: columns.read(), optColor: columns.read(), optLevel: columns.read(),
            address: columns.read(), optAddress: columns.read(), tags: columns.read(), scores: columns.read())
    }
    func encode(columns: inout ColumnWriter) throws {
        try columns.write(plain.id); try columns.write(plain.int); try columns.write(plain.int64)
        try columns.write(plain.double); try columns.write(plain.float); try columns.write(plain.bool)
        try columns.write(plain.string); try columns.write(plain.data); try columns.write(plain.date)
        try columns.write(plain.uuid); try columns.write(plain.optInt); try columns.write(plain.optString)
        try columns.write(plain.optDate); try columns.write(plain.optData); try columns.write(plain.color)
        try columns.write(plain.level); try columns.write(plain.optColor); try columns.write(plain.optLevel)
        try columns.write(plain.address); try columns.write(plain.optAddress); try columns.write(plain.tags)
        try columns.write(plain.scores)
    }
}

@Model
struct ColumnPlayer: Equatable {
    enum Team: String, Codable, CaseIterable, Sendable { case red, blue }
    var id: Int64
    var name: String
    var score: Int?
    var team: Team
    static let tableName = "column_player"
}

/// What @Model must follow of the synthesized Codable: renamed keys, a
/// property left out of CodingKeys, a `let` with an initial value (encoded,
/// never decoded: no column), JSON and optional enum columns.
@Model
struct ColumnRenamed: Equatable {
    var id: Int64
    var title: String
    var draft = true
    let version = 2
    var when: Date
    var tags: [String]
    var color: OrmAllTypes.Color?
    enum CodingKeys: String, CodingKey { case id, title = "headline", version, when, tags, color }
    static let tableName = "column_renamed"
}

@Model
struct ColumnBox<Content: Codable & Sendable & Equatable>: Equatable {
    var id: Int64
    var `default`: String {
        didSet { edits += 1 }
    }
    var content: Content
    var edits = 0
    let kind = "box"
    enum CodingKeys: String, CodingKey { case id, `default`, content }
    static var tableName: String { "column_box" }

    init(id: Int64, default value: String, content: Content) {
        self.id = id
        self.default = value
        self.content = content
    }
}

/// `ColumnRenamed` without @Model: through Codable.
struct CodableRenamed: Model, Equatable {
    var id: Int64
    var title: String
    var draft = true
    let version = 2
    var when: Date
    var tags: [String]
    var color: OrmAllTypes.Color?
    enum CodingKeys: String, CodingKey { case id, title = "headline", version, when, tags, color }
    static let tableName = "codable_renamed"

    init(_ model: ColumnRenamed) {
        (id, title, draft, when, tags, color) = (
            model.id, model.title, model.draft, model.when, model.tags, model.color
        )
    }
}

/// A hand-written conformance that can be made to miscount its columns.
struct ColumnMiscounted: Model, ColumnCodable, Equatable {
    static let extraWrite = Protected(false)
    static let skipsName = Protected(false)
    static let extraRead = Protected(false)
    var id: Int64
    var name: String
    static let tableName = "column_miscounted"

    init(id: Int64, name: String) {
        self.id = id
        self.name = name
    }
    static let codedColumns = ["id", "name"]
    init(columns: inout ColumnReader) throws {
        id = try columns.read()
        name = try columns.read()
        if Self.extraRead.withLock({ $0 }) { let _: Int64 = try columns.read() }
    }
    func encode(columns: inout ColumnWriter) throws {
        try columns.write(id)
        if !Self.skipsName.withLock({ $0 }) { try columns.write(name) }
        if Self.extraWrite.withLock({ $0 }) { try columns.write(id) }
    }
}

/// Coded columns that name a column `Codable` does not make.
struct ColumnMisnamed: Model, ColumnCodable, Equatable {
    var id: Int64
    var name: String
    static let tableName = "column_misnamed"

    init(id: Int64, name: String) {
        self.id = id
        self.name = name
    }
    static let codedColumns = ["id", "title"]
    init(columns: inout ColumnReader) throws {
        id = try columns.read()
        name = try columns.read()
    }
    func encode(columns: inout ColumnWriter) throws {
        try columns.write(id)
        try columns.write(name)
    }
}
