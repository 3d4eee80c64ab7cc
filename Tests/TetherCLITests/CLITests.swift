import Foundation
import Testing
import TetherTestSupport

#if canImport(Glibc)
    import Glibc
#endif

private let schema = """
    CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT NOT NULL, score REAL, avatar BLOB);
    CREATE TABLE note (id INTEGER PRIMARY KEY, body TEXT); -- not synced
    """

/// Makes a database with the test schema, `player` synced; returns its instance key.
private func initDatabase(_ directory: TemporaryDirectory, _ name: String) throws -> String {
    let schemaFile = try directory.write("schema.sql", schema)
    let result = try tether("init", "--db", directory.file(name), "--schema", schemaFile, "--sync", "player")
    #expect(result.status == 0, "\(result)")
    return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
}

private func statusJSON(_ db: String) throws -> [String: Any] {
    let result = try tether("status", "--db", db, "--json")
    #expect(result.status == 0, "\(result)")
    return (try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]) ?? [:]
}

/// A TCP port on 127.0.0.1 that nobody listens on (bound, then closed).
private func unusedPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    #expect(fd >= 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = 0
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer -> Bool in
            bind(fd, pointer, length) == 0 && getsockname(fd, pointer, &length) == 0
        }
    }
    #expect(bound)
    return Int(UInt16(bigEndian: address.sin_port))
}

private func fileMode(_ path: String) throws -> Int {
    let attributes = try FileManager.default.attributesOfItem(atPath: path)
    return (attributes[.posixPermissions] as? NSNumber)?.intValue ?? -1
}

@Suite("tether command line")
struct CLITests {
    @Test("init, sql writes and queries, status")
    func initSQLStatus() throws {
        let directory = try TemporaryDirectory()
        let key = try initDatabase(directory, "a.db")
        #expect(key.count == 32 && key.allSatisfy(\.isHexDigit))
        let db = directory.file("a.db")

        let insert = try tether(
            "sql", "--db", db,
            """
            INSERT INTO player (id, name, score) VALUES (1, 'Ann', 1.5), (2, 'Bob', NULL); INSERT INTO note \
            VALUES (1, 'x')
            """)
        #expect(insert.status == 0, "\(insert)")
        #expect(insert.stdout == "3 rows changed\n")
        let update = try tether("sql", "--db", db, "UPDATE player SET score = 7 WHERE id = 2")
        #expect(update.stdout == "1 row changed\n")

        let json = try tether("sql", "--db", db, "SELECT id, name, score, avatar FROM player ORDER BY id", "--json")
        #expect(json.status == 0, "\(json)")
        let rows = try jsonRows(json.stdout)
        #expect(rows.count == 2)
        #expect(rows.first?["name"] as? String == "Ann")
        #expect((rows.first?["score"] as? NSNumber)?.doubleValue == 1.5)
        #expect(rows.first?["avatar"] is NSNull)
        #expect((rows.last?["score"] as? NSNumber)?.doubleValue == 7)

        let table = try tether("sql", "--db", db, "SELECT id, name FROM player ORDER BY id")
        let lines = table.stdout.split(separator: "\n").map(String.init)
        #expect(lines == ["id  name", "--  ----", " 1  Ann", " 2  Bob", "(2 rows)"])

        let blob = try tether("sql", "--db", db, "SELECT X'0102FF' AS b, 3 AS i, 'q\"' AS t, NULL AS n", "--json")
        #expect(blob.stdout == "[\n{\"b\":\"AQL/\",\"i\":3,\"t\":\"q\\\"\",\"n\":null}\n]\n")

        let status = try statusJSON(db)
        #expect(status["instanceKey"] as? String == key)
        #expect((status["lastSequence"] as? NSNumber)?.intValue == 3)  // two inserts, one update; note is not synced
        #expect(status["syncedTables"] as? [String] == ["player"])
        #expect((status["pending"] as? NSNumber)?.intValue == 2)
        let text = try tether("status", "--db", db)
        #expect(text.stdout.contains("last sequence:  3"))
        #expect(text.stdout.contains("synced tables:  player"))

        // init again with the same schema: nothing changes, same key.
        let again = try tether("init", "--db", db, "--schema", directory.file("schema.sql"), "--sync", "player")
        #expect(again.status == 0, "\(again)")
        #expect(again.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == key)
    }

