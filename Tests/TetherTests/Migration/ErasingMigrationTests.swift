import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// sModel's "Bad Upgrade Recovery" ("the system will try and recover by deleting the existing
/// database and initializing fresh"), for caches of what peers hold: an explicit opt-in that
/// erases only when no local change waits for a peer.
@Suite(
    "sModel's recovery from a failed upgrade: erased and migrated from empty only when no local change waits for a peer"
)
struct ErasingMigrationTests {
    static let thingSchema = "CREATE TABLE thing (tid TEXT PRIMARY KEY, name TEXT)"

    /// The cache's first schema.
    static func version1() -> Migrator {
        var migrator = Migrator()
        migrator.register("001-thing", sql: thingSchema)
        return migrator
    }

    /// Its upgrade: names become unique, which fails on a database holding two things of one
    /// name and runs on an empty one.
    static func version2() -> Migrator {
        var migrator = version1()
        migrator.register("002-unique-name", sql: "CREATE UNIQUE INDEX thing_name ON thing (name)")
        migrator.erasesDatabaseOnFailure = true
        return migrator
    }

    /// A server holding two things of one name, and a version 1 cache at `path` that received them.
    static func cacheOfServer(at path: String) throws -> (server: Database, cache: Database) {
        let server = try makeDatabase(schema: thingSchema, syncing: ["thing"])
        try server.execute("INSERT INTO thing VALUES ('t1', 'same'), ('t2', 'same')")
        let opened = try version1().migrate(databaseAt: path)
        #expect(opened.applied == ["001-thing"] && opened.erasedAfter == nil)
        try opened.database.enableSync(table: "thing")
        try SyncTestKit.sync(server, opened.database)
        return (server, opened.database)
    }

    @Test func aCacheHoldingOnlyWhatPeersHoldIsErasedAndMigratedFromEmpty() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("cache.sqlite")
        let (server, cache) = try Self.cacheOfServer(at: path)
        #expect(try cache.pendingChangeCount() == 0)
        let oldKey = cache.instanceKey
        try cache.close()

        let upgraded = try Self.version2().migrate(databaseAt: path)
        guard case let .failed(migration, _)? = upgraded.erasedAfter else {
            Issue.record(
                """
                expected the database erased after 002-unique-name failed, got \
                \(String(describing: upgraded.erasedAfter))
                """)
            return
        }
        #expect(migration == "002-unique-name")
        #expect(upgraded.applied == ["001-thing", "002-unique-name"])
        let fresh = upgraded.database
        #expect(fresh.instanceKey != oldKey)
        #expect(try fresh.fetchValue("SELECT count(*) FROM thing", as: Int.self) == 0)
        #expect(try fresh.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 'thing_name'", as: Int.self) == 1)
        #expect(fresh.syncedTables.isEmpty)

        // Synced again, the erased cache is a new peer: the server sends it everything it holds.
        try server.execute("UPDATE thing SET name = 'other' WHERE tid = 't2'")
        try fresh.enableSync(table: "thing")
        try SyncTestKit.sync(server, fresh)
        #expect(
            try SyncTestKit.dump(fresh, "SELECT tid, name FROM thing ORDER BY tid") == ["'t1'|'same'", "'t2'|'other'"])
        try fresh.close()
    }

    @Test func aCacheHoldingChangesNoPeerAcknowledgedIsKeptAndTheErrorCountsThem() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("cache.sqlite")
        let (server, cache) = try Self.cacheOfServer(at: path)
        // One change sent and not acknowledged (in flight), one never sent.
        try cache.execute("INSERT INTO thing VALUES ('t3', 'mine')")
        try SyncTestKit.sync(cache, server, acknowledge: false)
        try cache.execute("INSERT INTO thing VALUES ('t4', 'also mine')")
        let key = cache.instanceKey
        try cache.close()

        let error = migrationError { _ = try Self.version2().migrate(databaseAt: path) }
        guard case let .erasingWouldLoseChanges(pending, failure)? = error, case let .failed(migration, _) = failure
        else {
            Issue.record(
                "expected erasingWouldLoseChanges after 002-unique-name failed, got \(String(describing: error))")
            return
        }
        #expect(pending == 2)
        #expect(migration == "002-unique-name")
        #expect(error?.description.contains("it holds 2 local change(s) that no peer has acknowledged") == true)

        // As it was before the failing migration, and not held open.
        let kept = try Database(path: path)
        #expect(kept.instanceKey == key)
        #expect(try SyncTestKit.dump(kept, "SELECT tid FROM thing ORDER BY tid") == ["'t1'", "'t2'", "'t3'", "'t4'"])
        #expect(try Self.version1().appliedMigrations(in: kept) == ["001-thing"])
        #expect(try kept.pendingChangeCount() == 2)
        try kept.close()
    }

    @Test func aRefusalToRunNeverErases() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("cache.sqlite")
        let (_, cache) = try Self.cacheOfServer(at: path)
        try cache.close()
        // A newer version applied a migration this one does not know: not a failed migration.
        var newer = Self.version1()
        newer.register("002-newer") { _ in }
        try newer.migrate(databaseAt: path).database.close()
        var older = Self.version1()
        older.erasesDatabaseOnFailure = true
        guard case .unknownMigrations(["002-newer"])? = migrationError({ _ = try older.migrate(databaseAt: path) })
        else {
            Issue.record("expected unknownMigrations")
            return
        }
        let kept = try Database(path: path)
        #expect(try kept.fetchValue("SELECT count(*) FROM thing", as: Int.self) == 2)
        try kept.close()
    }
}

@Suite("SchemaEvolution: starting afresh after a failed upgrade, with schema files")
struct ErasingSchemaFilesArticleTests {
    @Test func theArticlesExampleErasesACacheWhoseUpgradeFails() throws {
        let schemaDirectory = try TemporaryDirectory()
        let files = try TemporaryDirectory()
        let cachePath = files.file("cache.sqlite")
        _ = try schemaDirectory.write("001-thing.sql", ErasingMigrationTests.thingSchema)
        let first = try Database(path: cachePath)
        try first.applySchemaFiles(in: schemaDirectory.path)
        try first.execute("INSERT INTO thing VALUES ('t1', 'same'), ('t2', 'same')")
        try first.close()
        _ = try schemaDirectory.write("002-unique-name.sql", "CREATE UNIQUE INDEX thing_name ON thing (name)")

        var migrator = try Migrator(schemaFilesIn: schemaDirectory.path)
        migrator.erasesDatabaseOnFailure = true  // sModel's bad-upgrade recovery, asked for
        let opened = try migrator.migrate(databaseAt: cachePath)
        let db = opened.database  // migrated, or erased and migrated from empty
        if let failure = opened.erasedAfter { print("started afresh after", failure) }

        guard case let .failed(migration, _)? = opened.erasedAfter else {
            Issue.record(
                """
                expected the cache erased after 002-unique-name.sql failed, got \
                \(String(describing: opened.erasedAfter))
                """)
            return
        }
        #expect(migration == "002-unique-name.sql")
        #expect(opened.applied == ["001-thing.sql", "002-unique-name.sql"])
        #expect(try db.fetchValue("SELECT count(*) FROM thing", as: Int.self) == 0)
        #expect(try db.applySchemaFiles(in: schemaDirectory.path).isEmpty)
        try db.close()
    }
}
