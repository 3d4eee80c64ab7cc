import NIOConcurrencyHelpers
import NIOCore
import Testing
@testable import Tether
@testable import TetherSync
import TetherWire

/// A commit through the same `Database` reaches the live sessions from the commit itself, not
/// from the periodic check for other programs' writes, which here would come only after ten
/// minutes: the row arrives within the safety net of `appliedBatches`, or the test fails.
@Suite("Sync sessions: a commit in this process wakes the sessions at once")
struct SameProcessCommitTests {
    /// The periodic check for other programs' writes, never reached by these tests.
    static let distantCheck = TimeAmount.minutes(10)

    @Test(
        """
        observeCommittedSequences tells the last sequence number of each commit that gave some, until its token \
        is cancelled
        """)
    func watcherSeesEachCommit() throws {
        let db = try makeSyncedDatabase()
        try db.execute("CREATE TABLE unsynced (id INTEGER PRIMARY KEY)")
        let seen = NIOLockedValueBox<[Int64]>([])
        let token = db.observeCommittedSequences { last in seen.withLockedValue { $0.append(last) } }
        var expected: [Int64] = []
        try db.execute("INSERT INTO t (id, name, n) VALUES (1, 'one', 1)")
        expected.append(try db.lastSequence())
        try db.write { conn in
            try conn.execute("INSERT INTO t (id, name, n) VALUES (2, 'two', 2)")
            try conn.execute("INSERT INTO t (id, name, n) VALUES (3, 'three', 3)")
        }
        expected.append(try db.lastSequence())
        // Nothing for a commit that gave no sequence number, nor for a rolled-back one.
        try db.execute("INSERT INTO unsynced (id) VALUES (1)")
        _ = try? db.write { conn in
            try conn.execute("INSERT INTO t (id, name, n) VALUES (4, 'four', 4)")
            throw CancellationError()
        }
        #expect(seen.withLockedValue { $0 } == expected)
        #expect(expected.count == 2 && expected[0] < expected[1])
        token.cancel()
        try db.execute("INSERT INTO t (id, name, n) VALUES (5, 'five', 5)")
        #expect(seen.withLockedValue { $0 } == expected)
    }

    /// Runs `body` while a client holds a live session with a server, then stops it; the
    /// server's session must end well.
    static func withLiveSession(
        server: Database, serverOptions: SyncOptions, client: Database, clientOptions: SyncOptions,
        _ body: () async throws -> Void
    ) async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let (_, result) = try await runServer(server, pki: pki, options: serverOptions) { syncServer in
            let connection = try await SyncClient.connect(
                database: client, host: "127.0.0.1", port: syncServer.port,
                tls: try pki.clientContext(), options: clientOptions)
            try await body()
            return try await connection.stop()
        }
        guard case .success? = result else {
            Issue.record("the server's session failed: \(String(describing: result))")
            return
        }
    }

    @Test("a commit on the server reaches a live client without waiting for the server's change check")
    func serverCommitReachesClient() async throws {
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        var serverOptions = SyncOptions.patient
        serverOptions.changeCheckInterval = Self.distantCheck
        let (clientApplied, clientOptions) = appliedBatches()
        try await Self.withLiveSession(
            server: server, serverOptions: serverOptions, client: client, clientOptions: clientOptions
        ) {
            try server.execute("INSERT INTO t (id, name, n) VALUES (1, 'server', 10)")
            #expect(try await waitForRow(client, 1, in: clientApplied), "the server's commit did not reach the client")
        }
    }

    @Test("a commit on a live client reaches the server without waiting for the client's change check")
    func clientCommitReachesServer() async throws {
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        let (serverApplied, serverOptions) = appliedBatches()
        var clientOptions = SyncOptions.patient
        clientOptions.changeCheckInterval = Self.distantCheck
        try await Self.withLiveSession(
            server: server, serverOptions: serverOptions, client: client, clientOptions: clientOptions
        ) {
            // Two commits, one after the other: the second comes after the session's first look at
            // the database (`LocalChangeMonitor.start`), so only the commit itself can announce it.
            for id in 2...3 {
                try client.execute("INSERT INTO t (id, name, n) VALUES (?, 'client', 20)", [id])
                #expect(
                    try await waitForRow(server, id, in: serverApplied),
                    "the client's commit of row \(id) did not reach the server")
            }
        }
    }

    // The commit of a batch of the peer's wakes the sessions before its apply's result reaches
    // the state machine: what it issued is announced only once that result says whether it held
    // anything but the peer's own changes (§8.4).

    /// Opened with everything sent to the peer (so that new commits are announced), and the
    /// peer's last batch being applied: returns that apply.
    static func applyingPeerBatch(_ session: inout SessionStateMachineTests.Session) throws -> BatchApply {
        _ = session.pulling(after: 0)
        _ = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        _ = session.handle(
            .databaseCompleted(
                .extracted(
                    ChangeBatch(
                        source: session.local, after: 0, through: 0, isLast: true, tables: session.schema.tables,
                        changes: []), latest: 0)))
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 5, isLast: true))))
        guard case let .apply(apply)? = received.requests.first else { throw ApplyNotRequested(actions: received) }
        return apply
    }

    struct ApplyNotRequested: Error {
        let actions: [SyncSessionStateMachine.Action]
    }

    static func applied(_ apply: BatchApply, issued sequences: ClosedRange<Int64>) -> SyncSessionStateMachine.Event {
        var report = SessionStateMachineTests.report(cursor: apply.batch.through)
        report.sequenceBefore = sequences.lowerBound - 1
        report.sequenceAfter = sequences.upperBound
        return .databaseCompleted(.applied(.applied(report), apply))
    }

    @Test("the commit of the peer's batch, told before its apply's result, is not announced back to the peer")
    func applyOwnCommitIsNotAnnounced() throws {
        var session = try SessionStateMachineTests.Session()
        let apply = try Self.applyingPeerBatch(&session)
        #expect(session.handle(.localChangesCommitted(through: 3)).sent.isEmpty)
        let applied = session.handle(Self.applied(apply, issued: 1...3))
        #expect(applied.sent == [.ack(through: 5)])
        #expect(session.handle(.localChangesCommitted(through: 4)).sent == [.changed(latest: 4)])
    }

    @Test("a commit of this side's told while the peer's batch is applied is announced once it is applied")
    func localCommitDuringApplyIsAnnouncedAfter() throws {
        var session = try SessionStateMachineTests.Session()
        let apply = try Self.applyingPeerBatch(&session)
        #expect(session.handle(.localChangesCommitted(through: 3)).sent.isEmpty)
        #expect(session.handle(.localChangesCommitted(through: 4)).sent.isEmpty)
        let applied = session.handle(Self.applied(apply, issued: 1...3))
        #expect(applied.sent == [.ack(through: 5), .changed(latest: 4)])
    }
}
