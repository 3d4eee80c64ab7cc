import Foundation
import Testing
import Tether
import TetherSync

/// The README's "Over the network" example, kept true.
@Suite("README: sync over the network")
struct ReadmeNetworkExampleTests {
    @Test("the README's network example runs as written")
    func networkExample() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let serverTLS = try pki.serverContext()
        let clientTLS = try pki.clientContext()
        let a = try Database.inMemory()
        let b = try Database.inMemory()
        for db in [a, b] {
            try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
            try db.enableSync(table: "t")
        }
        try a.execute("INSERT INTO t (id, name) VALUES (1, 'one')")

        let server = try await SyncServer.start(database: a, host: "127.0.0.1", port: 0, tls: serverTLS)

        // Once: catch up both ways, then BYE.
        let summary = try await SyncClient.syncOnce(database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)

        // With progress (an AsyncSequence of snapshots: done, and expected each way).
        let run = try await SyncClient.startSync(database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)
        for await step in run.progress { print(step.done.changesReceived, step.changesExpectedToReceive ?? 0) }
        _ = try await run.summary()

        // Kept in sync: live push, heartbeats, and reconnection with backoff when the session ends.
        let link = SyncClient.keepSyncing(database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)
        var events = link.events.makeAsyncIterator()
        guard case .connected? = await events.next() else {
            Issue.record("the link did not connect")
            await link.stop()
            try await server.stop()
            return
        }
        // … later
        await link.stop()
        try await server.stop()

        #expect(summary.changesReceived == 1)
        #expect(try b.fetchValue("SELECT name FROM t WHERE id = 1", as: String.self) == "one")
        #expect(server.totals.sessions == 3)
    }
}
