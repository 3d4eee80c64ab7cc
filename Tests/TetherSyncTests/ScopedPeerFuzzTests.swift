import Foundation
import Testing
import Tether
import TetherTestSupport
@testable import TetherSync
import TetherWire

// Fuzzing what a scoped peer can send (issue 33): SCOPE (claims and interests), REFUSED, history
// marks, scope backfills and eviction batches, drawn at random from a seed, against a hub with a
// scoped and an unscoped peer. Whatever north sends, the hub's data stays as it was, north is sent
// nothing outside its scope, and the others are served. The frame decoder has its own fuzzer
// (Scripts/fuzz.sh); this one aims past the decoder, at what the receiver makes of valid frames.
// TETHER_PEER_FUZZ_RUNS sets the budget (sessions; CI runs the default), TETHER_PEER_FUZZ_SEED
// the first seed (a failure names the seed that replays it).

/// Pieces of interests: valid conditions, escapes from parentheses, reads of other rows,
/// functions outside the allow-list, comments and statement ends.
private let interestPieces = [
    "1=1", ")", "(", "OR", "AND", "NOT", "site", "'south'", "'north'", "id > 0", "id", "=", "body", "LIKE", "'%'",
    "(SELECT count(*) FROM orders WHERE site = 'south')", "EXISTS (SELECT 1 FROM orders AS o WHERE o.site = 'south')",
    "id IN (SELECT id FROM item)", "load_extension('libx')", "randomblob(100000000)", "zeroblob(100000000)",
    "printf('%.*c', 100000000, 'x')",
    "--", "/*", "*/", ";", ":peer_name", "?", "\"site\"", "[id]", "`body`", "'", "''", "x'00'", "sqlite_version()",
    "(WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT max(x) FROM r)", "CASE WHEN 1 THEN 1 END",
    "count(*)",
]
private let tableNames = ["orders", "item", "tether_refusals", "tether_synced_expiry", "nope", ""]

private func randomValue(_ random: inout SeededGenerator) -> DatabaseValue {
    switch Int.random(in: 0..<4, using: &random) {
    case 0: .integer(Int64.random(in: -3...12, using: &random))
    case 1: .text(["north", "south", "1", ""].randomElement(using: &random) ?? "")
    case 2: .null
    default: .integer(Int64.random(in: Int64.min...Int64.max, using: &random))
    }
}

private func randomInterest(_ random: inout SeededGenerator) -> ScopeRule {
    let count = Int.random(in: 1...6, using: &random)
    let text = (0..<count).map { _ in interestPieces.randomElement(using: &random) ?? "1" }.joined(separator: " ")
    return .filter(text)
}

private func randomAnnouncement(_ random: inout SeededGenerator) -> ScopeAnnouncement {
    var interest: [String: ScopeRule] = [:]
    for table in ["orders", "item"] where Bool.random(using: &random) { interest[table] = randomInterest(&random) }
    let scoped = Set(tableNames.filter { !$0.isEmpty && Int.random(in: 0..<3, using: &random) == 0 })
    return ScopeAnnouncement(interest: interest, scoped: scoped)
}

private func randomRefused(_ random: inout SeededGenerator) -> WireMessage {
    .refused(
        (0..<Int.random(in: 1...5, using: &random)).map { _ in
            RefusedChange(
                table: tableNames.randomElement(using: &random) ?? "orders", key: [randomValue(&random)],
                sequence: Int64.random(in: 0...1_000_000, using: &random), reason: "fuzz")
        })
}

private func randomPull(_ random: inout SeededGenerator) -> WireMessage {
    var pull = Pull(after: Int64.random(in: 0...40, using: &random), maxChanges: 10_000, maxBytes: 4 << 20)
    if Bool.random(using: &random) {
        pull.history = HistoryMark(
            through: Int64.random(in: 0...40, using: &random), clock: UInt64.random(in: 0...UInt64.max, using: &random))
    }
    if Bool.random(using: &random) { pull.scopeBackfill = true; pull.history = nil }
    return .pull(pull)
}

/// North's script for one seed: what it announces, what it sends after HELLO, and how it answers
/// the hub's PULL (evictions, or nothing).
private struct FuzzScript: Sendable {
    var announcement: ScopeAnnouncement
    var opening: [WireMessage]
    var evictions: [(table: String, key: DatabaseValue)]

