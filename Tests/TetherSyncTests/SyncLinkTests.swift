import Foundation
import Testing
import Tether
@testable import TetherSync
import TetherTestSupport

private func insert(_ db: Database, _ range: ClosedRange<Int>) throws {
    try db.write { conn in
        for id in range { try conn.execute("INSERT INTO t (id, name) VALUES (?, ?)", [id, "row-\(id)"]) }
    }
}

private func rowCount(_ db: Database) throws -> Int {
    try db.fetchValue("SELECT count(*) FROM t", as: Int.self) ?? -1
}

/// The link's next `.connected` event; nil if its events ended first.
private func nextConnected(_ events: inout AsyncStream<SyncLinkEvent>.Iterator) async -> InstanceKey? {
    while let event = await events.next() {
        if case let .connected(peer) = event { return peer }
    }
    return nil
}

@Suite("Sync sessions: progress, totals, reconnection, polling")
struct SyncLinkTests {
    @Test(
        """
        startSync reports progress with expected counts before the end, and exact counts at the end; the server's \
        totals add up
        """)
    func progressAndTotals() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase(columns: "name TEXT")
        let client = try makeDatabase(columns: "name TEXT")
        try insert(server, 1...200)
        try insert(client, 1001...1030)
        var options = SyncOptions()
        options.batchLimits = BatchLimits(maximumChanges: 50, maximumBytes: 1 << 20)
        let syncServer = try await SyncServer.start(database: server, tls: try pki.serverContext())
        do {
            let run = try await SyncClient.startSync(
                database: client, host: "127.0.0.1", port: syncServer.port,
                tls: try pki.clientContext(), options: options)
            var snapshots: [SyncSessionProgress] = []
            for await step in run.progress { snapshots.append(step) }
            let summary = try await run.summary()

            #expect(summary.changesReceived == 200)
            #expect(summary.changesSent == 30)
            #expect(summary.bytesReceived > 0 && summary.bytesSent > 0)
            let last = try #require(snapshots.last)
            #expect(last.done.changesReceived == 200)
            #expect(last.changesExpectedToReceive == 200)
            #expect(last.changesExpectedToSend == 30)
            #expect(last.caughtUp)
            // Before the last batch arrived, the expected count was already known (from the
            // server's CHANGED after HELLO), and never below what was done.
            let early = snapshots.filter { $0.done.changesReceived > 0 && $0.done.changesReceived < 200 }
            #expect(!early.isEmpty)
            #expect(early.allSatisfy { ($0.changesExpectedToReceive ?? 0) >= 200 })
            #expect(early.allSatisfy { ($0.bytesExpectedToReceive ?? 0) >= $0.done.bytesReceived })
        } catch {
            try? await syncServer.stop()
            throw error
        }
        var results = syncServer.sessionResults.makeAsyncIterator()
        _ = await results.next()
        try await syncServer.stop()
        let totals = syncServer.totals
        #expect(totals.sessions == 1)
        #expect(totals.changesSent == 200)
        #expect(totals.changesReceived == 30)
        #expect(totals.applied == 30)
        #expect(totals.bytesSent > 0)
        #expect(try rowCount(server) == 230)
        #expect(try rowCount(client) == 230)
    }

    @Test("keepSyncing reconnects after the server goes away and comes back on the same port, and nothing is lost")
    func reconnects() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase(columns: "name TEXT")
        let client = try makeDatabase(columns: "name TEXT")
        try insert(server, 1...20)
        let first = try await SyncServer.start(database: server, tls: try pki.serverContext())
        let port = first.port
        let (clientApplied, clientOptions) = appliedBatches()
        let link = SyncClient.keepSyncing(
            database: client, host: "127.0.0.1", port: port, tls: try pki.clientContext(),
            options: clientOptions,
            reconnect: ReconnectPolicy(initialDelay: .milliseconds(20), maximumDelay: .milliseconds(200)))
        var events = link.events.makeAsyncIterator()
        do {
            let peer = await nextConnected(&events)
            #expect(peer == server.instanceKey)
            #expect(try rowCount(client) == 20)
            #expect(link.isConnected)

            try await first.stop()
            // Written while the link is down: it must arrive after the reconnection.
            try insert(server, 21...25)
            try insert(client, 500...502)
            guard case let .disconnected(reason, _)? = await events.next() else {
                Issue.record("the link did not report the disconnection")
                await link.stop()
                return
            }
            #expect(reason != nil)

            let second = try await SyncServer.start(database: server, port: port, tls: try pki.serverContext())
            let again = await nextConnected(&events)
            #expect(again == server.instanceKey)
            #expect(try rowCount(client) == 28)
            #expect(try rowCount(server) == 28)

            // Live again: a new change on the server reaches the client.
            try insert(server, 30...30)
            second.notifyLocalChanges()
            #expect(try await waitForRow(client, 30, in: clientApplied))

            await link.stop()
            #expect(!link.isConnected)
            #expect(link.totals.sessions == 2)
            #expect(link.totals.changesReceived == 26)
            #expect(link.totals.changesSent == 3)
            try await second.stop()
        } catch {
            await link.stop()
            throw error
        }
        // The events end once the link stopped.
        while await events.next() != nil {}
    }

    @Test("a link to a port nobody listens on reports each failed attempt with a growing wait, and stops on demand")
    func backoffWhileUnreachable() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let client = try makeDatabase(columns: "name TEXT")
        // A port that was free a moment ago.
        let probe = try await SyncServer.start(
            database: try makeDatabase(columns: "name TEXT"), tls: try pki.serverContext())
        let port = probe.port
        try await probe.stop()
        let policy = ReconnectPolicy(
            initialDelay: .milliseconds(10), maximumDelay: .milliseconds(40), multiplier: 2, jitter: 0)
        let link = SyncClient.keepSyncing(
            database: client, host: "127.0.0.1", port: port, tls: try pki.clientContext(), reconnect: policy)
        var waits: [Duration] = []
        for await event in link.events {
            guard case let .disconnected(reason, wait) = event else { continue }
            #expect(reason != nil)
            waits.append(wait)
            if waits.count == 4 { break }
        }
        await link.stop()
        #expect(waits == [.milliseconds(10), .milliseconds(20), .milliseconds(40), .milliseconds(40)])
        #expect(!link.isConnected)
        #expect(try rowCount(client) == 0)
    }

    @Test("without livePush negotiated, a kept-open session polls: the server's new rows arrive without CHANGED")
    func pollsWithoutLivePush() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase(columns: "name TEXT")
        let client = try makeDatabase(columns: "name TEXT")
        try insert(server, 1...5)
        let (clientApplied, liveOptions) = appliedBatches()
        var options = liveOptions
        options.testHooks.offersLivePush = false
        options.pollInterval = .milliseconds(20)
        let (stopped, result) = try await runServer(server, pki: pki) { syncServer in
            let connection = try await SyncClient.connect(
                database: client, host: "127.0.0.1", port: syncServer.port,
                tls: try pki.clientContext(), options: options)
            #expect(try rowCount(client) == 5)
            try insert(server, 6...6)
            #expect(try await waitForRow(client, 6, in: clientApplied))
            return try await connection.stop()
        }
        #expect(stopped.changesReceived == 6)
        guard case .success? = result else {
            Issue.record("the server's session failed: \(String(describing: result))")
            return
        }
    }

    @Test("the reconnect policy grows by its multiplier up to its ceiling")
    func backoffPolicy() {
        let policy = ReconnectPolicy(
            initialDelay: .milliseconds(100), maximumDelay: .seconds(1), multiplier: 3, jitter: 0)
        #expect(policy.delay(afterFailures: 1) == .milliseconds(100))
        #expect(policy.delay(afterFailures: 2) == .milliseconds(300))
        #expect(policy.delay(afterFailures: 3) == .milliseconds(900))
        #expect(policy.delay(afterFailures: 4) == .seconds(1))
        #expect(policy.delay(afterFailures: 1000) == .seconds(1))
    }
}

