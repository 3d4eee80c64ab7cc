import Foundation
import Testing
import Tether
import TetherTestSupport
@testable import TetherSync
import TetherWire

/// A hub database with the synced table `orders`, each row belonging to one site.
private func makeOrdersDatabase() throws -> Database {
    let db = try Database.inMemory()
    try db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT NOT NULL, body TEXT)")
    try db.enableSync(table: "orders")
    return db
}

private func orders(_ db: Database) throws -> [String] {
    try db.fetchRows("SELECT id, site, body FROM orders ORDER BY id").map { row in
        (0..<row.count).map { "\(row[$0])" }.joined(separator: "|")
    }
}

/// The hub's rows `site` is entitled to, as the reading rule states it.
private func hubRows(_ hub: Database, where condition: String) throws -> [String] {
    try hub.fetchRows("SELECT id, site, body FROM orders WHERE \(condition) ORDER BY id").map { row in
        (0..<row.count).map { "\(row[$0])" }.joined(separator: "|")
    }
}

/// Every site's policy on the hub: the orders of its own site.
private var siteScopes: SyncOptions {
    var options = SyncOptions.patientServer
    options.peers.others = PeerPolicy(scopes: ["orders": .filter("site = :peer_name")])
    return options
}

/// Why one `syncOnce` of `client` with a server over `hub` failed; nil if it did not.
private func failedSync(
    of client: Database, with hub: Database, serverOptions: SyncOptions = .patientServer, pki: TestPKI,
    options: SyncOptions
) async throws -> String? {
    try await runServer(hub, pki: pki, options: serverOptions) { server in
        do {
            _ = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(), options: options)
            return nil
        } catch {
            return "\(error)"
        }
    }.0
}

@Suite("Partial replication over sync sessions (protocol version 3)")
struct ScopedSessionTests {
    @Test(
        """
        each site holds exactly its rows; a row moved between sites leaves one (evicted, observed as evict) and \
        reaches the other; writes outside a site's scope are refused, reported once, and undone there
        """)
    func sitesHoldTheirRowsAndWriteOnlyThem() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let north = try pki.issue(commonName: "north", as: "north")
        let south = try pki.issue(commonName: "south", as: "south")
        let hub = try makeOrdersDatabase()
        let northDB = try makeOrdersDatabase()
        let southDB = try makeOrdersDatabase()
        try await hub.write { conn in
            for id in 1...6 {
                try conn.execute(
                    "INSERT INTO orders (id, site, body) VALUES (?, ?, ?)",
                    [id, id <= 3 ? "north" : "south", "order \(id)"])
            }
        }
        let evicted = LockedBox<[String]>([])
        let observer = northDB.observe(.evict, in: "orders") { event in evicted.withLock { $0.append("\(event.key)") } }
        defer { observer.cancel() }

