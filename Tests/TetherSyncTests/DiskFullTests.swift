import Foundation
import NIOCore
import Testing
import Tether
@testable import TetherSync
import TetherTestSupport

/// Inserts rows 1...`rows` of `bytes` random bytes each into `t` (incompressible, one statement).
private func fill(_ db: Database, rows: Int, bytes: Int) throws {
    try db.execute(
        """
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
    @Test(
        """
        a catch-up that does not fit: pulled again in smaller batches, the room there is used (batch by batch) or \
        what arrived staged and the state before it kept whole (whole catch-ups); sync goes on once room is freed
        """, arguments: [false, true])
    func smallerBatchesThenRoomAgain(whole: Bool) async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase(columns: "body BLOB")
        try fill(server, rows: 3000, bytes: 1000)
        let client = try makeDatabase(columns: "body BLOB")
        // Room for about a third of the rows (3 per 4 KiB page). Whole, the catch-up (one
        // transaction of the server's) cannot be applied; its smaller batches are staged as room allows.
        try limitSize(client, toCurrentPlus: 350)
        var options = SyncOptions()
        options.noRoomRetryDelay = .milliseconds(50)
        options.wholeCatchUps = whole
        let syncServer = try await SyncServer.start(database: server, tls: try pki.serverContext())
        let link = SyncClient.keepSyncing(
            database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
            options: options)
        func staged() throws -> Int { try client.stagedCatchUp(from: server.instanceKey)?.changes ?? 0 }
        let partly = try await eventually { whole ? try staged() >= 300 : try rowCount(client) >= 700 }
        let heldBeforeRoom = try rowCount(client)
        let stagedBeforeRoom = try staged()
        try limitSize(client, toCurrentPlus: 100_000)
        let all = try await eventually { try rowCount(client) == 3000 }
        await link.stop()
        try await syncServer.stop()

        #expect(
            partly,
            """
            the batches were not made smaller: \(heldBeforeRoom) rows arrived and \(stagedBeforeRoom) changes were \
            staged while the disk was full
            """)
        if whole {
            #expect(heldBeforeRoom == 0, "part of the server's transaction showed: \(heldBeforeRoom) rows")
        } else {
            #expect(heldBeforeRoom < 3000)
        }
        let finalCount = try rowCount(client)
        #expect(all, "sync did not go on once there was room: \(finalCount) rows")
        #expect(try client.stagedCatchUp(from: server.instanceKey) == nil)
        let serverRows = try server.fetchValue(
            "SELECT group_concat(id || hex(body)) FROM (SELECT * FROM t ORDER BY id)", as: String.self)
        let clientRows = try client.fetchValue(
            "SELECT group_concat(id || hex(body)) FROM (SELECT * FROM t ORDER BY id)", as: String.self)
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
            _ = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
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
        let summary = try await SyncClient.syncOnce(
            database: peer, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        try await syncServer.stop()
        #expect(summary.changesReceived == 500)
        #expect(try rowCount(peer) == 500)
    }

    @Test(
        "a file database on a disk full to the last byte sends every row to a peer it never met",
        .enabled(if: SmallDisk.canMount, "mounting a tmpfs needs root with CAP_SYS_ADMIN"))
    func fileOnAFullDiskSendsToANewPeer() async throws {
        let disk = try SmallDisk(bytes: 4 << 20)
        defer { disk.unmount() }
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let full = try Database(path: disk.path + "/node.db")
        try full.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
        try full.enableSync(table: "t")
        try fill(full, rows: 300, bytes: 200)
        try disk.fillUp()
        #expect {
            try full.execute("INSERT INTO t (id, body) VALUES (1000, randomblob(5000))")
        } throws: { ($0 as? DatabaseError)?.isStorageFailure == true }
        let peer = try makeDatabase(columns: "body BLOB")
        let syncServer = try await SyncServer.start(database: full, tls: try pki.serverContext())
        let summary = try await SyncClient.syncOnce(
            database: peer, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        try await syncServer.stop()
        #expect(summary.changesReceived == 300)
        #expect(try rowCount(peer) == 300)
        try full.close()
    }
}

/// A tmpfs of a few megabytes, mounted for one test: a disk that can really be full.
private final class SmallDisk {
    let path: String

    /// Whether this process may mount one (root with CAP_SYS_ADMIN; not every CI machine).
    static let canMount: Bool = {
        guard let disk = try? SmallDisk(bytes: 1 << 20) else { return false }
        disk.unmount()
        return true
    }()

    init(bytes: Int) throws {
        path =
            FileManager.default.temporaryDirectory.appendingPathComponent("tether-small-disk-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        let mount = Process()
        mount.executableURL = URL(fileURLWithPath: "/bin/mount")
        mount.arguments = ["-t", "tmpfs", "-o", "size=\(bytes)", "tmpfs", path]
        mount.standardError = FileHandle.nullDevice
        try mount.run()
        mount.waitUntilExit()
        guard mount.terminationStatus == 0 else {
            try? FileManager.default.removeItem(atPath: path)
            throw CocoaError(.fileWriteNoPermission)
        }
    }

    /// Fills every byte left with a file.
    func fillUp() throws {
        guard FileManager.default.createFile(atPath: path + "/filler", contents: nil),
            let handle = FileHandle(forWritingAtPath: path + "/filler")
        else { throw CocoaError(.fileWriteUnknown) }
        defer { try? handle.close() }
        for size in [1 << 16, 1 << 12, 1 << 9, 1] {
            let chunk = Data(repeating: 0, count: size)
            while (try? handle.write(contentsOf: chunk)) != nil {}
        }
    }

    func unmount() {
        let umount = Process()
        umount.executableURL = URL(fileURLWithPath: "/bin/umount")
        umount.arguments = [path]
        try? umount.run()
        umount.waitUntilExit()
        try? FileManager.default.removeItem(atPath: path)
    }
}
