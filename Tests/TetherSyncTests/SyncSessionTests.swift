import Foundation
import NIOCore
import NIOPosix
import Testing
import Tether
import TetherSync
import TetherTestSupport
import TetherWire

/// Every row of `t`, in key order.
private func dump(_ db: Database) throws -> [String] {
    try db.fetchRows("SELECT id, name, n FROM t ORDER BY id").map { "\($0[0])|\($0[1])|\($0[2])" }
}

/// Rows with a local change not yet acknowledged by the peer (live rows and tombstones).
private func pendingCount(_ db: Database) throws -> Int {
    try db.pendingChangeCount(tables: ["t"])
}

/// Inserts ids in `range` in one transaction.
private func insert(_ db: Database, _ range: ClosedRange<Int>, prefix: String) throws {
    try db.write { conn in
        for id in range {
            try conn.execute("INSERT INTO t (id, name, n) VALUES (?, ?, ?)", [id, "\(prefix)-\(id)", id * 10])
        }
    }
}

extension SyncOptions {
    /// The defaults, but a server that waits a minute for the client's HELLO: the whole suite
    /// runs at once on two cores, and a test's client side can wait seconds for a thread of the
    /// cooperative pool before it sends HELLO. Tests of the HELLO timeout set their own.
    static var patientServer: SyncOptions { SyncOptions(helloTimeout: .seconds(60)) }

    /// `patientServer`, with a two-minute idle timeout: for a session held open over a test while
    /// the suite shares the machine, where this process may not run for seconds on end. Tests of
    /// timeouts and heartbeats set their own.
    static var patient: SyncOptions { SyncOptions(helloTimeout: .seconds(60), idleTimeout: .seconds(120)) }
}

/// Runs `body` with a sync server over `database`, always stopping it.
func withSyncServer<T>(
    _ database: Database, pki: TestPKI, options: SyncOptions = .patientServer, _ body: (SyncServer) async throws -> T
) async throws -> T {
    let server = try await SyncServer.start(
        database: database, host: "127.0.0.1", port: 0, tls: try pki.serverContext(), options: options)
    do {
        let result = try await body(server)
        try await server.stop()
        return result
    } catch {
        try? await server.stop()
        throw error
    }
}

/// Small batches, so that thousands of rows take several of them each way.
private let smallBatches = SyncOptions(batchLimits: BatchLimits(maximumChanges: 400, maximumBytes: 1 << 20))

@Suite("Sync sessions over TLS")
struct SyncSessionTests {
    @Test("syncOnce catches up both ways over several batches; both sides end identical, nothing pending")
    func catchUpBothWays() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        let client = try makeDatabase()
        try insert(server, 1...3_000, prefix: "server")
        try insert(client, 2_501...5_000, prefix: "client")
        try server.execute("UPDATE t SET n = n + 1 WHERE id % 7 = 0")
        try client.execute("UPDATE t SET name = 'edited' WHERE id % 5 = 0")
        try server.execute("DELETE FROM t WHERE id BETWEEN 100 AND 149")
        try client.execute("DELETE FROM t WHERE id BETWEEN 4900 AND 4909")

