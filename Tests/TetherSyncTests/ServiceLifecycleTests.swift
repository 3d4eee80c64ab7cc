import Foundation
import Logging
import ServiceLifecycle
import ServiceLifecycleTestKit
import Testing
import Tether
import TetherSync
import TetherTestSupport

private func insert(_ db: Database, _ range: ClosedRange<Int>) throws {
    try db.write { conn in
        for id in range { try conn.execute("INSERT INTO t (id, name) VALUES (?, ?)", [id, "row-\(id)"]) }
    }
}

private func rowCount(_ db: Database) throws -> Int {
    try db.fetchValue("SELECT count(*) FROM t", as: Int.self) ?? -1
}

/// What stands for the application's own HTTP server beside Tether's in its `ServiceGroup`: it
/// says when it runs, and runs until the group shuts down gracefully.
private final class StandInHTTPServer: Service {
    private let running: AsyncStream<Void>
    private let runningContinuation: AsyncStream<Void>.Continuation
    let shutDownGracefully = LockedBox(false)

    init() {
        (running, runningContinuation) = AsyncStream.makeStream(of: Void.self)
    }

    /// Returns once `run()` has begun.
    func started() async {
        var iterator = running.makeAsyncIterator()
        _ = await iterator.next()
    }

    func run() async throws {
        runningContinuation.yield()
        runningContinuation.finish()
        try? await gracefulShutdown()
        shutDownGracefully.withLock { $0 = true }
    }
}

@Suite("swift-service-lifecycle: the server and a link in a user's ServiceGroup")
struct ServiceLifecycleTests {
    /// SyncOverTheNetwork.md, "Logging and the service lifecycle".
    @Test(
        """
        a SyncServer and a SyncLink run in a ServiceGroup beside another service; its graceful shutdown stops \
        them and run() returns
        """)
    func serverInAServiceGroup() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let serverTLS = try pki.serverContext()
        let clientTLS = try pki.clientContext()
        let a = try makeDatabase(columns: "name TEXT")
        let b = try makeDatabase(columns: "name TEXT")
        let c = try makeDatabase(columns: "name TEXT")
        try insert(a, 1...10)
        let recorder = LogRecorder()
        let logger = recorder.logger(level: .info)
        let httpServer = StandInHTTPServer()

        let synced = try await testGracefulShutdown { trigger -> SyncSummary in
            var options = SyncOptions()
            options.logger = logger
            let server = try await SyncServer.start(
                database: a, host: "127.0.0.1", port: 0, tls: serverTLS, options: options)

            let link = SyncClient.keepSyncing(database: c, host: "127.0.0.1", port: server.port, tls: clientTLS)
            // The test: once the group runs, sync through the server, see the link catch up, then shut the group down.
            async let driven: Result<SyncSummary, any Error> = {
                defer { trigger.triggerGracefulShutdown() }
                await httpServer.started()
                do {
                    let summary = try await SyncClient.syncOnce(
                        database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)
                    for await event in link.events {
                        if case .connected = event { break }
                    }
                    return .success(summary)
                } catch {
                    return .failure(error)
                }
            }()
            let services: [any Service] = [httpServer, server, link]
            let group = ServiceGroup(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
            try await group.run()
            let summary = try await driven.get()

            // The group's run returned: the server no longer listens, the link is over.
            #expect(!link.isConnected)
            await #expect(throws: (any Error).self) {
                _ = try await SyncClient.syncOnce(database: b, host: "127.0.0.1", port: server.port, tls: clientTLS)
            }
            var results = server.sessionResults.makeAsyncIterator()
            while await results.next() != nil {}  // finished by the stop
            return summary
        }
        #expect(synced.changesReceived == 10)
        #expect(try rowCount(b) == 10)
        #expect(try rowCount(c) == 10)
        #expect(httpServer.shutDownGracefully.value)
        let messages = recorder.entries.map(\.message)
        #expect(
            messages.contains("sync server stopping") && messages.contains("sync server stopped"), "\(recorder.entries)"
        )
    }

    /// The example of SyncOverTheNetwork.md, as a reader would write it: the server in the
    /// application's group; the group's graceful shutdown (SIGTERM, in production) ends it.
    @Test(
        """
        the article's example: the server beside the application's service, in its ServiceGroup, stopped by \
        graceful shutdown
        """)
    func articleExample() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let serverTLS = try pki.serverContext()
        let a = try makeDatabase(columns: "name TEXT")
        let recorder = LogRecorder()
        let logger = recorder.logger(level: .info)
        let httpServer = StandInHTTPServer()
        try await testGracefulShutdown { trigger in
            async let shutDown: Void = {
                await httpServer.started()
                trigger.triggerGracefulShutdown()
            }()
            var options = SyncOptions()
            options.logger = logger
            let server = try await SyncServer.start(
                database: a, host: "127.0.0.1", port: 0, tls: serverTLS, options: options)
            let group = ServiceGroup(
                services: [httpServer, server], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
            try await group.run()
            await shutDown
        }
        #expect(httpServer.shutDownGracefully.value)
        #expect(recorder.entries.contains { $0.message == "sync server stopped" }, "\(recorder.entries)")
    }

    @Test("run() returns at once when the server was stopped, and stop() twice waits for the same stop")
    func runAfterStop() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try await SyncServer.start(
            database: try makeDatabase(columns: "name TEXT"), tls: try pki.serverContext())
        try await server.stop()
        try await server.stop()
        try await server.run()
        var results = server.sessionResults.makeAsyncIterator()
        #expect(await results.next() == nil)
    }
}
