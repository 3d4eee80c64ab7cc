import Foundation
import Testing
@testable import Tether
import TetherTestSupport

// The small things users of the source libraries reach for: AgileDB's values
// by key, row validation, tableHasAllKeys and lazy results; SQLiteORM-Swift's
// tables without a primary key and inserts under a new key; AHDataModel's
// best-effort delete by keys, `query(…, nil)` and sort strings; sModel's
// replace-duplicates option and its save rule for syncable models.

/// SQLiteORM-Swift's models: `id = 0` until inserted.
struct MigTask: Model, Equatable {
    var id: Int64
    var title: String
    static let tableName = "mig_task"
}

/// A table without a primary key.
struct MigLogLine: Model, Equatable {
    var level: String
    var message: String
    var code: Int?
    static let tableName = "mig_log"
    static var primaryKey: [ColumnRef<MigLogLine>] { [] }
    static var constraints: [Constraint<MigLogLine>] { [.unique("code")] }
}

/// A model over an AgileDB-style table made by `setValue`.
struct MigCategory: Model, Equatable {
    var key: String
    var name: String
    var budget: Double?
    static let tableName = "categories"
    static var primaryKey: [ColumnRef<MigCategory>] { ["key"] }
}

@Suite("ORM helpers for migrating users") struct ORMMigrationHelpersTests {
    // MARK: AgileDB's values by key

