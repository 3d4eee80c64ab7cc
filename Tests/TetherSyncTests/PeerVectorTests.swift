import Foundation
import Testing
import Tether
import TetherTestSupport
@testable import TetherSync
import TetherWire

// Protocol/vectors/peer: frames a scoped peer may send that decode (they are valid frames) but
// that the receiver must refuse or disarm (§6.11, §6.12, §7.4, §8.9, §8.10), each with what the
// reference hub of §12 does with it. Regenerate with `TETHER_WRITE_VECTORS=1 swift test --filter
// PeerVectorTests` (only when the protocol changes: the frozen files are the reference).

/// The peer all the vectors come from: `north`, scoped `site = :peer_name` on the hub.
private let northKey = InstanceKey(hex: "00112233445566778899aabbccddeeff") ?? .random()
/// 2026-01-01T00:00:00Z, counter 0: in the past of any receiver.
private let pastVersion = Version(
    timestamp: HybridTimestamp(milliseconds: 1_767_225_600_000, counter: 0), origin: northKey)

/// One frame of north's, when it is sent, and what the hub does with it.
private struct PeerVector: Codable {
    enum When: String, Codable {
        /// As north's SCOPE, right after its HELLO.
        case asScope = "as SCOPE"
        /// Right after north's HELLO and SCOPE.
        case afterScope = "after SCOPE"
        /// As the answer to the hub's first PULL (after 0).
        case answeringFirstPull = "answering the hub's first PULL"
    }
    var file: String
    var description: String
    var when: When
    /// What the hub does: an ERROR (code and name), REFUSED, a BATCH, or nothing at all.
    var outcome: String
}

private struct VectorError: Error {
    var what: String
}

private enum PeerVectorCatalog {
    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Protocol/vectors/peer")

    /// The hub's tables as its HELLO names them (the expiry store's columns included).
    static func descriptors() throws -> [String: TableDescriptor] {
        let schema = try LocalSchema.load(from: try makeSitesHub())
        return Dictionary(uniqueKeysWithValues: schema.tables.map { ($0.name, $0) })
    }

