import Foundation
import Testing
@testable import Tether

/// Batches are checked before anything of them is applied (Protocol/README.md §7.2): a batch that
/// breaks a rule of its own, or one that needs the receiver's state to see, is refused whole and
/// leaves every table, the sync metadata included, as it was.
@Suite struct SyncBatchValidationTests {
    /// A receiver with rows of its own (one pending, one deleted) and rows received from `peer`,
    /// so that its metadata tables hold something a refused batch could disturb.
    func receiver() throws -> (db: Database, peer: Database) {
        let peers = try SyncTestKit.peers(2)
        let (db, peer) = (peers[0], peers[1])
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        try peer.execute("INSERT INTO t (id, name, count) VALUES (10, 'ten', 10)")
        try SyncTestKit.settle([db, peer])
        try db.execute("UPDATE t SET count = 20 WHERE id = 2")
        try db.execute("DELETE FROM t WHERE id = 3")
        return (db, peer)
    }

    /// The schema and every row of every table, `tether_*` included.
    func everything(_ db: Database) throws -> [String] {
        let tables = try db.fetchRows("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").map {
            try $0.get(0, as: String.self)
        }
        var lines = try SyncTestKit.dump(db, "SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
        for table in tables { lines += try SyncTestKit.dump(db, "SELECT '\(table)', * FROM \(quoteIdentifier(table))") }
        return lines
    }

    /// Applies `batch`, expecting a `SyncError` that `matches` accepts, and the database unchanged.
    func expectRefused(
        _ batch: ChangeBatch, by db: Database, sourceLocation: SourceLocation = #_sourceLocation,
        _ matches: (SyncError) -> Bool
    ) throws {
        let before = try everything(db)
        let error = SyncTestKit.error { try db.apply(batch) }
        #expect(
            (error as? SyncError).map(matches) == true, "\(String(describing: error))", sourceLocation: sourceLocation)
        #expect(try everything(db) == before, "the refused batch changed the database", sourceLocation: sourceLocation)
    }

