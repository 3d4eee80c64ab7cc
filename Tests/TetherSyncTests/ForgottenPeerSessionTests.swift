import Foundation
import Testing
import Tether
import TetherSync
import TetherTestSupport

/// A peer the server forgot (not seen within the horizon of garbage collection) comes back over
/// the network: one session gives it the server's resync, then takes its changes.
@Suite struct ForgottenPeerSessionTests {
    private func dump(_ db: Database) throws -> [String] {
        try db.fetchRows("SELECT id, name, n FROM t ORDER BY id").map {
            try "\($0.get(0, as: Int64.self))|\($0.get(1, as: String.self))|\($0.get(2, as: Int64.self))"
        }
    }

    @Test func aForgottenClientConvergesInOneSession() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        let client = try makeDatabase()
        try await server.write { conn in
            for id in 1...1_000 {
                try conn.execute("INSERT INTO t (id, name, n) VALUES (?, ?, 0)", [id, "server-\(id)"])
            }
        }
        try await withSyncServer(server, pki: pki) { syncServer in
            _ = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        #expect(try dump(client) == dump(server))

        // The client is away: it edits rows the server is about to delete, and makes new ones.
        try client.execute("UPDATE t SET name = 'client edit' WHERE id <= 50")
        try await client.write { conn in
            for id in 2_001...2_100 {
                try conn.execute("INSERT INTO t (id, name, n) VALUES (?, ?, 1)", [id, "client-\(id)"])
            }
        }
        try server.execute("DELETE FROM t WHERE id <= 100")
        try server.execute("UPDATE t SET n = 5 WHERE id = 500")
        try server.execute(
            "UPDATE tether_peers SET last_seen = 0 WHERE instance_key = ?", [Data(client.instanceKey.bytes)])
        let collected = try server.collectGarbage(
            Database.GarbageCollectionOptions(forgetPeersUnseenFor: .seconds(3_600)))
        #expect(collected.peersForgotten == [client.instanceKey])
        #expect(collected.tombstonesRemoved == 100)

        try await withSyncServer(server, pki: pki) { syncServer in
            _ = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        let rows = try dump(server)
        #expect(rows.filter { $0.contains("client edit") }.isEmpty, "rows deleted on the server came back")
        #expect(rows.count == 900 + 100)
        #expect(rows.first == "101|server-101|0")
        #expect(rows.contains("500|server-500|5"))
        #expect(rows.last == "2100|client-2100|1")
        #expect(try dump(client) == rows, "the client's rows differ from the server's")
        #expect(try client.pendingChangeCount(tables: ["t"]) == 0)
        #expect(try server.peers().first { $0.instanceKey == client.instanceKey }?.forgotten == nil)
    }
}
