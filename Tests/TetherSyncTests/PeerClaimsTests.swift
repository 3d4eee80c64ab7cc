import Foundation
import Testing
@testable import Tether
import TetherTestSupport
@testable import TetherSync
import TetherWire

/// A hub with `orders` (each row one site's) and `item` (unscoped), three peers by certificate:
/// north and south scoped to their site's orders, east unscoped. What north sends is a claim,
/// checked against its policy: refused claims leave the hub unchanged, and other peers are served
/// (issue 33, items 3, 8 and 10).
private struct Hub {
    let pki: TestPKI
    let hub: Database
    let north: Database, south: Database, east: Database
    let northTLS: CredentialFiles, southTLS: CredentialFiles, eastTLS: CredentialFiles

    static func schema(_ db: Database) throws {
        try db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT NOT NULL, body TEXT)")
        try db.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT)")
        try db.enableSync(table: "orders")
        try db.enableSync(table: "item")
    }

    init() throws {
        pki = try TestPKI()
        hub = try Database.inMemory()
        north = try Database.inMemory()
        south = try Database.inMemory()
        east = try Database.inMemory()
        for db in [hub, north, south, east] { try Self.schema(db) }
        try hub.write { conn in
            for id in 1...7 {
                try conn.execute(
                    "INSERT INTO orders (id, site, body) VALUES (?, ?, ?)",
                    [id, id <= 3 ? "north" : "south", "order \(id)"])
            }
            for id in 1...3 { try conn.execute("INSERT INTO item (id, name) VALUES (?, ?)", [id, "item \(id)"]) }
        }
        northTLS = try pki.issue(commonName: "north", as: "north")
        southTLS = try pki.issue(commonName: "south", as: "south")
        eastTLS = try pki.issue(commonName: "east", as: "east")
    }

    /// North and south hold their site's orders; east holds everything.
    var options: SyncOptions {
        var options = SyncOptions.patientServer
        options.peers.others = PeerPolicy(scopes: ["orders": .filter("site = :peer_name")])
        options.peers[.name("east")] = PeerPolicy()
        return options
    }

    /// Every row of the hub's tables and of its synced expiry store.
    func dump() throws -> [String] {
        var dumped: [String] = []
        for sql in [
            "SELECT 'orders', id, site, body FROM orders ORDER BY id", "SELECT 'item', id, name FROM item ORDER BY id",
            "SELECT 'expiry', table_name, row_key, expires_at FROM tether_synced_expiry ORDER BY 2, 3",
        ] {
            dumped += try rows(hub, sql)
        }
        return dumped
    }

    func sync(_ db: Database, _ credentials: CredentialFiles, port: Int) async throws -> SyncSummary {
        try await SyncClient.syncOnce(
            database: db, host: "127.0.0.1", port: port, tls: try pki.clientContext(credentials))
    }

    /// Why `db`'s session failed; nil if it succeeded.
    func failure(_ db: Database, _ credentials: CredentialFiles, port: Int) async -> String? {
        do {
            _ = try await sync(db, credentials, port: port)
            return nil
        } catch {
            return "\(error)"
        }
    }

    /// One session each, so that every peer's key is pinned on the hub and each holds its rows.
    func syncEveryone(port: Int) async throws {
        _ = try await sync(north, northTLS, port: port)
        _ = try await sync(south, southTLS, port: port)
        _ = try await sync(east, eastTLS, port: port)
    }
}

/// Each row of `sql` on `db` as its columns joined by `|`, text unquoted.
private func rows(_ db: Database, _ sql: String) throws -> [String] {
    try db.fetchRows(sql).map { row in
        (0..<row.count).map { index -> String in
            if case let .text(text) = row[index] { return text }
            return "\(row[index])"
        }.joined(separator: "|")
    }
}

