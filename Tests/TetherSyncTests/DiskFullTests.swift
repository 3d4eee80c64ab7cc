import Foundation
import NIOCore
import Testing
import Tether
@testable import TetherSync
import TetherTestSupport

/// Inserts rows 1...`rows` of `bytes` random bytes each into `t` (incompressible, one statement).
private func fill(_ db: Database, rows: Int, bytes: Int) throws {
    try db.execute("""
        WITH RECURSIVE n(id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n WHERE id < \(rows))
        INSERT INTO t (id, body) SELECT id, randomblob(\(bytes)) FROM n
        """)
}

private func rowCount(_ db: Database) throws -> Int {
    try db.fetchValue("SELECT count(*) FROM t", as: Int.self) ?? -1
}

/// Limits the database to its current size plus `pages` pages: writes beyond fail with SQLITE_FULL,
/// as on a full disk (`PRAGMA max_page_count`, per connection: the writer's).
private func limitSize(_ db: Database, toCurrentPlus pages: Int) throws {
    try db.writeWithoutTransaction { conn in
        let current = try conn.fetchValue("PRAGMA page_count", as: Int.self) ?? 0
        _ = try conn.fetchValue("PRAGMA max_page_count = \(current + pages)", as: Int.self)
    }
}

@Suite("Sync sessions: a full disk")
struct DiskFullTests {
    @Test("a batch that does not fit is pulled again in smaller ones: the room there is gets used, and sync goes on once some is freed")
    func smallerBatchesThenRoomAgain() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase(columns: "body BLOB")
        try fill(server, rows: 3000, bytes: 1000)
        let client = try makeDatabase(columns: "body BLOB")
        // Room for about a third of the rows (3 per 4 KiB page).
        try limitSize(client, toCurrentPlus: 350)
        var options = SyncOptions()
        options.noRoomRetryDelay = .milliseconds(50)
        let syncServer = try await SyncServer.start(database: server, tls: try pki.serverContext())
        let link = SyncClient.keepSyncing(database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                                          options: options)
        let partly = try await eventually { try rowCount(client) >= 700 }
        let heldBeforeRoom = try rowCount(client)
        try limitSize(client, toCurrentPlus: 100_000)
        let all = try await eventually { try rowCount(client) == 3000 }
        await link.stop()
        try await syncServer.stop()

        #expect(partly, "the batches were not made smaller: \(heldBeforeRoom) rows arrived while the disk was full")
        #expect(heldBeforeRoom < 3000)
        let finalCount = try rowCount(client)
        #expect(all, "sync did not go on once there was room: \(finalCount) rows")
        let serverRows = try server.fetchValue("SELECT group_concat(id || hex(body)) FROM (SELECT * FROM t ORDER BY id)", as: String.self)
        let clientRows = try client.fetchValue("SELECT group_concat(id || hex(body)) FROM (SELECT * FROM t ORDER BY id)", as: String.self)
        #expect(serverRows == clientRows)
    }

    @Test("syncOnce on a disk where not even one change fits ends with a storage error, nothing half-applied")
    func syncOnceGivesUp() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase(columns: "body BLOB")
        try fill(server, rows: 200, bytes: 5000)
        let client = try makeDatabase(columns: "body BLOB")
        try limitSize(client, toCurrentPlus: 0)
        let syncServer = try await SyncServer.start(database: server, tls: try pki.serverContext())
        var outcome: SyncSessionError?
        do {
            _ = try await SyncClient.syncOnce(database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        } catch let error as SyncSessionError {
            outcome = error
        }
        try await syncServer.stop()
        guard case let .storage(_, reason)? = outcome else {
            Issue.record("syncOnce did not end with a storage error: \(String(describing: outcome))")
            return
        }
        #expect(reason.contains("full"), "\(reason)")
        #expect(try rowCount(client) == 0)
        #expect(try client.cursor(for: server.instanceKey).after == 0)
    }

    @Test("a database on a full disk still sends its own changes")
    func fullDiskStillSends() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let full = try makeDatabase(columns: "body BLOB")
        try fill(full, rows: 500, bytes: 100)
        try full.execute("UPDATE t SET body = zeroblob(10) WHERE id <= 50")
        try limitSize(full, toCurrentPlus: 0)
        #expect {
            try full.execute("INSERT INTO t (id, body) VALUES (1000, randomblob(10000))")
        } throws: { ($0 as? DatabaseError)?.isStorageFailure == true }
        let peer = try makeDatabase(columns: "body BLOB")
        let syncServer = try await SyncServer.start(database: full, tls: try pki.serverContext())
        // Whatever the full side cannot record (rows in flight, the peer's position), its changes go.
        let summary = try await SyncClient.syncOnce(database: peer, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        try await syncServer.stop()
        #expect(summary.changesReceived == 500)
        #expect(try rowCount(peer) == 500)
    }
}