@Suite("Sync nodes: a mesh of servers with links")
struct SyncNodeTests {
    @Test("three nodes in a line A–B–C converge through B, live, with writes on every node; stop is clean")
    func lineOfThreeNodes() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let databases = try (0..<3).map { _ in try makeDatabase(columns: "name TEXT") }
        try insert(databases[0], 1...10)
        try insert(databases[2], 201...210)
        // Every node reports its applied batches on one stream: the test waits on it, not on time.
        let (applied, appliedContinuation) = AsyncStream<Int>.makeStream()
        var options = SyncOptions()
        options.onBatchApplied = { appliedContinuation.yield($0) }
        let safetyNet = Task {
            try? await Task.sleep(for: .seconds(120))
            appliedContinuation.finish()
        }
        defer { safetyNet.cancel() }
        let reconnect = ReconnectPolicy(initialDelay: .milliseconds(20), maximumDelay: .milliseconds(200))
        let a = try await SyncNode.start(
            database: databases[0], host: "127.0.0.1", port: 0, serverTLS: try pki.serverContext(),
            clientTLS: try pki.clientContext(), options: options, reconnect: reconnect)
        let b = try await SyncNode.start(
            database: databases[1], host: "127.0.0.1", port: 0, serverTLS: try pki.serverContext(),
            clientTLS: try pki.clientContext(), peers: [PeerAddress(host: "127.0.0.1", port: a.port)],
            options: options, reconnect: reconnect)
        let c = try await SyncNode.start(
            database: databases[2], host: "127.0.0.1", port: 0, serverTLS: try pki.serverContext(),
            clientTLS: try pki.clientContext(), peers: [PeerAddress(host: "127.0.0.1", port: b.port)],
            options: options, reconnect: reconnect)
        func converged(_ count: Int) throws -> Bool {
            try databases.allSatisfy { try rowCount($0) == count }
        }
        var iterator = applied.makeAsyncIterator()
        while try !converged(20), await iterator.next() != nil {}
        #expect(try converged(20))