    init(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        announcement = randomAnnouncement(&random)
        opening =
            (0..<Int.random(in: 0...3, using: &random)).map { _ in
                switch Int.random(in: 0..<4, using: &random) {
                case 0: randomRefused(&random)
                case 1: randomPull(&random)
                case 2: .scope(randomAnnouncement(&random))
                default: .ack(through: Int64.random(in: 0...40, using: &random))
                }
            } + [randomPull(&random)]
        evictions = (0..<Int.random(in: 0...4, using: &random)).map { _ in
            (["orders", "item"].randomElement(using: &random) ?? "orders", randomValue(&random))
        }
    }
}

@Suite("Hostile peers: seeded messages of a scoped peer (fuzz)")
struct ScopedPeerFuzzTests {
    @Test(
        """
        whatever a scoped peer sends (random SCOPE claims and interests, REFUSED, history marks, scope backfills, \
        evictions), the hub's data is unchanged, the peer gets nothing outside its scope, and the others are \
        served
        """)
    func randomMessagesFromAScopedPeer() async throws {
        let environment = ProcessInfo.processInfo.environment
        let runs = environment["TETHER_PEER_FUZZ_RUNS"].flatMap(Int.init) ?? 200
        let firstSeed = environment["TETHER_PEER_FUZZ_SEED"].flatMap(UInt64.init) ?? 1
        let sites = try SitesCertificates()
        defer { sites.pki.directory.remove() }
        let (pki, north, south, whole) = (sites.pki, sites.north, sites.south, sites.whole)
        let hub = try makeSitesHub()
        var options = sitesHubOptions
        options.interestTimeLimit = .seconds(2)
        _ = try await runServer(hub, pki: pki, options: options) { server in
            func sync(_ db: Database, _ credentials: CredentialFiles) async throws -> SyncSummary {
                try await SyncClient.syncOnce(
                    database: db, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(credentials))
            }
            // Every row acknowledged by the unscoped peer first: an eviction would then take.
            _ = try await sync(try makeSitesDatabase(), whole)
            let before = try sitesDump(hub)
            for seed in firstSeed..<firstSeed + UInt64(runs) {
                let script = FuzzScript(seed: seed)
                let key = InstanceKey.random()
                let tables = HubTables()
                let messages = try await scriptedExchange(
                    port: server.port, pki: pki, as: north, instanceKey: key, scope: script.announcement
                ) { message in
                    tables.keep(message)
                    switch message {
                    case .hello:
                        return ScriptedReply(messages: script.opening)
                    case let .pull(pull) where pull.backfill == nil && !pull.scopeBackfill && !script.evictions.isEmpty:
                        let changes = script.evictions.enumerated().map { index, eviction in
                            RowChange.eviction(
                                table: max(0, tables.index(of: eviction.table)), key: [eviction.key],
                                existence: Version(timestamp: .zero, origin: key),
                                sequence: pull.after + Int64(index) + 1)
                        }
                        return .send(
                            .batch(
                                ChangeBatch(
                                    source: key, after: pull.after, through: pull.after + Int64(changes.count),
                                    isLast: true,
                                    tables: tables.all, changes: changes)))
                    case .batch, .error: return .close
                    default: return .nothing
                    }
                }
                let context = """
                    seed \(seed) (TETHER_PEER_FUZZ_SEED=\(seed) TETHER_PEER_FUZZ_RUNS=1 replays it): \
                    \(script.announcement), \(script.opening)
                    """
                #expect(try sitesDump(hub) == before, "\(context)")
                for batch in messages.batches {
                    for change in batch.changes where batch.tables[change.table].name == "orders" {
                        #expect(
                            change.isEvicted
                                ? [1, 2, 3].map { DatabaseValue.integer($0) }.contains(change.key.first ?? .null)
                                : change.values.contains(.text("north")),
                            "\(context): north was sent orders \(change.key) (evicted: \(change.isEvicted))")
                    }
                }
            }
            // The others are served after it all.
            let southDB = try makeSitesDatabase()
            _ = try await sync(southDB, south)
            #expect(try rowIDs(southDB, "orders") == [4, 5, 6, 7])
            let wholeDB = try makeSitesDatabase()
            _ = try await sync(wholeDB, whole)
            #expect(try rowIDs(wholeDB, "orders") == Array(1...7) && rowIDs(wholeDB, "item") == Array(1...5))
        }
    }
}
