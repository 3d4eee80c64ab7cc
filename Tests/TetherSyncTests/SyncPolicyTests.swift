import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import Tether
@testable import TetherSync
import TetherWire

/// A database with the synced table `t` and, with `withU`, the synced table `u`.
func makeSyncedDatabase(withU: Bool = false) throws -> Database {
    let db = try Database.inMemory()
    try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, n INTEGER)")
    try db.enableSync(table: "t")
    if withU {
        try db.execute("CREATE TABLE u (id INTEGER PRIMARY KEY, label TEXT)")
        try db.enableSync(table: "u")
    }
    return db
}

private func dump(_ db: Database, table: String = "t") throws -> [String] {
    let columns = table == "t" ? "id, name, n" : "id, label"
    return try db.fetchRows("SELECT \(columns) FROM \(table) ORDER BY id").map { row in
        (0..<row.count).map { "\(row[$0])" }.joined(separator: "|")
    }
}

private func pendingCount(_ db: Database, table: String = "t") throws -> Int {
    try db.pendingChangeCount(tables: [table])
}

private func inFlightCount(_ db: Database) throws -> Int {
    try db.fetchValue("SELECT count(*) FROM tether_rows_t WHERE in_flight != 0", as: Int.self) ?? -1
}

private func insert(_ db: Database, _ range: ClosedRange<Int>, prefix: String) throws {
    try db.write { conn in
        for id in range {
            try conn.execute("INSERT INTO t (id, name, n) VALUES (?, ?, ?)", [id, "\(prefix)-\(id)", id * 10])
        }
    }
}

private func insertU(_ db: Database, _ range: ClosedRange<Int>, prefix: String) throws {
    try db.write { conn in
        for id in range {
            try conn.execute("INSERT INTO u (id, label) VALUES (?, ?)", [id, "\(prefix)-\(id)"])
        }
    }
}

/// Runs `body` with a sync server over `database`, then stops it and returns the first session's result too.
func runServer<T: Sendable>(
    _ database: Database, pki: TestPKI, options: SyncOptions = .patientServer, _ body: (SyncServer) async throws -> T
) async throws -> (T, Result<SyncSummary, SyncSessionError>?) {
    let server = try await SyncServer.start(
        database: database, host: "127.0.0.1", port: 0, tls: try pki.serverContext(), options: options)
    do {
        let result = try await body(server)
        var iterator = server.sessionResults.makeAsyncIterator()
        let first = await iterator.next()
        try await server.stop()
        return (result, first)
    } catch {
        try? await server.stop()
        throw error
    }
}

/// syncOnce's outcome: its summary, or the description of its error.
private enum Outcome: Sendable {
    case success(SyncSummary)
    case failure(String)
}

private func attempt(_ client: Database, port: Int, tls: TLSContext, options: SyncOptions = SyncOptions()) async
    -> Outcome
{
    do {
        return .success(
            try await SyncClient.syncOnce(database: client, host: "127.0.0.1", port: port, tls: tls, options: options))
    } catch {
        return .failure("\(error)")
    }
}

private let smallBatches = SyncOptions(batchLimits: BatchLimits(maximumChanges: 100, maximumBytes: 1 << 20))

