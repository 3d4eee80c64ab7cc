import Foundation
import Testing
@testable import Tether
import TetherTestSupport

// Three versions of one table's model.
private struct GadgetV1: Model, Equatable {
    var id: Int64
    var name: String
    var weight: Int?
    var legacy: String?
    static let tableName = "gadget"
    static var constraints: [Constraint<GadgetV1>] { [.index(["name"])] }
}

private struct GadgetV2: Model, Equatable {
    var id: Int64
    var name: String
    var weight: Int?
    var legacy: String?
    var color: String?
    static let tableName = "gadget"
    static var constraints: [Constraint<GadgetV2>] { [.index(["name"]), .default("color", "red")] }
}

/// `legacy` removed, `weight` now NOT NULL with a default.
private struct GadgetV3: Model, Equatable {
    var id: Int64
    var name: String
    var weight: Int
    var color: String?
    static let tableName = "gadget"
    static var constraints: [Constraint<GadgetV3>] {
        [.index(["name"]), .default("color", "red"), .default("weight", 0)]
    }
}

private struct Widget: Model, Equatable {
    var id: Int64
    var label: String
    static let tableName = "widget"
}

/// Like GadgetV2, but its missing columns are added by writes (AgileDB's automatic columns).
private struct AutoGadget: Model, Equatable {
    var id: Int64
    var name: String
    var weight: Int?
    var legacy: String?
    var color: String?
    static let tableName = "gadget"
    static var addsMissingColumns: Bool { true }
}

/// SQLiteORM-Swift's `User` on its predefined `users` table (README of SQLiteORM-Swift), with
/// one property more: `email`.
private struct PredefinedUser: Model, Equatable {
    var id: Int64
    var firstName: String
    var lastName: String
    var birthDate: Int64
    var imageUrl: String?
    var typeId: Int64
    var email: String?
    enum CodingKeys: String, CodingKey {
        case id, firstName = "first_name", lastName = "last_name", birthDate = "birth_date", imageUrl = "image_url",
            typeId = "type_id", email
    }
    static let tableName = "users"
}

/// The same without `image_url`: a change only a rebuild makes.
private struct PredefinedUserWithoutImage: Model, Equatable {
    var id: Int64
    var firstName: String
    var lastName: String
    var birthDate: Int64
    var typeId: Int64
    var email: String?
    enum CodingKeys: String, CodingKey {
        case id, firstName = "first_name", lastName = "last_name", birthDate = "birth_date", typeId = "type_id", email
    }
    static let tableName = "users"
}

@Suite("updateSchema(toMatch:): tables follow the models")
struct SchemaUpdateTests {
    private func v1Database(rows: Int = 20) throws -> Database {
        let db = try Database.inMemory()
        try db.createTable(GadgetV1.self)
        try db.insert(
            contentsOf: (1...Int64(rows)).map {
                GadgetV1(id: $0, name: "g\($0)", weight: $0 % 3 == 0 ? nil : Int($0), legacy: "old \($0)")
            })
        return db
    }

    @Test("creates missing tables and adds missing columns; a dry run only reports")
    func createAndAdd() throws {
        let db = try v1Database()
        let before = try migrationDump(db)
        let planned = try db.updateSchema(toMatch: [GadgetV2.self, Widget.self], dryRun: true)
        #expect(planned.map(\.action) == [.addedColumns(["color"]), .created])
        #expect(try migrationDump(db) == before)

        let done = try db.updateSchema(toMatch: [GadgetV2.self, Widget.self])
        #expect(done.map(\.action) == [.addedColumns(["color"]), .created])
        #expect(done.map(\.description) == ["gadget: added color", "widget: created"])
        #expect(try db.fetchAll(GadgetV2.self).count == 20)
        #expect(try db.fetch(GadgetV2.self, key: PrimaryKey(4))?.color == "red")
        try db.insert(Widget(id: 1, label: "w"))
        #expect(try db.updateSchema(toMatch: [GadgetV2.self, Widget.self]).map(\.action) == [.unchanged, .unchanged])
        try db.execute("DROP INDEX gadget_on_name")
        #expect(try db.updateSchema(toMatch: [GadgetV2.self]).map(\.createdIndexes) == [["gadget_on_name"]])
    }

