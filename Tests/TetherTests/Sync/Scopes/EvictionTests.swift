import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Evictions in a batch: encoded only in format 2 (format 1 unchanged), checked like any change,
/// applied without tombstone or capture, and reported to observers as their own kind.
@Suite(.timeLimit(.minutes(1))) struct EvictionTests {
    typealias F = ScopeFixture

    static let source = InstanceKey(bytes: Array(repeating: 7, count: 16))!
    static let table = TableDescriptor(name: "orders", keyColumns: ["id"], valueColumns: ["site", "total"])

    func batch(_ changes: [RowChange]) -> ChangeBatch {
        ChangeBatch(source: Self.source, after: 0, through: 10, isLast: true, tables: [Self.table], changes: changes)
    }

    func live(_ id: Int64, sequence: Int64) -> RowChange {
        RowChange(
            table: 0, key: [.integer(id)], isAlive: true,
            existence: Version(timestamp: HybridTimestamp(rawValue: 1 << 20), origin: Self.source),
            values: [.text("north"), .integer(id)], versions: [], sequence: sequence)
    }

    @Test func aBatchWithoutEvictionIsWrittenInFormat1AndOneWithEvictionsInFormat2() throws {
        let plain = batch([live(1, sequence: 1), live(2, sequence: 2)])
        let bytes = BatchCoding.encode(plain)
        #expect(Array(bytes.prefix(3)) == BatchCoding.magic)
        #expect(BatchCoding.format(of: plain) == 1)
        #expect(try BatchCoding.decode(bytes) == plain)

        let evicting = batch([
            live(1, sequence: 1),
            .eviction(
                table: 0, key: [.integer(2)], existence: Version(timestamp: .zero, origin: Self.source), sequence: 5),
        ])
        let encoded = BatchCoding.encode(evicting)
        #expect(Array(encoded.prefix(3)) == BatchCoding.evictionMagic)
        #expect(try BatchCoding.decode(encoded, maximumFormat: 2) == evicting)
        // The eviction costs its key and little else; removing it gives format 1's bytes back.
        var withoutEviction = evicting
        withoutEviction.changes.removeLast()
        #expect(Array(BatchCoding.encode(withoutEviction).dropFirst(3)).count < Array(encoded.dropFirst(3)).count)
        // A reader that did not agree on evictions refuses format 2 by its magic, as before it existed.
        #expect(
            throws: BatchDecodingError.malformed(
                offset: 3, reason: "not a Tether change batch (bad magic or format version)")
        ) {
            _ = try BatchCoding.decode(encoded)
        }
    }

    @Test func malformedEvictionsAreRefused() throws {
        var bad = live(1, sequence: 1)
        bad.isEvicted = true
        #expect(throws: BatchValidationError.evictionWithRowState(change: 0, table: "orders")) {
            try batch([bad]).validate()
        }
        // Format 2 holding no eviction is not canonical; an evicted flag in format 1 is unknown.
        var format2 = BatchCoding.encode(batch([live(1, sequence: 1)]))
        format2[2] = 2
        #expect(throws: BatchDecodingError.self) { _ = try BatchCoding.decode(format2, maximumFormat: 2) }
        let evicting = BatchCoding.encode(
            batch([
                .eviction(
                    table: 0, key: [.integer(1)], existence: Version(timestamp: .zero, origin: Self.source), sequence: 1
                )
            ]))
        var format1 = evicting
        format1[2] = 1
        #expect(throws: BatchDecodingError.self) { _ = try BatchCoding.decode(format1, maximumFormat: 2) }
    }

    @Test func anEvictionIsObservedAsEvictLiveAndReadBackAndLeavesNothingToRelay() async throws {
        let hub = try F.database()
        let north = try F.database()
        try hub.execute("INSERT INTO orders VALUES (1, 'north', 1), (2, 'north', 2)")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        let start = try north.lastSequence()
        let events = ObservedEvents()
        let token = north.observe(.changes, in: "orders") { events.add($0) }
        defer { token.cancel() }
        try hub.execute("UPDATE orders SET site = 'south' WHERE id = 2")
        try hub.execute("DELETE FROM orders WHERE id = 1")
        try sendScopedChanges(from: hub, to: north, scope: F.site("north"))
        let heard = try await events.next(2)
        #expect(heard.map(\.kind).sorted { $0.rawValue < $1.rawValue } == [.delete, .evict])
        #expect(heard.first { $0.kind == .evict }?.key.values == [.integer(2)])
        var iterator = try north.committedTransactions(tables: ["orders"], resumingAfter: start).makeAsyncIterator()
        let readBack = try #require(try await iterator.next())
        #expect(readBack.changes.map(\.kind).sorted { $0.rawValue < $1.rawValue } == [.delete, .evict])
        #expect(readBack.changes.first { $0.kind == .evict }.map { $0.key.values } == [.integer(2)])
        #expect(readBack.changes.first { $0.kind == .evict }?.origin == .peer(hub.instanceKey))
        // The delete's tombstone is north's to relay; the eviction left none.
        #expect(try north.fetchValue("SELECT count(*) FROM tether_dead_orders", as: Int.self) == 1)
        #expect(try north.pendingChangeCount() == 0)
    }

    @Test func anEvictionOfARowNotHeldChangesNothing() throws {
        let db = try F.database()
        let evicting = batch([
            .eviction(
                table: 0, key: [.integer(9)], existence: Version(timestamp: .zero, origin: Self.source), sequence: 1)
        ])
        let report = try db.apply(evicting)
        #expect(report.evicted == 0 && report.applied == 0)
        #expect(try db.peers().first?.receivedThrough == 10)
    }
}