@Suite("Sync sessions: peer authorization")
struct SyncAuthorizationTests {
    @Test("a certificate outside the allowlist is refused with ERROR unauthorized; neither database changes")
    func unknownCertificate() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...20, prefix: "server")
        try insert(client, 100...110, prefix: "client")
        let serverBefore = try dump(server)
        let clientBefore = try dump(client)
        let options = SyncOptions(peers: .only([.name("node-other"): PeerPolicy()]))

        let (outcome, serverResult) = try await runServer(server, pki: pki, options: options) { syncServer in
            await attempt(client, port: syncServer.port, tls: try pki.clientContext())
        }
        guard case let .failure(text) = outcome else {
            Issue.record("syncOnce succeeded although the client's key is not allowed")
            return
        }
        #expect(text.contains("ERROR 3") && text.contains("node-client"), "\(text)")
        guard case let .failure(.unauthorized(reason)) = serverResult else {
            Issue.record("the server's session did not fail with unauthorized: \(String(describing: serverResult))")
            return
        }
        #expect(reason.contains("node-client") && reason.contains(pki.client.fingerprint), "\(reason)")
        #expect(try dump(server) == serverBefore)
        #expect(try dump(client) == clientBefore)
        #expect(try client.cursor(for: server.instanceKey).after == 0)
        #expect(try server.cursor(for: client.instanceKey).after == 0)
        #expect(try pendingCount(client) == 11)
        #expect(try pendingCount(server) == 20)
    }

    @Test("a fingerprint allowlist accepts the listed certificate and refuses another")
    func fingerprintAllowlist() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let other = try pki.issue(commonName: "node-other", as: "other")
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        let outsider = try makeSyncedDatabase()
        try insert(server, 1...10, prefix: "server")
        try insert(outsider, 50...60, prefix: "outsider")
        let options = SyncOptions(peers: .only([.fingerprint(pki.client.fingerprint.uppercased()): PeerPolicy()]))

        let (outcomes, _) = try await runServer(server, pki: pki, options: options) { syncServer in
            let accepted = await attempt(client, port: syncServer.port, tls: try pki.clientContext())
            let refused = await attempt(outsider, port: syncServer.port, tls: try pki.clientContext(other))
            return (accepted, refused)
        }
        if case let .failure(text) = outcomes.0 { Issue.record("the allowed certificate was refused: \(text)") }
        guard case let .failure(text) = outcomes.1 else {
            Issue.record("the other certificate was accepted")
            return
        }
        #expect(text.contains("ERROR 3") && text.contains(other.fingerprint), "\(text)")
        #expect(try dump(client) == dump(server))
        #expect(try dump(server).count == 10)
        #expect(try dump(outsider).count == 11)
        #expect(try pendingCount(outsider) == 11)
    }

    @Test("a read-only peer receives the server's changes, but its own are not applied there")
    func readOnlyPeer() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...250, prefix: "server")
        try insert(client, 1_000...1_020, prefix: "client")
        let serverBefore = try dump(server)
        var options = smallBatches
        options.peers[.name("node-client")] = PeerPolicy(readOnly: true)

        let (outcome, serverResult) = try await runServer(server, pki: pki, options: options) { syncServer in
            await attempt(client, port: syncServer.port, tls: try pki.clientContext(), options: smallBatches)
        }
        guard case let .success(summary) = outcome else {
            Issue.record("syncOnce failed: \(outcome)")
            return
        }
        guard case let .success(serverSummary) = serverResult else {
            Issue.record("the server's session failed: \(String(describing: serverResult))")
            return
        }
        #expect(summary.changesReceived == 250)
        #expect(summary.changesSent == 0)
        #expect(serverSummary.batchesReceived == 0)
        #expect(try dump(server) == serverBefore)
        #expect(try dump(client).count == 271)
        #expect(try pendingCount(server) == 0)
        #expect(try pendingCount(client) == 21, "the client's own changes stay pending")
        #expect(try server.cursor(for: client.instanceKey).after == 0)
    }

    @Test("a batch changing a table the peer may not sync is refused whole; nothing of it is applied")
    func tableNotAllowed() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase(withU: true)
        let client = try makeSyncedDatabase(withU: true)
        try insert(client, 1...30, prefix: "client")
        try insertU(client, 1...5, prefix: "client")
        var options = SyncOptions()
        options.peers[.name("node-client")] = PeerPolicy(allowedTables: ["t"])

        let (outcome, serverResult) = try await runServer(server, pki: pki, options: options) { syncServer in
            await attempt(client, port: syncServer.port, tls: try pki.clientContext())
        }
        guard case let .failure(text) = outcome else {
            Issue.record("syncOnce succeeded although the client sent table u")
            return
        }
        #expect(text.contains("ERROR 5") && text.contains("table u"), "\(text)")
        guard case let .failure(.tableNotAllowed(reason)) = serverResult else {
            Issue.record("the server's session did not fail with tableNotAllowed: \(String(describing: serverResult))")
            return
        }
        #expect(reason.contains("table u"), "\(reason)")
        #expect(try dump(server).isEmpty)
        #expect(try dump(server, table: "u").isEmpty)
        #expect(try server.cursor(for: client.instanceKey).after == 0)
        #expect(try pendingCount(client) == 30)
        #expect(try pendingCount(client, table: "u") == 5)
    }

    @Test("changes to tables a peer may not sync are not sent to it, and stay pending")
    func tablesNotSent() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase(withU: true)
        let client = try makeSyncedDatabase(withU: true)
        try insert(server, 1...30, prefix: "server")
        try insertU(server, 1...5, prefix: "server")
        try insert(client, 100...110, prefix: "client")
        var options = SyncOptions()
        options.peers[.name("node-client")] = PeerPolicy(allowedTables: ["t"])

        let (outcome, _) = try await runServer(server, pki: pki, options: options) { syncServer in
            await attempt(client, port: syncServer.port, tls: try pki.clientContext())
        }
        guard case let .success(summary) = outcome else {
            Issue.record("syncOnce failed: \(outcome)")
            return
        }
        #expect(summary.changesReceived == 30)
        #expect(try dump(client) == dump(server))
        #expect(try dump(client, table: "u").isEmpty)
        #expect(try pendingCount(server, table: "u") == 5)
        // Sent to a restricted peer, rows are not marked in flight: its ACK does not mark them synced.
        #expect(try pendingCount(server) == 30)
        #expect(try pendingCount(client) == 0)
    }

    @Test(
        """
        a rule follows the certificate, not the key the peer declares: a fresh database behind a read-only \
        certificate is still read-only
        """)
    func readOnlyFollowsTheCertificate() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...5, prefix: "server")
        var options = SyncOptions()
        options.peers[.name("node-client")] = PeerPolicy(readOnly: true)

        // Another database (another instance key) presented with the same certificate: under
        // rules keyed by instance key, its rows landed on the server.
        let fresh = try makeSyncedDatabase()
        try insert(fresh, 500...502, prefix: "from-b2-same-cert")
        let (outcomes, _) = try await runServer(server, pki: pki, options: options) { syncServer in
            (
                await attempt(client, port: syncServer.port, tls: try pki.clientContext()),
                await attempt(fresh, port: syncServer.port, tls: try pki.clientContext())
            )
        }
        for outcome in [outcomes.0, outcomes.1] {
            if case let .failure(text) = outcome { Issue.record("a read-only peer's sync failed: \(text)") }
        }
        #expect(try dump(server).count == 5, "no row of the read-only certificate's databases reached the server")
        #expect(try dump(fresh).count == 8)
        #expect(try pendingCount(fresh) == 3)
    }

    @Test(
        """
        an instance key is pinned to the certificate that first presented it: another certificate presenting it \
        is refused, naming both
        """)
    func instanceKeyPinnedToCertificate() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let other = try pki.issue(commonName: "node-other", as: "other")
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        let rekeyed = try makeSyncedDatabase()
        try insert(client, 1...3, prefix: "client")

        let (outcomes, _) = try await runServer(server, pki: pki) { syncServer in
            let first = await attempt(client, port: syncServer.port, tls: try pki.clientContext())
            try insert(client, 4...6, prefix: "client-later")
            // The same database, hence the same instance key, behind another certificate.
            let impostor = await attempt(client, port: syncServer.port, tls: try pki.clientContext(other))
            // The first certificate may present a new key (a rekeyed or restored database).
            let newKey = await attempt(rekeyed, port: syncServer.port, tls: try pki.clientContext())
            return (first, impostor, newKey)
        }
        if case let .failure(text) = outcomes.0 { Issue.record("the first session failed: \(text)") }
        guard case let .failure(text) = outcomes.1 else {
            Issue.record("a second certificate synced under the first one's instance key")
            return
        }
        #expect(
            text.contains("ERROR 3") && text.contains("\(client.instanceKey)") && text.contains("node-client")
                && text.contains("node-other") && text.contains("tether rekey"), "\(text)")
        if case let .failure(text) = outcomes.2 {
            Issue.record("a new key from a known certificate was refused: \(text)")
        }
        #expect(try dump(server).count == 3, "nothing of the refused session was applied")
        #expect(try server.cursor(for: client.instanceKey).after == 3)
        let pins = try server.peerCertificates()
        #expect(pins[client.instanceKey] == "node-client")
        #expect(pins[rekeyed.instanceKey] == "node-client")
        #expect(try client.peerCertificates()[server.instanceKey] == "node-server")
    }

}

