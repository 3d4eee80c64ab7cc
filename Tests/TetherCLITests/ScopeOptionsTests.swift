import Foundation
import Testing
import Tether
import TetherTestSupport

// Partial replication on the command line: `--peer-policy`'s "scopes", `--interest`, and the
// refused changes `tether status` lists.

/// Orders, each of one site, and their lines (scoped through their order).
let ordersSchema = """
    CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT NOT NULL, item TEXT, qty INTEGER);
    CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER REFERENCES orders(id), product TEXT);

    """

/// `id:site:item` of each order of `db`, by id; nil when the query failed (the database busy a moment).
func orders(_ db: String) throws -> [String]? {
    let result = try tether("sql", "--db", db, "SELECT id, site, item FROM orders ORDER BY id", "--json")
    guard result.status == 0 else { return nil }
    return try jsonRows(result.stdout).map { row in
        """
        \((row["id"] as? NSNumber)?.intValue.description ?? "?"):\(row["site"] as? String ?? "null"):\
        \(row["item"] as? String ?? "null")
        """
    }
}

@Suite("scopes and interest on the command line", .serialized)
struct ScopeOptionsTests {
    /// Flags `serve` and `sync` require; their files are never read when a flag is refused first.
    private let unreadFiles = [
        "--cert", "/nonexistent/cert.pem", "--key", "/nonexistent/key.pem", "--ca", "/nonexistent/ca.pem",
    ]