    @Test("writes by the sqlite3 shell to a table synced by init get sequence numbers")
    func externalWrites() throws {
        let directory = try TemporaryDirectory()
        _ = try initDatabase(directory, "a.db")
        let db = directory.file("a.db")
        #expect((try statusJSON(db)["lastSequence"] as? NSNumber)?.intValue == 0)
        let shell = try run(
            URL(fileURLWithPath: "/usr/bin/sqlite3"),
            [
                db,
                """
                INSERT INTO player (id, name) VALUES (10, 'Shell'), (11, 'Shell too'); UPDATE player \
                SET score = 3 WHERE id = 10;
                """,
            ])
        #expect(shell.status == 0, "\(shell)")
        let status = try statusJSON(db)
        #expect(((status["lastSequence"] as? NSNumber)?.intValue ?? 0) >= 2)
        #expect((status["pending"] as? NSNumber)?.intValue == 2)
        let rows = try jsonRows(
            try tether(
                "sql", "--db", db, "SELECT id FROM player WHERE rowid NOT IN (SELECT row_id FROM tether_rows_player)",
                "--json"
            ).stdout)
        #expect(rows.isEmpty)
    }

    @Test("export and import between two databases that never meet")
    func exportImport() throws {
        let directory = try TemporaryDirectory()
        _ = try initDatabase(directory, "a.db")
        let keyB = try initDatabase(directory, "b.db")
        let a = directory.file("a.db"), b = directory.file("b.db")
        #expect(
            try tether(
                "sql", "--db", a,
                "INSERT INTO player (id, name, score, avatar) VALUES (1, 'Ann', 1.5, X'00FF'), (2, 'Bob', NULL, NULL)"
            ).status == 0)
        #expect(try tether("sql", "--db", a, "UPDATE player SET name = 'Anne' WHERE id = 1").status == 0)

        let file = directory.file("a-to-b.tether")
        let exported = try tether("export", "--db", a, "--for", keyB, "--since", "0", "--out", file)
        #expect(exported.status == 0, "\(exported)")
        #expect(exported.stdout.hasPrefix("exported 2 changes"))
        let imported = try tether("import", "--db", b, file)
        #expect(imported.status == 0, "\(imported)")
        #expect(imported.stdout.hasPrefix("imported 2 changes"))

        let query = "SELECT id, name, score, avatar FROM player ORDER BY id"
        let rowsA = try tether("sql", "--db", a, query, "--json").stdout
        let rowsB = try tether("sql", "--db", b, query, "--json").stdout
        #expect(try jsonRows(rowsA).count == 2)
        #expect(rowsA == rowsB)
        #expect(try directory.contents().allSatisfy { !$0.hasSuffix(".partial") })