@Suite("Sync sessions: topologies and failures")
struct SyncTopologyTests {
    @Test("three peers in a line A–B–C: changes travel both ways through B, and nothing is echoed back")
    func lineOfThree() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try makeSyncedDatabase()
        let b = try makeSyncedDatabase()
        let c = try makeSyncedDatabase()
        try insert(a, 1...100, prefix: "a")
        try insert(b, 101...150, prefix: "b")
        try insert(c, 201...300, prefix: "c")

        let (results, _) = try await runServer(b, pki: pki, options: smallBatches) { syncServer in
            let tls = try pki.clientContext()
            func sync(_ db: Database) async throws -> SyncSummary {
                try await SyncClient.syncOnce(
                    database: db, host: "127.0.0.1", port: syncServer.port, tls: tls, options: smallBatches)
            }
            let first = [try await sync(a), try await sync(c), try await sync(a)]
            let bBefore = try dump(b)
            return (first + [try await sync(c)], bBefore)
        }
        let (summaries, bBefore) = results
        // A ↔ B: A's 100 rows to B, B's 50 to A.
        #expect(summaries[0].changesSent == 100 && summaries[0].changesReceived == 50)
        // B ↔ C: C gets A's and B's rows, B gets C's.
        #expect(summaries[1].changesSent == 100 && summaries[1].changesReceived == 150)
        // A ↔ B again: exactly C's rows, none of A's own rows echoed back.
        #expect(summaries[2].changesReceived == 100, "B sent A \(summaries[2].changesReceived) change(s)")
        #expect(summaries[2].changesSent == 0)
        // C ↔ B again: nothing either way. C received A's rows from B, so it does not send them back.
        #expect(summaries[3].changesReceived == 0, "\(summaries[3])")
        #expect(summaries[3].changesSent == 0, "\(summaries[3])")
        // Inspecting B's extract for A directly: nothing of A's is pending for it.
        let echo = try b.extractChanges(for: a.instanceKey, after: 0, markInFlight: false)
        let aRows = echo.changes.filter { change in
            if case let .integer(id) = change.key.first { return id <= 100 } else { return false }
        }
        #expect(aRows.isEmpty, "B would send A \(aRows.count) of A's own rows")
        let rows = try dump(a)
        #expect(rows.count == 250)
        #expect(try dump(b) == rows)
        #expect(bBefore == rows)
        #expect(try dump(c) == rows)
        #expect(try pendingCount(a) == 0 && pendingCount(b) == 0 && pendingCount(c) == 0)
    }

    /// A server of 500 rows and a client of 300 of its own sync in batches of 100: the first
    /// session is cut once the catch-up's first batch is applied (or staged, `whole`), and a second
    /// one goes to the end. Checks what both cases share (the cut session failed during the catch-up
    /// after one batch, the second succeeded, and all rows reached both sides, nothing pending);
    /// returns what the client held between the two sessions and the second one's summary.
    private func cutAndResumedCatchUp(whole: Bool) async throws -> CutCatchUp {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...500, prefix: "server")
        try insert(client, 1_001...1_300, prefix: "client")

        var resuming = smallBatches
        resuming.wholeCatchUps = whole
        var cutting = resuming
        let doneBeforeCut = NIOLockedValueBox(0)
        let cut: @Sendable (Int) -> Bool = { count in
            doneBeforeCut.withLockedValue { $0 = count }
            return count < 1
        }
        if whole { cutting.testHooks.batchStagedHook = cut } else { cutting.testHooks.batchAppliedHook = cut }
        let (outcome, _) = try await runServer(server, pki: pki, options: smallBatches) { syncServer in
            let tls = try pki.clientContext()
            let first = await attempt(client, port: syncServer.port, tls: tls, options: cutting)
            let between = CutCatchUpBetween(
                cursor: try client.cursor(for: server.instanceKey).after, inFlight: try inFlightCount(server),
                rows: try dump(client).count, staged: try client.stagedCatchUp(from: server.instanceKey))
            let second = await attempt(client, port: syncServer.port, tls: tls, options: resuming)
            return (first, second, between)
        }
        let (first, second, between) = outcome
        guard case let .failure(text) = first else { throw CutCatchUpFailure("the cut session succeeded") }
        #expect(text.contains("catch-up"), "\(text)")
        #expect(doneBeforeCut.withLockedValue { $0 } == 1)
        guard case let .success(resumed) = second else {
            throw CutCatchUpFailure("the resumed session failed: \(second)")
        }
        let rows = try dump(client)
        #expect(rows.count == 800)
        #expect(try dump(server) == rows)
        #expect(try pendingCount(server) == 0)
        #expect(try pendingCount(client) == 0)
        #expect(try inFlightCount(server) == 0)
        #expect(try client.stagedCatchUp(from: server.instanceKey) == nil)
        return CutCatchUp(between: between, resumed: resumed)
    }

    @Test("a catch-up cut after the first applied batch resumes: nothing lost, nothing applied twice")
    func cutAndResume() async throws {
        let (between, second) = try await cutAndResumedCatchUp(whole: false)
        #expect(between.cursor > 0, "the first batch's cursor was committed")
        #expect(between.inFlight >= 100, "the first batch's rows are in flight on the server, unacknowledged")
        // The batches pulled while the first was applied (pipelining, follow-on PULLs: at most three
        // held or coming) may have been applied too.
        #expect([400, 500, 600].contains(between.rows), "\(between.rows)")
        // The resumed session starts after the applied batches: only the rows not yet received.
        #expect(second.changesReceived == 800 - between.rows, "received \(second.changesReceived)")
        #expect(second.applied == 800 - between.rows)
    }

    @Test(
        """
        a whole catch-up cut after its first staged batch shows the state before it, and resumes after what was \
        staged: nothing lost, nothing fetched or applied twice
        """)
    func wholeCatchUpCutAndResumed() async throws {
        let (between, second) = try await cutAndResumedCatchUp(whole: true)
        #expect(between.cursor == 0, "nothing of the catch-up was applied: the cursor did not move")
        #expect(between.inFlight >= 100, "the staged batch's rows are in flight on the server, unacknowledged")
        // The state before the catch-up, whole: the client's own rows and none of the server's.
        #expect(between.rows == 300, "\(between.rows)")
        // The batches pulled while the first was staged (pipelining, follow-on PULLs: at most three
        // held or coming) may have been staged too.
        let staged = try #require(between.staged)
        #expect(staged.after == 0 && [100, 200, 300].contains(staged.changes), "\(staged)")
        // The resumed session starts after the staged batches: only the rows not yet received come,
        // and the whole catch-up is applied once.
        #expect(second.changesReceived == 500 - staged.changes, "received \(second.changesReceived)")
        #expect(second.applied == 500)
    }
}

