import Foundation
import Testing

/// `tether init --counter`: the inventory example from the command line (issue 39).
@Suite("tether init --counter: concurrent sales add up between two nodes")
struct CounterCommandTests {
    static let schema = "CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL);"

    @Test("two sales made at once on two nodes both count; status lists the counter; a peer without it is refused")
    func concurrentSalesAddUp() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (a, flagsA) = try fixture.node("a", schema: Self.schema, syncing: [])
        let (b, flagsB) = try fixture.node("b", schema: Self.schema, syncing: [])
        for db in [a, b] {
            let initialised = try tether("init", "--db", db, "--sync", "inventory", "--counter", "inventory.stock")
            #expect(initialised.status == 0, "\(initialised)")
        }
        let status = try tether("status", "--db", a)
        #expect(status.stdout.contains("column rules:   inventory.stock counter"), "\(status)")
        let json = try tether("status", "--db", a, "--json")
        let rule = #"{"table":"inventory","column":"stock","rule":"counter"}"#
        #expect(json.stdout.contains(#""columnRules":["# + rule + "]"), "\(json)")
        #expect(try tether("sql", "--db", a, "INSERT INTO inventory VALUES ('apple', 10)").status == 0)
        let server = try nodes.start(fixture.serveArguments(db: a, flags: flagsA))
        let listening = try #require(server.waitForListening(), "\(server.summary)")
        let peer = ["--peer", "127.0.0.1:\(listening.port)"]
        #expect(try tether(["sync", "--db", b] + peer + flagsB).status == 0)
        // Through the command line on both (the library captures its own writes).
        #expect(try tether("sql", "--db", a, "UPDATE inventory SET stock = stock - 3").status == 0)
        #expect(try tether("sql", "--db", b, "UPDATE inventory SET stock = stock - 4").status == 0)
        #expect(try tether(["sync", "--db", b] + peer + flagsB).status == 0)
        for db in [a, b] {
            let stock = try tether("sql", "--db", db, "--json", "SELECT stock FROM inventory")
            #expect(stock.stdout.contains("\"stock\":3"), "\(stock)")
        }

        // A node that merges stock by last writer: refused, the column named.
        let (c, flagsC) = try fixture.node("c", schema: Self.schema, syncing: ["inventory"])
        let refused = try tether(["sync", "--db", c] + peer + flagsC)
        #expect(refused.status != 0 && refused.stderr.contains("stock"), "\(refused)")
        #expect(server.stop() == 0, "\(server.summary)")
    }

    @Test("--counter needs TABLE.COLUMN of a table synced or named by --sync")
    func badCounterNames() throws {
        let fixture = try ServeFixture()
        let (a, _) = try fixture.node("a", schema: Self.schema, syncing: [])
        let malformed = try tether("init", "--db", a, "--sync", "inventory", "--counter", "stock")
        #expect(malformed.status == 64 && malformed.stderr.contains("TABLE.COLUMN"), "\(malformed)")
        let notSynced = try tether("init", "--db", a, "--counter", "inventory.stock")
        #expect(notSynced.status == 64 && notSynced.stderr.contains("inventory"), "\(notSynced)")
        let keyColumn = try tether("init", "--db", a, "--sync", "inventory", "--counter", "inventory.sku")
        #expect(keyColumn.status == 65, "\(keyColumn)")
    }

    @Test("--max and --min: a high-water mark from the command line; the shell cannot lower it; one rule a column")
    func maximumAndMinimum() throws {
        let schema = "CREATE TABLE devices (id TEXT PRIMARY KEY, last_seen INTEGER, first_seen INTEGER);"
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (a, flagsA) = try fixture.node("a", schema: schema, syncing: [])
        let (b, flagsB) = try fixture.node("b", schema: schema, syncing: [])
        for db in [a, b] {
            let initialised = try tether(
                "init", "--db", db, "--sync", "devices", "--max", "devices.last_seen", "--min", "devices.first_seen")
            #expect(initialised.status == 0, "\(initialised)")
        }
        let status = try tether("status", "--db", a)
        #expect(status.stdout.contains("devices.first_seen min"), "\(status)")
        #expect(status.stdout.contains("devices.last_seen max"), "\(status)")
        #expect(try tether("sql", "--db", a, "INSERT INTO devices VALUES ('d1', 100, 100)").status == 0)
        let lowered = try tether("sql", "--db", a, "UPDATE devices SET last_seen = 50")
        #expect(lowered.status != 0 && lowered.stderr.contains("may only raise"), "\(lowered)")
        let server = try nodes.start(fixture.serveArguments(db: a, flags: flagsA))
        let listening = try #require(server.waitForListening(), "\(server.summary)")
        let peer = ["--peer", "127.0.0.1:\(listening.port)"]
        #expect(try tether(["sync", "--db", b] + peer + flagsB).status == 0)
        #expect(try tether("sql", "--db", a, "UPDATE devices SET last_seen = 900, first_seen = 90").status == 0)
        #expect(try tether("sql", "--db", b, "UPDATE devices SET last_seen = 300, first_seen = 40").status == 0)
        #expect(try tether(["sync", "--db", b] + peer + flagsB).status == 0)
        #expect(try tether(["sync", "--db", b] + peer + flagsB).status == 0)
        for db in [a, b] {
            let row = try tether("sql", "--db", db, "--json", "SELECT last_seen, first_seen FROM devices")
            #expect(row.stdout.contains("\"last_seen\":900") && row.stdout.contains("\"first_seen\":40"), "\(row)")
        }
        #expect(server.stop() == 0, "\(server.summary)")
        let twice = try tether("init", "--db", a, "--max", "devices.last_seen", "--min", "devices.last_seen")
        #expect(twice.status == 64 && twice.stderr.contains("one rule"), "\(twice)")
    }

    @Test("--add-wins: the table's row rule, recorded and listed by status (text and JSON)")
    func addWinsRows() throws {
        let fixture = try ServeFixture()
        let (a, _) = try fixture.node("a", schema: Self.schema, syncing: [])
        let initialised = try tether("init", "--db", a, "--sync", "inventory", "--add-wins", "inventory")
        #expect(initialised.status == 0, "\(initialised)")
        let status = try tether("status", "--db", a)
        #expect(status.stdout.contains("column rules:   inventory rows addWins"), "\(status)")
        let json = try tether("status", "--db", a, "--json")
        #expect(json.stdout.contains(#"{"table":"inventory","column":"","rule":"addWins"}"#), "\(json)")
        let unknown = try tether("init", "--db", a, "--add-wins", "orders")
        #expect(unknown.status == 64 && unknown.stderr.contains("orders"), "\(unknown)")
    }
}
