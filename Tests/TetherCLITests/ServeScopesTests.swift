import Foundation
import Testing
import TetherTestSupport

// Partial replication end to end: `tether serve` processes, a hub and three sites, scoped by the
// hub's configuration file by certificate name (issue 23).

@Suite("tether serve with scoped peers", .serialized)
struct ServeScopesTests {
    @Test(
        """
        hub and three sites scoped by certificate name from a JSON configuration file: a row moved from north to \
        south leaves north (evict in tether watch) and reaches south; north's write of a south row is refused and \
        listed by tether status; --interest narrows what a site (serve, configuration file) and a one-shot sync \
        receive
        """)
    func hubAndThreeSites() async throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let sites = ["north", "south", "east"]
        let (hub, hubFlags) = try fixture.node("hub", schema: ordersSchema, syncing: ["orders"], certificateName: "hub")
        var siteNodes: [String: (db: String, flags: [String])] = [:]
        for site in sites {
            siteNodes[site] = try fixture.node(site, schema: ordersSchema, syncing: ["orders"], certificateName: site)
        }
        let seeded = try tether(
            "sql", "--db", hub,
            """
            INSERT INTO orders (id, site, item, qty) VALUES
              (1, 'north', 'n1', 1), (2, 'south', 's2', 2), (3, 'east', 'e3', 3), (4, 'north', 'n4', 4), (5, 'south', \
            's5', 5), (6, 'east', 'e6', 6)
            """)
        try #require(seeded.status == 0, "\(seeded)")

