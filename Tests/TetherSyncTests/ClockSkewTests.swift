import Foundation
import NIOCore
import Testing
import Tether
@testable import TetherSync
import TetherTestSupport

private func insert(_ db: Database, ids: ClosedRange<Int>) throws {
    try db.write { conn in
        for id in ids { try conn.execute("INSERT INTO t (id, body) VALUES (?, ?)", [id, "row \(id)"]) }
    }
}

private func ids(_ db: Database) throws -> [Int] {
    try db.read { conn in try conn.fetchRows("SELECT id FROM t ORDER BY id").map { try $0.get(0, as: Int.self) } }
}

/// How far ahead the skewed databases' clocks are: far beyond the 60 s the receivers accept, so
/// that even a test starved for many minutes on a loaded machine still sees the skew.
private let farAhead: Duration = .seconds(30 * 86_400)

/// Moves `db`'s clock `ahead` of the wall clock, as on a machine whose clock ran fast: every
/// change it writes from now on carries a timestamp that far in the future.
private func setClock(_ db: Database, ahead: Duration) throws {
    let now = UInt64(Date().timeIntervalSince1970 * 1000)
    let timestamp = HybridTimestamp(milliseconds: now + UInt64(ahead.components.seconds) * 1000, counter: 0)
    try db.execute("UPDATE tether_clock SET timestamp = ? WHERE id = 1", [Int64(bitPattern: timestamp.rawValue)])
}

@Suite("Sync sessions: a peer whose clock is ahead")
struct ClockSkewTests {
    @Test(
        """
        only the refused direction waits: the other keeps flowing on the same session, the sender shows why, and \
        the changes go through once the clocks agree
        """)
    func onlyTheSkewedDirectionWaits() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let ahead = try makeDatabase(columns: "body TEXT")
        try setClock(ahead, ahead: farAhead)
        try insert(ahead, ids: 1...50)
        let client = try makeDatabase(columns: "body TEXT")
        try client.setMaximumClockSkew(.seconds(60))
        try insert(client, ids: 101...130)

        let server = try await SyncServer.start(database: ahead, tls: try pki.serverContext())
        var options = SyncOptions()
        options.clockSkewRetryInterval = .milliseconds(100)
        let link = SyncClient.keepSyncing(
            database: client, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(),
            options: options)
        // The client's changes reach the skewed server, and the server records why its own wait.
        let clientRowsArrived = try await eventually { try ids(ahead).filter { $0 > 100 }.count == 30 }
        let deferralRecorded = try await eventually {
            try ahead.peers().first { $0.instanceKey == client.instanceKey }?.deferral != nil
        }
        // The session stays open and live in the other direction: a new client row arrives too.
        try insert(client, ids: 131...131)
        server.notifyLocalChanges()
        let liveRowArrived = try await eventually { try ids(ahead).contains(131) }
        let heldWhileSkewed = try ids(client).filter { $0 <= 50 }.count
        let deferral = try ahead.peers().first { $0.instanceKey == client.instanceKey }?.deferral

        // The clocks agree (here: the receiver accepts the skew): the deferred changes go through by themselves.
        try client.setMaximumClockSkew(farAhead * 2)
        let deferredRowsArrived = try await eventually { try ids(client).filter { $0 <= 50 }.count == 50 }
        let deferralCleared = try await eventually {
            try ahead.peers().first { $0.instanceKey == client.instanceKey }?.deferral == nil
        }
        let sessions = link.totals.sessions
        await link.stop()
        try await server.stop()

        #expect(clientRowsArrived)
        #expect(deferralRecorded)
        #expect(liveRowArrived)
        #expect(heldWhileSkewed == 0)
        #expect(deferral?.reason.contains("clock skew") == true, "\(String(describing: deferral))")
        #expect(deferral?.reason.contains("limit 60 s") == true, "\(String(describing: deferral))")
        #expect(deferredRowsArrived)
        #expect(deferralCleared)
        #expect(sessions == 1, "the session was torn down and restarted \(sessions - 1) time(s)")
        #expect(try ids(client) == ids(ahead))
    }

    @Test("syncOnce sends its changes, defers the skewed peer's, and says so in its summary")
    func syncOnceReportsTheDeferral() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let ahead = try makeDatabase(columns: "body TEXT")
        try setClock(ahead, ahead: farAhead)
        try insert(ahead, ids: 1...20)
        let client = try makeDatabase(columns: "body TEXT")
        try client.setMaximumClockSkew(.seconds(60))
        try insert(client, ids: 101...110)
        let server = try await SyncServer.start(database: ahead, tls: try pki.serverContext())
        let summary = try await SyncClient.syncOnce(
            database: client, host: "127.0.0.1", port: server.port, tls: try pki.clientContext())
        try await server.stop()

        #expect(summary.changesSent == 10)
        #expect(summary.applied == 0)
        #expect(
            summary.deferredFromPeer?.contains("clock skew") == true, "\(String(describing: summary.deferredFromPeer))")
        #expect(summary.deferredByPeer == nil)
        #expect(try ids(client) == Array(101...110))
        #expect(try ids(ahead).count == 30)
        #expect(try client.cursor(for: ahead.instanceKey).after == 0)
    }

    @Test("the skewed side's syncOnce learns its changes were deferred, and they stay pending")
    func senderLearnsOfTheDeferral() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let receiver = try makeDatabase(columns: "body TEXT")
        try receiver.setMaximumClockSkew(.seconds(60))
        let ahead = try makeDatabase(columns: "body TEXT")
        try setClock(ahead, ahead: farAhead)
        try insert(ahead, ids: 1...20)
        let server = try await SyncServer.start(database: receiver, tls: try pki.serverContext())
        let summary = try await SyncClient.syncOnce(
            database: ahead, host: "127.0.0.1", port: server.port, tls: try pki.clientContext())
        try await server.stop()

        #expect(summary.deferredByPeer?.contains("clock skew") == true, "\(String(describing: summary.deferredByPeer))")
        #expect(try ids(receiver).isEmpty)
        let state = try ahead.peers().first { $0.instanceKey == receiver.instanceKey }
        #expect(state?.deferral?.after == 0)
        #expect(state?.acknowledgedThrough == 0)
        #expect(try ahead.pendingChangeCount(tables: ["t"], after: 0) == 20)
    }

    @Test("with a peer that does not offer deferrals, a skewed batch still ends the session with ERROR 9")
    func withoutTheCapabilityTheBatchIsRejected() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let ahead = try makeDatabase(columns: "body TEXT")
        try setClock(ahead, ahead: farAhead)
        try insert(ahead, ids: 1...5)
        let client = try makeDatabase(columns: "body TEXT")
        try client.setMaximumClockSkew(.seconds(60))
        let server = try await SyncServer.start(database: ahead, tls: try pki.serverContext())
        var options = SyncOptions()
        options.testHooks.offersDeferrals = false
        var outcome: SyncSessionError?
        do {
            _ = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(),
                options: options)
        } catch let error as SyncSessionError {
            outcome = error
        }
        try await server.stop()
        guard case let .batchRejected(reason)? = outcome else {
            Issue.record("expected batchRejected, got \(String(describing: outcome))")
            return
        }
        #expect(reason.contains("clock skew"))
        #expect(try ids(client).isEmpty)
    }
}