        let (summary, serverResult, settling) = try await withSyncServer(server, pki: pki, options: smallBatches) {
            syncServer in
            let summary = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port,
                tls: try pki.clientContext(), options: smallBatches)
            var results = syncServer.sessionResults.makeAsyncIterator()
            let serverResult = await results.next()
            // A row both sides changed, merged here while this side's change was in flight, has a
            // new sequence number that the peer's ACK (of the batch that sent it) does not reach: it
            // stays pending until the next session acknowledges it, which sends nothing the peer lacks.
            let settling = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port,
                tls: try pki.clientContext(), options: smallBatches)
            return (summary, serverResult, settling)
        }
        #expect(settling.applied == 0, "the second session applied \(settling.applied) change(s)")
        guard case let .success(serverSummary) = serverResult else {
            Issue.record("the server's session did not end with BYE: \(String(describing: serverResult))")
            return
        }
        #expect(serverSummary.peer == client.instanceKey)
        #expect(serverSummary.changesSent == summary.changesReceived)
        #expect(serverSummary.changesReceived == summary.changesSent)
        #expect(summary.peer == server.instanceKey)
        #expect(summary.batchesReceived > 3, "expected several batches from the server, got \(summary.batchesReceived)")
        #expect(summary.batchesSent > 3, "expected several batches to the server, got \(summary.batchesSent)")
        // Overlapping rows the client's later writes won may not come back (they originate here), so not all 3,000.
        #expect(summary.changesReceived >= 2_500)
        #expect(summary.changesSent >= 2_500)
        #expect(summary.applied > 0)

        let serverRows = try dump(server)
        let clientRows = try dump(client)
        #expect(serverRows.count == 5_000 - 50 - 10)
        #expect(serverRows == clientRows)
        #expect(try pendingCount(client) == 0)
        #expect(try pendingCount(server) == 0)
    }

    @Test("a second syncOnce right after the first transfers nothing")
    func secondSyncTransfersNothing() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        let client = try makeDatabase()
        try insert(server, 1...1_200, prefix: "server")
        try insert(client, 1_001...2_000, prefix: "client")
        try client.execute("UPDATE t SET n = -n WHERE id % 3 = 0")

        let (first, second) = try await withSyncServer(server, pki: pki, options: smallBatches) { syncServer in
            let tls = try pki.clientContext()
            let first = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: tls, options: smallBatches)
            let second = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: tls, options: smallBatches)
            return (first, second)
        }
        #expect(first.changesSent > 0 && first.changesReceived > 0)
        #expect(second.changesSent == 0, "the second session sent \(second.changesSent) change(s)")
        #expect(second.changesReceived == 0, "the second session received \(second.changesReceived) change(s)")
        #expect(second.applied == 0)
        #expect(try dump(server) == dump(client))
        #expect(try pendingCount(client) == 0)
    }

    @Test("peers whose tables differ by a column sync what both have; the other column keeps its values")
    func peersWithAnotherColumnSyncWhatTheyShare() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase(columns: "name TEXT, n INTEGER, color TEXT")
        let client = try makeDatabase()
        try server.execute("INSERT INTO t (id, name, n, color) VALUES (1, 'a', 1, 'red'), (2, 'b', 2, 'blue')")
        try insert(client, 10...20, prefix: "client")

        let summary = try await withSyncServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
        #expect(summary.changesSent == 11 && summary.changesReceived == 2)
        #expect(try dump(server) == dump(client))
        #expect(
            try server.fetchRows("SELECT id, color FROM t WHERE id < 3 OR id = 10 ORDER BY id").map {
                "\($0[0])|\($0[1])"
            }
                == ["1|'red'", "2|'blue'", "10|NULL"])
        #expect(try pendingCount(client) == 0)
        let differences = try client.peerSchemas().first?.differences ?? []
        #expect(differences == ["table t: column color is synced by the peer, not here"])
    }

    @Test("a table identified by other key columns on each side is ERROR 2 naming it; neither database changes")
    func keyMismatch() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try Database.inMemory()
        try server.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, n INTEGER)")
        try server.enableSync(table: "t", identity: ["name"])
        let client = try makeDatabase()
        try server.execute("INSERT INTO t (id, name, n) VALUES (1, 'a', 1), (2, 'b', 2)")
        try insert(client, 10...20, prefix: "client")
        let serverBefore = try dump(server)
        let clientBefore = try dump(client)

        let outcome: Result<SyncSummary, any Error> = try await withSyncServer(server, pki: pki) { syncServer in
            do {
                return .success(
                    try await SyncClient.syncOnce(
                        database: client, host: "127.0.0.1", port: syncServer.port,
                        tls: try pki.clientContext()))
            } catch {
                return .failure(error)
            }
        }
        guard case let .failure(error) = outcome else {
            Issue.record("syncOnce succeeded despite the key mismatch")
            return
        }
        guard case let .schemaMismatch(table, _, message) = error as? SyncSessionError else {
            Issue.record("expected SyncSessionError.schemaMismatch, got \(error)")
            return
        }
        #expect(table == "t")
        #expect(message.contains("table t") && message.contains("key columns differ"), "\(message)")
        #expect(try dump(server) == serverBefore)
        #expect(try dump(client) == clientBefore)
        #expect(try client.cursor(for: server.instanceKey).after == 0)
        #expect(try server.cursor(for: client.instanceKey).after == 0)
        #expect(try pendingCount(client) == 11)
    }
}

/// Connects a bare TLS client (no session) to `port`, sends `bytes` once the
/// handshake is done, and returns the messages the server sent before closing.
func rawExchange(port: Int, pki: TestPKI, sending bytes: [UInt8]) async throws -> [WireMessage] {
    let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    do {
        let loop = group.next()
        let log = ConnectionLog(eventLoop: loop)
        let tls = try pki.clientContext()
        let channel = try await ClientBootstrap(group: loop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        try TLSHandler(context: tls), Recorder(log: log, echo: false),
                    ])
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        _ = try await awaitResult(log.handshakeCompleted.futureResult, "the TLS handshake")
        try await channel.send(bytes).get()
        try await awaitResult(log.closed.futureResult, "the server to close the connection")
        try await group.shutdownGracefully()
        var decoder = FrameDecoder()
        decoder.append(log.received)
        var messages: [WireMessage] = []
        while let message = try decoder.nextMessage() { messages.append(message) }
        return messages
    } catch {
        try? await group.shutdownGracefully()
        throw error
    }
}

