import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Partial changes (Protocol/README.md §7.2): a bulk-inserted row the receiver already got,
/// updated since, is sent with only its changed columns.
@Suite("Sync: partial rows")
struct SyncPartialRowsTests {
    private func pair() throws -> (Database, Database) {
        let a = try makeDatabase(syncing: SyncItem.self)
        let b = try makeDatabase(syncing: SyncItem.self)
        return (a, b)
    }

    /// A holding `items`, synced to B, which relays them to C.
    private func relayed(_ items: [SyncItem]) throws -> (Database, Database, Database) {
        let (a, b) = try pair()
        let c = try makeDatabase(syncing: SyncItem.self)
        try a.insert(contentsOf: items)
        try sync(a, b, partial: true)
        try sync(b, c, partial: true)
        return (a, b, c)
    }

    private func rows(_ db: Database) throws -> [SyncItem] { try db.fetchAll(SyncItem.query.orderBy("id")) }

    /// Moves everything `to` lacks from `from`, through the wire encoding; returns the batches sent.
    @discardableResult
    private func sync(_ from: Database, _ to: Database, partial: Bool) throws -> [ChangeBatch] {
        try sendChanges(from: from, to: to, allowingPartialRows: partial).map(\.batch)
    }

    @Test("an update of one column of bulk-inserted rows the peer has is sent without the other columns, and applies")
    func updateAfterSyncIsPartial() throws {
        let (a, b) = try pair()
        try a.insert(
            contentsOf: (1...200).map {
                SyncItem(id: $0, name: String(repeating: "long name \($0) ", count: 4), count: Int($0))
            })
        try sync(a, b, partial: true)
        try a.execute("UPDATE item SET count = count + 1000")

        let whole = try a.extractChanges(
            for: b.instanceKey, after: try b.cursor(for: a.instanceKey).after, markInFlight: false)
        let batches = try sync(a, b, partial: true)
        let changes = batches.flatMap(\.changes)
        #expect(changes.count == 200)
        #expect(changes.allSatisfy { $0.omitted == [true, false] && $0.values[0] == .null }, "\(changes.prefix(2))")
        let partialBytes = batches.map { BatchCoding.encode($0).count }.reduce(0, +)
        #expect(
            partialBytes * 2 < BatchCoding.encode(whole).count,
            "partial \(partialBytes) bytes, whole \(BatchCoding.encode(whole).count)")
        #expect(try rows(a) == rows(b))
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(7))?.count == 1007)
    }

    @Test(
        """
        rows loaded by SQL (metadata of their own, no insert range), then one column updated: sent without the \
        columns still at their insert's version, and applied
        """)
    func updateOfRowsInsertedOneByOneIsPartial() throws {
        let (a, b) = try pair()
        try a.execute(
            """
            WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200) \
            INSERT INTO item (id, name, count) SELECT x, 'a long name, long enough to matter ' || x, x FROM c
            """)
        try sync(a, b, partial: true)
        // One row gets a new name before the update: that column is no longer at the insert's version.
        try a.execute("UPDATE item SET name = 'renamed' WHERE id = 7")
        try sync(a, b, partial: true)
        try a.execute("UPDATE item SET count = count + 1000")

        let changes = try sync(a, b, partial: true).flatMap(\.changes)
        #expect(changes.count == 200)
        let partial = changes.filter { $0.omitted == [true, false] && $0.values[0] == .null }
        #expect(partial.count == 199, "\(changes.prefix(2))")
        #expect(try rows(a) == rows(b))
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(7)) == SyncItem(id: 7, name: "renamed", count: 1007))
        #expect(
            try b.fetch(SyncItem.self, key: PrimaryKey(8))
                == SyncItem(id: 8, name: "a long name, long enough to matter 8", count: 1008))
        // b holds a's rows as a has them: nothing goes back.
        let back = try b.extractChanges(
            for: a.instanceKey, after: try a.cursor(for: b.instanceKey).after, markInFlight: false)
        #expect(
            back.changes.isEmpty,
            "\(back.changes.count) change(s) go back, first \(back.changes.first.map { "\($0)" } ?? "")")
    }

    @Test(
        """
        one-column changes to rows held whole, applied in place (only that column written): synced, taken for the \
        sender's state (nothing goes back), relayed on; a row with a pending change here still merges both
        """)
    func partialChangesAppliedInPlace() throws {
        let (a, b, c) = try relayed((1...100).map { SyncItem(id: $0, name: "name \($0)", count: 0) })
        // Row 60's name changes first: both its columns then differ from its insert's, it goes whole.
        try a.execute("UPDATE item SET name = 'renamed on a' WHERE id = 60")
        try sync(a, b, partial: true)
        try b.execute("UPDATE item SET name = 'b renamed' WHERE id = 5")
        try a.execute("UPDATE item SET count = 7 WHERE id IN (3, 5, 40, 60)")

        let changes = try sync(a, b, partial: true).flatMap(\.changes)
        #expect(changes.filter(\.isPartial).map(\.key) == [[.integer(3)], [.integer(5)], [.integer(40)]])
        #expect(changes.count == 4)
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(3)) == SyncItem(id: 3, name: "name 3", count: 7))
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(60)) == SyncItem(id: 60, name: "renamed on a", count: 7))
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(5)) == SyncItem(id: 5, name: "b renamed", count: 7))
        for id: Int64 in [3, 40, 60] {
            #expect(try SyncTestKit.status(b, "item", id: id) == .synced, "row \(id)")
            #expect(try SyncTestKit.inFlight(b, "item", id: id) == false, "row \(id)")
        }
        #expect(try SyncTestKit.status(b, "item", id: 5) == .updated)
        // Only b's own change goes back to a; everything goes on to c.
        let back = try b.extractChanges(
            for: a.instanceKey, after: try a.cursor(for: b.instanceKey).after, markInFlight: false)
        #expect(back.changes.map { $0.key } == [[.integer(5)]])
        try sync(b, a, partial: true)
        try sync(b, c, partial: true)
        #expect(try rows(a) == rows(b))
        #expect(try rows(c) == rows(b))
    }

    @Test(
        """
        a partial change to a row the receiver deleted (its key its rowid, its state an insert range's) \
        finds no row to update in place: the delete stands, no metadata is left for the row, both converge
        """)
    func partialChangeToADeletedRow() throws {
        let (a, b, _) = try relayed((1...100).map { SyncItem(id: $0, name: "name \($0)", count: 0) })
        try b.execute("DELETE FROM item WHERE id = 7")
        try a.execute("UPDATE item SET count = 3 WHERE id IN (6, 7)")

        let changes = try sync(a, b, partial: true).flatMap(\.changes)
        #expect(changes.filter(\.isPartial).map(\.key) == [[.integer(6)], [.integer(7)]])
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(6)) == SyncItem(id: 6, name: "name 6", count: 3))
        #expect(try b.fetch(SyncItem.self, key: PrimaryKey(7)) == nil)
        #expect(try SyncTestKit.deadStatus(b, "item", id: 7) == .deleted)
        let rowsTable = RowMetadataLayout.rowsTableName(of: "item")
        #expect(try b.fetchValue("SELECT count(*) FROM \"\(rowsTable)\" WHERE row_id = 7", as: Int.self) == 0)
        try sync(b, a, partial: true)
        #expect(try rows(a) == rows(b))
        #expect(try rows(a).count == 99)
    }

    @Test(
        """
        a partial change for rows the peer never received (a wrong guess of what it holds) is refused whole \
        (needsWholeRows), nothing applied; whole rows then converge
        """)
    func partialForRowsNotHeldIsRefused() throws {
        let (a, b) = try pair()
        try a.insert(contentsOf: (1...10).map { SyncItem(id: $0, name: "a\($0)", count: 0) })
        // b pulls past the rows' insert without receiving rows 1–3, which changed before it pulled.
        try a.execute("UPDATE item SET count = 5 WHERE id <= 3")
        let first = try a.extractChanges(for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 7))
        try b.apply(first)
        #expect(try rows(b).map(\.id) == Array(Int64(4)...10))
        let cursor = try b.cursor(for: a.instanceKey).after
        // a takes that cursor for a complete point, as a stale or wrong record would have it.
        try a.execute(
            "INSERT OR REPLACE INTO tether_peer_complete_points (peer, offered, held) VALUES (?, NULL, ?)",
            [Data(b.instanceKey.bytes), cursor])
        let partial = try a.extractChanges(for: b.instanceKey, after: cursor, allowingPartialRows: true)
        #expect(partial.changes.contains { $0.isPartial })
        let before = try rows(b)
        #expect(throws: SyncError.self) { try b.apply(partial) }
        do {
            try b.apply(partial)
        } catch let error as SyncError {
            guard case .needsWholeRows = error else { throw error }
        }
        #expect(try rows(b) == before)
        #expect(try b.cursor(for: a.instanceKey).after == cursor)

        try sync(a, b, partial: false)
        #expect(try rows(a) == rows(b))
    }

    @Test(
        """
        rows inserted, then changed before the catch-up that passed their insert had read them, were \
        never sent: their next change goes whole, and applies
        """)
    func rowsChangedDuringACatchUpGoWhole() throws {
        let (a, b) = try pair()
        try a.insert(contentsOf: (1...10).map { SyncItem(id: $0, name: "a\($0)", count: 0) })
        // b pulls past the rows' insert without receiving rows 1–3, which changed before it pulled.
        try a.execute("UPDATE item SET count = 5 WHERE id <= 3")
        let first = try a.extractChanges(for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 7))
        #expect(!first.isLast)
        try b.apply(first)
        #expect(try rows(b).map(\.id) == Array(Int64(4)...10))
        try a.execute("UPDATE item SET count = 6 WHERE id <= 3")
        let rest = try a.extractChanges(for: b.instanceKey, after: first.through, allowingPartialRows: true)
        #expect(rest.changes.count == 3 && !rest.changes.contains(where: \.isPartial))
        try b.apply(rest)
        #expect(try rows(a) == rows(b))
    }

    @Test("partial changes survive the wire encoding byte for byte, and bad bitmaps are refused")
    func encoding() throws {
        let key = InstanceKey(bytes: Array(repeating: 7, count: 16))!
        let existence = Version(timestamp: HybridTimestamp(rawValue: 1_000), origin: key)
        let later = Version(timestamp: HybridTimestamp(rawValue: 2_000), origin: key)
        let batch = ChangeBatch(
            source: key, after: 5, through: 6, isLast: true, isResync: false,
            tables: [TableDescriptor(name: "item", keyColumns: ["id"], valueColumns: ["name", "count"])],
            changes: [
                RowChange(
                    table: 0, key: [.integer(1)], isAlive: true, existence: existence,
                    values: [.null, .integer(9)], versions: [existence, later], sequence: 6,
                    omitted: [true, false])
            ])
        let bytes = BatchCoding.encode(batch)
        let decoded = try BatchCoding.decode(bytes)
        #expect(decoded == batch)
        #expect(BatchCoding.encode(decoded) == bytes)
        // The bitmap byte follows the key; a bit beyond the two columns is refused.
        guard let bitmapIndex = bytes.lastIndex(of: 0b01) else {
            Issue.record("no bitmap found")
            return
        }
        var hostile = bytes
        hostile[bitmapIndex] = 0b101
        #expect(throws: BatchDecodingError.self) { try BatchCoding.decode(hostile) }
        hostile[bitmapIndex] = 0
        #expect(throws: BatchDecodingError.self) { try BatchCoding.decode(hostile) }
    }

    @Test(
        """
        a partial change completed with a newer value held here does not make the row the sender's: it is still \
        sent back
        """)
    func completedWithNewerValueIsSentBack() throws {
        let (a, b, c) = try relayed((1...5).map { SyncItem(id: $0, name: "n\($0)", count: 0) })
        // c renames row 2 and a changes its count, concurrently; b hears from c first.
        try c.execute("UPDATE item SET name = 'renamed' WHERE id = 2")
        try a.execute("UPDATE item SET count = 7 WHERE id = 2")
        try sync(c, b, partial: true)
        let fromA = try sync(a, b, partial: true)
        #expect(fromA.flatMap(\.changes).contains { $0.isPartial }, "a's update should travel partial")
        // b holds the rename, which a lacks: b must send the row back to a.
        try sync(b, a, partial: true)
        try sync(b, c, partial: true)
        let expected = SyncItem(id: 2, name: "renamed", count: 7)
        for db in [a, b, c] { #expect(try db.fetch(SyncItem.self, key: PrimaryKey(2)) == expected) }
    }

    @Test(
        """
        a peer pulling back what it sent (25,000 rows inserted, then 15,000 updated there) gets one empty batch \
        that reaches the end of the log: the echoes are skipped unread, not 10,000 at a pull
        """)
    func echoesArePassedInOnePull() throws {
        let (a, b) = try pair()
        try a.insert(contentsOf: (1...25_000).map { SyncItem(id: $0, name: "n\($0)", count: 0) })
        try sync(a, b, partial: false)
        try a.execute("UPDATE item SET count = 1 WHERE id % 5 != 0")
        try sync(a, b, partial: true)
        let end = try b.lastSequence()
        #expect(end >= 40_000)
        let back = try b.extractChanges(for: a.instanceKey, after: 0, markInFlight: false)
        #expect(back.changes.isEmpty && back.isLast && back.through == end, "through \(back.through) of \(end)")
        // A row changed here since is found among them.
        try b.execute("UPDATE item SET name = 'b' WHERE id = 12345")
        let changed = try b.extractChanges(for: a.instanceKey, after: 0, markInFlight: false)
        #expect(changed.changes.count == 1 && changed.isLast)
    }
}
