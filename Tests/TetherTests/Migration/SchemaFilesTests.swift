import Foundation
import Testing
@testable import Tether
import TetherTestSupport

@Suite("Schema files: a directory of .sql files, each run once")
struct SchemaFilesTests {
    private func write(_ directory: URL, _ name: String, _ text: String) throws {
        try Data(text.utf8).write(to: directory.appendingPathComponent(name))
    }

    @Test("files run once each in name order, recorded with their SHA-256; new files run later")
    func runOnce() throws {
        try withTemporaryDirectory { directory in
            try write(directory, "002-score.sql", "ALTER TABLE player ADD COLUMN score INTEGER NOT NULL DEFAULT 0;")
            try write(
                directory, "001-player.sql",
                """
                CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT);\nINSERT INTO player (id, name) VALUES \
                (1, 'Ann');
                """)
            try write(directory, "notes.txt", "not SQL")
            let db = try Database.inMemory()
            #expect(try db.applySchemaFiles(in: directory.path) == ["001-player.sql", "002-score.sql"])
            #expect(try db.applySchemaFiles(in: directory.path) == [])
            try write(directory, "003-team.sql", "CREATE TABLE team (id INTEGER PRIMARY KEY);")
            #expect(try db.applySchemaFiles(in: directory.path) == ["003-team.sql"])
            #expect(try db.fetchValue("SELECT score FROM player", as: Int.self) == 0)
            let recorded = try db.fetchValue(
                "SELECT checksum FROM tether_migrations WHERE kind = 'schema file' AND name = '002-score.sql'",
                as: String.self)
            #expect(
                recorded == SHA256.hex(Array("ALTER TABLE player ADD COLUMN score INTEGER NOT NULL DEFAULT 0;".utf8)))
            // Registered migrations and schema files are recorded apart: neither is the other's unknown name.
            var migrator = Migrator()
            migrator.register("1-x") { _ in }
            #expect(try migrator.migrate(db) == ["1-x"])
        }
    }

    @Test("an applied file that changed is refused by name, and nothing runs")
    func editedFileRefused() throws {
        try withTemporaryDirectory { directory in
            try write(directory, "001-player.sql", "CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT);")
            let db = try Database.inMemory()
            try db.applySchemaFiles(in: directory.path)
            try write(
                directory, "001-player.sql", "CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT, email TEXT);")
            try write(directory, "002-team.sql", "CREATE TABLE team (id INTEGER PRIMARY KEY);")
            let error = migrationError { try db.applySchemaFiles(in: directory.path) }
            guard case let .changedAfterApplying(name, _, _)? = error else {
                Issue.record("\(String(describing: error))"); return
            }
            #expect(name == "001-player.sql")
            #expect(error?.description.contains("001-player.sql") == true)
            #expect(try db.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 'team'", as: Int.self) == 0)
        }
    }

    @Test(
        """
        a failing file is rolled back and stops the run; an applied file gone from the directory is refused \
        unless allowed
        """)
    func failingAndMissingFiles() throws {
        try withTemporaryDirectory { directory in
            try write(directory, "001-player.sql", "CREATE TABLE player (id INTEGER PRIMARY KEY);")
            try write(
                directory, "002-broken.sql",
                "CREATE TABLE half (id INTEGER PRIMARY KEY);\nINSERT INTO nowhere VALUES (1);")
            try write(directory, "003-never.sql", "CREATE TABLE never (id INTEGER PRIMARY KEY);")
            let db = try Database.inMemory()
            let error = migrationError { try db.applySchemaFiles(in: directory.path) }
            guard case let .failed(name, _)? = error else { Issue.record("\(String(describing: error))"); return }
            #expect(name == "002-broken.sql")
            #expect(
                try db.fetchRows(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('player', 'half', 'never')"
                ).count == 1)

            try FileManager.default.removeItem(at: directory.appendingPathComponent("001-player.sql"))
            try FileManager.default.removeItem(at: directory.appendingPathComponent("002-broken.sql"))
            guard
                case .appliedSchemaFilesMissing(["001-player.sql"])? = migrationError({
                    try db.applySchemaFiles(in: directory.path)
                })
            else {
                Issue.record("a missing applied file was accepted"); return
            }
            #expect(try db.applySchemaFiles(in: directory.path, allowingMissingFiles: true) == ["003-never.sql"])
        }
    }
}