@Suite("Sync sessions: refused peers")
struct SyncSessionRefusalTests {
    /// The server answers HELLO, then ERROR with `code`, closes, and reports `expected` for the session.
    private func expectRefusal(
        sending bytes: [UInt8], code: WireErrorCode, text expectedText: String? = nil,
        _ matches: (SyncSessionError) -> Bool
    ) async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        try insert(server, 1...10, prefix: "server")
        let before = try dump(server)
        let (messages, result) = try await withSyncServer(server, pki: pki) { syncServer in
            let messages = try await rawExchange(port: syncServer.port, pki: pki, sending: bytes)
            var iterator = syncServer.sessionResults.makeAsyncIterator()
            return (messages, await iterator.next())
        }
        #expect(messages.count == 2, "\(messages)")
        if case .hello = messages.first {} else { Issue.record("the server's first message is not HELLO: \(messages)") }
        guard case let .error(received, text) = messages.last else {
            Issue.record("the server's last message is not ERROR: \(messages)")
            return
        }
        #expect(received == code, "\(text)")
        if let expectedText { #expect(text.contains(expectedText), "\(text)") }
        guard case let .failure(error) = result else {
            Issue.record("the server's session did not fail: \(String(describing: result))")
            return
        }
        #expect(matches(error), "\(error)")
        #expect(try dump(server) == before)
    }

    @Test("an unknown frame type gets ERROR malformedFrame, and the server closes")
    func unknownFrameType() async throws {
        try await expectRefusal(sending: [0, 0, 0, 2, 42, 0], code: .malformedFrame) {
            if case .malformedFrame(.unknownMessageType(42)) = $0 { return true } else { return false }
        }
    }

    @Test(
        """
        a HELLO of protocol version 1 (a peer not upgraded) gets ERROR protocolVersion saying which version this \
        peer speaks
        """)
    func otherProtocolVersion() async throws {
        try await expectRefusal(
            sending: [0, 0, 0, 3, 1, 0, 1], code: .protocolVersion, text: "this peer speaks version 2"
        ) {
            if case .protocolVersion(peerVersion: 1) = $0 { return true } else { return false }
        }
    }

    @Test("a PULL before HELLO gets ERROR malformedFrame")
    func pullBeforeHello() async throws {
        let pull = try FrameEncoder(compression: false).encode(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000)))
        try await expectRefusal(sending: pull, code: .malformedFrame) {
            if case .protocolViolation = $0 { return true } else { return false }
        }
    }
}

/// Sends `frames` as soon as the TLS handshake is done, then closes: a scripted server.
private final class ScriptedPeer: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let frames: [UInt8]
    init(frames: [UInt8]) { self.frames = frames }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is TLSHandshakeCompleted {
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: frames)), promise: nil)
            context.close(promise: nil)
        }
        context.fireUserInboundEventTriggered(event)
    }
}

@Suite("Sync sessions: the client's errors")
struct SyncClientErrorTests {
    /// Runs syncOnce against a TLS server that sends `frames` and closes; returns the error syncOnce threw.
    private func syncAgainstScript(_ frames: [UInt8]) async throws -> (any Error)? {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let client = try makeDatabase()
        try insert(client, 1...5, prefix: "client")
        let serverTLS = try pki.serverContext()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let channel: Channel
        do {
            channel = try await ServerBootstrap(group: group)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandlers([
                            try TLSHandler(context: serverTLS), ScriptedPeer(frames: frames),
                        ])
                    }
                }
                .bind(host: "127.0.0.1", port: 0).get()
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
        var thrown: (any Error)?
        do {
            _ = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: channel.localAddress?.port ?? 0,
                tls: try pki.clientContext())
        } catch {
            thrown = error
        }
        try? await channel.close()
        try await group.shutdownGracefully()
        #expect(try pendingCount(client) == 5)
        return thrown
    }

    @Test("an ERROR from the server is surfaced as peerError with its code and message")
    func peerError() async throws {
        let frame = try FrameEncoder(compression: false).encode(
            .error(code: .unauthorized, message: "instance key not accepted"))
        let error = try await syncAgainstScript(frame)
        #expect(
            error as? SyncSessionError == .peerError(code: .unauthorized, message: "instance key not accepted"),
            "\(String(describing: error))")
    }

    @Test("connecting to a port nobody listens on throws, and leaves the database alone")
    func nobodyListening() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let client = try makeDatabase()
        try insert(client, 1...3, prefix: "client")
        let server = try await SyncServer.start(database: try makeDatabase(), port: 0, tls: try pki.serverContext())
        let port = server.port
        try await server.stop()
        await #expect(throws: (any Error).self) {
            try await SyncClient.syncOnce(database: client, host: "127.0.0.1", port: port, tls: try pki.clientContext())
        }
        #expect(try pendingCount(client) == 3)
    }

    @Test("a server that closes without a word fails the session: the connection ended during the handshake")
    func silentClose() async throws {
        let error = try await syncAgainstScript([])
        #expect(
            error as? SyncSessionError == .connectionClosed(during: "the handshake"), "\(String(describing: error))")
    }
}
