import Foundation
import Logging
import Testing
import Tether
@testable import TetherSync
import TetherTestSupport

private func insert(_ db: Database, _ range: ClosedRange<Int>) throws {
    try db.write { conn in
        for id in range { try conn.execute("INSERT INTO t (id, name) VALUES (?, ?)", [id, "row-\(id)"]) }
    }
}

@Model
struct ExpiringReminder {
    var id: Int64
    var text: String
}

@Suite("Logging through swift-log: sessions, failures, the engine's own work")
struct SyncLoggingTests {
    @Test(
        """
        a session logs its start and end at info with the peer's certificate name and instance key, each batch at \
        debug
        """)
    func sessionStartAndEnd() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let serverDB = try makeDatabase(columns: "name TEXT")
        let clientDB = try makeDatabase(columns: "name TEXT")
        try insert(serverDB, 1...20)
        try insert(clientDB, 101...105)
        let serverLog = LogRecorder()
        let clientLog = LogRecorder()
        var serverOptions = SyncOptions()
        serverOptions.logger = serverLog.logger()
        var clientOptions = SyncOptions()
        clientOptions.logger = clientLog.logger()

        let server = try await SyncServer.start(
            database: serverDB, tls: try pki.serverContext(), options: serverOptions)
        let summary: SyncSummary
        do {
            summary = try await SyncClient.syncOnce(
                database: clientDB, host: "127.0.0.1", port: server.port,
                tls: try pki.clientContext(), options: clientOptions)
            // The server's session has ended (and logged its end) once its result is out.
            var results = server.sessionResults.makeAsyncIterator()
            let result = try #require(await results.next())
            _ = try result.get()
        } catch {
            try? await server.stop()
            throw error
        }
        try await server.stop()
        #expect(summary.changesReceived == 20 && summary.changesSent == 5)

