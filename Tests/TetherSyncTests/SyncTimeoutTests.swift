import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import Tether
import TetherSync
import TetherTestSupport
import TetherWire

private func insert(_ db: Database, _ range: ClosedRange<Int>, prefix: String) throws {
    try db.write { conn in
        for id in range {
            try conn.execute("INSERT INTO t (id, name, n) VALUES (?, ?, ?)", [id, "\(prefix)-\(id)", id * 10])
        }
    }
}

private func rowCount(_ db: Database) throws -> Int {
    try db.fetchValue("SELECT count(*) FROM t", as: Int.self) ?? -1
}

/// A bare TLS client: records every frame the server sends and, if `mirrorAs` is set, answers the
/// server's HELLO with the same HELLO under that instance key (so the handshake succeeds; with
/// `capabilities` instead of the server's if given), then sends `afterHello` (raw bytes, maybe
/// hostile) and, if `closeAfterSending`, closes; otherwise stays silent (no SCOPE, no PONG, no
/// BATCH), but for `afterPull`, sent once as the answer to the server's first PULL. Without
/// `mirrorAs` it never sends anything. Returns what the server sent before the connection closed.
func silentExchange(
    port: Int, pki: TestPKI, mirrorAs: InstanceKey?, capabilities: Capabilities? = nil, afterHello: [UInt8] = [],
    afterPull: [UInt8] = [], closeAfterSending: Bool = false
) async throws -> [WireMessage] {
    let answeredPull = LockedBox(false)
    return try await scriptedExchange(
        port: port, pki: pki, as: nil, instanceKey: mirrorAs, capabilities: capabilities, scope: nil
    ) { message in
        switch message {
        case .hello where mirrorAs != nil:
            return ScriptedReply(raw: afterHello, close: closeAfterSending)
        case .pull where !afterPull.isEmpty && !answeredPull.value:
            answeredPull.withLock { $0 = true }
            return ScriptedReply(raw: afterPull)
        default:
            return .nothing
        }
    }
}

private func isTimeout(_ result: Result<SyncSummary, SyncSessionError>?) -> Bool {
    if case .failure(.timeout) = result { return true } else { return false }
}

@Suite("Sync sessions: heartbeats and timeouts")
struct SyncTimeoutTests {
    @Test(
        "a client that never sends HELLO gets ERROR timeout after the HELLO timeout; the server's session says timeout")
    func silentClient() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        let options = SyncOptions(helloTimeout: .milliseconds(300))
        let start = NIODeadline.now()
        let (messages, result) = try await runServer(server, pki: pki, options: options) { syncServer in
            try await silentExchange(port: syncServer.port, pki: pki, mirrorAs: nil)
        }
        #expect(NIODeadline.now() - start >= .milliseconds(300))
        #expect(messages.count == 2, "\(messages)")
        if case .hello = messages.first {} else { Issue.record("the server's first message is not HELLO: \(messages)") }
        guard case let .error(code, text) = messages.last else {
            Issue.record("the server's last message is not ERROR: \(messages)")
            return
        }
        #expect(code == .timeout, "\(text)")
        #expect(text.contains("HELLO"), "\(text)")
        #expect(isTimeout(result), "\(String(describing: result))")
    }

    @Test("a client that answers nothing after HELLO (not even PONG) is pinged, then gets ERROR timeout")
    func silentAfterHello() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        let options = SyncOptions(idleTimeout: .milliseconds(400), pingInterval: .milliseconds(100))
        let impostor = try makeDatabase().instanceKey
        let (messages, result) = try await runServer(server, pki: pki, options: options) { syncServer in
            try await silentExchange(port: syncServer.port, pki: pki, mirrorAs: impostor)
        }
        if case .hello = messages.first {} else { Issue.record("the server's first message is not HELLO: \(messages)") }
        #expect(messages.contains { if case .pull = $0 { return true } else { return false } }, "\(messages)")
        let pings = messages.filter { if case .ping = $0 { return true } else { return false } }
        #expect(pings.count >= 2, "\(messages)")
        guard case let .error(code, text) = messages.last else {
            Issue.record("the server's last message is not ERROR: \(messages)")
            return
        }
        #expect(code == .timeout, "\(text)")
        #expect(isTimeout(result), "\(String(describing: result))")
    }

    @Test("a session kept idle longer than the idle timeout stays open: both sides PING and answer PONG")
    func heartbeatsKeepAlive() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        let client = try makeDatabase()
        try insert(server, 1...5, prefix: "server")
        // The client does not take the server's changes, and the server not the client's: after
        // the handshake nothing but heartbeats flows until the client's wait for a PULL (the
        // idle timeout) ends and it says BYE; without heartbeats both would have timed out.
        var serverOptions = SyncOptions(idleTimeout: .milliseconds(300), pingInterval: .milliseconds(50))
        serverOptions.peers[.name("node-client")] = PeerPolicy(readOnly: true)
        var clientOptions = SyncOptions(idleTimeout: .milliseconds(600), pingInterval: .milliseconds(50))
        clientOptions.peers[.name("node-server")] = PeerPolicy(readOnly: true)
        let start = NIODeadline.now()
        let (summary, result) = try await runServer(server, pki: pki, options: serverOptions) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                options: clientOptions)
        }
        #expect(NIODeadline.now() - start >= .milliseconds(600))
        #expect(summary.changesSent == 0 && summary.changesReceived == 0, "\(summary)")
        guard case let .success(serverSummary) = result else {
            Issue.record("the server's session failed: \(String(describing: result))")
            return
        }
        #expect(serverSummary.changesSent == 0 && serverSummary.changesReceived == 0)
        #expect(try rowCount(client) == 0)
    }

    @Test("both sides marking each other read-only: syncOnce ends with an empty summary, not a hang")
    func bothReadOnly() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        let client = try makeDatabase()
        try insert(server, 1...5, prefix: "server")
        try insert(client, 100...105, prefix: "client")
        var serverOptions = SyncOptions()
        serverOptions.peers[.name("node-client")] = PeerPolicy(readOnly: true)
        var clientOptions = SyncOptions(idleTimeout: .milliseconds(300))
        clientOptions.peers[.name("node-server")] = PeerPolicy(readOnly: true)
        let (summary, result) = try await runServer(server, pki: pki, options: serverOptions) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                options: clientOptions)
        }
        #expect(summary.peer == server.instanceKey)
        #expect(summary.batchesSent == 0 && summary.batchesReceived == 0, "\(summary)")
        guard case .success = result else {
            Issue.record("the server's session failed: \(String(describing: result))")
            return
        }
        #expect(try rowCount(server) == 5)
        #expect(try rowCount(client) == 6)
    }
}