    static func all() throws -> [(vector: PeerVector, message: WireMessage)] {
        let tables = try descriptors()
        func table(_ name: String) throws -> TableDescriptor {
            guard let table = tables[name] else { throw VectorError(what: "the hub announces no table \(name)") }
            return table
        }
        func interest(_ filter: String) -> WireMessage {
            .scope(ScopeAnnouncement(interest: ["orders": .filter(filter)]))
        }
        var mark = Pull(after: 0, maxChanges: 10_000, maxBytes: 4 << 20)
        mark.history = HistoryMark(through: 29, clock: 1)
        var scopeBackfill = Pull(after: 12, maxChanges: 10_000, maxBytes: 4 << 20)
        scopeBackfill.scopeBackfill = true
        let expiry = RowChange(
            table: 0, key: [.text("orders"), .text("[6]")], isAlive: true, existence: pastVersion,
            values: [.real(4_102_444_800)],
            versions: [pastVersion], sequence: 1)
        let cases: [(String, PeerVector.When, String, String, WireMessage)] = [
            (
                "scope-claims-tables", .asScope, "ignored: nothing recorded",
                """
                SCOPE from a scoped site claiming it sends the hub part of item (whole on the hub) and of orders \
                (the hub scopes it): a site holds a part of what the hub holds, never the other way round (§8.10, \
                What a peer can claim)
                """,
                .scope(ScopeAnnouncement(scoped: ["item", "orders"]))
            ),
            (
                "scope-interest-escapes", .asScope, "ERROR 2 schemaMismatch",
                """
                SCOPE with the interest `1=1) OR (1=1`: it closes the parenthesis it is pasted in (§8.10, \
                Checking an interest)
                """,
                interest("1=1) OR (1=1")
            ),
            (
                "scope-interest-reads-other-rows", .asScope, "ERROR 2 schemaMismatch",
                """
                SCOPE with an interest reading other rows of orders in a subquery: one bit of south's orders per \
                session
                """,
                interest("EXISTS (SELECT 1 FROM orders AS o WHERE o.site = 'south' AND o.body LIKE 'order 4%')")
            ),
            (
                "scope-interest-recursive", .asScope, "ERROR 2 schemaMismatch",
                "SCOPE with an endless recursive WITH as its interest",
                interest("id IN (WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT x FROM r)")
            ),
            (
                "scope-interest-function", .asScope, "ERROR 2 schemaMismatch",
                "SCOPE with an interest calling load_extension, outside the functions an interest may call",
                interest("load_extension('libevil') IS NULL")
            ),
            (
                "refused-unsolicited", .afterScope, "ERROR 6 malformedFrame",
                """
                REFUSED of south's order 4, which the hub never sent north (§6.11: a refusal names a change sent \
                and not yet acknowledged)
                """,
                .refused([
                    RefusedChange(
                        table: "orders", key: [.integer(4)], sequence: 4, reason: "outside the scope of the writer")
                ])
            ),
            (
                "pull-made-up-mark", .afterScope, "ERROR 11 internal",
                """
                PULL after 0 showing a mark of the hub's history it was never sent (through 29 at clock 1): \
                refuses north alone (§8.9)
                """,
                .pull(mark)
            ),
            (
                "pull-scope-backfill-made-up-cursor", .afterScope, "BATCH: only north's rows, no eviction",
                """
                PULL for a scope backfill after 12, north's first, though the hub sent it nothing: what north \
                holds is what the hub sent it (§8.10)
                """,
                .pull(scopeBackfill)
            ),
            (
                "batch-evicts-other-site", .answeringFirstPull, "ERROR 9 batchRejected",
                """
                BATCH evicting south's order 4 from a site the hub does not take part of orders from (§8.10, What \
                a peer can claim)
                """,
                .batch(
                    ChangeBatch(
                        source: northKey, after: 0, through: 1, isLast: true, tables: [try table("orders")],
                        changes: [
                            .eviction(
                                table: 0, key: [.integer(4)], existence: Version(timestamp: .zero, origin: northKey),
                                sequence: 1)
                        ]))
            ),
            (
                "batch-expiry-other-site", .answeringFirstPull, "REFUSED",
                """
                BATCH setting an expiry on south's order 6: an expiry is a change to the row it names, outside \
                north's scope (§7.4)
                """,
                .batch(
                    ChangeBatch(
                        source: northKey, after: 0, through: 1, isLast: true,
                        tables: [try table("tether_synced_expiry")], changes: [expiry]))
            ),
        ]
        return cases.enumerated().map { index, item in
            let (name, when, outcome, description, message) = item
            return (
                PeerVector(
                    file: String(format: "%02d-%@.hex", index + 1, name), description: description, when: when,
                    outcome: outcome), message
            )
        }
    }

    static func hex(_ bytes: [UInt8]) -> String {
        stride(from: 0, to: bytes.count, by: 32).map { start in
            bytes[start..<min(bytes.count, start + 32)].map { String(format: "%02x", $0) }.joined()
        }.joined(separator: "\n") + "\n"
    }

    static func bytes(ofHex text: String) throws -> [UInt8] {
        let digits = Array(text.filter(\.isHexDigit))
        return try stride(from: 0, to: digits.count, by: 2).map { index in
            guard index + 1 < digits.count, let byte = UInt8(String(digits[index...index + 1]), radix: 16) else {
                throw VectorError(what: "an odd number of hex digits")
            }
            return byte
        }
    }
}

