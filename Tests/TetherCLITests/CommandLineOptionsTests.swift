import Foundation
import Testing
import TetherTestSupport

/// The options several commands share (declared once: `--db`, the TLS files, `--json`), the
/// `--json` report of every command that prints one, shell completion, and usage errors.
@Suite struct CommandLineOptionsTests {
    static let schema = "CREATE TABLE note (id INTEGER PRIMARY KEY, body TEXT);"

    /// The JSON object a command printed on stdout (one line), or an issue recorded.
    static func object(_ result: CLIResult, sourceLocation: SourceLocation = #_sourceLocation) throws -> [String: Any] {
        #expect(result.status == 0, "\(result)", sourceLocation: sourceLocation)
        #expect(result.stdout.split(separator: "\n").count == 1, "one line: \(result)", sourceLocation: sourceLocation)
        let parsed = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8))
        return try #require(parsed as? [String: Any], "\(result)", sourceLocation: sourceLocation)
    }

    static func int(_ value: Any?) -> Int? { (value as? NSNumber)?.intValue }

    @Test("--db, --json and the TLS files keep their names in every command's help")
    func sharedOptionsInHelp() throws {
        let takingDB = ["init", "sync", "serve", "sql", "status", "gc", "watch", "export", "import", "rekey", "backup"]
        let takingJSON = ["init", "sync", "sql", "status", "gc", "watch", "export", "import", "rekey", "backup"]
        for command in takingDB {
            let help = try tether("help", command)
            #expect(help.status == 0, "\(command): \(help)")
            #expect(help.stdout.contains("--db <path>"), "\(command): \(help.stdout)")
            #expect(help.stdout.contains("--json") == takingJSON.contains(command), "\(command): \(help.stdout)")
            #expect(help.stdout.contains("--log-level <level>"), "\(command): \(help.stdout)")
        }
        #expect(try tether("help", "init").stdout.contains("created if missing"))
        #expect(try tether("help", "status").stdout.contains("made by tether init"))
        for command in ["sync", "serve"] {
            let help = try tether("help", command).stdout
            #expect(
                help.contains("TLS OPTIONS:") && help.contains("--cert <file>") && help.contains("--key <file>")
                    && help.contains("--ca <file>"), "\(command): \(help)")
        }
        for command in [["cert", "ca"], ["cert", "node"]] {
            #expect(try tether(["help"] + command).stdout.contains("--json"), "\(command)")
        }
    }

    @Test("init, rekey, backup, export and import print one JSON object with --json")
    func reportsAsJSON() throws {
        let directory = try TemporaryDirectory()
        let schema = try directory.write("schema.sql", Self.schema)
        let a = directory.file("a.db"), b = directory.file("b.db")

        let made = try Self.object(tether("init", "--db", a, "--schema", schema, "--sync", "note", "--json"))
        let keyA = try #require(made["instanceKey"] as? String)
        #expect(keyA.count == 32)
        #expect(made["database"] as? String == a)
        #expect(made["created"] as? Bool == true)
        #expect(Self.int(made["statementsApplied"]) == 1)
        #expect(made["schemaFilesApplied"] as? [String] == [])
        #expect(made["syncTurnedOn"] as? [String] == ["note"])
        #expect(made["syncedTables"] as? [String] == ["note"])
        let again = try Self.object(tether("init", "--db", a, "--schema", schema, "--sync", "note", "--json"))
        #expect(again["instanceKey"] as? String == keyA && again["created"] as? Bool == false)
        #expect(Self.int(again["statementsApplied"]) == 0 && again["syncTurnedOn"] as? [String] == [], "\(again)")
        // Without --json, the key alone, as scripts already read it.
        #expect(try tether("init", "--db", a).stdout == keyA + "\n")

        let schemaDirectory = directory.file("schema")
        try FileManager.default.createDirectory(atPath: schemaDirectory, withIntermediateDirectories: true)
        _ = try directory.write("schema/001-note.sql", Self.schema)
        let fromDirectory = try Self.object(
            tether("init", "--db", b, "--schema", schemaDirectory, "--sync", "note", "--json"))
        #expect(fromDirectory["schemaFilesApplied"] as? [String] == ["001-note.sql"], "\(fromDirectory)")
        let keyB = try #require(fromDirectory["instanceKey"] as? String)

        #expect(try tether("sql", "--db", a, "INSERT INTO note VALUES (1, 'one'), (2, 'two')").status == 0)
        let file = directory.file("a-to-b.tether")
        let exported = try Self.object(tether("export", "--db", a, "--for", keyB, "--out", file, "--json"))
        #expect(exported["file"] as? String == file && exported["for"] as? String == keyB)
        #expect(Self.int(exported["changes"]) == 2 && Self.int(exported["batches"]) == 1)
        #expect(Self.int(exported["nextSince"]) == 2)
        let imported = try Self.object(tether("import", "--db", b, file, "--json"))
        #expect(imported["from"] as? String == keyA && Self.int(imported["changes"]) == 2, "\(imported)")
        #expect(Self.int(imported["throughSequence"]) == 2 && Self.int(imported["keptAside"]) == 0)
        #expect(Self.int(imported["keptForSchema"]) == 0 && imported["tablesNotSynced"] as? [String] == [])

        let backup = directory.file("backup.db")
        let copied = try Self.object(tether("backup", "--db", a, "--to", backup, "--json"))
        #expect(copied["database"] as? String == a && copied["backup"] as? String == backup)
        #expect((Self.int(copied["bytes"]) ?? 0) > 0)

        let rekeyed = try Self.object(tether("rekey", "--db", a, "--json"))
        #expect(rekeyed["previousInstanceKey"] as? String == keyA && rekeyed["keptKey"] as? Bool == false)
        let newKey = try #require(rekeyed["instanceKey"] as? String)
        #expect(newKey != keyA && newKey.count == 32)
        let kept = try Self.object(tether("rekey", "--db", a, "--keep-key", "--json"))
        #expect(
            kept["previousInstanceKey"] as? String == newKey && kept["instanceKey"] as? String == newKey
                && kept["keptKey"] as? Bool == true)
    }

    @Test("cert ca and cert node report the files, the name, the validity and the fingerprint with --json")
    func certificatesAsJSON() throws {
        let directory = try TemporaryDirectory()
        let ca = directory.file("ca"), node = directory.file("node")
        let authority = try Self.object(tether("cert", "ca", "--out", ca, "--name", "Test CA", "--json"))
        #expect(
            authority["certificate"] as? String == ca + "/ca.pem" && authority["key"] as? String == ca + "/ca-key.pem")
        #expect(authority["commonName"] as? String == "Test CA")
        let issued = try Self.object(
            tether("cert", "node", "--ca", ca, "--name", "north", "--out", node, "--days", "30", "--json"))
        #expect(issued["certificate"] as? String == node + "/cert.pem" && issued["commonName"] as? String == "north")
        let fingerprint = try #require(issued["sha256"] as? String)
        #expect(fingerprint.count == 64 && fingerprint.allSatisfy(\.isHexDigit))
        let notAfter = try #require(
            (issued["notAfter"] as? String).flatMap { ISO8601DateFormatter().date(from: $0) }, "\(issued)")
        #expect(abs(notAfter.timeIntervalSinceNow - 30 * 86_400) < 3_600)
        // The fingerprint is the one openssl computes.
        let openssl = try run(
            URL(fileURLWithPath: "/usr/bin/openssl"),
            ["x509", "-in", node + "/cert.pem", "-noout", "-fingerprint", "-sha256"])
        #expect(openssl.stdout.lowercased().replacingOccurrences(of: ":", with: "").contains(fingerprint), "\(openssl)")
    }

    @Test("tether sync --json: the summary as one object on stdout")
    func syncSummaryAsJSON() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (a, flagsA) = try fixture.node("a")
        let (b, flagsB) = try fixture.node("b")
        #expect(
            try tether("sql", "--db", a, "INSERT INTO t (id, body, n) VALUES (1, 'from a', 1), (2, 'also a', 2)").status
                == 0)
        #expect(try tether("sql", "--db", b, "INSERT INTO t (id, body, n) VALUES (3, 'from b', 3)").status == 0)
        let server = try nodes.start(fixture.serveArguments(db: a, flags: flagsA))
        let listening = try #require(server.waitForListening(), "\(server.summary)")

        let synced = try tether(["sync", "--db", b, "--peer", "127.0.0.1:\(listening.port)", "--json"] + flagsB)
        let summary = try Self.object(synced)
        #expect(summary["peer"] as? String == listening.key, "\(summary)")
        #expect(Self.int(summary["changesSent"]) == 1 && Self.int(summary["changesReceived"]) == 2, "\(summary)")
        #expect(
            Self.int(summary["applied"]) == 2 && Self.int(summary["conflicts"]) == 0
                && Self.int(summary["keptAside"]) == 0)
        #expect((Self.int(summary["bytesSent"]) ?? 0) > 0 && (Self.int(summary["bytesReceived"]) ?? 0) > 0)
        #expect(summary["deferredFromPeer"] is NSNull && summary["deferredByPeer"] is NSNull)
        #expect(summary["seconds"] is NSNumber)
        // stderr is not a terminal here: no progress line.
        #expect(synced.stderr.isEmpty, "\(synced)")
        #expect(server.stop() == 0, "\(server.summary)")
    }

    @Test("tether sync on a terminal draws a progress line on stderr: percentage, counts, bytes, rate and time left")
    func progressOnATerminal() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (a, flagsA) = try fixture.node("a")
        let (b, flagsB) = try fixture.node("b")
        // Two batches (10,000 changes each at most): after the first, changes are still expected.
        let rows = 12_000
        let insert = try tether(
            "sql", "--db", a,
            """
            WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < \(rows))
            INSERT INTO t (id, body, n) SELECT i, 'row ' || i, i FROM r
            """)
        #expect(insert.status == 0, "\(insert)")
        let server = try nodes.start(fixture.serveArguments(db: a, flags: flagsA))
        let listening = try #require(server.waitForListening(), "\(server.summary)")

        // script(1) runs the command on a pseudo-terminal (stdout and stderr both that terminal), here
        // 120 columns wide.
        let wide = try Self.onATerminal(
            columns: 120, [tetherExecutable.path, "sync", "--db", b, "--peer", "127.0.0.1:\(listening.port)"] + flagsB)
        #expect(wide.status == 0, "\(wide)")
        let lines = wide.stdout.split(separator: "\r").map(String.init)
        let underWay = try Regex(
            #"^\[[#.]{30}\] \d{1,3}%  received \d+/\d+, sent 0, [\d.]+ [kM]?B, \d+ rows/s, "#
                + #"(\d+h \d\dm|\d+m \d\ds|\d+s) left\e\[K$"#)
        #expect(lines.contains { $0.wholeMatch(of: underWay) != nil }, "\(wide.stdout.debugDescription)")
        #expect(
            lines.contains {
                $0.hasPrefix("[" + String(repeating: "#", count: 30) + "] 100%  received \(rows)/\(rows), sent 0")
            },
            "\(wide.stdout.debugDescription)")
        // The line is erased before the summary.
        #expect(
            wide.stdout.contains("\r\u{1B}[Ksynced with \(listening.key): sent 0, received \(rows)"),
            "\(wide.stdout.debugDescription)")

        // On a narrow terminal every line fits (one that wrapped could not be redrawn in place): the bar
        // narrows, then goes.
        let (c, flagsC) = try fixture.node("c")
        let narrow = try Self.onATerminal(
            columns: 60, [tetherExecutable.path, "sync", "--db", c, "--peer", "127.0.0.1:\(listening.port)"] + flagsC)
        #expect(narrow.status == 0, "\(narrow)")
        let drawn = narrow.stdout.split(separator: "\r").filter { $0.hasSuffix("\u{1B}[K") && $0.count > 3 }
        #expect(!drawn.isEmpty && drawn.allSatisfy { $0.count - 3 < 60 }, "\(narrow.stdout.debugDescription)")
        #expect(drawn.contains { $0.contains("rows/s") }, "\(narrow.stdout.debugDescription)")
        #expect(server.stop() == 0, "\(server.summary)")
    }

    /// Runs `command` through script(1) on a pseudo-terminal `columns` wide; its output is the terminal's.
    static func onATerminal(columns: Int, _ command: [String]) throws -> CLIResult {
        let shell = "stty cols \(columns) rows 24 && " + command.map { "'\($0)'" }.joined(separator: " ")
        return try run(
            URL(fileURLWithPath: "/usr/bin/script"), ["--quiet", "--return", "--command", shell, "/dev/null"])
    }

    @Test(
        """
        tether --generate-completion-script writes bash, zsh and fish scripts naming every subcommand and the \
        shared flags
        """)
    func completionScripts() throws {
        let subcommands = [
            "init", "cert", "serve", "sync", "sql", "status", "gc", "watch", "export", "import", "rekey", "backup",
            "demo",
        ]
        for shell in ["bash", "zsh", "fish"] {
            let script = try tether("--generate-completion-script", shell)
            #expect(script.status == 0, "\(shell): \(script)")
            // fish names a long flag without its dashes: -l 'db'.
            let flags = ["db", "json", "cert", "interest"].map { shell == "fish" ? "-l '\($0)'" : "--\($0)" }
            for name in subcommands + flags {
                #expect(script.stdout.contains(name), "\(shell) script lacks \(name)")
            }
        }
        // The bash script is valid bash.
        let directory = try TemporaryDirectory()
        let file = try directory.write("tether.bash", try tether("--generate-completion-script", "bash").stdout)
        let checked = try run(URL(fileURLWithPath: "/bin/bash"), ["-n", file])
        #expect(checked.status == 0, "\(checked)")
        let unknown = try tether("--generate-completion-script", "tcsh")
        #expect(unknown.status == 64 && unknown.isOneLineError, "\(unknown)")
    }

    @Test(
        """
        a flag that takes one value, given twice on the command line or as an array in the configuration file: \
        exit 64 naming both values (--ca: write a bundle); repeatable flags and a command line overriding the \
        file are not repeats
        """)
    func singleValueFlagGivenTwice() throws {
        let directory = try TemporaryDirectory()
        let missingDB = directory.file("missing.db")
        let tls = ["--cert", "c.pem", "--key", "k.pem"]
        for (command, extra) in [("serve", ["--listen", "127.0.0.1:0"]), ("sync", ["--peer", "127.0.0.1:1"])] {
            for cas in [["--ca", "old-ca.pem", "--ca", "new-ca.pem"], ["--ca=old-ca.pem", "--ca", "new-ca.pem"]] {
                let twice = try tether([command, "--db", missingDB] + extra + tls + cas)
                #expect(twice.status == 64 && twice.isOneLineError, "\(command) \(cas): \(twice)")
                #expect(twice.stderr.contains("--ca given twice (old-ca.pem, then new-ca.pem)"), "\(twice)")
                #expect(
                    twice.stderr.contains("cat a.pem b.pem > bundle.pem")
                        && twice.stderr.contains("(see: tether help \(command))"), "\(twice)")
            }
        }
        let twoDatabases = try tether("status", "--db", directory.file("a.db"), "--db", directory.file("b.db"))
        #expect(twoDatabases.status == 64 && twoDatabases.isOneLineError, "\(twoDatabases)")
        #expect(
            twoDatabases.stderr.contains(
                "--db given twice (\(directory.file("a.db")), then \(directory.file("b.db")))"), "\(twoDatabases)")

        // The configuration file: an array repeats the flag, refused for one that takes one value.
        let arrayOfCAs = try directory.write(
            "two-cas.json",
            #"""
            {"db": "\#(missingDB)", "listen": "127.0.0.1:0", "cert": "c.pem", "key": "k.pem", "ca": \#
            ["old-ca.pem", "new-ca.pem"]}
            """#)
        let fromFile = try tether("serve", "--config", arrayOfCAs)
        #expect(fromFile.status == 64 && fromFile.isOneLineError, "\(fromFile)")
        #expect(
            fromFile.stderr.contains("configuration file \(arrayOfCAs)")
                && fromFile.stderr.contains(#""ca" holds 2 values (old-ca.pem, then new-ca.pem): --ca takes one"#)
                && fromFile.stderr.contains("bundle.pem"), "\(fromFile)")
        // The command line's --ca replaces the file's, whole: not a repeat (the missing files are what fails).
        let overridden = try tether("serve", "--config", arrayOfCAs, "--ca", "bundle.pem")
        #expect(overridden.status == 66 && !overridden.stderr.contains("given twice"), "\(overridden)")
        // Repeatable flags stay repeatable.
        let twoPeers = try tether(
            [
                "serve", "--db", missingDB, "--listen", "127.0.0.1:0", "--ca", "ca.pem", "--peer", "127.0.0.1:1",
                "--peer", "127.0.0.1:2",
            ] + tls)
        #expect(twoPeers.status == 66 && !twoPeers.stderr.contains("given twice"), "\(twoPeers)")
    }

    @Test("wrong flags: a missing --db, a missing TLS file, a conflicting pair, a flag another command takes")
    func usageErrors() throws {
        for arguments in [
            ["status"], ["sql", "SELECT 1"],
            ["sync", "--peer", "127.0.0.1:1", "--cert", "c", "--key", "k", "--ca", "a"],
        ] {
            let missing = try tether(arguments)
            #expect(missing.status == 64 && missing.isOneLineError, "\(arguments): \(missing)")
            #expect(
                missing.stderr.contains("--db <path>") && missing.stderr.contains("(see: tether help \(arguments[0]))"),
                "\(arguments): \(missing)")
        }
        let noKey = try tether("sync", "--db", "x.db", "--peer", "127.0.0.1:1", "--cert", "c", "--ca", "a")
        #expect(noKey.status == 64 && noKey.isOneLineError && noKey.stderr.contains("--key <file>"), "\(noKey)")
        let emptyDB = try tether("status", "--db", "")
        #expect(
            emptyDB.status == 64 && emptyDB.isOneLineError && emptyDB.stderr.contains("--db must name a file"),
            "\(emptyDB)")

        let conflicting = try tether(
            "serve", "--db", "x.db", "--listen", "127.0.0.1:0", "--cert", "c", "--key", "k", "--ca", "a",
            "--allow", "north", "--peer-policy", #"*={"read-only":true}"#)
        #expect(conflicting.status == 64 && conflicting.isOneLineError, "\(conflicting)")
        #expect(
            conflicting.stderr.contains("--allow") && conflicting.stderr.contains("--peer-policy"), "\(conflicting)")

        let notHere = try tether(
            "serve", "--db", "x.db", "--listen", "127.0.0.1:0", "--cert", "c", "--key", "k", "--ca", "a", "--json")
        #expect(notHere.status == 64 && notHere.isOneLineError && notHere.stderr.contains("--json"), "\(notHere)")
    }
}
