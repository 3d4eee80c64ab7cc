import Foundation
import Testing
import Tether
import TetherTestSupport

// The examples of README.md's "Schema evolution", kept true by running them. When an example
// changes in the README, change it here (and the other way round).

struct Contact: Model, Equatable {
    var id: Int64
    var gender: String?
    var fullName: String?
    var color: String
    enum CodingKeys: String, CodingKey { case id, gender, fullName = "full_name", color }
    static let tableName = "contact"
    static var constraints: [Constraint<Contact>] { [.default("color", "red")] }
}

/// The next version of `Contact`: one more property.
struct ContactV2: Model, Equatable {
    var id: Int64
    var gender: String?
    var fullName: String?
    var color: String
    var nickname: String?
    enum CodingKeys: String, CodingKey { case id, gender, fullName = "full_name", color, nickname }
    static let tableName = "contact"
    static var constraints: [Constraint<ContactV2>] { [.default("color", "red")] }
}

struct Team: Model, Equatable {
    var id: Int64
    var name: String
    static let tableName = "team"
}

@Suite("README examples: schema evolution") struct ReadmeSchemaEvolutionTests {
    @Test func schemaEvolution() throws {
        let db = try Database.inMemory()

        var migrator = Migrator()
        migrator.register("1-create") { migration in
            try migration.execute(
                """
                CREATE TABLE contact (id INTEGER PRIMARY KEY, first_name TEXT, last_name TEXT, sex TEXT) STRICT;
                INSERT INTO contact VALUES (1, 'Michael', 'Jackson', 'm');
                """)
        }
        migrator.register("2-columns") { migration in
            try migration.addColumn("color", to: "contact", "TEXT NOT NULL DEFAULT 'red'")
            try migration.renameProperty(\Contact.gender, from: "sex")  // AHDataModel's renameProperty
            try migration.combineColumns(
                ["last_name", "first_name"], into: "full_name", in: "contact", "TEXT",
                sql: "last_name || ', ' || first_name", droppingSources: true)
        }
        migrator.register("3-index", sql: "CREATE INDEX contact_on_full_name ON contact (full_name)")
        #expect(try migrator.migrate(db) == ["1-create", "2-columns", "3-index"])
        #expect(try migrator.migrate(db) == [])  // each runs once
        #expect(
            try db.fetchAll(Contact.self) == [Contact(id: 1, gender: "m", fullName: "Jackson, Michael", color: "red")])

        let schemaFiles = try TemporaryDirectory()
        defer { schemaFiles.remove() }
        let schemaDirectory = schemaFiles.url
        try Data("CREATE TABLE team (id INTEGER PRIMARY KEY, name TEXT NOT NULL) STRICT;".utf8)
            .write(to: schemaDirectory.appendingPathComponent("001-team.sql"))

        let applied = try db.applySchemaFiles(in: schemaDirectory.path)  // ["001-team.sql"], then []
        #expect(applied == ["001-team.sql"])
        #expect(try db.applySchemaFiles(in: schemaDirectory.path) == [])

        let plan = try db.updateSchema(toMatch: [ContactV2.self, Team.self], dryRun: true)
        #expect(plan.map(\.description) == ["contact: added nickname", "team: unchanged"])
        try db.updateSchema(toMatch: [ContactV2.self, Team.self], rebuildingTables: true)
        #expect(try db.fetchAll(ContactV2.self).map(\.nickname) == [nil])
    }
}