    @Test(
        """
        --peer-policy \"scopes\" of the wrong shape: exit 64 before anything is opened, naming the flag, the \
        peer, the table and the key
        """)
    func peerPolicyScopesShape() throws {
        let cases: [(json: String, expected: [String])] = [
            (#"{"scopes": 3}"#, [#""scopes" must be an object of table → rule"#]),
            (#"{"scopes": ["orders"]}"#, [#""scopes" must be an object"#]),
            (#"{"scopes": {"orders": 3}}"#, ["scope of orders", "a rule is a filter (a string) or a reference"]),
            (#"{"scopes": {"orders": ""}}"#, ["scope of orders", "the filter is empty"]),
            (
                #"{"scopes": {"order_line": {"reference": "order_id"}}}"#,
                ["scope of order_line", #"a reference needs "reference""#, #""parent""#]
            ),
            (
                #"{"scopes": {"order_line": {"parent": "orders"}}}"#,
                ["scope of order_line", #"a reference needs "reference""#]
            ),
            (
                #"{"scopes": {"order_line": {"reference": "order_id", "parent": "orders", "colour": "red"}}}"#,
                ["scope of order_line", #"unknown key "colour""#, #""parent-column""#]
            ),
            (
                #"{"scopes": {"order_line": {"reference": 7, "parent": "orders"}}}"#,
                ["scope of order_line", #""reference" must be a column name"#]
            ),
            (
                #"{"scopes": {"order_line": {"reference": "order_id", "parent": ["orders"]}}}"#,
                [#""parent" must be a table name"#]
            ),
            (#"{"scope": {"orders": "site = :peer_name"}}"#, [#"unknown key "scope""#, #""scopes""#]),
        ]
        for (json, expected) in cases {
            let result = try tether(
                ["serve", "--db", "/nonexistent/hub.db", "--listen", "127.0.0.1:0", "--peer-policy", "north=\(json)"]
                    + unreadFiles)
            #expect(result.status == 64, "\(json): \(result)")
            #expect(result.isOneLineError, "\(json): \(result)")
            #expect(result.stderr.contains("--peer-policy north:"), "\(json): \(result)")
            for text in expected { #expect(result.stderr.contains(text), "\(json) should say \(text): \(result)") }
        }
    }

    @Test(
        """
        --interest of the wrong shape, on sync and serve: exit 64 naming the flag and the table, before the peer \
        is reached
        """)
    func interestShape() throws {
        let cases: [(values: [String], expected: [String])] = [
            (["orders"], ["--interest orders", "TABLE=RULE"]),
            (["=site = 'north'"], ["TABLE=RULE"]),
            (["orders="], ["--interest orders", "the filter is empty"]),
            (["orders={bad"], ["--interest orders", "is not a JSON object"]),
            ([#"order_line={"reference": "order_id"}"#], ["--interest order_line", #"a reference needs "reference""#]),
            (
                [#"order_line={"reference": "order_id", "parent": "orders", "via": "x"}"#],
                ["--interest order_line", #"unknown key "via""#]
            ),
            (["orders=site = 'north'", "orders=qty > 1"], ["--interest orders", "given twice"]),
        ]
        for (values, expected) in cases {
            let interest = values.flatMap { ["--interest", $0] }
            // Port 1: nothing listens there, so an interest let through would end in 69, not 64.
            for arguments in [
                ["sync", "--db", "/nonexistent/north.db", "--peer", "127.0.0.1:1"],
                ["serve", "--db", "/nonexistent/north.db", "--listen", "127.0.0.1:0"],
            ] {
                let result = try tether(arguments + interest + unreadFiles)
                #expect(result.status == 64, "\(values): \(result)")
                #expect(result.isOneLineError, "\(values): \(result)")
                for text in expected {
                    #expect(result.stderr.contains(text), "\(values) should say \(text): \(result)")
                }
            }
        }
    }

    @Test(
        """
        scopes checked against the database when tether serve loads them: a bad one fails with the ScopeError \
        before listening (flag and configuration file); good ones serve
        """)
    func peerPolicyScopesValidated() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (hub, flags) = try fixture.node("hub", schema: ordersSchema, syncing: ["orders", "order_line"])
        let serve = fixture.serveArguments(db: hub, flags: flags)

        /// A serve that must fail: it exits 64 with one line naming the flag and the reason, and never listens.
        func refused(_ extra: [String], _ expected: [String], sourceLocation: SourceLocation = #_sourceLocation) throws
        {
            let process = try nodes.start(serve + extra)
            let status = process.waitForExit(timeout: 15)
            #expect(status == 64, "\(process.summary)", sourceLocation: sourceLocation)
            #expect(!process.stdout.contains("listening on"), "\(process.summary)", sourceLocation: sourceLocation)
            let lines = process.stderr.split(separator: "\n")
            #expect(
                lines.count == 1 && lines[0].hasPrefix("tether: error: "), "\(process.summary)",
                sourceLocation: sourceLocation)
            for text in expected {
                #expect(
                    process.stderr.contains(text), "should say \(text): \(process.summary)",
                    sourceLocation: sourceLocation)
            }
        }

        try refused(
            ["--peer-policy", #"north={"scopes": {"orders": "region = :peer_name"}}"#],
            ["--peer-policy north: scope of orders: the filter is not a valid expression over the table", "region"])
        try refused(
            ["--peer-policy", #"north={"scopes": {"orders": "item"}}"#],
            ["--peer-policy north: scope of orders: the filter is a value of type TEXT, not a condition"])
        try refused(
            ["--peer-policy", #"north={"scopes": {"shipments": "1"}}"#],
            ["--peer-policy north: scope of shipments: the table is not synced"])
        try refused(
            ["--peer-policy", #"north={"scopes": {"orders": "site IN (SELECT name FROM sqlite_schema)"}}"#],
            ["--peer-policy north: scope of orders: the filter reads table sqlite_", "which is not synced"])
        try refused(
            ["--peer-policy", #"*={"scopes": {"order_line": {"reference": "order_id", "parent": "orders"}}}"#],
            ["--peer-policy *: scope of order_line: the referenced table orders is not scoped"])
        try refused(
            [
                "--peer-policy",
                #"""
                sha256:\#(String(repeating: "ab", count: 32))={"scopes": {"order_line": {"reference": \#
                "order_no", "parent": "orders"}, "orders": "site = :peer_name"}}
                """#,
            ],
            [
                """
                --peer-policy sha256:\(String(repeating: "ab", count: 32)): scope of order_line: table \
                order_line has no column order_no
                """
            ])
        // The same from the configuration file, as "peer-policy": {"north": {"scopes": …}}.
        let badConfig = try fixture.directory.write(
            "bad-scopes.json",
            #"""
            { "peer-policy": { "north": { "scopes": { "orders": "site = :peer_name", "order_line": { "reference": \#
            "order_id", "parent": "orders", "parent-column": "number" } } } } }
            """#)
        try refused(
            ["--config", badConfig], ["--peer-policy north: scope of order_line: table orders has no column number"])
        // An interest that does not fit the database: its ScopeError, an interest taking no parameter.
        try refused(
            ["--interest", "orders=site = :peer_name"],
            ["--interest: scope of orders: the filter uses parameter peer_name", "an interest takes no parameters"])
        try refused(
            ["--interest", "order_line=qty > 1"],
            ["--interest: scope of order_line: the filter is not a valid expression", "qty"])

        // Good scopes and interest from the configuration file (a filter quoting a column, a
        // reference with its parent column, the catch-all policy): the node listens.
        let goodConfig = try fixture.directory.write(
            "good-scopes.json",
            #"""
            { "peer-policy": {
                "north": { "read-only": false, "scopes": { "orders": "\"site\" = :peer_name", "order_line": { \#
            "reference": "order_id", "parent": "orders", "parent-column": "id" } } },
                "*": { "tables": ["orders"], "scopes": { "orders": "site = :peer_fingerprint" } } },
              "interest": { "orders": "qty IS NULL OR \"qty\" > 0", "order_line": { "reference": "order_id", \#
            "parent": "orders" } } }
            """#)
        let node = try nodes.start(serve + ["--config", goodConfig])
        _ = try #require(node.waitForListening(), "\(node.summary)")
        #expect(node.stop() == 0, "\(node.summary)")
        #expect(!node.stderr.contains("error"), "\(node.summary)")
    }

    @Test(
        """
        tether sync --interest is checked against the local database before connecting: 64 with the ScopeError; a \
        good one (flag or configuration file) goes on to the peer
        """)
    func syncInterestValidated() throws {
        let fixture = try ServeFixture()
        let directory = fixture.directory
        let (db, flags) = try fixture.node("north", schema: ordersSchema, syncing: ["orders", "order_line"])
        // Port 1: nothing listens there. Trying it (69) means the interest was accepted.
        let sync = ["sync", "--db", db, "--peer", "127.0.0.1:1"] + flags

        let unknownColumn = try tether(sync + ["--interest", "orders=region = 'north'"])
        #expect(unknownColumn.status == 64 && unknownColumn.isOneLineError, "\(unknownColumn)")
        #expect(
            unknownColumn.stderr.contains("--interest: scope of orders: the filter is not a valid expression")
                && unknownColumn.stderr.contains("region"),
            "\(unknownColumn)")
        let notSynced = try tether(sync + ["--interest", "shipments=1"])
        #expect(
            notSynced.status == 64
                && notSynced.stderr.contains("--interest: scope of shipments: the table is not synced"), "\(notSynced)")
        let unscopedParent = try tether(
            sync + ["--interest", #"order_line={"reference": "order_id", "parent": "orders"}"#])
        #expect(
            unscopedParent.status == 64 && unscopedParent.stderr.contains("the referenced table orders is not scoped"),
            "\(unscopedParent)")
        let badConfig = try directory.write("bad.json", #"{ "interest": { "orders": "site" } }"#)
        let fromFile = try tether(sync + ["--config", badConfig])
        #expect(
            fromFile.status == 64
                && fromFile.stderr.contains(
                    "--interest: scope of orders: the filter is a value of type TEXT, not a condition"),
            "\(fromFile)")

        // Accepted: the sync goes on to the peer, which is not there (69).
        let good = try tether(
            sync + [
                "--interest", "orders=site = 'north'", "--interest",
                #"order_line={"reference": "order_id", "parent": "orders"}"#,
            ])
        #expect(good.status == 69 && good.stderr.contains("127.0.0.1:1"), "\(good)")
        let goodConfig = try directory.write(
            "good.json",
            #"""
            { "interest": { "orders": "\"site\" = 'north'", "order_line": { "reference": "order_id", "parent": \#
            "orders", "parent-column": "id" } } }
            """#)
        let goodFromFile = try tether(sync + ["--config", goodConfig])
        #expect(goodFromFile.status == 69 && goodFromFile.stderr.contains("127.0.0.1:1"), "\(goodFromFile)")
    }

    @Test(
        """
        tether status lists refused changes (table, key, sequence, reason, the refusing peer) only when there are \
        some, in text and JSON
        """)
    func statusListsRefusals() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("north.db")
        let schema = try directory.write("schema.sql", ordersSchema)
        try #require(
            try tether("init", "--db", path, "--schema", schema, "--sync", "orders", "--sync", "order_line").status == 0
        )
        try #require(
            try tether(
                "sql", "--db", path,
                """
                INSERT INTO orders (id, site, item) VALUES (1, 'north', 'kept'), (2, 'south', 'refused'), (3, \
                'east', 'refused too')
                """
            ).status == 0)

        let before = try tether("status", "--db", path)
        #expect(before.status == 0, "\(before)")
        #expect(!before.stdout.contains("refused"), "\(before)")
        let beforeJSON = try tether("status", "--db", path, "--json")
        let beforeObject = try #require(
            try JSONSerialization.jsonObject(with: Data(beforeJSON.stdout.utf8)) as? [String: Any], "\(beforeJSON)")
        #expect(beforeObject["refusedChanges"] == nil, "\(beforeJSON)")

        // The hub (pinned to its certificate here) refused the change of row 2, an unknown peer that of row 3.
        let hub = try #require(InstanceKey(hex: String(repeating: "1a", count: 16)))
        let stranger = try #require(InstanceKey(hex: String(repeating: "2b", count: 16)))
        let database = try Database(path: path)
        try database.pinPeer(hub, to: PeerIdentity(name: "hub", fingerprint: String(repeating: "ab", count: 32)))
        try database.recordRefusals(
            [
                RefusedChange(
                    table: "orders", key: [.integer(2)], sequence: 2,
                    reason: "outside the writer's scope: site = :peer_name")
            ],
            by: hub)
        try database.recordRefusals(
            [
                RefusedChange(
                    table: "orders", key: [.integer(3)], sequence: 3,
                    reason: "outside the writer's scope after the change")
            ],
            by: stranger)
        try database.close()

        let after = try tether("status", "--db", path)
        #expect(after.status == 0, "\(after)")
        let lines = after.stdout.split(separator: "\n").map(String.init)
        let section = try #require(lines.firstIndex { $0.hasPrefix("refused:") }, "\(after)")
        #expect(lines[section].hasPrefix("refused:        2"), "\(after)")
        #expect(
            lines[section + 1]
                == "  orders [2] change 2, refused by \(hub.hex) (hub): outside the writer's scope: site = :peer_name",
            "\(after)")
        #expect(
            lines[section + 2]
                == "  orders [3] change 3, refused by \(stranger.hex): outside the writer's scope after the change",
            "\(after)")
        // The rest of the status is as it was (the refused rows dropped, each eviction a sequence number: pending and
        // the last sequence moved).
        let unchanged = { (text: String) in
            text.split(separator: "\n").filter {
                !$0.hasPrefix("pending:") && !$0.hasPrefix("last sequence:") && !$0.contains("refused")
            }
        }
        #expect(
            unchanged(after.stdout) == unchanged(before.stdout), "before:\n\(before.stdout)\nafter:\n\(after.stdout)")

        let afterJSON = try tether("status", "--db", path, "--json")
        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(afterJSON.stdout.utf8)) as? [String: Any], "\(afterJSON)")
        let refused = try #require(object["refusedChanges"] as? [[String: Any]], "\(afterJSON)")
        #expect(refused.count == 2)
        #expect(refused.first?["table"] as? String == "orders")
        #expect((refused.first?["key"] as? [NSNumber])?.map(\.intValue) == [2])
        #expect((refused.first?["sequence"] as? NSNumber)?.intValue == 2)
        #expect(refused.first?["reason"] as? String == "outside the writer's scope: site = :peer_name")
        #expect(refused.first?["refusedBy"] as? String == hub.hex)
        #expect(refused.first?["refusedByCertificate"] as? String == "hub")
        #expect(refused.last?["refusedBy"] as? String == stranger.hex)
        #expect(refused.last?["refusedByCertificate"] is NSNull)
        // Every other key as before.
        #expect(Set(object.keys).subtracting(["refusedChanges"]) == Set(beforeObject.keys))

        // A table the hub sends only part of is listed as held in part, with the peer, in text and JSON.
        let reopened = try Database(path: path)
        try reopened.recordPartialTables(["orders"], from: hub)
        try reopened.close()
        let partial = try tether("status", "--db", path)
        #expect(
            partial.stdout.split(separator: "\n").contains(
                "held in part:   orders, as \(hub.hex) sends it (partial replication)"), "\(partial)")
        let partialJSON = try tether("status", "--db", path, "--json")
        let partialObject = try #require(
            try JSONSerialization.jsonObject(with: Data(partialJSON.stdout.utf8)) as? [String: Any], "\(partialJSON)")
        #expect(partialObject["partialTables"] as? [String: [String]] == ["orders": [hub.hex]], "\(partialJSON)")
    }
}