    @Test func valuesByKeyCreateTheirColumns() throws {
        let db = try Database.inMemory()
        try db.setValue(
            ["name": "Groceries", "budget": 120.5, "tags": ["food", "home"], "active": true, "key": "ignored"],
            inTable: "categories", forKey: "c1")
        // The table and a column per member, typed by its value; "key" is the key column, not a member.
        #expect(
            try ormTableInfo(db, "categories").map { "\($0.name) \($0.type)" }
                == ["key TEXT", "active INTEGER", "budget REAL", "name TEXT", "tags TEXT"])
        #expect(
            try db.value(fromTable: "categories", forKey: "c1") == [
                "name": .text("Groceries"), "budget": .real(120.5), "tags": .text(#"["food","home"]"#),
                "active": .integer(1),
            ])
        #expect(
            try db.jsonValue(fromTable: "categories", forKey: "c1")
                == #"{"active":1,"budget":120.5,"name":"Groceries","tags":["food","home"]}"#)
        // JSON text in; a later value adds its new member's column, and members it lacks become NULL.
        try db.setValue(
            json: #"{"name": "Rent", "budget": 900, "day": 1, "key": "x"}"#, inTable: "categories", forKey: "c2")
        try db.setValue(json: #"{"name": "Food", "note": null}"#, inTable: "categories", forKey: "c1")
        #expect(try db.value(fromTable: "categories", forKey: "c1") == ["name": .text("Food")])
        #expect(
            try db.value(fromTable: "categories", forKey: "c2") == [
                "name": .text("Rent"), "budget": .real(900), "day": .integer(1),
            ])
        #expect(
            try ormTableInfo(db, "categories").map(\.name) == [
                "key", "active", "budget", "name", "tags", "day", "note",
            ])
        // A model reads the same rows.
        #expect(
            try db.fetchAll(MigCategory.query.orderBy("key")) == [
                MigCategory(key: "c1", name: "Food", budget: nil), MigCategory(key: "c2", name: "Rent", budget: 900),
            ])
        // Keys, checks and deletes.
        #expect(try db.keys(inTable: "categories", sortOrder: "name desc") == [.text("c2"), .text("c1")])
        #expect(try db.tableHasKey("categories", key: "c1"))
        #expect(try db.tableHasAllKeys("categories", keys: ["c1", "c2", "c1"]))
        #expect(try !db.tableHasAllKeys("categories", keys: ["c1", "c3"]))
        #expect(try !db.tableHasAllKeys("nowhere", keys: ["c1"]))
        #expect(try db.deleteValue(fromTable: "categories", forKey: "c2"))
        #expect(try !db.deleteValue(fromTable: "categories", forKey: "c2"))
        #expect(try db.value(fromTable: "categories", forKey: "c2") == nil)
        #expect(try db.value(fromTable: "nowhere", forKey: "c2") == nil)
    }

    @Test func valuesByKeyRefuseWhatTheyCannotStore() throws {
        let db = try Database.inMemory()
        try db.setValue(["count": 3], inTable: "counters", forKey: "a")
        // The column is a STRICT INTEGER now: text that is no integer is refused, the row unchanged.
        ormExpectDatabaseError(.typeMismatch) { try db.setValue(["count": "three"], inTable: "counters", forKey: "a") }
        #expect(try db.value(fromTable: "counters", forKey: "a") == ["count": .integer(3)])
        ormExpectModelError(.invalidArgument) { try db.setValue(json: "[1, 2]", inTable: "counters", forKey: "a") }
        ormExpectModelError(.invalidArgument) { try db.setValue(["": 1], inTable: "counters", forKey: "a") }
        ormExpectModelError(.invalidArgument) {
            try db.keys(inTable: "counters", sortOrder: "count; DROP TABLE counters")
        }
        ormExpectModelError(.unknownColumn) { try db.keys(inTable: "counters", sortOrder: "nope") }
        // A table whose key is not one column cannot be used by key.
        try db.execute("CREATE TABLE pairs (a, b, PRIMARY KEY (a, b))")
        ormExpectModelError(.invalidArgument) { try db.value(fromTable: "pairs", forKey: "x") }
        #expect(try db.tableExists("counters"))
    }

    // MARK: Checking stored rows against a model

    @Test func validateRowsReportsRowsTheModelCannotRead() throws {
        let db = try Database.inMemory()
        try db.execute(
            "CREATE TABLE orm_user (id INTEGER PRIMARY KEY, name TEXT, email TEXT, age, score, nickname TEXT)")
        try db.execute(
            """
            INSERT INTO orm_user VALUES (1, 'Ann', 'a@x', 30, NULL, NULL), (2, 'Bob', 'b@x', 'old', NULL, NULL),
              (3, NULL, 'c@x', 20, NULL, NULL), (4, 'Dan', 'd@x', 41, 2.5, NULL)
            """)
        let failures = try db.validateRows(OrmUser.self)
        #expect(failures.map(\.element) == [PrimaryKey(2), PrimaryKey(3), PrimaryKey(4)])
        #expect(failures.map(\.index) == [1, 2, 3])
        #expect(failures.map { ($0.error as? ModelError)?.ormCase } == [.typeMismatch, .typeMismatch, .typeMismatch])
        #expect(
            failures.map { failure -> String? in
                guard case let .typeMismatch(column, _, _, _)? = failure.error as? ModelError else { return nil }
                return column
            } == ["age", "name", "score"])
        #expect(try db.validateRows(OrmUser.self).count == 3, "validating changes nothing")
        try db.execute("DELETE FROM orm_user WHERE id > 1")
        #expect(try db.validateRows(OrmUser.self).isEmpty)
    }

    // MARK: Lazy results

    @Test func lazyResultsHoldKeysAndReadModelsOnAccess() throws {
        let db = try ormUserFixture()
        let results = try db.lazyFetch(OrmUser.where(\.age >= 30).orderBy("name"))
        #expect(results.keys == [PrimaryKey(1), PrimaryKey(3), PrimaryKey(4), PrimaryKey(6)])
        #expect(results.count == 4)
        // Read on access, as the database is then.
        try db.update(OrmUser.self, key: PrimaryKey(3), set: [.set("name", to: "Caroline")])
        try db.delete(OrmUser.self, key: PrimaryKey(4))
        #expect(results.map { $0?.name } == ["Alice", "Caroline", nil, "alan"])
        #expect(try results.model(at: 0).id == 1)
        // A row deleted since the keys were fetched: the element is nil, model(at:) names its key.
        #expect(throws: RowDeletedError(table: OrmUser.tableName, key: PrimaryKey(4), position: 2)) {
            try results.model(at: 2)
        }
        ormExpectModelError(.invalidArgument) { try results.model(at: 4) }
        ormExpectModelError(.invalidArgument) { try db.lazyFetch(MigLogLine.query) }
    }

    // MARK: Tables without a primary key

    @Test func tablesWithoutAPrimaryKeyWorkByCondition() throws {
        let db = try Database.inMemory()
        try db.createTable(MigLogLine.self)
        #expect(try ormTableInfo(db, "mig_log").map(\.pk) == [0, 0, 0])
        let lines = [
            MigLogLine(level: "info", message: "up", code: nil), MigLogLine(level: "warn", message: "slow", code: 7),
            MigLogLine(level: "info", message: "up", code: nil),
        ]
        try db.insert(contentsOf: lines)
        #expect(try db.insert(MigLogLine(level: "error", message: "down", code: 9)) == 4)
        #expect(try db.fetchAll(MigLogLine.where(\.level == "info")) == [lines[0], lines[2]])
        #expect(try db.update(MigLogLine.where(\.level == "info").limit(1), set: [.set("message", to: "started")]) == 1)
        #expect(try db.fetchAll(MigLogLine.query("level", "=", "info")).map(\.message) == ["started", "up"])
        #expect(try db.delete(MigLogLine.where(\.level == "info")) == 2)
        #expect(try db.count(MigLogLine.self) == 2)
        // A unique column still says which row collided.
        let duplicate = ormExpectModelError(.duplicate) { try db.insert(MigLogLine(level: "x", message: "y", code: 7)) }
        if case let .duplicate(existing, _)? = duplicate { #expect((existing as? MigLogLine)?.message == "slow") }
        // What needs a key says so.
        for operation in [
            { try db.update(lines[1]) }, { try db.save(lines[1]) }, { _ = try db.delete(lines[1]) },
            { _ = try db.fetch(MigLogLine.self, key: PrimaryKey(1)) }, { _ = try db.fetchKeys(MigLogLine.query) },
        ] {
            let error = ormExpectModelError(.invalidArgument, operation)
            #expect(error?.description.contains("has no primary key") == true)
        }
        #expect(try db.count(MigLogLine.self) == 2)
    }

    @Test func syncRefusesATableWithoutAPrimaryKeyUnlessGivenAnIdentity() throws {
        let a = try Database.inMemory()
        let b = try Database.inMemory()
        for db in [a, b] { try db.createTable(MigLogLine.self) }
        let error = SyncTestKit.error { try a.enableSync(for: MigLogLine.self) }
        guard case let .invalidTable(reason)? = error as? SyncError else {
            Issue.record("expected SyncError.invalidTable, got \(String(describing: error))")
            return
        }
        #expect(reason.contains("no primary key"))
        // Rowids are local; a unique column can identify rows across peers.
        for db in [a, b] { try db.enableSync(for: MigLogLine.self, identity: ["code"]) }
        try a.insert(MigLogLine(level: "warn", message: "slow", code: 7))
        try SyncTestKit.sync(a, b)
        #expect(try b.fetchAll(MigLogLine.self) == [MigLogLine(level: "warn", message: "slow", code: 7)])
        try a.update(MigLogLine.where(\.code == 7), set: [.set("message", to: "slower")])
        try SyncTestKit.sync(a, b)
        #expect(try b.fetchAll(MigLogLine.self).map(\.message) == ["slower"])
    }

    // MARK: Inserting under a new key

    @Test func insertAssigningANewKeyIgnoresTheGivenOne() throws {
        let db = try Database.inMemory()
        try db.createTable(MigTask.self)
        #expect(try db.insert(MigTask(id: 0, title: "a"), assigningNewKey: true) == 1)
        #expect(try db.insert(MigTask(id: 0, title: "b"), assigningNewKey: true) == 2)
        #expect(try db.insert(MigTask(id: 1, title: "c"), assigningNewKey: true) == 3)
        #expect(
            try db.fetchAll(MigTask.query.orderBy("id")) == [
                MigTask(id: 1, title: "a"), MigTask(id: 2, title: "b"), MigTask(id: 3, title: "c"),
            ])
        // Without it, the key given is the key: 0 is stored as 0, a taken key is a duplicate.
        #expect(try db.insert(MigTask(id: 0, title: "zero")) == 0)
        ormExpectModelError(.duplicate) { try db.insert(MigTask(id: 1, title: "again")) }
        // A nil key always gets a new one.
        try db.createTable(OrmDevice.self)
        #expect(try db.insert(OrmDevice(id: nil, uid: UUID(), label: "x")) == 1)
        #expect(try db.fetchAll(OrmDevice.self).map(\.id) == [1])
        // Only a single INTEGER key can be assigned.
        try db.createTable(MigCategory.self)
        ormExpectModelError(.invalidArgument) {
            try db.insert(MigCategory(key: "k", name: "n", budget: nil), assigningNewKey: true)
        }
        #expect(try db.count(MigCategory.self) == 0)
    }

    // MARK: Best-effort delete by keys

    @Test func deleteEachByKeysReportsTheKeysThatFailed() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAuthor.self)
        try db.createTable(OrmReview.self)
        try db.insert(contentsOf: [
            OrmAuthor(id: 1, name: "a"), OrmAuthor(id: 2, name: "b"), OrmAuthor(id: 3, name: "c"),
        ])
        try db.insert(OrmReview(id: 1, authorId: 2, stars: 5))
        let failures = try db.deleteEach(
            OrmAuthor.self, keys: [PrimaryKey(1), PrimaryKey(2), PrimaryKey(9), [1, 2], PrimaryKey(3)])
        #expect(failures.map(\.index) == [1, 2, 3])
        #expect(failures.map(\.element) == [PrimaryKey(2), PrimaryKey(9), [1, 2]])
        #expect((failures[0].error as? DatabaseError)?.kind == .foreignKeyViolation)
        #expect((failures[1].error as? ModelError)?.ormCase == .notFound)
        #expect((failures[2].error as? ModelError)?.ormCase == .invalidArgument)
        #expect(try db.fetchAll(OrmAuthor.self).map(\.id) == [2])
    }

    // MARK: Query builder spellings

    @Test func queryTakesNilAndSortStrings() throws {
        let db = try ormUserFixture()
        #expect(try db.fetchAll(OrmUser.query("score", "IS NOT", nil).orderBy("id")).map(\.id) == [1, 3, 4, 5, 6])
        #expect(try db.fetchAll(OrmUser.query("score", "IS", nil)).map(\.id) == [2])
        #expect(
            try db.fetchAll(OrmUser.query("age", ">", 20).and("nickname", "=", nil).orderBy("id")).map(\.id) == [2, 4])
        #expect(
            try db.fetchAll(OrmUser.query("age", ">", 39).or("score", "IS", nil).orderBy("id")).map(\.id) == [2, 4])
        ormExpectModelError(.invalidArgument) { try db.fetchAll(OrmUser.query("score", ">", nil)) }
        // Aggregates by column name, the model given once.
        #expect(try db.aggregate(.sum("age"), of: OrmUser.self, as: Int.self) == 182)
        #expect(try db.aggregate(.sum("score"), of: OrmUser.query("score", "IS NOT", nil), as: Int.self) == 115)
        // Sort strings, checked column by column.
        #expect(try db.fetchAll(OrmUser.query.orderBy("age desc, name")).map(\.id) == [4, 3, 1, 6, 2, 5])
        #expect(try db.fetchAll(OrmUser.query.orderBy("AGE DESC , \"name\" asc")).map(\.id) == [4, 3, 1, 6, 2, 5])
        #expect(try db.fetchAll(OrmUser.query.orderBy("age, id", ascending: false)).map(\.id) == [4, 3, 6, 1, 2, 5])
        for bad in ["age desc; DROP TABLE orm_user", "age sideways", "age,", "\"age", "name desc desc", ""] {
            ormExpectModelError(.invalidArgument) { try db.fetchAll(OrmUser.query.orderBy(bad)) }
        }
        let unknown = ormExpectModelError(.unknownColumn) {
            try db.fetchAll(OrmUser.query.orderBy("age, password desc"))
        }
        #expect(unknown?.description.contains("password") == true)
        #expect(try db.count(OrmUser.self) == 6)
    }

    // MARK: sModel: replacing duplicates, and saving by secondary key

    @Test func replacesDuplicatesReplacesTheCollidingRows() throws {
        var configuration = Database.Configuration()
        configuration.replacesDuplicates = true
        let db = try Database.inMemory(configuration: configuration)
        try db.createTable(OrmUser.self)
        try db.insert(contentsOf: ormUsers)
        // Same email as Alice (id 1), another id: Alice's row is replaced.
        try db.insert(OrmUser(id: 7, name: "Alicia", email: "alice@x", age: 31, score: nil, nickname: nil))
        try db.save(OrmUser(id: 8, name: "Bobby", email: "bob@x", age: 26, score: nil, nickname: nil))
        #expect(
            try db.insertEach([OrmUser(id: 3, name: "Carla", email: "carla@x", age: 36, score: nil, nickname: nil)])
                .isEmpty)
        #expect(
            try db.fetchAll(OrmUser.query.orderBy("id")).map(\.name) == [
                "Carla", "Dave", "Anna", "alan", "Alicia", "Bobby",
            ])
        // Other constraints still fail.
        ormExpectDatabaseError(.checkViolation) {
            try db.insert(OrmUser(id: 9, name: "Neg", email: "n@x", age: -1, score: nil, nickname: nil))
        }
        // Off (the default), a collision is a duplicate.
        let strict = try ormUserFixture()
        ormExpectModelError(.duplicate) {
            try strict.insert(OrmUser(id: 7, name: "Alicia", email: "alice@x", age: 31, score: nil, nickname: nil))
        }
        ormExpectModelError(.duplicate) {
            try strict.save(OrmUser(id: 7, name: "Alicia", email: "alice@x", age: 31, score: nil, nickname: nil))
        }
    }

    @Test func replacedRowsReachPeersAsDeletes() throws {
        var configuration = Database.Configuration()
        configuration.replacesDuplicates = true
        let a = try Database.inMemory(configuration: configuration)
        let b = try Database.inMemory()
        for db in [a, b] {
            try db.createTable(OrmUser.self)
            try db.enableSync(for: OrmUser.self)
        }
        try a.insert(contentsOf: ormUsers)
        try SyncTestKit.sync(a, b)
        try a.insert(contentsOf: [OrmUser(id: 7, name: "Alicia", email: "alice@x", age: 31, score: nil, nickname: nil)])
        try SyncTestKit.sync(a, b)
        #expect(try b.fetchAll(OrmUser.query.orderBy("id")) == a.fetchAll(OrmUser.query.orderBy("id")))
        #expect(try b.fetch(OrmUser.self, key: PrimaryKey(1)) == nil)
    }

    @Test func savingBySecondaryKeyUpdatesASyncedIdleRow() throws {
        let server = try makeDatabase(syncing: Thing.self)
        let client = try makeDatabase(syncing: Thing.self)
        try server.insert(Thing(id: 50, serverID: "s1", name: "from server"))
        try SyncTestKit.sync(server, client)
        let local = try #require(try client.fetchFirst(Thing.where(\.serverID == "s1")))
        #expect(local.syncStatus == .synced)

        // Saved with another local key: the synced row takes the values and keeps its key.
        try client.save(Thing(id: 999, serverID: "s1", name: "renamed"))
        let stored = try client.fetchAll(Thing.self)
        #expect(stored.map(\.id) == [local.id])
        #expect(stored.map(\.name) == ["renamed"])
        #expect(stored.map(\.syncStatus) == [.updated])
        // Now pending: a save by secondary key would overwrite a local change, so it is a duplicate.
        let pending = ormExpectModelError(.duplicate) { try client.save(Thing(id: 998, serverID: "s1", name: "again")) }
        if case let .duplicate(existing, _)? = pending { #expect((existing as? Thing)?.name == "renamed") }
        // In flight too.
        _ = try client.extractChanges(for: server.instanceKey, after: 0)
        #expect(try client.fetchAll(Thing.self).map(\.inFlight) == [true])
        ormExpectModelError(.duplicate) { try client.save(Thing(id: 997, serverID: "s1", name: "again")) }
        #expect(try client.fetchAll(Thing.self).map(\.name) == ["renamed"])
        // The change reaches the server under its identity.
        try SyncTestKit.sync(client, server)
        #expect(try server.fetchAll(Thing.self).map(\.name) == ["renamed"])
        // Rows never synced (a table not synced at all) are local changes: a duplicate as well.
        let offline = try Database.inMemory()
        try offline.createTable(Thing.self)
        try offline.insert(Thing(id: 1, serverID: "s1", name: "local"))
        ormExpectModelError(.duplicate) { try offline.save(Thing(id: 2, serverID: "s1", name: "other")) }
    }
}
