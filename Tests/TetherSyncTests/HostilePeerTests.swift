import Foundation
import Testing
import Tether
import TetherTestSupport
@testable import TetherSync
import TetherWire

// A hub scoping its sites (`orders`: `site = :peer_name`; `item` whole), one unscoped peer
// (`whole`), an honest site (`south`), and `north`: a valid certificate in the hands of a client
// written from the protocol alone, sending what a compromised or buggy site could (issue 33).

/// The hub: orders 1–3 of north, 4–7 of south, items 1–5.
func makeSitesHub() throws -> Database {
    let db = try makeSitesDatabase()
    try db.write { conn in
        for id in 1...7 {
            try conn.execute(
                "INSERT INTO orders (id, site, body) VALUES (?, ?, ?)",
                [id, id <= 3 ? "north" : "south", "order \(id)"])
        }
        for id in 1...5 { try conn.execute("INSERT INTO item (id, name) VALUES (?, ?)", [id, "item \(id)"]) }
    }
    return db
}

func makeSitesDatabase() throws -> Database {
    let db = try Database.inMemory()
    try db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT NOT NULL, body TEXT)")
    try db.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT)")
    try db.enableSync(table: "orders")
    try db.enableSync(table: "item")
    return db
}

/// Everything a peer's message could change on the hub: the rows, and what it records of its peers'
/// refusals and partial tables.
func sitesDump(_ db: Database) throws -> [String] {
    let rows = try db.fetchRows(
        "SELECT 'orders', id, site, body FROM orders UNION ALL SELECT 'item', id, name, NULL FROM item ORDER BY 1, 2")
    return try rows.map { row in (0..<row.count).map { "\(row[$0])" }.joined(separator: "|") }
        + db.refusedChanges().map { "refused \($0)" }
        + db.partialTables().map { "partial \($0.key) \($0.value.map(\.hex).sorted())" }.sorted()
}

func rowIDs(_ db: Database, _ table: String) throws -> [Int] {
    try db.fetchRows("SELECT id FROM \(table) ORDER BY id").map { try $0.get(0, as: Int.self) }
}

var sitesHubOptions: SyncOptions {
    var options = SyncOptions.patientServer
    options.peers.others = PeerPolicy(scopes: ["orders": .filter("site = :peer_name")])
    options.peers[.name("whole")] = PeerPolicy()
    return options
}

/// The hub's tables as its HELLO names them, kept by the script when the HELLO arrives.
final class HubTables: Sendable {
    private let box = LockedBox<[TableDescriptor]>([])
    func keep(_ message: WireMessage) { if case let .hello(hello) = message { box.withLock { $0 = hello.tables } } }
    func index(of name: String) -> Int { box.value.firstIndex { $0.name == name } ?? -1 }
    var all: [TableDescriptor] { box.value }
}

/// The certificates of the hub's peers: `north` and `south` (sites, scoped) and `whole` (unscoped).
struct SitesCertificates {
    let pki: TestPKI
    let north: CredentialFiles
    let south: CredentialFiles
    let whole: CredentialFiles

    init() throws {
        pki = try TestPKI()
        north = try pki.issue(commonName: "north", as: "north")
        south = try pki.issue(commonName: "south", as: "south")
        whole = try pki.issue(commonName: "whole", as: "whole")
    }
}