@Suite("Protocol specification: what a scoped peer may not do, as vectors (Protocol/vectors/peer)")
struct PeerVectorTests {
    @Test(.enabled(if: ProcessInfo.processInfo.environment["TETHER_WRITE_VECTORS"] == "1"))
    func writeVectors() throws {
        let manager = FileManager.default
        try? manager.removeItem(at: PeerVectorCatalog.directory)
        try manager.createDirectory(at: PeerVectorCatalog.directory, withIntermediateDirectories: true)
        let all = try PeerVectorCatalog.all()
        for (vector, message) in all {
            let frame = try FrameEncoder(compression: false).encode(message)
            try PeerVectorCatalog.hex(frame).write(
                to: PeerVectorCatalog.directory.appendingPathComponent(vector.file), atomically: true, encoding: .utf8)
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        var json = try encoder.encode(all.map(\.vector))
        json.append(0x0A)
        try json.write(to: PeerVectorCatalog.directory.appendingPathComponent("manifest.json"))
    }

    @Test(
        """
        each peer vector is the frame the catalog makes, decodes, and gets from a hub with a scoped and an \
        unscoped peer what its manifest entry says, the hub's data unchanged
        """)
    func everyVectorGetsItsOutcome() async throws {
        let manifest = try JSONDecoder().decode(
            [PeerVector].self,
            from: Data(contentsOf: PeerVectorCatalog.directory.appendingPathComponent("manifest.json")))
        let catalog = try PeerVectorCatalog.all()
        #expect(manifest.map(\.file) == catalog.map(\.vector.file))
        for entry in manifest {
            let bytes = try PeerVectorCatalog.bytes(
                ofHex: String(
                    contentsOf: PeerVectorCatalog.directory.appendingPathComponent(entry.file), encoding: .utf8))
            let made = try catalog.first { $0.vector.file == entry.file }.map {
                try FrameEncoder(compression: false).encode($0.message)
            }
            #expect(made == bytes, "\(entry.file) is not what the catalog makes")
            let message = try FrameDecoder.decode(frame: bytes)
            let outcome = try await replay(message, when: entry.when)
            #expect(outcome.hasPrefix(entry.outcome), "\(entry.file): \(outcome), not \(entry.outcome)")
        }
    }

    /// Sends `message` from north at `when`, against a hub whose rows an unscoped peer acknowledged,
    /// and says what the hub did, checking its data did not change.
    private func replay(_ message: WireMessage, when: PeerVector.When) async throws -> String {
        let sites = try SitesCertificates()
        defer { sites.pki.directory.remove() }
        let (pki, north, whole) = (sites.pki, sites.north, sites.whole)
        let hub = try makeSitesHub()
        return try await runServer(hub, pki: pki, options: sitesHubOptions) { server in
            _ = try await SyncClient.syncOnce(
                database: try makeSitesDatabase(), host: "127.0.0.1", port: server.port,
                tls: try pki.clientContext(whole))
            let before = try sitesDump(hub)
            var scope = ScopeAnnouncement()
            if case let .scope(announcement) = message, when == .asScope { scope = announcement }
            let messages = try await scriptedExchange(
                port: server.port, pki: pki, as: north, instanceKey: northKey, scope: scope
            ) { received in
                switch (when, received) {
                case (.asScope, .hello): return .send(.pull(Pull(after: 0, maxChanges: 10_000, maxBytes: 4 << 20)))
                case (.afterScope, .hello): return .send(message)
                case let (.answeringFirstPull, .pull(pull))
                where pull.after == 0 && pull.backfill == nil && !pull.scopeBackfill: return .send(message)
                case (_, .batch), (_, .error), (_, .refused): return .close
                default: return .nothing
                }
            }
            let after = try sitesDump(hub)
            #expect(after == before, "the hub changed: \(Set(after).symmetricDifference(before).sorted())")
            if let error = messages.finalError { return "ERROR \(error.code.rawValue) \(error.code): \(error.message)" }
            if messages.contains(where: { if case .refused = $0 { true } else { false } }) { return "REFUSED" }
            if let batch = messages.batches.last {
                let outside = batch.changes.filter { change in
                    batch.tables[change.table].name == "orders"
                        && (change.isEvicted || !change.values.contains(.text("north")))
                }
                guard outside.isEmpty else { return "BATCH revealing \(outside.map(\.key))" }
                return try hub.partialTables().isEmpty
                    ? (when == .asScope ? "ignored: nothing recorded" : "BATCH: only north's rows, no eviction")
                    : "BATCH, with partial tables recorded: \(try hub.partialTables())"
            }
            return "nothing"
        }.0
    }
}