        let onServer = serverLog.entries
        let started = try #require(onServer.first { $0.message == "sync session started" }, "\(onServer)")
        #expect(started.level == .info)
        #expect(started.metadata[SyncLogMetadataKey.peerCertificate] == "node-client")
        #expect(started.metadata[SyncLogMetadataKey.peerInstanceKey] == "\(clientDB.instanceKey)")
        #expect(started.metadata[SyncLogMetadataKey.role] == "server")
        #expect(started.metadata[SyncLogMetadataKey.remoteAddress]?.hasPrefix("127.0.0.1:") == true)
        let session = try #require(started.metadata[SyncLogMetadataKey.session])
        #expect(session.count == 8)
        let ended = try #require(onServer.first { $0.message == "sync session ended" }, "\(onServer)")
        #expect(ended.level == .info)
        #expect(ended.metadata[SyncLogMetadataKey.session] == session)
        #expect(ended.metadata[SyncLogMetadataKey.peerCertificate] == "node-client")
        #expect(ended.metadata[SyncLogMetadataKey.peerInstanceKey] == "\(clientDB.instanceKey)")
        #expect(ended.metadata["tether.received"] == "5" && ended.metadata["tether.sent"] == "20")
        // Exactly one line each at info for the session; batches at debug, with their tables.
        let sessionLines = onServer.filter { $0.metadata[SyncLogMetadataKey.session] == session && $0.level >= .info }
        #expect(sessionLines.map(\.message) == ["sync session started", "sync session ended"], "\(onServer)")
        let applied = try #require(onServer.first { $0.message == "batch applied" }, "\(onServer)")
        #expect(applied.level == .debug)
        #expect(applied.metadata[SyncLogMetadataKey.tables] == "t")
        #expect(applied.metadata[SyncLogMetadataKey.changes] == "5")
        #expect(
            onServer.contains {
                $0.message == "batch sent" && $0.level == .debug && $0.metadata[SyncLogMetadataKey.changes] == "20"
            })
        #expect(!onServer.contains { $0.level >= .warning }, "\(onServer)")
        #expect(onServer.contains { $0.message == "sync server listening" && $0.level == .info })

        // The client names the server the same way.
        let onClient = clientLog.entries
        let clientStarted = try #require(onClient.first { $0.message == "sync session started" }, "\(onClient)")
        #expect(clientStarted.metadata[SyncLogMetadataKey.peerCertificate] == "node-server")
        #expect(clientStarted.metadata[SyncLogMetadataKey.peerInstanceKey] == "\(serverDB.instanceKey)")
        #expect(clientStarted.metadata[SyncLogMetadataKey.role] == "client")
        #expect(onClient.contains { $0.message == "sync session ended" && $0.level == .info })
    }

    @Test(
        """
        a peer whose certificate the server does not trust: the server logs the failed session at warning, and no \
        session start
        """)
    func untrustedPeerIsAWarning() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let stranger = try CertificateAuthority.create(commonName: "Stranger CA", validity: 30 * day)
        let strangerFiles = try pki.directory.write(
            try CertificateAuthority.issue(commonName: "intruder", signedBy: stranger, validity: 30 * day),
            as: "intruder")
        let serverDB = try makeDatabase(columns: "name TEXT")
        let clientDB = try makeDatabase(columns: "name TEXT")
        let serverLog = LogRecorder()
        var options = SyncOptions()
        options.logger = serverLog.logger()
        let server = try await SyncServer.start(database: serverDB, tls: try pki.serverContext(), options: options)
        do {
            await #expect(throws: (any Error).self) {
                _ = try await SyncClient.syncOnce(
                    database: clientDB, host: "127.0.0.1", port: server.port,
                    tls: try pki.clientContext(strangerFiles))
            }
            var results = server.sessionResults.makeAsyncIterator()
            let result = try #require(await results.next())
            #expect(throws: SyncSessionError.self) { try result.get() }
        } catch {
            try? await server.stop()
            throw error
        }
        try await server.stop()

        let entries = serverLog.entries
        let failed = try #require(entries.first { $0.message == "sync session failed" }, "\(entries)")
        #expect(failed.level == .warning)
        #expect(failed.metadata[SyncLogMetadataKey.reason]?.isEmpty == false)
        #expect(failed.metadata[SyncLogMetadataKey.remoteAddress]?.hasPrefix("127.0.0.1:") == true)
        #expect(!entries.contains { $0.message == "sync session started" }, "\(entries)")
    }

    @Test("a failure on this side (the database cannot be written) is an error, not a warning")
    func levelsOfFailures() {
        #expect(SessionLog.level(of: .storage(operation: "apply a batch", reason: "disk full")) == .error)
        #expect(SessionLog.level(of: .database(operation: "apply a batch", reason: "locked")) == .error)
        #expect(SessionLog.level(of: .timeout("no HELLO")) == .warning)
        #expect(SessionLog.level(of: .unauthorized("not allowed")) == .warning)
    }

    @Test(
        """
        the engine logs through Database.Configuration.logger: the expiry timer's deletions, garbage collection, \
        kept-aside retries
        """)
    func engineWork() async throws {
        let log = LogRecorder()
        var configuration = Database.Configuration()
        configuration.logger = log.logger()
        let db = try Database.inMemory(configuration: configuration)
        try db.createTable(ExpiringReminder.self)
        try db.enableSync(for: ExpiringReminder.self)
        _ = try db.insert(ExpiringReminder(id: 1, text: "soon gone"), expiresAt: Date().addingTimeInterval(0.2))
        // The timer deletes the row by itself, nobody reading or writing.
        let deleted = try await eventually {
            log.entries.contains {
                $0.message == "deleted expired rows" && $0.level == .debug && $0.metadata["tether.rows"] == "1"
            }
        }
        #expect(deleted, "\(log.entries)")

        let removed = try db.collectGarbage()
        let collected = try #require(log.entries.last { $0.message == "collected garbage" }, "\(log.entries)")
        #expect(collected.level == .debug)
        #expect(collected.metadata["tether.tombstones_removed"] == "\(removed)")

        try db.retryKeptAside()
        let retried = try #require(
            log.entries.last { $0.message == "retried the kept-aside changes" }, "\(log.entries)")
        #expect(retried.metadata["tether.still_kept_aside"] == "0")
        #expect(!log.entries.contains { $0.level >= .warning }, "\(log.entries)")
    }

    @Test("by default nothing is logged: the default loggers discard everything")
    func silentByDefault() {
        #expect(SyncOptions().logger.handler is SwiftLogNoOpLogHandler)
        #expect(Database.Configuration().logger.handler is SwiftLogNoOpLogHandler)
    }
}
