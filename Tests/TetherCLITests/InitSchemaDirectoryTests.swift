import Foundation
import Testing
import TetherTestSupport

@Suite("tether init --schema DIR")
struct InitSchemaDirectoryTests {
    @Test(
        """
        a directory of .sql files runs once each, in name order; new files run on the next init; an edited one is \
        refused by name
        """)
    func schemaDirectory() throws {
        let directory = try TemporaryDirectory()
        try FileManager.default.createDirectory(atPath: directory.file("schema"), withIntermediateDirectories: true)
        _ = try directory.write(
            "schema/001-player.sql", "CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT NOT NULL);")
        _ = try directory.write(
            "schema/002-score.sql", "ALTER TABLE player ADD COLUMN score INTEGER NOT NULL DEFAULT 0;")
        let db = directory.file("a.db")

        let first = try tether("init", "--db", db, "--schema", directory.file("schema"), "--sync", "player")
        #expect(first.status == 0, "\(first)")
        let key = first.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(key.count == 32)
        let insert = try tether("sql", "--db", db, "INSERT INTO player (id, name) VALUES (1, 'Ann')")
        #expect(insert.status == 0, "\(insert)")

        _ = try directory.write("schema/003-color.sql", "ALTER TABLE player ADD COLUMN color TEXT DEFAULT 'red';")
        let second = try tether("init", "--db", db, "--schema", directory.file("schema"), "--sync", "player")
        #expect(second.status == 0, "\(second)")
        #expect(second.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == key)
        let query = try tether("sql", "--db", db, "--json", "SELECT name, score, color FROM player")
        #expect(query.status == 0, "\(query)")
        let rows = try jsonRows(query.stdout)
        #expect(
            rows.count == 1 && rows.first?["color"] as? String == "red" && rows.first?["score"] as? Int == 0, "\(query)"
        )
        let applied = try tether("sql", "--db", db, "--json", "SELECT name FROM tether_migrations ORDER BY name")
        #expect(
            try jsonRows(applied.stdout).compactMap { $0["name"] as? String } == [
                "001-player.sql", "002-score.sql", "003-color.sql",
            ])

        _ = try directory.write(
            "schema/002-score.sql", "ALTER TABLE player ADD COLUMN score INTEGER NOT NULL DEFAULT 1;")
        _ = try directory.write("schema/004-team.sql", "CREATE TABLE team (id INTEGER PRIMARY KEY);")
        let edited = try tether("init", "--db", db, "--schema", directory.file("schema"))
        #expect(edited.status == 65, "\(edited)")
        #expect(edited.isOneLineError)
        #expect(edited.stderr.contains("002-score.sql"))
        let team = try tether(
            "sql", "--db", db, "--json", "SELECT count(*) AS n FROM sqlite_master WHERE name = 'team'")
        #expect(try jsonRows(team.stdout).first?["n"] as? Int == 0)
    }

    @Test(
        """
        init makes the directories a new database's path names, as mkdir -p would; one that cannot be made is \
        named (73)
        """)
    func initMakesTheDatabasesDirectory() throws {
        let directory = try TemporaryDirectory()
        let schema = try directory.write(
            "schema.sql", "CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT NOT NULL);")
        let db = directory.file("var/lib/tether/north.db")
        let made = try tether("init", "--db", db, "--schema", schema, "--sync", "player")
        #expect(made.status == 0, "\(made)")
        #expect(FileManager.default.fileExists(atPath: db))
        let query = try tether("sql", "--db", db, "SELECT count(*) FROM player")
        #expect(query.status == 0, "\(query)")

        let file = try directory.write("plain-file", "not a directory")
        let underFile = try tether("init", "--db", file + "/x/north.db", "--schema", schema)
        #expect(
            underFile.status == 73 && underFile.isOneLineError
                && underFile.stderr.contains("cannot create the directory"), "\(underFile)")
    }

    @Test("a failing file on a new database creates nothing")
    func failingFileCreatesNothing() throws {
        let directory = try TemporaryDirectory()
        try FileManager.default.createDirectory(atPath: directory.file("schema"), withIntermediateDirectories: true)
        _ = try directory.write("schema/001-ok.sql", "CREATE TABLE ok (id INTEGER PRIMARY KEY);")
        _ = try directory.write("schema/002-bad.sql", "CREATE TABLEE bad (x);")
        let fresh = directory.file("fresh.db")
        let result = try tether("init", "--db", fresh, "--schema", directory.file("schema"))
        #expect(result.status == 65, "\(result)")
        #expect(result.isOneLineError)
        #expect(result.stderr.contains("002-bad.sql"))
        #expect(!FileManager.default.fileExists(atPath: fresh))
    }
}