    /// Expects `batch` refused by `db` for breaking `rule`, and by the decoder alike.
    func expectRefused(
        _ batch: ChangeBatch, by db: Database, breaking rule: BatchValidationError,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        try expectRefused(batch, by: db, sourceLocation: sourceLocation) { error in
            if case .invalidBatch(rule) = error { return true } else { return false }
        }
        #expect(throws: BatchDecodingError.invalid(rule), sourceLocation: sourceLocation) {
            try BatchCoding.decode(BatchCoding.encode(batch))
        }
    }

    /// A version of `peer`'s a second ahead of now: later than anything the receiver holds.
    func later(_ peer: Database) -> Version {
        SyncTestKit.version(SyncTestKit.nowMilliseconds + 1_000, peer.instanceKey)
    }

    // MARK: Rules of the batch alone

    @Test func sequenceNumbersThatDoNotIncreaseOrLieOutsideTheBatchRangeAreRefusedWhole() throws {
        let (db, peer) = try receiver()
        let after = try db.cursor(for: peer.instanceKey).after
        let version = later(peer)
        func row(_ id: Int64, _ sequence: Int64) -> RowChange {
            SyncTestKit.row(id, name: "new \(id)", count: id, at: version, sequence: after + sequence)
        }
        func batch(through: Int64, _ changes: [RowChange]) -> ChangeBatch {
            SyncTestKit.batch(from: peer.instanceKey, after: after, through: after + through, changes: changes)
        }
        // Going back, or standing still.
        try expectRefused(
            batch(through: 2, [row(20, 2), row(21, 1)]), by: db,
            breaking: .sequenceNotIncreasing(change: 1, table: "t", sequence: after + 1, previous: after + 2))
        try expectRefused(
            batch(through: 2, [row(20, 1), row(21, 1)]), by: db,
            breaking: .sequenceNotIncreasing(change: 1, table: "t", sequence: after + 1, previous: after + 1))
        // After `through`, at `after` itself, before it.
        try expectRefused(
            batch(through: 1, [row(20, 1), row(21, 2)]), by: db,
            breaking: .sequenceOutOfRange(change: 1, table: "t", sequence: after + 2, after: after, through: after + 1))
        try expectRefused(
            batch(through: 1, [row(20, 0)]), by: db,
            breaking: .sequenceOutOfRange(change: 0, table: "t", sequence: after, after: after, through: after + 1))
        try expectRefused(
            batch(through: 1, [row(20, -1)]), by: db,
            breaking: .sequenceOutOfRange(change: 0, table: "t", sequence: after - 1, after: after, through: after + 1))
        // A range that ends before it starts.
        try expectRefused(batch(through: -1, []), by: db, breaking: .invalidRange(after: after, through: after - 1))
    }

    @Test func aTableDescribedTwiceIsRefusedWhole() throws {
        let (db, peer) = try receiver()
        let after = try db.cursor(for: peer.instanceKey).after
        var second = SyncTestKit.row(21, name: "new 21", count: 21, at: later(peer), sequence: after + 2)
        second.table = 1
        let batch = SyncTestKit.batch(
            from: peer.instanceKey, after: after, tables: [SyncTestKit.tDescriptor, SyncTestKit.tDescriptor],
            changes: [SyncTestKit.row(20, name: "new 20", count: 20, at: later(peer), sequence: after + 1), second])
        try expectRefused(batch, by: db, breaking: .tableNamedTwice(name: "t", first: 0, second: 1))
    }

    // MARK: Rules of the receiver

    @Test func aTableDescribedWithoutAColumnSyncedHereKeepsThatColumn() throws {
        let (db, peer) = try receiver()
        // The peer's update of row 2 (count 20 here) and its new row 30, as a peer without the
        // column count describes them: row 30 gets the column's default here.
        try peer.execute("UPDATE t SET name = 'renamed' WHERE id = 2")
        try peer.execute("INSERT INTO t (id, name, count) VALUES (30, 'renamed', 30)")
        let full = try peer.extractChanges(for: db.instanceKey, after: try db.cursor(for: peer.instanceKey).after)
        let name = try #require(full.tables.first { $0.name == "t" }?.valueColumns.firstIndex(of: "name"))
        let batch = full.cut(tables: { descriptor in
            descriptor.name != "t"
                ? ChangeBatch.TableCut(descriptor: descriptor)
                : ChangeBatch.TableCut(
                    descriptor: TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["name"]),
                    keptValues: [name])
        })
        let report = try db.apply(batch)
        #expect(report.applied == 2)
        #expect(
            try SyncTestKit.dump(db, "SELECT id, name, count FROM t WHERE id IN (2, 30) ORDER BY id") == [
                "2|'renamed'|20", "30|'renamed'|NULL",
            ])
        // Nothing in the batch alone is wrong: the decoder takes it.
        #expect(try BatchCoding.decode(BatchCoding.encode(batch)) == batch)
    }

    @Test func aChangeForgingThisDatabasesOwnWritesIsRefusedWhole() throws {
        let (db, peer) = try receiver()
        let after = try db.cursor(for: peer.instanceKey).after
        // Ten minutes past this database's clock (within the hour a peer's clock may be ahead).
        let forged = SyncTestKit.version(SyncTestKit.nowMilliseconds + 600_000, db.instanceKey)
        // As a row's existence, or as one column's version in a row of the peer's.
        let asExistence = SyncTestKit.row(1, name: "forged", count: 666, at: forged, sequence: after + 1)
        let asColumn = SyncTestKit.row(
            10, name: "forged", count: 666, at: later(peer), sequence: after + 1, versions: [later(peer), forged])
        for change in [asExistence, asColumn] {
            try expectRefused(SyncTestKit.batch(from: peer.instanceKey, after: after, changes: [change]), by: db) {
                error in
                guard case let .forgedVersion(message) = error else { return false }
                return message.contains("\(db.instanceKey)")
            }
        }
        // The refused batches did not move the clock: the next local write is earlier than the forged version.
        try db.execute("UPDATE t SET count = 21 WHERE id = 1")
        let clock = try #require(try SyncTestKit.int(db, "SELECT timestamp FROM tether_clock WHERE id = 1"))
        #expect(HybridTimestamp(rawValue: UInt64(bitPattern: clock)) < forged.timestamp)
    }

    @Test func anEchoOfThisDatabasesOwnChangeChangesNothing() throws {
        let (db, peer) = try receiver()
        let after = try db.cursor(for: peer.instanceKey).after
        // Row 1 as this database sends it, coming back from the peer.
        let sent = try db.extractChanges(for: nil, after: 0, markInFlight: false)
        var echo = try #require(sent.changes.first { $0.key == [.integer(1)] })
        #expect(echo.existence.origin == db.instanceKey)
        echo.sequence = after + 1
        let before = try SyncTestKit.dump(db)
        let report = try db.apply(
            SyncTestKit.batch(from: peer.instanceKey, after: after, tables: sent.tables, changes: [echo]))
        #expect(report.applied == 0)
        #expect(report.unchanged == 1)
        #expect(try SyncTestKit.dump(db) == before)
        #expect(try db.cursor(for: peer.instanceKey).after == after + 1)
    }

    /// A database is the authority on its own writes: a stale copy of one, all of whose versions
    /// are its own, cannot bring back a row it deleted, even once its tombstone is collected.
    @Test func anEchoOfARowThisDatabaseDeletedLongAgoDoesNotBringItBack() throws {
        let peers = try SyncTestKit.peers(2)
        let (db, peer) = (peers[0], peers[1])
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'gone', 1)")
        let inserted = try db.extractChanges(for: nil, after: 0, markInFlight: false)
        try SyncTestKit.sync(db, peer)
        try db.execute("DELETE FROM t WHERE id = 1")
        try SyncTestKit.sync(db, peer)
        #expect(try db.collectGarbage() == 1)
        let after = try db.cursor(for: peer.instanceKey).after
        var stale = try #require(inserted.changes.first)
        stale.sequence = after + 1
        let report = try db.apply(
            SyncTestKit.batch(from: peer.instanceKey, after: after, tables: inserted.tables, changes: [stale]))
        #expect(report.applied == 0)
        #expect(report.unchanged == 1)
        #expect(try SyncTestKit.dump(db).isEmpty)
    }
}