/// A hub server with `whole` (unscoped) and `south` (scoped) synced first, so that every row is
/// acknowledged; runs `hostile` against it, then checks the hub's data did not change and that
/// both honest peers are still served. Returns what `hostile` returned.
private func againstHub<T: Sendable>(
    _ hostile: @Sendable (_ port: Int, _ pki: TestPKI, _ north: CredentialFiles) async throws -> T,
    checkingAfter: (Database) throws -> Void = { _ in }
) async throws -> T {
    let sites = try SitesCertificates()
    defer { sites.pki.directory.remove() }
    let (pki, north, south, whole) = (sites.pki, sites.north, sites.south, sites.whole)
    let hub = try makeSitesHub()
    let southDB = try makeSitesDatabase()
    let wholeDB = try makeSitesDatabase()
    let (result, _) = try await runServer(hub, pki: pki, options: sitesHubOptions) { server in
        func sync(_ db: Database, _ credentials: CredentialFiles, options: SyncOptions = SyncOptions()) async throws
            -> SyncSummary
        {
            try await SyncClient.syncOnce(
                database: db, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(credentials),
                options: options)
        }
        _ = try await sync(wholeDB, whole)
        _ = try await sync(southDB, south)
        let before = try sitesDump(hub)
        let result = try await hostile(server.port, pki, north)
        let after = try sitesDump(hub)
        #expect(after == before, "the hub changed: \(Set(after).symmetricDifference(before).sorted())")
        try checkingAfter(hub)
        // Others are served as before: a write of south's reaches the hub and the unscoped peer.
        try southDB.execute("UPDATE orders SET body = 'south edit' WHERE id = 5")
        _ = try await sync(southDB, south)
        _ = try await sync(wholeDB, whole)
        #expect(try rowIDs(southDB, "orders") == [4, 5, 6, 7])
        #expect(try wholeDB.fetchValue("SELECT body FROM orders WHERE id = 5", as: String.self) == "south edit")
        #expect(try rowIDs(wholeDB, "orders") == Array(1...7) && rowIDs(wholeDB, "item") == Array(1...5))
        // A version 2 peer taking the tables whole is served too (no table was made partial).
        var versionTwo = SyncOptions()
        versionTwo.testHooks.offersVersion3 = false
        let older = try makeSitesDatabase()
        _ = try await sync(older, whole, options: versionTwo)
        #expect(try rowIDs(older, "orders") == Array(1...7))
        return result
    }
    return result
}

private let smallPull = Pull(after: 0, maxChanges: 10_000, maxBytes: 4 << 20)

@Suite("Hostile peers: a scoped peer can harm only what it may touch (issue 33)")
struct HostilePeerTests {
    @Test(
        """
        evictions from a scoped site (of its own row, another site's row, a row of an unscoped table), even \
        claiming those tables in SCOPE, are refused whole: ERROR 9, nothing deleted
        """,
        arguments: [Set<String>(), ["orders", "item"]])
    func evictionsFromASite(claimed: Set<String>) async throws {
        let messages = try await againstHub { port, pki, north in
            let key = InstanceKey.random()
            let tables = HubTables()
            return try await scriptedExchange(
                port: port, pki: pki, as: north, instanceKey: key, scope: ScopeAnnouncement(scoped: claimed)
            ) { message in
                tables.keep(message)
                guard case let .pull(pull) = message, pull.backfill == nil, !pull.scopeBackfill else { return .nothing }
                let orders = tables.index(of: "orders"), item = tables.index(of: "item")
                let evicted = [(orders, 1), (orders, 4), (orders, 6), (item, 2)]
                let changes = evicted.enumerated().map { index, row in
                    RowChange.eviction(
                        table: row.0, key: [.integer(Int64(row.1))], existence: Version(timestamp: .zero, origin: key),
                        sequence: Int64(index + 1))
                }
                return .send(
                    .batch(
                        ChangeBatch(
                            source: key, after: pull.after, through: pull.after + 4, isLast: true, tables: tables.all,
                            changes: changes)))
            }
        }
        let error = try #require(messages.finalError, "the hub did not end the session: \(messages)")
        #expect(error.code == .batchRejected && error.message.contains("evicts a row"), "\(error)")
    }