        // A file made for another database is refused, and changes nothing.
        let refused = try tether("import", "--db", a, file)
        #expect(refused.status == 65, "\(refused)")
        #expect(refused.isOneLineError)
        #expect(refused.stderr.contains("not for this database"))
    }

    @Test("cert ca and cert node write 0600 keys that openssl verifies")
    func certificates() throws {
        let directory = try TemporaryDirectory()
        let ca = directory.file("ca"), node = directory.file("nodes/a")
        let made = try tether("cert", "ca", "--out", ca)
        #expect(made.status == 0, "\(made)")
        let issued = try tether("cert", "node", "--ca", ca, "--name", "node-a", "--out", node)
        #expect(issued.status == 0, "\(issued)")
        #expect(try fileMode(ca + "/ca-key.pem") == 0o600)
        #expect(try fileMode(node + "/key.pem") == 0o600)
        #expect(try directory.contents("ca") == ["ca-key.pem", "ca.pem"])
        #expect(try directory.contents("nodes/a") == ["cert.pem", "key.pem"])
        let verify = try run(
            URL(fileURLWithPath: "/usr/bin/openssl"), ["verify", "-CAfile", ca + "/ca.pem", node + "/cert.pem"])
        #expect(verify.status == 0, "\(verify)")
        #expect(verify.stdout.contains(": OK"))

        // A CA directory without a CA: one line, nothing written.
        let missing = try tether(
            "cert", "node", "--ca", directory.file("nope"), "--name", "b", "--out", directory.file("b"))
        #expect(missing.status == 66, "\(missing)")
        #expect(missing.isOneLineError)
        #expect(!FileManager.default.fileExists(atPath: directory.file("b")))
        // A CA key that is not PEM.
        let badCA = directory.file("badca")
        try FileManager.default.createDirectory(atPath: badCA, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: ca + "/ca.pem", toPath: badCA + "/ca.pem")
        _ = try directory.write("badca/ca-key.pem", "not a key")
        let bad = try tether("cert", "node", "--ca", badCA, "--name", "b", "--out", directory.file("b"))
        #expect(bad.status == 77, "\(bad)")
        #expect(bad.isOneLineError)
        #expect(!FileManager.default.fileExists(atPath: directory.file("b/key.pem")))
    }

    @Test("sync: an unreachable peer, bad certificates, a bad address")
    func syncErrors() throws {
        let directory = try TemporaryDirectory()
        _ = try initDatabase(directory, "a.db")
        let db = directory.file("a.db"), ca = directory.file("ca"), node = directory.file("node")
        #expect(try tether("cert", "ca", "--out", ca).status == 0)
        #expect(try tether("cert", "node", "--ca", ca, "--name", "node-a", "--out", node).status == 0)
        let credentials = ["--cert", node + "/cert.pem", "--key", node + "/key.pem", "--ca", ca + "/ca.pem"]

        let port = try unusedPort()
        let unreachable = try tether(["sync", "--db", db, "--peer", "127.0.0.1:\(port)"] + credentials)
        #expect(unreachable.status == 69, "\(unreachable)")
        #expect(unreachable.isOneLineError)
        #expect(unreachable.stderr.contains("127.0.0.1:\(port)"))
        #expect(unreachable.stdout.isEmpty)

        let notPEM = try directory.write("cert.txt", "hello")
        let badCert = try tether(
            ["sync", "--db", db, "--peer", "127.0.0.1:\(port)"] + replacing("--cert", with: notPEM, in: credentials))
        #expect(badCert.status == 77, "\(badCert)")
        #expect(badCert.isOneLineError)

        #expect(
            try tether("cert", "node", "--ca", ca, "--name", "node-b", "--out", directory.file("other")).status == 0)
        let mismatched = try tether(
            ["sync", "--db", db, "--peer", "127.0.0.1:\(port)"]
                + replacing("--key", with: directory.file("other/key.pem"), in: credentials))
        #expect(mismatched.status == 77, "\(mismatched)")
        #expect(mismatched.isOneLineError)
        #expect(mismatched.stderr.contains("does not match"))

        let noCA = try tether(
            ["sync", "--db", db, "--peer", "127.0.0.1:\(port)"]
                + replacing("--ca", with: directory.file("missing.pem"), in: credentials))
        #expect(noCA.status == 66, "\(noCA)")
        #expect(noCA.isOneLineError)

        let badAddress = try tether(["sync", "--db", db, "--peer", "localhost"] + credentials)
        #expect(badAddress.status == 64, "\(badAddress)")
        #expect(badAddress.isOneLineError)
    }

    @Test("usage errors: a missing flag, an unknown command, a bad log level")
    func usageErrors() throws {
        for arguments in [
            ["sql", "SELECT 1"], ["frobnicate"], ["status", "--db", "x.db", "--log-level", "loud"],
            ["export", "--db", "x.db", "--for", "zz", "--out", "f"], ["init"],
        ] {
            let result = try tether(arguments)
            #expect(result.status == 64, "\(arguments): \(result)")
            #expect(result.isOneLineError, "\(arguments): \(result)")
        }
        let help = try tether("--help")
        #expect(help.status == 0)
        #expect(help.stdout.contains("SUBCOMMANDS"))
    }

    @Test("databases that are missing, not SQLite, or not Tether's")
    func notTetherDatabases() throws {
        let directory = try TemporaryDirectory()
        let missing = directory.file("missing.db")
        let absent = try tether("status", "--db", missing)
        #expect(absent.status == 66, "\(absent)")
        #expect(absent.isOneLineError)
        #expect(!FileManager.default.fileExists(atPath: missing))

        let text = try directory.write(
            "notes.txt", "just some text, long enough to be read as a header by SQLite......\n")
        for arguments in [["sql", "--db", text, "SELECT 1"], ["init", "--db", text], ["status", "--db", text]] {
            let result = try tether(arguments)
            #expect(result.status == 65, "\(arguments): \(result)")
            #expect(result.isOneLineError)
            #expect(result.stderr.contains("not a SQLite database"))
        }
        #expect(try String(contentsOfFile: text, encoding: .utf8).hasPrefix("just some text"))

        let plain = directory.file("plain.db")
        #expect(try run(URL(fileURLWithPath: "/usr/bin/sqlite3"), [plain, "CREATE TABLE t (a);"]).status == 0)
        let notTether = try tether("sql", "--db", plain, "SELECT * FROM t")
        #expect(notTether.status == 65, "\(notTether)")
        #expect(notTether.isOneLineError)
        #expect(notTether.stderr.contains("not a Tether database"))
        let tables = try run(
            URL(fileURLWithPath: "/usr/bin/sqlite3"),
            [plain, "SELECT count(*) FROM sqlite_master WHERE name LIKE 'tether%';"])
        #expect(tables.stdout == "0\n")  // left untouched
    }

    @Test("malformed SQL changes nothing")
    func malformedSQL() throws {
        let directory = try TemporaryDirectory()
        _ = try initDatabase(directory, "a.db")
        let db = directory.file("a.db")
        let result = try tether("sql", "--db", db, "INSERT INTO player (id, name) VALUES (1, 'Ann'); SELEC 1")
        #expect(result.status == 65, "\(result)")
        #expect(result.isOneLineError)
        #expect(result.stderr.contains("syntax error"))
        let rows = try jsonRows(try tether("sql", "--db", db, "SELECT count(*) AS n FROM player", "--json").stdout)
        #expect((rows.first?["n"] as? NSNumber)?.intValue == 0)
        let constraint = try tether("sql", "--db", db, "INSERT INTO player (id) VALUES (1)")
        #expect(constraint.status == 65)
        #expect(constraint.isOneLineError)
        #expect(constraint.stderr.contains("NOT NULL"))
    }

    @Test("init: an unreadable schema, a bad schema, a schema mismatch, an unsyncable table")
    func initErrors() throws {
        let directory = try TemporaryDirectory()
        let fresh = directory.file("fresh.db")
        let noSchema = try tether("init", "--db", fresh, "--schema", directory.file("missing.sql"))
        #expect(noSchema.status == 66, "\(noSchema)")
        #expect(noSchema.isOneLineError)
        let badSQL = try directory.write(
            "bad.sql", "CREATE TABLE ok (id INTEGER PRIMARY KEY);\nCREATE TABLEE broken (x);")
        let bad = try tether("init", "--db", fresh, "--schema", badSQL)
        #expect(bad.status == 65, "\(bad)")
        #expect(bad.isOneLineError)
        let noKey = try directory.write("nokey.sql", "CREATE TABLE loose (x TEXT);")
        let unsyncable = try tether("init", "--db", fresh, "--schema", noKey, "--sync", "loose")
        #expect(unsyncable.status == 65, "\(unsyncable)")
        #expect(unsyncable.isOneLineError)
        #expect(unsyncable.stderr.contains("loose"))
        #expect(!FileManager.default.fileExists(atPath: fresh))  // nothing was created

        _ = try initDatabase(directory, "a.db")
        let other = try directory.write(
            "other.sql", "CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT NOT NULL, rank INTEGER);")
        let mismatch = try tether("init", "--db", directory.file("a.db"), "--schema", other)
        #expect(mismatch.status == 65, "\(mismatch)")
        #expect(mismatch.isOneLineError)
        #expect(mismatch.stderr.contains("schema mismatch"))
    }

    @Test("export and import errors leave no file half-written")
    func fileErrors() throws {
        let directory = try TemporaryDirectory()
        _ = try initDatabase(directory, "a.db")
        let keyB = try initDatabase(directory, "b.db")
        let a = directory.file("a.db"), b = directory.file("b.db")
        #expect(try tether("sql", "--db", a, "INSERT INTO player (id, name) VALUES (1, 'Ann')").status == 0)

        let noDirectory = try tether(
            "export", "--db", a, "--for", keyB, "--since", "0", "--out", directory.file("nope/x.tether"))
        #expect(noDirectory.status == 73, "\(noDirectory)")
        #expect(noDirectory.isOneLineError)

        let file = directory.file("x.tether")
        #expect(try tether("export", "--db", a, "--for", keyB, "--since", "0", "--out", file).status == 0)
        var bytes = try Data(contentsOf: URL(fileURLWithPath: file))
        bytes.removeLast(5)
        let truncated = directory.file("truncated.tether")
        try bytes.write(to: URL(fileURLWithPath: truncated))
        let damaged = try tether("import", "--db", b, truncated)
        #expect(damaged.status == 65, "\(damaged)")
        #expect(damaged.isOneLineError)
        let rows = try jsonRows(try tether("sql", "--db", b, "SELECT count(*) AS n FROM player", "--json").stdout)
        #expect((rows.first?["n"] as? NSNumber)?.intValue == 0)

        let absent = try tether("import", "--db", b, directory.file("absent.tether"))
        #expect(absent.status == 66, "\(absent)")
        #expect(absent.isOneLineError)
        #expect(try directory.contents().allSatisfy { !$0.hasSuffix(".partial") })
    }

    @Test("a configuration file supplies flags; the command line overrides it")
    func configuration() throws {
        let directory = try TemporaryDirectory()
        _ = try initDatabase(directory, "a.db")
        _ = try initDatabase(directory, "b.db")
        #expect(
            try tether("sql", "--db", directory.file("b.db"), "INSERT INTO player (id, name) VALUES (1, 'B')").status
                == 0)
        let config = try directory.write(
            "tether.json",
            """
            {"db": "\(directory.file("a.db"))", "json": true, "log-level": "error", "peer": "127.0.0.1:1"}
            """)
        let fromFile = try tether("sql", "--config", config, "SELECT count(*) AS n FROM player")
        #expect(fromFile.status == 0, "\(fromFile)")
        #expect((try jsonRows(fromFile.stdout).first?["n"] as? NSNumber)?.intValue == 0)
        let overridden = try tether(
            "sql", "--config", config, "--db", directory.file("b.db"), "SELECT count(*) AS n FROM player")
        #expect((try jsonRows(overridden.stdout).first?["n"] as? NSNumber)?.intValue == 1)

        let unknown = try directory.write("unknown.json", #"{"colour": "blue"}"#)
        let refused = try tether("status", "--config", unknown)
        #expect(refused.status == 64, "\(refused)")
        #expect(refused.isOneLineError)
        #expect(refused.stderr.contains("colour"))
        let notJSON = try directory.write("broken.json", "db = a.db")
        let broken = try tether("status", "--config", notJSON)
        #expect(broken.status == 64, "\(broken)")
        #expect(broken.isOneLineError)
        #expect(broken.stderr.contains("not valid JSON") && broken.stderr.contains("line 1, column 1"), "\(broken)")
        // Where the syntax breaks, not only that the file is not a JSON object.
        let misplaced = try directory.write("misplaced.json", "{\n  \"db\": \"a.db\",\n  \"json\" true\n}\n")
        let told = try tether("status", "--config", misplaced)
        #expect(told.status == 64 && told.isOneLineError, "\(told)")
        #expect(told.stderr.contains("line 3") && told.stderr.contains("\"json\" true"), "\(told)")
        let missing = try tether("status", "--config", directory.file("none.json"))
        #expect(missing.status == 66, "\(missing)")
        #expect(missing.isOneLineError)
    }
}
