import Foundation
import Testing
@testable import Tether

/// The model of `helper_user` once its columns were migrated.
private struct HelperUser: Model, Equatable {
    var id: Int64
    var gender: String?
    var fullName: String?
    enum CodingKeys: String, CodingKey { case id, gender, fullName = "full_name" }
    static let tableName = "helper_user"
}

@Suite("Migration helpers: columns, combined columns, table rebuilds")
struct MigrationHelperTests {
    private func database() throws -> Database {
        let db = try Database.inMemory()
        try db.execute(
            """
            CREATE TABLE helper_user (id INTEGER PRIMARY KEY, first_name TEXT, last_name TEXT, sex TEXT, age INTEGER);
            INSERT INTO helper_user VALUES (1, 'Michael', 'Jackson', 'm', 50), (2, 'Ann', 'Lee', 'f', NULL);
            """)
        return db
    }

    private func migrate(_ db: Database, _ body: @escaping @Sendable (Migration) throws -> Void) throws {
        var migrator = Migrator()
        migrator.register("under test", body)
        try migrator.migrate(db)
    }

    private func columns(_ db: Database, _ table: String) throws -> [String] {
        try db.fetchRows("SELECT name FROM pragma_table_info(?) ORDER BY cid", [table]).map {
            try $0.get(0, as: String.self)
        }
    }

    @Test("add, drop and rename a column; rename a property's column; combine columns by SQL, dropping the sources")
    func columnHelpers() throws {
        let db = try database()
        try migrate(db) { migration in
            try migration.addColumn("color", to: "helper_user", "TEXT NOT NULL DEFAULT 'red'")
            try migration.dropColumn("age", from: "helper_user")
            try migration.renameProperty(\HelperUser.gender, from: "sex")
            try migration.combineColumns(
                ["last_name", "first_name"], into: "full_name", in: "helper_user", "TEXT",
                sql: "last_name || ', ' || first_name", droppingSources: true)
            try migration.renameColumn("color", to: "colour", in: "helper_user")
        }
        #expect(try columns(db, "helper_user") == ["id", "gender", "colour", "full_name"])
        #expect(
            try db.fetchAll(HelperUser.self) == [
                HelperUser(id: 1, gender: "m", fullName: "Jackson, Michael"),
                HelperUser(id: 2, gender: "f", fullName: "Lee, Ann"),
            ])
        #expect(try db.fetchValue("SELECT group_concat(colour) FROM helper_user", as: String.self) == "red,red")