@Suite("What a scoped peer claims is checked against its policy: expiries, history marks, origins")
struct PeerClaimsTests {
    @Test(
        """
        an expiry from a scoped peer on another site's row is refused (REFUSED naming why), the hub unchanged; on \
        its own row it is taken
        """)
    func expiryOnAnotherSitesRowIsRefused() async throws {
        let nodes = try Hub()
        defer { nodes.pki.directory.remove() }
        _ = try await runServer(nodes.hub, pki: nodes.pki, options: nodes.options) { server in
            try await nodes.syncEveryone(port: server.port)
            let before = try nodes.dump()
            // North sets an expiry on south's order 6 (2030-01-01): a row it may not change.
            try nodes.north.execute(
                """
                INSERT INTO tether_synced_expiry (table_name, row_key, expires_at) VALUES ('orders', '[6]', \
                1893456000.0)
                """)
            let summary = try await nodes.sync(nodes.north, nodes.northTLS, port: server.port)
            #expect(summary.refusedByPeer == 1)
            #expect(try nodes.dump() == before, "nothing of the refused expiry is written on the hub")
            let refused = try nodes.north.refusedChanges()
            #expect(
                refused.count == 1 && refused.first?.table == "tether_synced_expiry"
                    && refused.first?.reason.contains("outside the writer's scope") == true, "\(refused)")
            #expect(
                try rows(nodes.north, "SELECT id FROM orders ORDER BY id") == ["1", "2", "3"],
                "north is sent nothing outside its scope")
            // South is served meanwhile, and its order 6 has no expiry.
            _ = try await nodes.sync(nodes.south, nodes.southTLS, port: server.port)
            #expect(try rows(nodes.south, "SELECT count(*) FROM tether_synced_expiry") == ["0"])
            #expect(try rows(nodes.south, "SELECT id FROM orders ORDER BY id") == ["4", "5", "6", "7"])