    @Test(
        """
        a REFUSED that names no change the hub sent the site in an unacknowledged batch is a protocol violation: \
        ERROR 6, nothing dropped or recorded
        """,
        arguments: ["unsolicited", "sent to it", "never sent", "flood"])
    func refusalsFromASite(kind: String) async throws {
        let messages = try await againstHub { port, pki, north in
            let refused = LockedBox(false)
            @Sendable func refusal(_ id: Int64, _ sequence: Int64) -> RefusedChange {
                RefusedChange(
                    table: "orders", key: [.integer(id)], sequence: sequence, reason: "outside the scope of the writer")
            }
            return try await scriptedExchange(port: port, pki: pki, as: north, instanceKey: .random()) { message in
                switch (kind, message) {
                case ("unsolicited", .hello):
                    return .send(.refused([refusal(4, 0), refusal(1, 999_999)]))
                case (_, .hello):
                    return .send(.pull(smallPull))
                case let ("sent to it", .batch(batch)) where !refused.value:
                    // Every row it was sent, at the sequence it was sent with, as an honest writer would.
                    refused.withLock { $0 = true }
                    let rows = batch.changes.map {
                        RefusedChange(
                            table: batch.tables[$0.table].name, key: $0.key, sequence: $0.sequence, reason: "no")
                    }
                    return .send(.refused(rows))
                case ("never sent", .batch) where !refused.value:
                    refused.withLock { $0 = true }
                    return .send(.refused([refusal(4, 4)]))
                case ("flood", .batch) where !refused.value:
                    refused.withLock { $0 = true }
                    return .send(.refused((1...10_000).map { refusal(Int64($0), 999_999) }))
                default:
                    return .nothing
                }
            }
        }
        let error = try #require(messages.finalError, "the hub did not end the session: \(messages)")
        #expect(error.code == .malformedFrame && error.message.contains("REFUSED"), "\(error)")
        if kind != "unsolicited" {
            #expect(!messages.batches.isEmpty, "north was sent its rows first")
        }
    }

    @Test(
        """
        a scope backfill as a site's first PULL, with a made-up cursor, reveals no row outside its scope: no \
        eviction names another site's row
        """)
    func scopeBackfillRevealsNothing() async throws {
        let batches = try await againstHub { port, pki, north in
            try await scriptedExchange(port: port, pki: pki, as: north, instanceKey: .random()) { message in
                switch message {
                case .hello:
                    var pull = Pull(after: 12, maxChanges: 10_000, maxBytes: 4 << 20)
                    pull.scopeBackfill = true
                    return .send(.pull(pull))
                case .batch: return .close
                default: return .nothing
                }
            }.batches
        }
        let batch = try #require(batches.first)
        let named = batch.changes.map { "\(batch.tables[$0.table].name) \($0.key) evicted: \($0.isEvicted)" }
        #expect(!batch.changes.contains { $0.isEvicted }, "\(named)")
        let orders = batch.changes.filter { batch.tables[$0.table].name == "orders" }
        #expect(orders.allSatisfy { $0.values.contains(.text("north")) }, "\(named)")
    }

    @Test(
        """
        a site's SCOPE claiming it sends the hub part of tables (one the hub scopes for it, one it holds whole) \
        changes nothing: not recorded as partial, version 2 peers still served whole
        """)
    func scopeClaimsFromASite() async throws {
        let messages = try await againstHub { port, pki, north in
            try await scriptedExchange(
                port: port, pki: pki, as: north, instanceKey: .random(),
                scope: ScopeAnnouncement(scoped: ["item", "orders"])
            ) { message in
                switch message {
                case .hello: return .send(.pull(smallPull))
                case .batch: return .close
                default: return .nothing
                }
            }
        } checkingAfter: { hub throws in
            let partial = try hub.partialTables()
            #expect(partial.isEmpty, "\(partial)")
        }
        #expect(!messages.batches.isEmpty)
    }
}