        // Live writes at both ends reach the other end through B.
        try insert(databases[0], 11...11)
        a.notifyLocalChanges()
        try insert(databases[2], 211...211)
        c.notifyLocalChanges()
        while try !converged(22), await iterator.next() != nil {}
        #expect(try converged(22))
        // Connected at the end (a link cut on a starved machine reconnects within the backoff).
        #expect(try await eventually { b.peerStates.map(\.connected) == [true] })

        try await c.stop()
        try await b.stop()
        try await a.stop()
        #expect(b.totals.changesReceived >= 12)
        #expect(b.totals.changesSent >= 12)
        // Nothing pending on any node once everything was acknowledged.
        for db in databases {
            #expect(try db.pendingChangeCount(tables: ["t"]) == 0)
        }
    }

    @Test("peer addresses parse HOST:PORT and [v6]:PORT, and refuse the rest")
    func peerAddresses() {
        #expect(PeerAddress("127.0.0.1:7400") == PeerAddress(host: "127.0.0.1", port: 7400))
        #expect(PeerAddress("[::1]:80") == PeerAddress(host: "::1", port: 80))
        #expect(PeerAddress("[::1]:80")?.description == "[::1]:80")
        #expect(PeerAddress("host") == nil)
        #expect(PeerAddress("host:0") == nil)
        #expect(PeerAddress("host:70000") == nil)
        #expect(PeerAddress(":80") == nil)
    }
}

private struct Note: Model, Equatable {
    var id: Int64
    var body: String
    var count: Int
    static let tableName = "note"
}

@Suite("Sync sessions: partial rows")
struct SyncPartialRowsSessionTests {
    /// A server and a client database, each with the synced table `note`.
    private func notePair() throws -> (server: Database, client: Database) {
        let server = try Database.inMemory()
        let client = try Database.inMemory()
        for db in [server, client] {
            try db.createTable(Note.self)
            try db.enableSync(for: Note.self)
        }
        return (server, client)
    }

