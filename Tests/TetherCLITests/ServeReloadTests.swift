import Foundation
import Testing
import TetherTestSupport

#if canImport(Glibc)
    import Glibc
#endif

// `tether serve` reads its configuration file again on SIGHUP (issue 34): the peer policies and the
// log level of the next sessions change, a configuration that cannot be used is refused and the
// previous one kept, and what needs a restart is said.

@Suite("tether serve reloads its configuration on SIGHUP", .serialized)
struct ServeReloadTests {
    @Test(
        """
        north's scope widened, then narrowed, by SIGHUP: each next sync holds the new scope; a file that is not \
        JSON and a scope naming an unknown column are refused, logged, and the previous scope kept; the log level \
        changes; a changed --listen waits for a restart
        """)
    func sighupChangesTheNextSessions() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (hub, hubFlags) = try fixture.node("hub", schema: ordersSchema, syncing: ["orders"], certificateName: "hub")
        let (north, northFlags) = try fixture.node(
            "north", schema: ordersSchema, syncing: ["orders"], certificateName: "north")
        let seeded = try tether(
            "sql", "--db", hub,
            """
            INSERT INTO orders (id, site, item, qty) VALUES (1, 'north', 'n1', 1), (2, 'south', 's2', 2), (3, \
            'east', 'e3', 3)
            """)
        try #require(seeded.status == 0, "\(seeded)")

        let files = stride(from: 0, to: hubFlags.count, by: 2).map {
            "\"\(hubFlags[$0].dropFirst(2))\": \"\(hubFlags[$0 + 1])\""
        }
        /// Writes the hub's configuration file: north allowed alone, its orders scoped by `filter`.
        func writeConfiguration(scope filter: String, listen: String = "127.0.0.1:0", logLevel: String = "warning")
            throws -> String
        {
            try fixture.directory.write(
                "hub.json",
                """
                { "db": "\(hub)", "listen": "\(listen)", \(files.joined(separator: ", ")), "log-level": "\(logLevel)",
                  "allow": ["north"], "peer-policy": { "north": { "scopes": { "orders": "\(filter)" } } } }
                """)
        }
        let config = try writeConfiguration(scope: "site = 'north'")
        let server = try nodes.start(["serve", "--config", config])
        let (port, _) = try #require(server.waitForListening(), "\(server.summary)")

        /// A one-shot sync of north with the hub; north's orders after it.
        func syncNorth(sourceLocation: SourceLocation = #_sourceLocation) throws -> [String]? {
            let synced = try tether(["sync", "--db", north, "--peer", "127.0.0.1:\(port)"] + northFlags)
            #expect(synced.status == 0, "\(synced)\n\(server.summary)", sourceLocation: sourceLocation)
            return try orders(north)
        }
        func hangUp() { _ = Glibc.kill(server.pid, SIGHUP) }

        #expect(try syncNorth() == ["1:north:n1"])
        // The hub logs at warning: a session start (info) is not logged; it was, if at all, before the sync ended.
        #expect(!server.stderr.contains("sync session started"), "\(server.summary)")

        // Widened, and the log level raised; --listen changed too, which waits for a restart.
        _ = try writeConfiguration(scope: "site IN ('north', 'south')", listen: "127.0.0.1:1", logLevel: "info")
        hangUp()
        let reloaded = try #require(
            server.waitForLine(containing: "reloaded configuration from \(config)"), "\(server.summary)")
        #expect(reloaded.contains("1 peer policy") && reloaded.contains("log level info"), "\(reloaded)")
        let restartOnly = server.waitForLine(
            containing: "listen is now 127.0.0.1:1, still 127.0.0.1:0 until tether serve restarts", onStderr: true)
        #expect(restartOnly != nil, "\(server.summary)")
        #expect(try syncNorth() == ["1:north:n1", "2:south:s2"], "\(server.summary)")
        #expect(
            server.waitForLine(containing: "sync session started", onStderr: true) != nil,
            "the info level applies: \(server.summary)")

        // A file that is not JSON: refused, logged, the widened scope kept (no east order, which a hub
        // without north's policy would send).
        _ = try fixture.directory.write("hub.json", "{ \"db\": ")
        hangUp()
        let notJSON = try #require(
            server.waitForLine(containing: "configuration not reloaded from \(config)", onStderr: true),
            "\(server.summary)")
        #expect(
            notJSON.contains("not valid JSON") && notJSON.contains("the previous configuration stays"), "\(notJSON)")
        let written = try tether(
            "sql", "--db", hub,
            "INSERT INTO orders (id, site, item, qty) VALUES (4, 'south', 's4', 4), (5, 'east', 'e5', 5)")
        try #require(written.status == 0, "\(written)")
        #expect(try syncNorth() == ["1:north:n1", "2:south:s2", "4:south:s4"], "\(server.summary)")

        // A scope that does not fit the database: refused too, naming the column.
        _ = try writeConfiguration(scope: "region = 'north'")
        hangUp()
        let unknownColumn = try #require(
            server.waitForLine(containing: "configuration not reloaded from \(config)", onStderr: true, occurrence: 2),
            "\(server.summary)")
        #expect(unknownColumn.contains("region"), "\(unknownColumn)")
        #expect(try syncNorth() == ["1:north:n1", "2:south:s2", "4:south:s4"], "\(server.summary)")

        // Narrowed back: the next session evicts the south orders.
        _ = try writeConfiguration(scope: "site = 'north'")
        hangUp()
        #expect(
            server.waitForLine(containing: "reloaded configuration from \(config)", occurrence: 2) != nil,
            "\(server.summary)")
        #expect(try syncNorth() == ["1:north:n1"], "\(server.summary)")

        #expect(server.stop() == 0, "\(server.summary)")
    }

    @Test("SIGHUP without --config: logged as nothing to read again, and the node keeps serving")
    func sighupWithoutConfiguration() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (a, flags) = try fixture.node("a")
        let server = try nodes.start(fixture.serveArguments(db: a, flags: flags))
        _ = try #require(server.waitForListening(), "\(server.summary)")
        _ = Glibc.kill(server.pid, SIGHUP)
        let said = server.waitForLine(containing: "started without --config", onStderr: true)
        #expect(said?.contains("nothing changed") == true, "\(server.summary)")
        #expect(server.isRunning, "\(server.summary)")
        #expect(server.stop() == 0, "\(server.summary)")
    }
}