/// What `cutAndResumedCatchUp(whole:)` saw: what the client held between the cut session and the
/// next, and the next one's summary.
private typealias CutCatchUp = (between: CutCatchUpBetween, resumed: SyncSummary)

private struct CutCatchUpBetween: Sendable {
    var cursor: Int64
    var inFlight: Int
    var rows: Int
    var staged: StagedCatchUp?
}

/// A session of `cutAndResumedCatchUp(whole:)` that did not end as the test needs.
private struct CutCatchUpFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

@Suite("Sync sessions: a read-only peer that pushes")
struct SyncReadOnlyPushTests {
    @Test("an unsolicited BATCH from a read-only peer gets ERROR readOnly; nothing of it is applied")
    func unsolicitedBatch() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        try insert(server, 1...5, prefix: "server")
        try insert(client, 100...110, prefix: "client")
        let serverBefore = try dump(server)
        let schema = try LocalSchema.load(from: client)
        let hello = Hello(
            instanceKey: schema.instanceKey, schemaFingerprint: schema.fingerprint, capabilities: [],
            tables: schema.tables)
        let batch = try client.extractChanges(for: server.instanceKey, after: 0, markInFlight: false)
        let encoder = FrameEncoder(compression: false)
        let bytes = try encoder.encode(.hello(hello)) + encoder.encode(.batch(batch))
        var options = SyncOptions.patientServer
        options.peers[.name("node-client")] = PeerPolicy(readOnly: true)

        let (messages, result) = try await runServer(server, pki: pki, options: options) { syncServer in
            try await rawExchange(port: syncServer.port, pki: pki, sending: bytes)
        }
        if case .hello = messages.first {} else { Issue.record("the server's first message is not HELLO: \(messages)") }
        guard case let .error(code, text) = messages.last else {
            Issue.record("the server's last message is not ERROR: \(messages)")
            return
        }
        #expect(code == .readOnly, "\(text)")
        #expect(
            !messages.contains { if case .pull = $0 { return true } else { return false } },
            "the server pulled from a read-only peer")
        guard case .failure(.readOnly) = result else {
            Issue.record("the server's session did not fail with readOnly: \(String(describing: result))")
            return
        }
        #expect(try dump(server) == serverBefore)
        #expect(try server.cursor(for: client.instanceKey).after == 0)
    }
}
