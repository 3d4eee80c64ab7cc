import Foundation
import NIOCore
import Testing
@testable import Tether
@testable import TetherSync
import TetherTestSupport

/// A live session with nothing to do costs nothing: no change check while nobody writes. Another
/// program's commit still reaches the peer, noticed from the file system (inotify), or by the
/// periodic check where that is unavailable.
@Suite("Sync sessions: an idle node sleeps; other programs' commits still go live", .hangLimit)
struct IdleSessionTests {
    /// The periodic check, never reached by these tests unless they ask for polling.
    static let distantCheck = TimeAmount.minutes(10)

    /// A file database with the synced table `t`.
    static func database(_ directory: TemporaryDirectory, _ name: String, watchesFiles: Bool = true) throws -> Database
    {
        var configuration = Database.Configuration()
        configuration.watchesFiles = watchesFiles
        let db = try Database(path: directory.file(name), configuration: configuration)
        try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, n INTEGER)")
        try db.enableSync(table: "t")
        return db
    }

    /// Runs `body(server, connection)` while a client holds a live session with a server, then
    /// stops it; the server's session must end well.
    static func withLiveSession(
        server: Database, serverOptions: SyncOptions, client: Database, clientOptions: SyncOptions,
        _ body: (SyncServer, SyncConnection) async throws -> Void
    ) async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let (_, result) = try await runServer(server, pki: pki, options: serverOptions) { syncServer in
            let connection = try await SyncClient.connect(
                database: client, host: "127.0.0.1", port: syncServer.port,
                tls: try pki.clientContext(), options: clientOptions)
            try await body(syncServer, connection)
            return try await connection.stop()
        }
        guard case .success? = result else {
            Issue.record("the server's session failed: \(String(describing: result))")
            return
        }
    }

    @Test("an idle live session checks neither database: no change check, no look at the files, over a quiet spell")
    func idleSessionDoesNotCheck() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let server = try Self.database(directory, "server.sqlite")
        let client = try Self.database(directory, "client.sqlite")
        try server.execute("INSERT INTO t (id, name, n) VALUES (1, 'server', 1)")
        // The default 50 ms check: polling would show as about ten checks a side in the quiet spell.
        let options = SyncOptions.patientServer
        try await Self.withLiveSession(
            server: server, serverOptions: options, client: client, clientOptions: SyncOptions()
        ) { syncServer, connection in
            #expect(try hasRow(client, 1))
            func counts() -> [Int] {
                [
                    syncServer.monitor.checks.load(ordering: .relaxed),
                    connection.monitor.checks.load(ordering: .relaxed),
                    server.observation.externalCommits.looks.load(ordering: .relaxed),
                    client.observation.externalCommits.looks.load(ordering: .relaxed),
                ]
            }
            // The catch-up wrote to both files: the looks that follow writes end within 1.2 s.
            try await Task.sleep(for: .milliseconds(1300))
            #expect(
                server.observation.externalCommits.isWatchingFiles && client.observation.externalCommits.isWatchingFiles
            )
            let before = counts()
            try await Task.sleep(for: .milliseconds(500))
            #expect(
                counts() == before,
                "an idle session checked its database (monitor, monitor, looks, looks: \(before) → \(counts()))")
        }
    }

    @Test("another connection's commit reaches the live peer from the file system, both ways, with no periodic check")
    func otherConnectionsCommitReachesPeer() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let server = try Self.database(directory, "server.sqlite")
        let client = try Self.database(directory, "client.sqlite")
        var (serverBatches, serverOptions) = appliedBatches()
        serverOptions.changeCheckInterval = Self.distantCheck
        var (clientApplied, clientOptions) = appliedBatches()
        clientOptions.changeCheckInterval = Self.distantCheck
        try await Self.withLiveSession(
            server: server, serverOptions: serverOptions, client: client, clientOptions: clientOptions
        ) { _, _ in
            // Another program writes the server's file (here another `Database` on it, a
            // connection of its own): the client receives it.
            let otherOnServer = try Database(path: server.path)
            try otherOnServer.execute("INSERT INTO t (id, name, n) VALUES (1, 'written beside the server', 1)")
            #expect(
                try await waitForRow(client, 1, in: clientApplied),
                "another connection's commit on the server did not reach the client")
            // And the client's file: the server receives it.
            let otherOnClient = try Database(path: client.path)
            try otherOnClient.execute("INSERT INTO t (id, name, n) VALUES (2, 'written beside the client', 2)")
            #expect(
                try await waitForRow(server, 2, in: serverBatches),
                "another connection's commit on the client did not reach the server")
            try otherOnServer.close()
            try otherOnClient.close()
        }
    }

    @Test("without file watching (no inotify), the periodic check still brings another connection's commit to the peer")
    func pollingFallbackReachesPeer() async throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let server = try Self.database(directory, "server.sqlite", watchesFiles: false)
        let client = try Self.database(directory, "client.sqlite", watchesFiles: false)
        var serverOptions = SyncOptions.patient
        serverOptions.changeCheckInterval = .milliseconds(20)
        let (clientApplied, clientOptions) = appliedBatches()
        try await Self.withLiveSession(
            server: server, serverOptions: serverOptions, client: client, clientOptions: clientOptions
        ) { _, _ in
            #expect(!server.observation.externalCommits.isWatchingFiles)
            let otherOnServer = try Database(path: server.path)
            try otherOnServer.execute("INSERT INTO t (id, name, n) VALUES (1, 'written beside the server', 1)")
            #expect(
                try await waitForRow(client, 1, in: clientApplied),
                "the periodic check did not bring the commit to the client")
            // Polling checks whether anyone wrote or not.
            let looks = server.observation.externalCommits.looks.load(ordering: .relaxed)
            #expect(
                try await eventually { server.observation.externalCommits.looks.load(ordering: .relaxed) >= looks + 3 })
            try otherOnServer.close()
        }
    }
}