@Suite("Hostile peers: deferral as §8.3 says")
struct DeferralDiscardTests {
    @Test(
        """
        a batch pipelined behind one deferred for its clock is discarded, not applied past the gap: the hub \
        answers DEFERRED through it and holds none of either
        """)
    func pipelinedBatchAfterADeferralIsDiscarded() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let north = try pki.issue(commonName: "north", as: "north")
        let hub = try makeSitesHub()
        let before = try sitesDump(hub)
        let (messages, _) = try await runServer(hub, pki: pki) { server in
            let key = InstanceKey.random()
            let tables = HubTables()
            let now = UInt64(Date().timeIntervalSince1970 * 1000)
            @Sendable func rows(_ ids: ClosedRange<Int>, at milliseconds: UInt64, firstSequence: Int64) -> [RowChange] {
                ids.enumerated().map { offset, id in
                    let version = Version(
                        timestamp: HybridTimestamp(milliseconds: milliseconds, counter: UInt16(offset % 1000)),
                        origin: key)
                    return RowChange(
                        table: tables.index(of: "item"), key: [.integer(Int64(id))], isAlive: true, existence: version,
                        values: [.text("from north \(id)")], versions: [version],
                        sequence: firstSequence + Int64(offset))
                }
            }
            return try await scriptedExchange(port: server.port, pki: pki, as: north, instanceKey: key) { message in
                tables.keep(message)
                switch message {
                case let .pull(pull) where pull.after == 0:
                    // Ten thousand rows two days ahead of the hub's clock: deferred (its limit is an hour).
                    let ahead = rows(1_000...10_999, at: now + 2 * 86_400_000, firstSequence: 1)
                    return .send(
                        .batch(
                            ChangeBatch(
                                source: key, after: 0, through: 10_000, isLast: false, tables: tables.all,
                                changes: ahead)))
                case let .pull(pull) where pull.after == 10_000:
                    // Pipelined: on time, but after the gap the deferral leaves.
                    let onTime = rows(100...104, at: now, firstSequence: 10_001)
                    return .send(
                        .batch(
                            ChangeBatch(
                                source: key, after: 10_000, through: 10_005, isLast: true, tables: tables.all,
                                changes: onTime)))
                case .deferred: return .close
                default: return .nothing
                }
            }
        }
        let deferrals = messages.compactMap { if case let .deferred(deferral) = $0 { deferral } else { nil } }
        #expect(deferrals.map(\.after) == [0] && deferrals.map(\.through) == [10_005], "\(deferrals)")
        #expect(try sitesDump(hub) == before, "a row of a deferred or discarded batch was applied")
    }
}

@Suite("Hostile peers: flow control as §8.5 says")
struct UnreadBatchTests {
    @Test(
        """
        a peer that leaves a 1 MB BATCH unread while sending PINGs is timed out within the idle timeout (it \
        answers none of the server's PINGs), not kept open by its own PINGs
        """)
    func pingsWithoutReadingDoNotKeepTheSessionOpen() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let north = try pki.issue(commonName: "north", as: "north")
        let hub = try makeSitesHub()
        // About 1 MB that LZ4 cannot shrink: random hex, 500 bytes a row.
        try await hub.write { conn in
            for id in 100..<2_100 {
                let noise = (0..<250).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
                try conn.execute("INSERT INTO item (id, name) VALUES (?, ?)", [id, noise])
            }
        }
        var options = SyncOptions(idleTimeout: .milliseconds(800), pingInterval: .milliseconds(100))
        options.peers.others = PeerPolicy(readOnly: true)
        // The exchange ends when the server closes (its safety net: 60 s); it stayed open for as
        // long as the peer pinged before.
        let (messages, result) = try await runServer(hub, pki: pki, options: options) { server in
            try await scriptedExchange(port: server.port, pki: pki, as: north, instanceKey: .random()) { message in
                guard case .hello = message else { return .nothing }
                var reply = ScriptedReply.send(.pull(Pull(after: 0, maxChanges: 10_000, maxBytes: 16 << 20)))
                reply.stopReadingAndPingEvery = .milliseconds(50)
                return reply
            }
        }
        // Timed out as a peer that reads nothing: its PINGs unanswered, or (when the sockets could
        // not hold the batch) the send buffer never drained.
        guard case let .failure(.timeout(reason))? = result,
            reason.contains("answered no PING") || reason.contains("read nothing")
        else {
            Issue.record(
                """
                the server's session did not time out the peer that reads nothing: \(String(describing: result)), \
                after \(messages.count) messages
                """)
            return
        }
    }
}