        _ = try await runServer(hub, pki: pki, options: siteScopes) { server in
            let northTLS = try pki.clientContext(north), southTLS = try pki.clientContext(south)
            func sync(_ db: Database, _ tls: TLSContext) async throws -> SyncSummary {
                try await SyncClient.syncOnce(database: db, host: "127.0.0.1", port: server.port, tls: tls)
            }
            _ = try await sync(northDB, northTLS)
            _ = try await sync(southDB, southTLS)
            #expect(try orders(northDB) == hubRows(hub, where: "site = 'north'"))
            #expect(try orders(southDB) == hubRows(hub, where: "site = 'south'"))
            #expect(try orders(northDB).count == 3)

            // Moved from north to south on the hub.
            try hub.execute("UPDATE orders SET site = 'south' WHERE id = 2")
            _ = try await sync(northDB, northTLS)
            _ = try await sync(southDB, southTLS)
            #expect(try orders(northDB) == hubRows(hub, where: "site = 'north'"))
            #expect(try orders(southDB) == hubRows(hub, where: "site = 'south'"))
            let observed = try await eventually(within: .seconds(60)) { evicted.value.count == 1 }
            #expect(observed, "north observed the move-out as evict: \(evicted.value)")

            // North writes its own row (accepted), a row of south's (refused) and moves its own
            // row out of its scope (refused).
            try northDB.execute("UPDATE orders SET body = 'north edit' WHERE id = 1")
            try northDB.execute("INSERT INTO orders (id, site, body) VALUES (10, 'south', 'forged by north')")
            try northDB.execute("UPDATE orders SET site = 'south', body = 'pushed out' WHERE id = 3")
            let summary = try await sync(northDB, northTLS)
            #expect(summary.refusedByPeer == 2)
            #expect(try hub.fetchValue("SELECT body FROM orders WHERE id = 1", as: String.self) == "north edit")
            #expect(
                try hub.fetchValue("SELECT site || ':' || body FROM orders WHERE id = 3", as: String.self)
                    == "north:order 3",
                "nothing of a refused change is written on the hub")
            #expect(try hub.fetchValue("SELECT count(*) FROM orders WHERE id = 10", as: Int.self) == 0)
            let refused = try northDB.refusedChanges()
            #expect(
                refused.map(\.table) == ["orders", "orders"] && refused.allSatisfy { $0.refusedBy == hub.instanceKey },
                "\(refused)")
            // The next pull brings north back to the hub's state: row 3 returns, row 10 is gone.
            _ = try await sync(northDB, northTLS)
            #expect(try orders(northDB) == hubRows(hub, where: "site = 'north'"))
            #expect(try northDB.refusedChanges().count == 2, "each refusal is recorded once")
            _ = try await sync(southDB, southTLS)
            #expect(try orders(southDB) == hubRows(hub, where: "site = 'south'"))
        }
    }

    @Test(
        """
        a site's transaction writing lines before their orders reaches a hub taking catch-ups whole in batches of \
        two changes: a line \
        whose order comes a batch later is accepted with the catch-up, and kept on both sides; a line of another \
        site's order is refused with it
        """)
    func aCatchUpCutIntoBatchesIsJudgedWhole() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let north = try pki.issue(commonName: "north", as: "north")
        func makeDatabase() throws -> Database {
            let db = try makeOrdersDatabase()
            try db.execute("CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER, item TEXT)")
            try db.enableSync(table: "order_line")
            return db
        }
        let hub = try makeDatabase()
        let site = try makeDatabase()
        let small = BatchLimits(maximumChanges: 2)
        // Both apply catch-ups whole: the hub judges the site's catch-up as one.
        var hubOptions = SyncOptions.patientServer
        hubOptions.batchLimits = small
        hubOptions.wholeCatchUps = true
        hubOptions.peers.others = PeerPolicy(scopes: [
            "orders": .filter("site = :peer_name"), "order_line": .reference(column: "order_id", parent: "orders"),
        ])
        var siteOptions = SyncOptions()
        siteOptions.batchLimits = small
        siteOptions.wholeCatchUps = true
        try await site.write { conn in
            try conn.execute("INSERT INTO order_line VALUES (18, 8, 'gear'), (19, 9, 'cog')")
            try conn.execute("INSERT INTO orders VALUES (8, 'north', 'order 8'), (9, 'south', 'order 9')")
        }
        _ = try await runServer(hub, pki: pki, options: hubOptions) { server in
            let tls = try pki.clientContext(north)
            for _ in 0..<2 {
                _ = try await SyncClient.syncOnce(
                    database: site, host: "127.0.0.1", port: server.port, tls: tls, options: siteOptions)
            }
        }
        func ids(_ table: String, _ db: Database) throws -> String? {
            try db.fetchValue("SELECT group_concat(id) FROM (SELECT id FROM \(table) ORDER BY id)", as: String.self)
        }
        let held = try [hub, site].map { db in
            "lines \(try ids("order_line", db) ?? ""), orders \(try ids("orders", db) ?? "")"
        }
        #expect(held == ["lines 18, orders 8", "lines 18, orders 8"])
        let refused = try site.refusedChanges().map { "\($0.table) \($0.key)" }.sorted()
        #expect(refused == ["order_line [19]", "orders [9]"])
    }

    @Test(
        """
        a relaying node's * policy covers the peer it connects to: an upstream no rule names is scoped by it \
        (sent only its rows; its writes outside them refused, and dropped there); named with an unscoped rule, it \
        syncs whole
        """)
    func aCatchAllPolicyCoversThePeerANodeConnectsTo() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        /// A regional node whose * policy scopes every peer to its site syncs once with a hub
        /// (certificate node-server), naming the hub in a rule of its own or not.
        func relay(namingTheHub: Bool) async throws -> (hub: Database, regional: Database, summary: SyncSummary) {
            let hub = try makeOrdersDatabase()
            let regional = try makeOrdersDatabase()
            try regional.execute(
                "INSERT INTO orders (id, site, body) VALUES (1, 'node-server', 'the hub''s'), (2, 'north', 'a site''s')"
            )
            try hub.execute("INSERT INTO orders (id, site, body) VALUES (3, 'south', 'from the hub')")
            var options = SyncOptions()
            options.peers.others = PeerPolicy(scopes: ["orders": .filter("site = :peer_name")])
            if namingTheHub { options.peers[.name("node-server")] = PeerPolicy() }
            let (summary, _) = try await runServer(hub, pki: pki) { server in
                try await SyncClient.syncOnce(
                    database: regional, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(),
                    options: options)
            }
            return (hub, regional, summary)
        }

        let scoped = try await relay(namingTheHub: false)
        #expect(
            try orders(scoped.hub) == ["1|'node-server'|'the hub''s'"], "the hub was sent only the rows of its site")
        #expect(try orders(scoped.regional) == ["1|'node-server'|'the hub''s'", "2|'north'|'a site''s'"])
        #expect(scoped.summary.refused == 1, "\(scoped.summary)")
        #expect(
            try scoped.hub.refusedChanges().map(\.table) == ["orders"],
            "the hub's own row 3, refused, was dropped there")

        let named = try await relay(namingTheHub: true)
        #expect(try orders(named.hub).count == 3)
        #expect(try orders(named.hub) == orders(named.regional))
    }

    @Test(
        """
        a client's interest narrows what its policy grants it; widening it backfills the rows it lacks, narrowing \
        it evicts
        """)
    func interestNarrowsThePolicy() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let south = try pki.issue(commonName: "south", as: "south")
        let hub = try makeOrdersDatabase()
        let site = try makeOrdersDatabase()
        try await hub.write { conn in
            for id in 1...12 {
                try conn.execute(
                    "INSERT INTO orders (id, site, body) VALUES (?, ?, ?)",
                    [id, id % 2 == 0 ? "south" : "north", "order \(id)"])
            }
        }
        _ = try await runServer(hub, pki: pki, options: siteScopes) { server in
            let tls = try pki.clientContext(south)
            func sync(interest: [String: SyncScope.Rule]) async throws {
                var options = SyncOptions()
                options.interest = interest
                _ = try await SyncClient.syncOnce(
                    database: site, host: "127.0.0.1", port: server.port, tls: tls, options: options)
            }
            try await sync(interest: ["orders": .filter("id > 6")])
            #expect(try orders(site) == hubRows(hub, where: "site = 'south' AND id > 6"))
            try await sync(interest: ["orders": .filter("id > 2")])
            #expect(
                try orders(site) == hubRows(hub, where: "site = 'south' AND id > 2"),
                "widened: the rows it lacked are backfilled")
            try await sync(interest: ["orders": .filter("id > 8")])
            #expect(
                try orders(site) == hubRows(hub, where: "site = 'south' AND id > 8"),
                "narrowed: the rows outside are evicted")
            try await sync(interest: [:])
            #expect(try orders(site) == hubRows(hub, where: "site = 'south'"))
        }
    }

    @Test(
        """
        a scope that goes away — the policy stops scoping a peer, or the peer drops its interest — brings the \
        rows it lacked at the next session
        """,
        arguments: [false, true])
    func scopeRemovedBringsTheRowsLacked(byInterest: Bool) async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let north = try pki.issue(commonName: "north", as: "north")
        let hub = try makeOrdersDatabase()
        let site = try makeOrdersDatabase()
        try hub.execute(
            """
            INSERT INTO orders (id, site, body) VALUES (1, 'north', 'order 1'), (2, 'south', 'order 2'), (3, \
            'north', 'order 3')
            """)
        var scoped = SyncOptions.patientServer
        if !byInterest { scoped.peers[.name("north")] = PeerPolicy(scopes: ["orders": .filter("site = 'north'")]) }
        _ = try await runServer(hub, pki: pki, options: scoped) { server in
            let tls = try pki.clientContext(north)
            var clientOptions = SyncOptions()
            if byInterest { clientOptions.interest = ["orders": .filter("site = 'north'")] }
            _ = try await SyncClient.syncOnce(
                database: site, host: "127.0.0.1", port: server.port, tls: tls, options: clientOptions)
            #expect(try orders(site) == hubRows(hub, where: "site = 'north'"))
            // The scope goes: the next session sends order 2, which the cursor passed.
            if byInterest {
                clientOptions.interest = [:]
            } else {
                var whole = server.options
                whole.peers[.name("north")] = PeerPolicy()
                server.replaceOptions(whole)
            }
            _ = try await SyncClient.syncOnce(
                database: site, host: "127.0.0.1", port: server.port, tls: tls, options: clientOptions)
            #expect(try orders(site) == hubRows(hub, where: "1"), "every row, order 2 included")
            // It is done once: the site holds the table whole from now on, as any unscoped peer.
            try hub.execute("INSERT INTO orders (id, site, body) VALUES (4, 'south', 'order 4')")
            _ = try await SyncClient.syncOnce(
                database: site, host: "127.0.0.1", port: server.port, tls: tls, options: clientOptions)
            #expect(try orders(site) == hubRows(hub, where: "1"))
            #expect(try site.partialTables().isEmpty)
        }
    }

    @Test(
        """
        replaceOptions: a live session keeps the scope it started with, to its end; the next session takes the \
        new one (widened: the rows it lacks come by a scope backfill)
        """)
    func replacedOptionsApplyFromTheNextSession() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let north = try pki.issue(commonName: "north", as: "north")
        let hub = try makeOrdersDatabase()
        let site = try makeOrdersDatabase()
        try hub.execute("INSERT INTO orders (id, site, body) VALUES (1, 'north', 'order 1'), (2, 'south', 'order 2')")
        var narrow = SyncOptions.patientServer
        narrow.peers[.name("north")] = PeerPolicy(scopes: ["orders": .filter("site = 'north'")])
        let (applied, clientOptions) = appliedBatches()
        _ = try await runServer(hub, pki: pki, options: narrow) { server in
            let tls = try pki.clientContext(north)
            let live = try await SyncClient.connect(
                database: site, host: "127.0.0.1", port: server.port, tls: tls, options: clientOptions)
            #expect(try orders(site) == hubRows(hub, where: "site = 'north'"))

            var wide = server.options
            wide.peers[.name("north")] = PeerPolicy(scopes: ["orders": .filter("site IN ('north', 'south')")])
            server.replaceOptions(wide)
            // The open session keeps the narrow scope: order 3 (south) is not sent, order 4 (north),
            // committed after it, is — had the session taken the wide scope, 3 would come first.
            try hub.execute("INSERT INTO orders (id, site, body) VALUES (3, 'south', 'order 3')")
            try hub.execute("INSERT INTO orders (id, site, body) VALUES (4, 'north', 'order 4')")
            let order4 = try #require(try hubRows(hub, where: "id = 4").first)
            #expect(
                try await waitForBatches(in: applied) { try orders(site).contains(order4) },
                "order 4 reached the live session")
            #expect(try orders(site) == hubRows(hub, where: "site = 'north'"), "the live session kept its scope")
            _ = try await live.stop()

            // The next session takes the wide scope.
            _ = try await SyncClient.syncOnce(database: site, host: "127.0.0.1", port: server.port, tls: tls)
            #expect(try orders(site) == hubRows(hub, where: "site IN ('north', 'south')"))
            #expect(try orders(site).count == 4)
        }
    }

    @Test(
        """
        a peer speaking only version 2 syncs whole tables with a version 3 node, and is refused (ERROR 1, naming \
        why) when its policy is scoped
        """)
    func versionTwoPeers() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let hub = try makeOrdersDatabase()
        try hub.execute("INSERT INTO orders (id, site, body) VALUES (1, 'north', 'a'), (2, 'south', 'b')")
        var versionTwo = SyncOptions()
        versionTwo.testHooks.offersVersion3 = false

        let whole = try makeOrdersDatabase()
        _ = try await runServer(hub, pki: pki) { server in
            _ = try await SyncClient.syncOnce(
                database: whole, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(), options: versionTwo
            )
        }
        #expect(try orders(whole) == orders(hub))

        let scoped = try makeOrdersDatabase()
        let failure = try await failedSync(
            of: scoped, with: hub, serverOptions: siteScopes, pki: pki, options: versionTwo)
        let text = try #require(failure, "a version 2 peer with a scoped policy synced")
        #expect(text.contains("ERROR 1") && text.contains("orders") && text.contains("version 3"), "\(text)")
        #expect(try orders(scoped).isEmpty)
    }

    @Test(
        "an interest that is not a condition over the table is refused before any row moves (ERROR 2, naming the table)"
    )
    func badInterestIsRefused() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let hub = try makeOrdersDatabase()
        try hub.execute("INSERT INTO orders (id, site, body) VALUES (1, 'north', 'a')")
        let site = try makeOrdersDatabase()
        try site.execute("INSERT INTO orders (id, site, body) VALUES (2, 'north', 'b')")
        let before = try orders(site)
        var options = SyncOptions()
        options.interest = ["orders": .filter("no_such_column = 1")]
        let failure = try await failedSync(of: site, with: hub, pki: pki, options: options)
        let text = try #require(failure, "a session with an invalid interest went on")
        #expect(text.contains("ERROR 2") && text.contains("orders") && text.contains("no_such_column"), "\(text)")
        #expect(try orders(site) == before, "no row of the hub reached the site")
    }

    @Test(
        """
        a regional node holding part of a table relays it as partial: its sites get their scope of it, a peer \
        taking it whole gets its evictions too, and a version 2 peer is refused it (ERROR 1)
        """)
    func regionalNodeRelaysWhatItHolds() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let eu = try pki.issue(commonName: "eu", as: "eu")
        let north = try pki.issue(commonName: "north", as: "north")
        let whole = try pki.issue(commonName: "whole", as: "whole")
        let hub = try makeOrdersDatabase()
        let regional = try makeOrdersDatabase()
        let northDB = try makeOrdersDatabase()
        let wholeDB = try makeOrdersDatabase()
        try await hub.write { conn in
            for (id, site) in [(1, "north"), (2, "north"), (3, "south"), (4, "east")] {
                try conn.execute("INSERT INTO orders (id, site, body) VALUES (?, ?, ?)", [id, site, "order \(id)"])
            }
        }
        var hubOptions = SyncOptions.patientServer
        hubOptions.peers[.name("eu")] = PeerPolicy(scopes: ["orders": .filter("site IN ('north', 'south')")])
        var regionalOptions = SyncOptions.patientServer
        regionalOptions.peers[.name("north")] = PeerPolicy(scopes: ["orders": .filter("site = :peer_name")])

        _ = try await runServer(hub, pki: pki, options: hubOptions) { hubServer in
            _ = try await runServer(regional, pki: pki, options: regionalOptions) { regionalServer in
                func pull(
                    _ db: Database, from port: Int, as credentials: CredentialFiles,
                    options: SyncOptions = SyncOptions()
                ) async throws {
                    _ = try await SyncClient.syncOnce(
                        database: db, host: "127.0.0.1", port: port, tls: try pki.clientContext(credentials),
                        options: options)
                }
                try await pull(regional, from: hubServer.port, as: eu)
                #expect(try orders(regional) == hubRows(hub, where: "site IN ('north', 'south')"))
                #expect(try regional.partialTables() == ["orders": [hub.instanceKey]])
                try await pull(northDB, from: regionalServer.port, as: north)
                try await pull(wholeDB, from: regionalServer.port, as: whole)
                #expect(try orders(northDB) == hubRows(hub, where: "site = 'north'"))
                #expect(
                    try orders(wholeDB) == hubRows(hub, where: "site IN ('north', 'south')"),
                    "all the regional node holds, no more")

                // Moved out of the region on the hub: evicted from the regional node, then from both of its peers.
                try hub.execute("UPDATE orders SET site = 'east' WHERE id = 1")
                try await pull(regional, from: hubServer.port, as: eu)
                try await pull(northDB, from: regionalServer.port, as: north)
                try await pull(wholeDB, from: regionalServer.port, as: whole)
                #expect(try orders(regional) == hubRows(hub, where: "site IN ('north', 'south')"))
                #expect(try orders(northDB) == hubRows(hub, where: "site = 'north'"))
                #expect(
                    try orders(wholeDB) == hubRows(hub, where: "site IN ('north', 'south')"),
                    "the eviction reached the peer taking the table whole")
                // What the regional node sends the whole peer in part makes it hold the table in part too.
                #expect(try wholeDB.partialTables().keys.sorted() == ["orders"])

                // A version 2 peer would get the partial table as if it were whole: refused, naming it.
                var versionTwo = SyncOptions()
                versionTwo.testHooks.offersVersion3 = false
                let stale = try makeOrdersDatabase()
                do {
                    try await pull(stale, from: regionalServer.port, as: whole, options: versionTwo)
                    Issue.record("a version 2 peer was sent a table the node holds only part of")
                } catch {
                    #expect("\(error)".contains("ERROR 1") && "\(error)".contains("orders"), "\(error)")
                }
                #expect(try orders(stale).isEmpty)
            }
        }
    }
}