    @Test("removed or changed columns are refused without rebuildingTables, and rebuilt keeping every row with it")
    func rebuildKeepsRows() throws {
        let db = try v1Database(rows: 300)
        try db.updateSchema(toMatch: [GadgetV2.self])
        try db.execute("UPDATE gadget SET color = 'blue' WHERE id % 2 = 0")
        try db.execute("UPDATE gadget SET weight = 0 WHERE weight IS NULL")
        let kept = try db.fetchRows("SELECT rowid, id, name, weight, color FROM gadget ORDER BY id").map(\.values)
        let before = try migrationDump(db)

        let refused = try db.updateSchema(toMatch: [GadgetV3.self])
        guard case let .refused(reason) = refused[0].action else { Issue.record("\(refused)"); return }
        #expect(reason.contains("legacy") && reason.contains("weight") && reason.contains("rebuildingTables"))
        #expect(try migrationDump(db) == before)

        let rebuilt = try db.updateSchema(toMatch: [GadgetV3.self], rebuildingTables: true)
        #expect(
            rebuilt.map(\.action) == [
                .rebuilt(removedColumns: ["legacy"], changedColumns: ["weight"], addedColumns: [])
            ])
        #expect(try db.fetchRows("SELECT rowid, id, name, weight, color FROM gadget ORDER BY id").map(\.values) == kept)
        #expect(try db.fetchAll(GadgetV3.self).count == 300)
        #expect(
            try db.fetchValue(
                "SELECT \"notnull\" FROM pragma_table_info('gadget') WHERE name = 'weight'", as: Bool.self) == true)
        #expect(
            try db.fetchValue(
                "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'gadget_on_name'", as: Int.self)
                == 1)
        #expect(try db.updateSchema(toMatch: [GadgetV3.self]).map(\.action) == [.unchanged])
    }

    @Test("a table Tether did not create gets a column added, and a rebuild keeps it as it was made (not STRICT)")
    func predefinedTable() throws {
        let db = try Database.inMemory()
        try db.execute(
            """
            CREATE TABLE users (
                id INTEGER PRIMARY KEY NOT NULL,
                first_name TEXT NOT NULL,
                last_name TEXT NOT NULL,
                birth_date INTEGER NOT NULL,
                image_url TEXT,
                type_id INTEGER NOT NULL);
            INSERT INTO users VALUES (1, 'John', 'Doe', 664416000, 'url_to_heaven', 3), (2, 'Alice', 'Inwonder', \
            831168000, NULL, 2);
            """)
        func isStrict() throws -> Bool? {
            try db.fetchValue("SELECT strict FROM pragma_table_list WHERE name = 'users'", as: Bool.self)
        }

        let added = try db.updateSchema(toMatch: [PredefinedUser.self])
        #expect(added.map(\.action) == [.addedColumns(["email"])])
        #expect(try isStrict() == false)
        #expect(
            try db.fetchValue("SELECT \"notnull\" FROM pragma_table_info('users') WHERE name = 'id'", as: Bool.self)
                == true)
        #expect(
            try db.fetchAll(PredefinedUser.self) == [
                PredefinedUser(
                    id: 1, firstName: "John", lastName: "Doe", birthDate: 664416000, imageUrl: "url_to_heaven",
                    typeId: 3, email: nil),
                PredefinedUser(
                    id: 2, firstName: "Alice", lastName: "Inwonder", birthDate: 831168000, imageUrl: nil, typeId: 2,
                    email: nil),
            ])
        #expect(try db.updateSchema(toMatch: [PredefinedUser.self]).map(\.action) == [.unchanged])

        // Without rebuilds, the reason says what differs, and no data loss where none is removed.
        let refused = try db.updateSchema(toMatch: [PredefinedUserWithoutImage.self])
        guard case let .refused(reason) = refused[0].action else { Issue.record("\(refused)"); return }
        #expect(reason.contains("removed image_url") && reason.contains("rebuildingTables"))
        // A rebuild the model asks for changes what it asks, not the table's STRICT-ness.
        let rebuilt = try db.updateSchema(toMatch: [PredefinedUserWithoutImage.self], rebuildingTables: true)
        #expect(
            rebuilt.map(\.action) == [.rebuilt(removedColumns: ["image_url"], changedColumns: [], addedColumns: [])])
        #expect(try isStrict() == false)
        #expect(try db.fetchAll(PredefinedUserWithoutImage.self).map(\.firstName) == ["John", "Alice"])
    }

    @Test("a rebuild that cannot keep the rows is refused: a new NOT NULL column without a default")
    func notNullWithoutDefault() throws {
        struct Strict: Model {
            var id: Int64
            var name: String
            var weight: Int?
            var legacy: String?
            var serial: String
            static let tableName = "gadget"
        }
        let db = try v1Database(rows: 2)
        let report = try db.updateSchema(toMatch: [Strict.self], rebuildingTables: true)
        guard case let .refused(reason) = report[0].action else { Issue.record("\(report)"); return }
        #expect(reason.contains("serial"))
    }

    @Test("on a synced table, columns added by updateSchema are synced, removed ones are not; rows are not re-sent")
    func syncedTable() throws {
        let db = try v1Database(rows: 30)
        try db.enableSync(for: GadgetV1.self)
        let peer = try makeDatabase(syncing: GadgetV1.self)
        try SyncTestKit.sync(db, peer)
        let sequence = try db.lastSequence()
        for side in [db, peer] { try side.updateSchema(toMatch: [GadgetV3.self], rebuildingTables: true) }
        #expect(try db.lastSequence() == sequence)
        #expect(
            try db.fetchValue("SELECT value_columns FROM tether_tables WHERE name = 'gadget'", as: String.self)
                == #"["name","weight","color"]"#)
        try db.update(GadgetV3(id: 5, name: "five", weight: 55, color: "green"))
        try SyncTestKit.sync(db, peer)
        #expect(
            try peer.fetch(GadgetV3.self, key: PrimaryKey(5))
                == GadgetV3(id: 5, name: "five", weight: 55, color: "green"))
        #expect(try peer.fetchAll(GadgetV3.self).count == 30)
    }

    @Test("a model property with no column is an error naming table and column, on reads and writes")
    func missingColumnIsAnError() throws {
        let db = try v1Database(rows: 2)
        let attempts: [@Sendable () throws -> Void] = [
            { _ = try db.fetchAll(GadgetV2.self) }, { _ = try db.fetch(GadgetV2.self, key: PrimaryKey(1)) },
            { try db.insert(GadgetV2(id: 9, name: "n", weight: 1, legacy: nil, color: "c")) },
            { try db.update(GadgetV2(id: 1, name: "n", weight: 1, legacy: nil, color: "c")) },
        ]
        for attempt in attempts {
            let error = ormExpectModelError(.columnNotInTable) { try attempt() }
            guard case let .columnNotInTable(model, table, column)? = error else { continue }
            #expect(model == "GadgetV2" && table == "gadget" && column == "color")
            #expect(error?.description.contains("table gadget has no column color") == true)
        }
    }

    @Test("a model with addsMissingColumns reads a missing column as NULL and adds it on its first write")
    func automaticColumns() throws {
        let db = try v1Database(rows: 2)
        #expect(try db.fetchAll(AutoGadget.self).map(\.color) == [nil, nil])
        // A first write rolled back takes its added column with it; the next write adds it again.
        #expect(throws: SyncTestAbort.self) {
            try db.write { conn in
                try conn.insert(AutoGadget(id: 3, name: "rolled back", weight: nil, legacy: nil, color: "x"))
                throw SyncTestAbort()
            }
        }
        #expect(
            try db.fetchValue("SELECT count(*) FROM pragma_table_info('gadget') WHERE name = 'color'", as: Int.self)
                == 0)
        try db.insert(AutoGadget(id: 3, name: "auto", weight: nil, legacy: nil, color: "teal"))
        #expect(try db.fetch(AutoGadget.self, key: PrimaryKey(3))?.color == "teal")
        #expect(
            try db.fetchValue("SELECT count(*) FROM pragma_table_info('gadget') WHERE name = 'color'", as: Int.self)
                == 1)
    }
}