/// Whether `db` has the row `id` of `t`.
func hasRow(_ db: Database, _ id: Int) throws -> Bool {
    (try db.fetchValue("SELECT count(*) FROM t WHERE id = ?", [id], as: Int.self) ?? 0) == 1
}

/// Batches applied by one side, as an async sequence, with the options that feed it (patient:
/// the session stays open while the suite loads the machine). The stream never ends by itself:
/// each wait on it is bounded from its own start (`waitForBatches`), not from the stream's, which
/// a loaded machine once let pass before the test got to the wait.
func appliedBatches() -> (AsyncStream<Int>, SyncOptions) {
    let (stream, continuation) = AsyncStream<Int>.makeStream()
    var options = SyncOptions.patient
    options.onBatchApplied = { continuation.yield($0) }
    return (stream, options)
}

/// Waits, batch by batch, until `condition` holds: false if it still does not `eventuallyWindow`
/// after the wait began (then `batches` ends: a test fails before waiting on it again).
func waitForBatches(
    in batches: AsyncStream<Int>, until condition: @escaping @Sendable () throws -> Bool
) async throws -> Bool {
    if try condition() { return true }
    return try await withThrowingTaskGroup(of: Bool.self) { group in
        group.addTask {
            for await _ in batches where try condition() { return true }
            return try condition()
        }
        group.addTask {
            try? await Task.sleep(for: eventuallyWindow)
            return try condition()
        }
        defer { group.cancelAll() }
        return try await group.next() ?? false
    }
}

/// Waits, batch by batch, until `db` has the row `id` (see `waitForBatches`).
func waitForRow(_ db: Database, _ id: Int, in batches: AsyncStream<Int>) async throws -> Bool {
    try await waitForBatches(in: batches) { try hasRow(db, id) }
}

@Suite("Sync sessions: live push")
struct SyncLiveTests {
    @Test("a live session catches up, then pushes each side's new changes to the other via CHANGED")
    func liveBothWays() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase()
        let client = try makeDatabase()
        try insert(server, 1...10, prefix: "server")
        try insert(client, 100...110, prefix: "client")
        let (serverApplied, serverOptions) = appliedBatches()
        let (clientApplied, clientOptions) = appliedBatches()
        let (summary, result) = try await runServer(server, pki: pki, options: serverOptions) { syncServer in
            let connection = try await SyncClient.connect(
                database: client, host: "127.0.0.1", port: syncServer.port,
                tls: try pki.clientContext(), options: clientOptions)
            #expect(try rowCount(client) == 21)
            #expect(try rowCount(server) == 21)

            try insert(server, 50...52, prefix: "server-live")
            syncServer.notifyLocalChanges()
            #expect(try await waitForRow(client, 52, in: clientApplied))

            try insert(client, 200...201, prefix: "client-live")
            connection.notifyLocalChanges()
            #expect(try await waitForRow(server, 201, in: serverApplied))

            // Without a notification: the periodic check finds it.
            try insert(server, 60...60, prefix: "server-unnotified")
            #expect(try await waitForRow(client, 60, in: clientApplied))
            return try await connection.stop()
        }
        #expect(try rowCount(client) == 27)
        #expect(try rowCount(server) == 27)
        #expect(summary.changesReceived == 14, "\(summary)")
        #expect(summary.changesSent == 13, "\(summary)")
        guard case .success = result else {
            Issue.record("the server's session failed: \(String(describing: result))")
            return
        }
    }
}
