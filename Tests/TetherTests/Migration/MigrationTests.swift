import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Everything a database holds: its schema (sqlite_master) and every row of every table.
func migrationDump(_ db: Database) throws -> [String] {
    try db.read { conn in
        let schema = try conn.fetchRows("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name")
        var lines = schema.map { $0.values.map(\.description).joined(separator: " | ") }
        for row in schema where row.values[0] == .text("table") {
            let table = try row.get(1, as: String.self)
            lines += try conn.fetchRows("SELECT * FROM \(quoteIdentifier(table))")
                .map { "\(table): " + $0.values.map(\.description).joined(separator: ", ") }.sorted()
        }
        return lines
    }
}

/// Runs `body`, expecting a `MigrationError`; returns it.
func migrationError(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) -> MigrationError? {
    do {
        try body()
        Issue.record("expected a MigrationError, nothing was thrown", sourceLocation: sourceLocation)
    } catch let error as MigrationError {
        return error
    } catch {
        Issue.record("expected a MigrationError, got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}

@Suite("Migrations: run once, in order, all or nothing")
struct MigrationTests {
    private func baseMigrator() -> Migrator {
        var migrator = Migrator()
        migrator.register("1-player") { migration in
            try migration.execute(
                """
                CREATE TABLE team (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
                CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT NOT NULL, score INTEGER, team_id INTEGER \
                REFERENCES team (id));
                CREATE INDEX player_on_name ON player (name);
                INSERT INTO team VALUES (1, 'red');
                INSERT INTO player VALUES (1, 'Ann', 10, 1), (2, 'Bob', NULL, 1);
                """)
        }
        migrator.register("2-score-default", sql: "UPDATE player SET score = 0 WHERE score IS NULL")
        return migrator
    }

    @Test("migrations run once each, in registration order, and are recorded with their checksum")
    func runOnceInOrder() throws {
        let db = try Database.inMemory()
        let order = LockedBox<[String]>([])
        var migrator = baseMigrator()
        migrator.register("3-log") { _ in order.withLock { $0.append("3") } }
        #expect(try migrator.pendingMigrations(in: db) == ["1-player", "2-score-default", "3-log"])
        #expect(try migrator.migrate(db) == ["1-player", "2-score-default", "3-log"])
        #expect(try migrator.migrate(db) == [])
        #expect(order.value == ["3"])
        #expect(try migrator.appliedMigrations(in: db) == ["1-player", "2-score-default", "3-log"])
        #expect(try db.fetchValue("SELECT score FROM player WHERE id = 2", as: Int.self) == 0)
        let checksums = try db.fetchRows("SELECT name, checksum FROM tether_migrations ORDER BY name")
        #expect(checksums[0].values[1] == .null)
        #expect(
            checksums[1].values[1] == .text(SHA256.hex(Array("UPDATE player SET score = 0 WHERE score IS NULL".utf8))))
    }

    @Test("a migration failing halfway leaves a dump of schema and data identical to before")
    func failingHalfwayChangesNothing() throws {
        let db = try Database.inMemory()
        try baseMigrator().migrate(db)
        try db.enableSync(table: "player")
        let before = try migrationDump(db)
        var migrator = baseMigrator()
        migrator.register("3-halfway") { migration in
            try migration.addColumn("color", to: "player", "TEXT DEFAULT 'red'")
            try migration.execute("UPDATE player SET name = upper(name)")
            try migration.renameColumn("score", to: "points", in: "player")
            try migration.execute("CREATE TABLE extra (id INTEGER PRIMARY KEY)")
            try migration.execute("INSERT INTO extra VALUES (1)")
            try migration.execute("INSERT INTO player (id, name) VALUES (1, 'duplicate')")  // fails: primary key
        }
        migrator.register("4-never") { _ in Issue.record("a migration after a failed one ran") }
        let error = migrationError { try migrator.migrate(db) }
        guard case let .failed(name, underlying)? = error else { Issue.record("\(String(describing: error))"); return }
        #expect(name == "3-halfway")
        #expect((underlying as? DatabaseError)?.kind == .uniqueViolation)
        #expect(try migrationDump(db) == before)
        // The engine follows the rolled-back schema: writes still sync with the old columns.
        try db.execute("UPDATE player SET score = 5 WHERE id = 1")
        #expect(db.syncedTables == ["player"])
        #expect(try migrator.pendingMigrations(in: db) == ["3-halfway", "4-never"])
    }

    @Test(
        """
        foreign keys are off during a migration and checked before commit: a violation rolls back, naming table \
        and rowid
        """)
    func foreignKeyCheck() throws {
        let db = try Database.inMemory()
        try baseMigrator().migrate(db)
        let before = try migrationDump(db)
        var migrator = baseMigrator()
        migrator.register("3-orphan") { migration in
            // With foreign keys on, this DELETE would fail at once; off, the check at the end catches it.
            try migration.execute("DELETE FROM team WHERE id = 1")
        }
        let error = migrationError { try migrator.migrate(db) }
        guard case let .foreignKeyViolations(name, violations)? = error else {
            Issue.record("\(String(describing: error))"); return
        }
        #expect(name == "3-orphan")
        #expect(
            Set(violations) == [
                ForeignKeyViolation(table: "player", rowid: 1, parent: "team"),
                ForeignKeyViolation(table: "player", rowid: 2, parent: "team"),
            ])
        #expect(error?.description.contains("row 1 of player refers to a missing row of team") == true)
        #expect(try migrationDump(db) == before)
        #expect(try db.fetchValue("PRAGMA foreign_keys", as: Bool.self) == true)

        // A migration that repairs what it breaks commits.
        var repairing = baseMigrator()
        repairing.register("3-recreate-team") { migration in
            try migration.execute("DELETE FROM team WHERE id = 1")
            try migration.execute("INSERT INTO team VALUES (1, 'blue')")
        }
        #expect(try repairing.migrate(db) == ["3-recreate-team"])
    }

    @Test("a database migrated by a newer version is refused unless allowed; a changed SQL migration is refused")
    func newerDatabaseAndChangedSQL() throws {
        let db = try Database.inMemory()
        var newer = baseMigrator()
        newer.register("3-newer") { migration in try migration.addColumn("rank", to: "player", "INTEGER") }
        try newer.migrate(db)

        var older = baseMigrator()
        older.register("3-older-only") { _ in }
        let error = migrationError { try older.migrate(db) }
        guard case let .unknownMigrations(names)? = error else { Issue.record("\(String(describing: error))"); return }
        #expect(names == ["3-newer"])
        #expect(error?.description.contains("newer version") == true)
        #expect(try older.appliedMigrations(in: db).contains("3-older-only") == false)
        older.allowsUnknownMigrations = true
        #expect(try older.migrate(db) == ["3-older-only"])

        var edited = Migrator()
        edited.allowsUnknownMigrations = true
        edited.register("2-score-default", sql: "UPDATE player SET score = 1 WHERE score IS NULL")
        guard case let .changedAfterApplying(name, _, _)? = migrationError({ try edited.migrate(db) }) else {
            Issue.record("an edited SQL migration ran"); return
        }
        #expect(name == "2-score-default")
    }

    @Test(
        """
        a database handed open is never erased: erasesDatabaseOnFailure there is refused, saying where it works; \
        duplicate names are refused
        """)
    func erasingRefused() throws {
        let db = try Database.inMemory()
        var migrator = baseMigrator()
        migrator.erasesDatabaseOnFailure = true
        let error = migrationError { try migrator.migrate(db) }
        guard case .erasingRefused? = error else { Issue.record("\(String(describing: error))"); return }
        #expect(error?.description.contains("erasesDatabaseOnFailure needs migrate(databaseAt:)") == true)
        #expect(try db.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 'player'", as: Int.self) == 0)

        var duplicated = baseMigrator()
        duplicated.register("1-player") { _ in }
        guard case .duplicateName("1-player")? = migrationError({ try duplicated.migrate(db) }) else {
            Issue.record("duplicate names were accepted"); return
        }
    }

    @Test("SHA-256 matches the FIPS 180-4 examples")
    func sha256() {
        #expect(SHA256.hex([UInt8]()) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(SHA256.hex(Array("abc".utf8)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(
            SHA256.hex(Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8))
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        #expect(
            SHA256.hex([UInt8](repeating: 0x61, count: 1_000_000))
                == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }
}