    @Test("a batch of partial changes the client cannot complete is pulled again with whole rows; both sides converge")
    func wholeRowsFallback() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let (server, client) = try notePair()
        // Rows 1–3 change before the client ever sees them: when its cursor passes their insert,
        // they are not sent (they have newer sequence numbers). The server takes sequence 1 for a
        // point at which the client held every row (a wrong guess): their update comes partial.
        try server.insert(contentsOf: (1...10).map { Note(id: $0, body: "note \($0)", count: 0) })
        try server.execute("UPDATE note SET count = 5 WHERE id <= 3")
        try server.execute(
            "INSERT INTO tether_peer_complete_points (peer, offered, held) VALUES (?, NULL, 1)",
            [Data(client.instanceKey.bytes)])
        var options = SyncOptions()
        options.batchLimits = BatchLimits(maximumChanges: 3, maximumBytes: 1 << 20)
        let (summary, result) = try await runServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                options: options)
        }
        let all = Note.query.orderBy("id")
        #expect(try client.fetchAll(all) == server.fetchAll(all))
        #expect(try client.fetchAll(all).count == 10)
        #expect(summary.changesReceived == 10, "\(summary)")
        guard case .success = result else {
            Issue.record("the server's session failed: \(String(describing: result))")
            return
        }
    }

    @Test("after a first sync, an update of bulk-inserted rows travels partial and applies")
    func partialUpdateOverTheNetwork() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let (server, client) = try notePair()
        try server.insert(
            contentsOf: (1...500).map { Note(id: $0, body: UUID().uuidString + UUID().uuidString, count: 0) })
        let (summaries, _) = try await runServer(server, pki: pki) { syncServer in
            let first = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
            try server.execute("UPDATE note SET count = id")
            let second = try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
            return (first, second)
        }
        let all = Note.query.orderBy("id")
        #expect(try client.fetchAll(all) == server.fetchAll(all))
        #expect(summaries.1.changesReceived == 500)
        // The bodies were not sent again: far fewer bytes than the first sync's.
        #expect(
            summaries.1.bytesReceived * 4 < summaries.0.bytesReceived,
            "\(summaries.0.bytesReceived) then \(summaries.1.bytesReceived)")
    }

}

@Suite("Sync sessions: what a summary counts")
struct SyncSummaryTests {
    @Test("a session cut while its batch is being applied counts that batch in the totals once it commits")
    func cutDuringApplyIsCounted() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        // Files: the server's reads must not wait for its writer, which the test holds.
        let server = try Database(path: pki.directory.file("server.db"))
        try server.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
        try server.enableSync(table: "t")
        let client = try Database(path: pki.directory.file("client.db"))
        try client.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
        try client.enableSync(table: "t")
        try insert(client, 1...100)

        // The server's writer is held: its apply of the client's batch waits until the session is over.
        let release = DispatchSemaphore(value: 0)
        let held = DispatchSemaphore(value: 0)
        let writerThread = Thread {
            _ = try? server.write { _ in
                held.signal()
                release.wait()
            }
        }
        writerThread.start()
        held.wait()
        let syncServer = try await SyncServer.start(database: server, tls: try pki.serverContext())
        let run = try await SyncClient.startSync(
            database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        for await step in run.progress where step.done.changesSent == 100 {
            run.cancel()
            break
        }
        await #expect(throws: SyncSessionError.self) { _ = try await run.summary() }
        release.signal()
        var results = syncServer.sessionResults.makeAsyncIterator()
        _ = await results.next()
        try await syncServer.stop()

        #expect(try rowCount(server) == 100)
        let totals = syncServer.totals
        #expect(totals.changesReceived == 100)
        #expect(totals.applied == 100, "the batch committed after the session ended is counted")
    }
}