        /// A configuration file of `serve`: the node's database, certificate and, as given, more keys.
        func config(_ name: String, db: String, flags: [String], _ more: String) throws -> String {
            let files = stride(from: 0, to: flags.count, by: 2).map {
                "\"\(flags[$0].dropFirst(2))\": \"\(flags[$0 + 1])\""
            }
            return try fixture.directory.write(
                "\(name).json",
                """
                { "db": "\(db)", "listen": "127.0.0.1:0", \(files.joined(separator: ", ")), \(more) }
                """)
        }
        let policies = sites.map { "\"\($0)\": { \"scopes\": { \"orders\": \"site = :peer_name\" } }" }.joined(
            separator: ", ")
        let hubConfig = try config(
            "hub", db: hub, flags: hubFlags,
            "\"allow\": [\(sites.map { "\"\($0)\"" }.joined(separator: ", "))], \"peer-policy\": { \(policies) }")
        let hubNode = try nodes.start(["serve", "--config", hubConfig])
        let (hubPort, hubKey) = try #require(hubNode.waitForListening(), "\(hubNode.summary)")
        var processes = [hubNode]
        for site in sites {
            let (db, flags) = try #require(siteNodes[site])
            // South asks for less than its scope: its orders of fewer than 5 items.
            let interest = site == "south" ? #", "interest": { "orders": "qty < 5" }"# : ""
            let siteConfig = try config(site, db: db, flags: flags, "\"peer\": \"127.0.0.1:\(hubPort)\"" + interest)
            let node = try nodes.start(["serve", "--config", siteConfig])
            _ = try #require(node.waitForListening(), "\(node.summary)")
            processes.append(node)
        }
        let db = { (site: String) in siteNodes[site]?.db ?? "" }

        /// Waits (up to 30 s) until each database holds exactly the orders given.
        func expectOrders(_ expected: [String: [String]], sourceLocation: SourceLocation = #_sourceLocation)
            async throws
        {
            var last: [String: [String]] = [:]
            let reached = try await eventually(checkingEvery: .milliseconds(100)) {
                for (path, rows) in expected {
                    last[path] = try orders(path) ?? ["(query failed)"]; if last[path] != rows { return false }
                }
                return true
            }
            #expect(
                reached,
                """
                expected \(expected.map { "\(($0.key as NSString).lastPathComponent): \($0.value)" }.sorted())
                found \(last.map { "\(($0.key as NSString).lastPathComponent): \($0.value)" }.sorted())
                \(processes.map(\.summary).joined(separator: "\n"))
                """, sourceLocation: sourceLocation)
        }

        // Each site holds its own orders, and only those (south only those it is interested in).
        let all = ["1:north:n1", "2:south:s2", "3:east:e3", "4:north:n4", "5:south:s5", "6:east:e6"]
        try await expectOrders([
            db("north"): ["1:north:n1", "4:north:n4"], db("south"): ["2:south:s2"],
            db("east"): ["3:east:e3", "6:east:e6"], hub: all,
        ])

        // Order 4 moves from north to south on the hub: north evicts it (tether watch says evict), south gets it whole.
        let watch = try nodes.start([
            "watch", "--db", db("north"), "--json", "--table", "orders", "--poll-interval", "20",
        ])
        _ = try #require(watch.waitForLine(containing: "watching", onStderr: true), "\(watch.summary)")
        let moved = try tether("sql", "--db", hub, "UPDATE orders SET site = 'south' WHERE id = 4")
        #expect(moved.stdout == "1 row changed\n", "\(moved)")
        let afterMove = ["1:north:n1", "2:south:s2", "3:east:e3", "4:south:n4", "5:south:s5", "6:east:e6"]
        try await expectOrders([
            db("north"): ["1:north:n1"], db("south"): ["2:south:s2", "4:south:n4"],
            db("east"): ["3:east:e3", "6:east:e6"], hub: afterMove,
        ])
        let evicted = try #require(watch.waitForLine(containing: "\"key\":[4]"), "\(watch.summary)")
        #expect(evicted.contains("\"kind\":\"evict\"") && evicted.contains("\"table\":\"orders\""), "\(evicted)")
        #expect(!watch.stdout.contains("\"kind\":\"delete\""), "an eviction is not a delete: \(watch.summary)")

        // North writes south's order 2: the hub refuses it, north lists the refusal and drops its version.
        let forged = try tether(
            "sql", "--db", db("north"),
            "INSERT INTO orders (id, site, item, qty) VALUES (2, 'south', 'changed by north', 99)")
        #expect(forged.status == 0, "\(forged)")
        var status = CLIResult(status: -1, stdout: "", stderr: "")
        let listed = try await eventually(checkingEvery: .milliseconds(200)) {
            status = try tether("status", "--db", db("north"))
            return status.stdout.contains("refused:")
        }
        #expect(listed, "\(status)\n\(processes.map(\.summary).joined(separator: "\n"))")
        let refusal = status.stdout.split(separator: "\n").first { $0.hasPrefix("  orders [2] change ") }
        #expect(refusal?.contains("refused by \(hubKey) (hub)") == true, "\(status)")
        try await expectOrders([
            db("north"): ["1:north:n1"], db("south"): ["2:south:s2", "4:south:n4"],
            db("east"): ["3:east:e3", "6:east:e6"], hub: afterMove,
        ])
        // Listed once, however many sessions later.
        let json = try tether("status", "--db", db("north"), "--json")
        let refusedChanges =
            (try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])?["refusedChanges"]
            as? [[String: Any]]
        #expect(refusedChanges?.count == 1, "\(json)")

        // tether sync --interest: a database behind east's certificate asks for east's larger orders only.
        let once = fixture.directory.file("east-once.db")
        #expect(
            try tether("init", "--db", once, "--schema", fixture.directory.file("schema-east.sql"), "--sync", "orders")
                .status == 0)
        let synced = try tether(
            ["sync", "--db", once, "--peer", "127.0.0.1:\(hubPort)", "--interest", "orders=qty > 4"]
                + (siteNodes["east"]?.flags ?? []))
        #expect(synced.status == 0, "\(synced)")
        #expect(try orders(once) == ["6:east:e6"], "\(synced)")

        #expect(watch.stop() == 0, "\(watch.summary)")
        for node in processes.reversed() {
            #expect(node.stop() == 0, "\(node.summary)")
        }
    }
}
