import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// The kind of each change, whatever path made it (the ORM, raw SQL, a bulk insert, a peer's
/// batch, a sync file, another process, a kept-aside retry): an insert is an insert, an update an
/// update, a delete a delete — to a listener in the writing process and to one that reads the
/// changelog back (another process, `tether watch`), even once an acknowledgement has marked the
/// rows synced.
@Suite(.hangLimit) struct ObservationKindTests {
    typealias Player = ObservationTests.Player

    /// The changes to `db` after `sequence`, read back from its changelog as another process reads them.
    func readBack(_ db: Database, after sequence: Int64, table: String = "player") async throws -> [DatabaseEvent] {
        var iterator = try db.committedTransactions(tables: [table], resumingAfter: sequence).makeAsyncIterator()
        let transaction = try #require(try await iterator.next())
        #expect(transaction.isReadBack)
        return transaction.changes
    }

    /// What observes `db` from now on: the last sequence number before it, and a listener of `player`.
    struct Observed {
        let start: Int64
        let events = ObservedEvents()
        let token: ObservationToken

        init(_ db: Database) throws {
            start = try db.lastSequence()
            let events = self.events
            token = db.observe(of: Player.self) { events.add($0) }
        }
    }

    /// Sends `b` everything `a` holds through a sync file, then writes on `b` from another connection
    /// (another program, as far as `b`'s observers can tell).
    func fileThenOtherProgram(from a: Database, to b: Database, in directory: URL, _ sql: String) throws {
        let file = directory.appendingPathComponent("a-to-b.tether")
        try a.exportSyncFile(to: file, for: b.instanceKey, since: 0)
        try b.importSyncFile(from: file)
        try Database(path: b.path).execute(sql)
    }

    /// Each row's key and kinds, by key.
    func kinds(_ events: [DatabaseEvent]) -> [Int64: [DatabaseEvent.Kind]] {
        Dictionary(grouping: events) { event -> Int64 in
            if case let .integer(id)? = event.key.values.first { return id }
            return -1
        }.mapValues { $0.map(\.kind) }
    }

    @Test func anInsertIsAnInsertWhateverThePathToListenersAndWhenReadBackAfterAnAcknowledgement() async throws {
        try await withTemporaryDirectory { directory in
            let a = try ObservationTests.database(in: directory, name: "a.sqlite")
            let b = try ObservationTests.database(in: directory, name: "b.sqlite")
            // A row b deleted: its tombstone sends a peer's new rows down the apply's full path.
            try b.insert(Player(id: 99, name: "gone", score: 0))
            try b.execute("DELETE FROM player WHERE id = 99")
            let observed = try Observed(b)
            defer { observed.token.cancel() }

            try b.insert(Player(id: 1, name: "orm", score: 1))
            try b.execute("INSERT INTO player (id, name, score) VALUES (2, 'sql', 2)")
            try b.insert(contentsOf: [Player(id: 3, name: "bulk", score: 3), Player(id: 4, name: "bulk", score: 4)])
            try a.insert(Player(id: 5, name: "peer", score: 5))
            try SyncTestKit.sync(a, b)
            try a.insert(Player(id: 6, name: "file", score: 6))
            try fileThenOtherProgram(
                from: a, to: b, in: directory, "INSERT INTO player (id, name, score) VALUES (7, 'other process', 7)")
            // A inserted and then updated since the last look: still an insert.
            try b.insert(Player(id: 8, name: "inserted", score: 8))
            try b.update(Player(id: 8, name: "then updated", score: 8))

            let heard = kinds(try await observed.events.next(9))
            #expect(
                heard == [
                    1: [.insert], 2: [.insert], 3: [.insert], 4: [.insert], 5: [.insert], 6: [.insert], 7: [.insert],
                    8: [.insert, .update],
                ])
            // A acknowledges every row: b's own inserts are marked synced, as a peer's are.
            try SyncTestKit.sync(b, a)
            #expect(try SyncTestKit.pendingCount(b, "player") == 0)
            let readBack = kinds(try await readBack(b, after: observed.start))
            #expect(
                readBack == [
                    1: [.insert], 2: [.insert], 3: [.insert], 4: [.insert], 5: [.insert], 6: [.insert], 7: [.insert],
                    8: [.insert],
                ])
        }
    }

    @Test func updatesAndDeletesAreUpdatesAndDeletesWhateverThePath() async throws {
        try await withTemporaryDirectory { directory in
            let a = try ObservationTests.database(in: directory, name: "a.sqlite")
            let b = try ObservationTests.database(in: directory, name: "b.sqlite")
            try a.insert(contentsOf: (1...7).map { Player(id: Int64($0), name: "p\($0)", score: $0) })
            try SyncTestKit.settle([a, b])
            let observed = try Observed(b)
            defer { observed.token.cancel() }

            try b.update(Player(id: 1, name: "orm", score: 1))
            try b.execute("UPDATE player SET name = 'sql' WHERE id = 2")
            try a.update(Player(id: 3, name: "peer", score: 3))
            try a.execute("DELETE FROM player WHERE id = 7")
            try SyncTestKit.sync(a, b)
            try a.update(Player(id: 4, name: "file", score: 4))
            try fileThenOtherProgram(
                from: a, to: b, in: directory, "UPDATE player SET name = 'other process' WHERE id = 5")
            try b.execute("DELETE FROM player WHERE id = 6")

            let expected: [Int64: [DatabaseEvent.Kind]] = [
                1: [.update], 2: [.update], 3: [.update], 4: [.update], 5: [.update], 6: [.delete], 7: [.delete],
            ]
            #expect(kinds(try await observed.events.next(7)) == expected)
            try SyncTestKit.sync(b, a)
            #expect(kinds(try await readBack(b, after: observed.start)) == expected)
        }
    }

    @Test func aRowAppliedFromTheKeptAsideChangesIsAnInsert() async throws {
        try await withTemporaryDirectory { directory in
            func family(_ name: String) throws -> Database {
                let db = try Database(path: directory.appendingPathComponent(name).path)
                try db.execute(SyncBehaviorConstraintTests.familySchema)
                try db.enableSync(table: "parent")
                try db.enableSync(table: "child")
                return db
            }
            let a = try family("a.sqlite")
            let b = try family("b.sqlite")
            // A child b deleted: its tombstone sends the retried row down the apply's full path.
            try b.execute("INSERT INTO parent (id, name) VALUES ('p0', 'on b')")
            try b.execute("INSERT INTO child (id, parent_id, value) VALUES (50, 'p0', 0)")
            try b.execute("DELETE FROM child WHERE id = 50")
            try a.execute("INSERT INTO parent (id, name) VALUES ('p1', 'first')")
            try a.execute("INSERT INTO child (id, parent_id, value) VALUES (1, 'p1', 10)")
            try a.execute("UPDATE parent SET name = 'parent' WHERE id = 'p1'")
            // One change per batch: the child comes first, and waits aside for its parent.
            let childBatch = try a.extractChanges(for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 1))
            let start = try b.lastSequence()
            let events = ObservedEvents()
            let token = b.observe(in: "child") { events.add($0) }
            defer { token.cancel() }
            #expect(try b.apply(childBatch).keptAside == 1)
            try SyncTestKit.sync(a, b)
            #expect(try b.keptAsideChanges().isEmpty)

            #expect(try await events.next(1).map(\.kind) == [.insert])
            #expect(try await readBack(b, after: start, table: "child").map(\.kind) == [.insert])
        }
    }
}