        // The columns a model has and its table lacks, added as the model declares them.
        try db.execute("ALTER TABLE helper_user DROP COLUMN full_name")
        var adding = Migrator()
        adding.allowsUnknownMigrations = true
        adding.register("model columns") { migration in
            let added = try migration.addMissingColumns(of: HelperUser.self)
            #expect(added == ["full_name"])
        }
        try adding.migrate(db)
        #expect(try db.fetchAll(HelperUser.self).map(\.fullName) == [nil, nil])
    }

    @Test("the doc example of combineColumns with a closure computes initials")
    func combineColumnsDocExample() throws {
        let db = try Database.inMemory()
        try db.execute(
            """
            CREATE TABLE user (id INTEGER PRIMARY KEY, first_name TEXT, last_name TEXT);
            INSERT INTO user VALUES (1, 'Michael', 'Jackson'), (2, 'Ann', NULL);
            """)
        try migrate(db) { migration in
            // As the doc comment of `combineColumns(_:into:in:_:droppingSources:combine:)` has it.
            try migration.combineColumns(["first_name", "last_name"], into: "initials", in: "user", "TEXT") { values in
                .text(values.compactMap { String.fromDatabaseValue($0)?.first.map(String.init) }.joined())
            }
        }
        #expect(
            try db.fetchRows("SELECT initials FROM user ORDER BY id").map { try $0.get(0, as: String.self) } == [
                "MJ", "A",
            ])
    }

    @Test("combine columns with a Swift closure; helpers name what is wrong")
    func combineWithClosure() throws {
        let db = try database()
        try migrate(db) { migration in
            try migration.combineColumns(["first_name", "last_name"], into: "initials", in: "helper_user", "TEXT") {
                values in
                .text(values.compactMap { String.fromDatabaseValue($0)?.first.map(String.init) }.joined())
            }
        }
        #expect(
            try db.fetchRows("SELECT initials FROM helper_user ORDER BY id").map { try $0.get(0, as: String.self) } == [
                "MJ", "AL",
            ])

        var failing = Migrator()
        failing.allowsUnknownMigrations = true
        failing.register("bad") { try $0.dropColumn("nope", from: "helper_user") }
        let error = migrationError { try failing.migrate(db) }
        guard case let .failed(_, underlying)? = error,
            case let .invalidChange(table, reason)? = underlying as? MigrationError
        else {
            Issue.record("\(String(describing: error))"); return
        }
        #expect(table == "helper_user" && reason.contains("nope"))
    }

    @Test(
        """
        rebuild a table (12 steps): rows with their rowids, indexes, triggers, views and the AUTOINCREMENT \
        counter are kept
        """)
    func rebuildKeepsEverything() throws {
        let db = try Database.inMemory()
        try db.execute(
            """
            CREATE TABLE item (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, price TEXT);
            CREATE TABLE audit (item_id INTEGER, note TEXT);
            CREATE TABLE tag (item_id INTEGER NOT NULL REFERENCES item (id), label TEXT);
            CREATE INDEX item_on_name ON item (name);
            CREATE TRIGGER item_audit AFTER UPDATE ON item BEGIN INSERT INTO audit VALUES (NEW.id, 'updated'); END;
            CREATE VIEW cheap AS SELECT name FROM item WHERE price < 10;
            INSERT INTO item (name, price) VALUES ('a', '5'), ('b', '20'), ('c', '7');
            DELETE FROM item WHERE id = 3;
            INSERT INTO tag VALUES (1, 'x');
            """)
        try migrate(db) { migration in
            try migration.rebuildTable(
                "item",
                as: """
                    CREATE TABLE item (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, price INTEGER NOT \
                    NULL CHECK (price >= 0), stock INTEGER NOT NULL DEFAULT 0) STRICT
                    """, values: ["price": "CAST(price AS INTEGER)"])
        }
        #expect(
            try db.fetchRows("SELECT id, name, price, stock FROM item ORDER BY id").map { $0.values }
                == [
                    [.integer(1), .text("a"), .integer(5), .integer(0)],
                    [.integer(2), .text("b"), .integer(20), .integer(0)],
                ])
        #expect(
            try db.fetchValue(
                "SELECT count(*) FROM sqlite_master WHERE name IN ('item_on_name', 'item_audit', 'cheap')", as: Int.self
            ) == 3)
        #expect(try db.fetchValue("SELECT group_concat(name) FROM cheap", as: String.self) == "a")
        try db.execute("UPDATE item SET stock = 1 WHERE id = 1")
        #expect(try db.fetchValue("SELECT count(*) FROM audit", as: Int.self) == 1)
        try db.execute("INSERT INTO item (name, price) VALUES ('d', 1)")
        #expect(try db.fetchValue("SELECT max(id) FROM item", as: Int.self) == 4)  // 3 stays used
        #expect(try db.fetchValue("SELECT strict FROM pragma_table_list WHERE name = 'item'", as: Int.self) == 1)

        // A view that no longer fits is named, and the rebuild is rolled back.
        let before = try migrationDump(db)
        var breaking = Migrator()
        breaking.allowsUnknownMigrations = true
        breaking.register("drop name") { migration in
            try migration.rebuildTable(
                "item",
                as: """
                    CREATE TABLE item (id INTEGER PRIMARY KEY AUTOINCREMENT, price INTEGER NOT NULL, stock \
                    INTEGER NOT NULL DEFAULT 0) STRICT
                    """)
        }
        let error = migrationError { try breaking.migrate(db) }
        #expect(
            error?.description.contains("item_on_name") == true || error?.description.contains("cheap") == true,
            "\(String(describing: error))")
        #expect(try migrationDump(db) == before)
    }
}
