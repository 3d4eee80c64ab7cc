import Foundation
import Testing
import Tether
@testable import TetherSync

/// Expiry dates over the network: Tether's store of them is synced by every database that syncs
/// a table, so a node setting an expiry never makes its schema differ from its peers', and a
/// peer restricted to some tables gets and may set only their rows' expiries.
@Suite("Sync sessions: expiry dates")
struct SyncExpiryTests {
    /// A row of `makeSyncedDatabase`'s table `t`.
    struct Item: Model {
        var id: Int64
        var name: String?
        var n: Int64?
        static let tableName = "t"
    }

    struct Label: Model {
        var id: Int64
        var label: String?
        static let tableName = "u"
    }

    @Test("an expiry set on the server reaches the client in the same session as the row; the schemas still match")
    func expiryReachesThePeer() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        let later = Date(timeIntervalSinceNow: 3600)
        try server.insert(Item(id: 1, name: "keep", n: 1))
        _ = try server.insert(Item(id: 2, name: "goes", n: 2), expiresAt: later)
        #expect(server.syncedTables == ["t"], "Tether's own store is not the user's table")

        let (summary, _) = try await runServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        #expect(summary.changesReceived == 3, "the two rows and the expiry entry")
        #expect(try client.fetchAll(Item.self).map(\.id) == [1, 2])
        #expect(
            try client.expiry(of: Item.self, key: PrimaryKey(2))?.timeIntervalSince1970 == later.timeIntervalSince1970)
        #expect(try client.expiry(of: Item.self, key: PrimaryKey(1)) == nil)
    }

    @Test("a peer allowed only table t is sent the expiries of t's rows, not those of u's")
    func restrictedPeerGetsOnlyItsTablesExpiries() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase(withU: true)
        let client = try makeSyncedDatabase(withU: true)
        let later = Date(timeIntervalSinceNow: 3600)
        _ = try server.insert(Item(id: 1, name: "a", n: 1), expiresAt: later)
        _ = try server.insert(Label(id: 1, label: "hidden"), expiresAt: later)
        var options = SyncOptions()
        options.peers[.name("node-client")] = PeerPolicy(allowedTables: ["t"])

        let (summary, _) = try await runServer(server, pki: pki, options: options) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        #expect(summary.changesReceived == 2, "t's row and its expiry")
        #expect(
            try client.expiry(of: Item.self, key: PrimaryKey(1))?.timeIntervalSince1970 == later.timeIntervalSince1970)
        #expect(
            try client.fetchValue("SELECT group_concat(table_name) FROM tether_synced_expiry", as: String.self) == "t")
        #expect(try client.count(Label.self) == 0)
    }

    @Test("a peer allowed only table t that sends an expiry for a row of u is refused whole (ERROR 5 naming u)")
    func restrictedPeerMayNotSetOtherTablesExpiries() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase(withU: true)
        try server.execute("INSERT INTO u (id, label) VALUES (1, 'kept')")
        let client = try makeSyncedDatabase(withU: true)
        try client.execute("INSERT INTO t (id, name, n) VALUES (1, 'client', 1)")
        // What a hostile peer could write into the store: an expiry for the server's row u 1.
        try client.execute("INSERT INTO tether_synced_expiry (table_name, row_key, expires_at) VALUES ('u', '[1]', 0)")
        var options = SyncOptions()
        options.peers[.name("node-client")] = PeerPolicy(allowedTables: ["t"])

        let (outcome, serverResult) = try await runServer(server, pki: pki, options: options) { syncServer -> String? in
            do {
                _ = try await SyncClient.syncOnce(
                    database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
                return nil
            } catch {
                return "\(error)"
            }
        }
        let text = try #require(outcome, "syncOnce succeeded although the client set an expiry on table u")
        #expect(text.contains("ERROR 5") && text.contains("table u"), "\(text)")
        guard case let .failure(.tableNotAllowed(reason))? = serverResult else {
            Issue.record("the server's session did not fail with tableNotAllowed: \(String(describing: serverResult))")
            return
        }
        #expect(reason.contains("table u"), "\(reason)")
        #expect(try server.fetchValue("SELECT count(*) FROM tether_synced_expiry", as: Int.self) == 0)
        #expect(try server.fetchValue("SELECT label FROM u WHERE id = 1", as: String.self) == "kept")
        #expect(try server.count(Item.self) == 0)
    }
    @Test("a peer that does not sync u is sent no expiry of u's rows, and the session succeeds")
    func peerNotSyncingATableGetsNoneOfItsExpiries() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase(withU: true)
        let client = try makeSyncedDatabase()
        let later = Date(timeIntervalSinceNow: 3600)
        _ = try server.insert(Item(id: 1, name: "a", n: 1), expiresAt: later)
        _ = try server.insert(Label(id: 1, label: "u's"), expiresAt: later)

        let (summary, serverResult) = try await runServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        guard case .success? = serverResult else {
            Issue.record("the server's session failed: \(String(describing: serverResult))"); return
        }
        #expect(summary.changesReceived == 2, "t's row and its expiry")
        #expect(
            try client.fetchValue("SELECT group_concat(table_name) FROM tether_synced_expiry", as: String.self) == "t")
    }

    @Test(
        """
        entries a server stored before entries were checked (a table it does not sync, one of Tether's) are not \
        relayed
        """)
    func entriesStoredBeforeTheCheckAreNotRelayed() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        try server.execute(
            """
            INSERT INTO tether_synced_expiry (table_name, row_key, expires_at)
            VALUES ('secret', '[1]', 0), ('tether_peers', '[1]', 0), ('bulk; DROP TABLE item', '[1]', 0)
            """)
        try server.execute("INSERT INTO t (id, name, n) VALUES (1, 'kept', 1)")
        let client = try makeSyncedDatabase()

        let (summary, serverResult) = try await runServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        guard case .success? = serverResult else {
            Issue.record("the server's session failed: \(String(describing: serverResult))"); return
        }
        #expect(summary.changesReceived == 1, "t's row alone")
        #expect(try client.fetchValue("SELECT count(*) FROM tether_synced_expiry", as: Int.self) == 0)
        #expect(try client.fetchAll(Item.self).map(\.id) == [1])
    }
}