            // On its own order 1, north's expiry is taken.
            try nodes.north.execute(
                """
                INSERT INTO tether_synced_expiry (table_name, row_key, expires_at) VALUES ('orders', '[1]', \
                1893456000.0)
                """)
            let own = try await nodes.sync(nodes.north, nodes.northTLS, port: server.port)
            #expect(own.refusedByPeer == 0)
            #expect(try rows(nodes.hub, "SELECT table_name, row_key FROM tether_synced_expiry") == ["orders|[1]"])
        }
    }

    @Test(
        """
        a made-up history mark from a scoped peer refuses that peer alone (ERROR 11 naming the fix, now and \
        later); other peers sync meanwhile; a rekey ends it
        """)
    func madeUpHistoryMarkCostsTheLiarAlone() async throws {
        let nodes = try Hub()
        defer { nodes.pki.directory.remove() }
        _ = try await runServer(nodes.hub, pki: nodes.pki, options: nodes.options) { server in
            try await nodes.syncEveryone(port: server.port)
            let before = try nodes.dump()
            // North shows a mark of the hub's history that the hub never sent: through 29 at clock 1.
            let hubKey = nodes.hub.instanceKey
            try await nodes.north.write {
                try $0.peerStore.recordHistoryMark(HistoryMark(through: 29, clock: 1), of: hubKey)
            }
            try nodes.north.execute("UPDATE orders SET body = 'north edit' WHERE id = 1")
            let refused = await nodes.failure(nodes.north, nodes.northTLS, port: server.port)
            #expect(
                refused.map { $0.contains("ERROR 11") && $0.contains("tether rekey") } == true,
                "\(String(describing: refused))")
            // South and east are served right after.
            try nodes.hub.execute("UPDATE orders SET body = 'hub edit' WHERE id = 5")
            _ = try await nodes.sync(nodes.south, nodes.southTLS, port: server.port)
            _ = try await nodes.sync(nodes.east, nodes.eastTLS, port: server.port)
            #expect(try rows(nodes.south, "SELECT body FROM orders WHERE id = 5") == ["hub edit"])
            #expect(try rows(nodes.east, "SELECT body FROM orders WHERE id = 5") == ["hub edit"])
            // North stays refused at its next session; nothing of its changes was applied.
            let again = await nodes.failure(nodes.north, nodes.northTLS, port: server.port)
            #expect(again.map { $0.contains("ERROR 11") } == true, "\(String(describing: again))")
            #expect(try rows(nodes.hub, "SELECT body FROM orders WHERE id = 1") == ["order 1"])
            var after = try nodes.dump()
            after.removeAll { $0.hasPrefix("orders|5|") }
            #expect(after == before.filter { !$0.hasPrefix("orders|5|") })
            // The finding is shown, naming north.
            #expect(try nodes.hub.historyFindings().map(\.peer) == [nodes.north.instanceKey])
            #expect(try nodes.hub.detectedCopy()?.kind == .restored)

            // A new key for the hub: north holds no mark of it, and syncs.
            try nodes.hub.resetInstanceKey()
            #expect(try nodes.hub.historyFindings().isEmpty)
            _ = try await nodes.sync(nodes.north, nodes.northTLS, port: server.port)
            #expect(try rows(nodes.hub, "SELECT body FROM orders WHERE id = 1") == ["north edit"])
        }
    }

    @Test(
        """
        a row south wrote, moved into north's scope and edited by north, is taken: south's versions it carries \
        are held on the hub, not forged
        """)
    func carriedVersionsAreNotForged() async throws {
        let nodes = try Hub()
        defer { nodes.pki.directory.remove() }
        _ = try await runServer(nodes.hub, pki: nodes.pki, options: nodes.options) { server in
            try await nodes.syncEveryone(port: server.port)
            try nodes.south.execute("INSERT INTO orders (id, site, body) VALUES (8, 'south', 'written by south')")
            _ = try await nodes.sync(nodes.south, nodes.southTLS, port: server.port)
            try nodes.hub.execute("UPDATE orders SET site = 'north' WHERE id = 8")
            _ = try await nodes.sync(nodes.north, nodes.northTLS, port: server.port)
            #expect(try rows(nodes.north, "SELECT body FROM orders WHERE id = 8") == ["written by south"])
            try nodes.north.execute("UPDATE orders SET body = 'edited by north' WHERE id = 8")
            let summary = try await nodes.sync(nodes.north, nodes.northTLS, port: server.port)
            let refused = try nodes.north.refusedChanges()
            #expect(summary.refusedByPeer == 0 && refused.isEmpty, "\(refused)")
            #expect(try rows(nodes.hub, "SELECT site, body FROM orders WHERE id = 8") == ["north|edited by north"])
        }
    }

    @Test(
        """
        a version a scoped peer writes under another pinned peer's key is refused (REFUSED naming the key and its \
        certificate); the rest of its batch applies; an unscoped peer relays
        """)
    func forgedOriginIsRefused() async throws {
        let nodes = try Hub()
        defer { nodes.pki.directory.remove() }
        _ = try await runServer(nodes.hub, pki: nodes.pki, options: nodes.options) { server in
            try await nodes.syncEveryone(port: server.port)
            let before = try nodes.dump()
            // North holds item 2 written "by south" (a batch under south's key applied on north as
            // a sync file would be), and edits its own order 1: both go to the hub in one batch.
            let now = UInt64(Date().timeIntervalSince1970 * 1000)
            func southsWrite(item: Int64, name: String) -> ChangeBatch {
                let version = Version(
                    timestamp: HybridTimestamp(milliseconds: now, counter: 0), origin: nodes.south.instanceKey)
                return ChangeBatch(
                    source: nodes.south.instanceKey, after: 0, through: 1, isLast: true,
                    tables: [TableDescriptor(name: "item", keyColumns: ["id"], valueColumns: ["name"])],
                    changes: [
                        RowChange(
                            table: 0, key: [.integer(item)], isAlive: true, existence: version, values: [.text(name)],
                            versions: [], sequence: 1)
                    ])
            }
            try nodes.north.apply(southsWrite(item: 2, name: "forged by north"))
            try nodes.north.execute("UPDATE orders SET body = 'north edit' WHERE id = 1")
            let summary = try await nodes.sync(nodes.north, nodes.northTLS, port: server.port)
            #expect(summary.refusedByPeer == 1)
            let refused = try nodes.north.refusedChanges()
            #expect(
                refused.count == 1 && refused.first?.table == "item"
                    && refused.first?.reason.contains("\(nodes.south.instanceKey)") == true
                    && refused.first?.reason.contains("south") == true,
                "\(refused)")
            var expected = before
            expected[0] = "orders|1|north|north edit"
            #expect(try nodes.dump() == expected, "the forged change is not written; north's own edit is")
            // South, from 0, gets the hub's item 2.
            let fresh = try Database.inMemory()
            try Hub.schema(fresh)
            _ = try await nodes.sync(fresh, nodes.southTLS, port: server.port)
            #expect(try rows(fresh, "SELECT id, name FROM item ORDER BY id") == ["1|item 1", "2|item 2", "3|item 3"])

            // East, unscoped, relays south's versions as a full peer of a mesh does: applied.
            try nodes.east.apply(southsWrite(item: 3, name: "relayed by east"))
            let relayed = try await nodes.sync(nodes.east, nodes.eastTLS, port: server.port)
            #expect(relayed.refusedByPeer == 0)
            #expect(try rows(nodes.hub, "SELECT name FROM item WHERE id = 3") == ["relayed by east"])
        }
    }
}
