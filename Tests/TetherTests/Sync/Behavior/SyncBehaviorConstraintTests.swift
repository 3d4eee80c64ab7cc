import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Changes kept aside (foreign keys, unique values) and unique races.
@Suite struct SyncBehaviorConstraintTests {
    static let familySchema = """
        CREATE TABLE parent (id TEXT PRIMARY KEY NOT NULL, name TEXT);
        CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id TEXT NOT NULL REFERENCES parent(id), value INTEGER);
        """

    func family(_ db: Database) throws -> Database {
        try db.execute(Self.familySchema)
        try db.enableSync(table: "parent")
        try db.enableSync(table: "child")
        return db
    }

    let children = "SELECT id, parent_id, value FROM child ORDER BY id"
    let parents = "SELECT id, name FROM parent ORDER BY id"

    /// a holds parent p1 and its child 1; the parent changed last, so with
    /// one change per batch the child is sent first. Returns the two batches.
    func childBeforeParent(_ a: Database, for b: Database) throws -> (child: ChangeBatch, parent: ChangeBatch) {
        try a.execute("INSERT INTO parent (id, name) VALUES ('p1', 'first')")
        try a.execute("INSERT INTO child (id, parent_id, value) VALUES (1, 'p1', 10)")
        try a.execute("UPDATE parent SET name = 'parent' WHERE id = 'p1'")
        let child = try a.extractChanges(for: b.instanceKey, after: 0, limits: BatchLimits(maximumChanges: 1))
        #expect(child.changes.map { child.tables[$0.table].name } == ["child"])
        let parent = try a.extractChanges(
            for: b.instanceKey, after: child.through, limits: BatchLimits(maximumChanges: 1))
        #expect(parent.changes.map { parent.tables[$0.table].name } == ["parent"])
        #expect(parent.isLast)
        return (child, parent)
    }

    @Test func aChildWhoseParentIsMissingIsKeptAsideAndAppliedWhenTheParentArrives() throws {
        let a = try family(Database.inMemory())
        let b = try family(Database.inMemory())
        let (childBatch, parentBatch) = try childBeforeParent(a, for: b)

        let first = try b.apply(childBatch)
        #expect(first.keptAside == 1)
        #expect(first.stillKeptAside == 1)
        #expect(first.applied == 0)
        #expect(try b.cursor(for: a.instanceKey).after == childBatch.through)
        #expect(try SyncTestKit.dump(b, children).isEmpty)
        let kept = try b.keptAsideChanges()
        #expect(kept.count == 1)
        #expect(kept.first?.table == "child")
        #expect(kept.first?.key == [.integer(1)])
        #expect(kept.first?.peer == a.instanceKey)
        #expect(
            kept.first?.reason.uppercased().contains("FOREIGN KEY") == true, "reason: \(kept.first?.reason ?? "none")")
        let attempts = try #require(kept.first?.attempts)

        // Retrying without the parent keeps it aside, and counts the attempt.
        let retry = try b.retryKeptAside()
        #expect(retry.stillKeptAside == 1)
        #expect(retry.resolvedFromKeptAside == 0)
        #expect(try b.keptAsideChanges().first?.attempts ?? 0 > attempts)

        // The parent's batch brings it in.
        let second = try b.apply(parentBatch)
        #expect(second.resolvedFromKeptAside == 1)
        #expect(second.stillKeptAside == 0)
        #expect(try b.keptAsideChanges().isEmpty)
        #expect(try SyncTestKit.dump(b, children) == ["1|'p1'|10"])
        #expect(try SyncTestKit.dump(b, parents) == ["'p1'|'parent'"])
        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a, children) == SyncTestKit.dump(b, children))
        #expect(try SyncTestKit.dump(a, parents) == SyncTestKit.dump(b, parents))
    }

    @Test func retryKeptAsideAppliesOnceTheLocalDatabaseAllowsIt() throws {
        let a = try family(Database.inMemory())
        let b = try family(Database.inMemory())
        let (childBatch, _) = try childBeforeParent(a, for: b)
        try b.apply(childBatch)
        #expect(try b.keptAsideChanges().count == 1)
        try b.execute("INSERT INTO parent (id, name) VALUES ('p1', 'made on b')")
        let report = try b.retryKeptAside()
        #expect(report.resolvedFromKeptAside == 1)
        #expect(report.stillKeptAside == 0)
        #expect(try b.keptAsideChanges().isEmpty)
        #expect(try SyncTestKit.dump(b, children) == ["1|'p1'|10"])
        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a, parents) == SyncTestKit.dump(b, parents))
        #expect(try SyncTestKit.dump(a, children) == SyncTestKit.dump(b, children))
    }

    @Test func conflictsMetWhileRetryingOutsideAnApplyAreReturnedAndObserved() throws {
        let a = try family(Database.inMemory())
        let b = try family(Database.inMemory())
        let (childBatch, _) = try childBeforeParent(a, for: b)
        try b.apply(childBatch)
        let observed = observe(b)
        // b makes the parent and a child of the same key itself: the kept-aside child now meets a pending local row.
        try b.execute("INSERT INTO parent (id, name) VALUES ('p1', 'made on b')")
        try b.execute("INSERT INTO child (id, parent_id, value) VALUES (1, 'p1', 99)")
        let report = try b.retryKeptAside()
        #expect(report.resolvedFromKeptAside == 1)
        #expect(report.conflicts.count == 1)
        #expect(report.conflicts.first?.table == "child")
        #expect(observed.value.map(\.table) == ["child"])
        #expect(try SyncTestKit.dump(b, children) == ["1|'p1'|99"])
    }

    @Test func keptAsideChangesSurviveReopen() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.url.appendingPathComponent("b.sqlite").path
        let a = try family(Database.inMemory())
        var b: Database? = try family(Database(path: path))
        let (childBatch, parentBatch) = try childBeforeParent(a, for: b!)
        try b!.apply(childBatch)
        try b!.close()
        b = nil
        let reopened = try Database(path: path)
        defer { try? reopened.close() }
        #expect(try reopened.keptAsideChanges().map(\.table) == ["child"])
        let report = try reopened.apply(parentBatch)
        #expect(report.resolvedFromKeptAside == 1)
        #expect(try SyncTestKit.dump(reopened, children) == ["1|'p1'|10"])
    }

    // MARK: Unique races

    static let accountSchema = "CREATE TABLE acct (id TEXT PRIMARY KEY NOT NULL, email TEXT UNIQUE, name TEXT)"
    let accounts = "SELECT id, email, name FROM acct ORDER BY id"
    let deadAccounts = "SELECT id, email, name FROM tether_dead_acct ORDER BY id"

    func accountPeers() throws -> (Database, Database) {
        let peers = try (0..<2).map { _ in
            let db = try Database.inMemory()
            try db.execute(Self.accountSchema)
            try db.enableSync(table: "acct")
            return db
        }
        return (peers[0], peers[1])
    }

    func observe(_ db: Database) -> LockedBox<[Conflict]> {
        let box = LockedBox<[Conflict]>([])
        db.onConflict { conflict in box.withLock { $0.append(conflict) } }
        return box
    }

    func uniqueRaces(_ conflicts: [Conflict]) -> [(winner: [DatabaseValue], loser: [DatabaseValue], conflict: Conflict)]
    {
        conflicts.compactMap { conflict in
            if case let .uniqueRace(winner, loser) = conflict.resolution { return (winner, loser, conflict) }
            return nil
        }
    }

    @Test func aReceivedRowWithTheLaterUniqueValueEvictsTheLocalHolder() throws {
        let (a, b) = try accountPeers()
        let observedB = observe(b)
        try b.execute("INSERT INTO acct (id, email, name) VALUES ('b1', 'x@y', 'B')")
        try SyncTestKit.moveClockAhead(a)
        try a.execute("INSERT INTO acct (id, email, name) VALUES ('a1', 'x@y', 'A')")

        let reports = try SyncTestKit.sync(a, b)
        #expect(try SyncTestKit.dump(b, accounts) == ["'a1'|'x@y'|'A'"])
        // The loser is deleted as a local change; its values stay in its tombstone.
        #expect(try SyncTestKit.dump(b, deadAccounts) == ["'b1'|'x@y'|'B'"])
        #expect(
            try SyncTestKit.int(b, "SELECT tether_status FROM tether_dead_acct WHERE id = 'b1'")
                == Int64(SyncStatus.deleted.rawValue))
        let races = uniqueRaces(reports.flatMap(\.conflicts))
        #expect(races.count == 1)
        #expect(races.first?.winner == [.text("a1")])
        #expect(races.first?.loser == [.text("b1")])
        #expect(races.first?.conflict.table == "acct")
        #expect(
            races.first?.conflict.peer == a.instanceKey,
            "Conflict.peer is documented as the peer the remote change came from")
        #expect(uniqueRaces(observedB.value).count == 1)

        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a, accounts) == ["'a1'|'x@y'|'A'"])
        #expect(try SyncTestKit.dump(b, accounts) == ["'a1'|'x@y'|'A'"])
        #expect(try SyncTestKit.dump(a, deadAccounts) == ["'b1'|'x@y'|'B'"])
        #expect(try a.keptAsideChanges().isEmpty)
        #expect(try b.keptAsideChanges().isEmpty)
    }

    @Test func aHeldRowWithTheLaterUniqueValueKeepsItAndTheReceivedRowWaits() throws {
        let (a, b) = try accountPeers()
        let observedA = observe(a)
        let observedB = observe(b)
        try a.execute("INSERT INTO acct (id, email, name) VALUES ('a1', 'x@y', 'A')")
        try SyncTestKit.moveClockAhead(b)
        try b.execute("INSERT INTO acct (id, email, name) VALUES ('b1', 'x@y', 'B')")

        // b holds the later value: a's row waits aside on b.
        try SyncTestKit.sync(a, b)
        #expect(try SyncTestKit.dump(b, accounts) == ["'b1'|'x@y'|'B'"])
        let kept = try b.keptAsideChanges()
        #expect(kept.map(\.table) == ["acct"])
        #expect(kept.first?.key == [.text("a1")])
        #expect(kept.first?.reason.uppercased().contains("UNIQUE") == true, "reason: \(kept.first?.reason ?? "none")")

        // On a, the received b1 wins: a1 is deleted as a local change, values kept.
        let reports = try SyncTestKit.sync(b, a)
        #expect(try SyncTestKit.dump(a, accounts) == ["'b1'|'x@y'|'B'"])
        #expect(try SyncTestKit.dump(a, deadAccounts) == ["'a1'|'x@y'|'A'"])
        let races = uniqueRaces(reports.flatMap(\.conflicts))
        #expect(races.count == 1)
        #expect(races.first?.winner == [.text("b1")])
        #expect(races.first?.loser == [.text("a1")])
        #expect(
            races.first?.conflict.peer == b.instanceKey,
            "Conflict.peer is documented as the peer the remote change came from")

        // That deletion reaches b and releases the kept-aside change.
        let back = try SyncTestKit.sync(a, b)
        #expect(back.reduce(0) { $0 + $1.resolvedFromKeptAside } == 1)
        #expect(try b.keptAsideChanges().isEmpty)

        try SyncTestKit.settle([a, b])
        #expect(try SyncTestKit.dump(a, accounts) == ["'b1'|'x@y'|'B'"])
        #expect(try SyncTestKit.dump(b, accounts) == ["'b1'|'x@y'|'B'"])
        #expect(try a.keptAsideChanges().isEmpty)
        #expect(uniqueRaces(observedA.value + observedB.value).count == 1)
    }

    @Test(
        """
        a peer with foreign keys off deletes a parent whose children it inserted in that transaction, or \
        before: the receiver's cascade deletes the children there, its deletions go back, both end without them
        """,
        arguments: [(false, 1000), (true, 1000), (false, 1), (true, 1), (false, 3)])
    func aCascadeTheSourceDidNotMakeGoesBackToIt(childrenBefore: Bool, changesPerBatch: Int) throws {
        let schema = """
            CREATE TABLE parent (id TEXT PRIMARY KEY NOT NULL, name TEXT);
            CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id TEXT REFERENCES parent(id) ON DELETE CASCADE, \
            value INTEGER);
            """
        let (a, b) = (try Database.inMemory(), try Database.inMemory())
        for db in [a, b] {
            try db.execute(schema)
            try db.enableSync(table: "parent")
            try db.enableSync(table: "child")
        }
        let insertChildren = "INSERT INTO child (id, parent_id, value) VALUES (1, 'p1', 1), (2, 'p1', 2), (3, 'p1', 3)"
        try a.execute("INSERT INTO parent (id, name) VALUES ('p1', 'parent')")
        if childrenBefore { try a.execute(insertChildren) }
        try sendChanges(from: a, to: b)
        try a.writeWithoutTransaction { conn in try conn.execute("PRAGMA foreign_keys = OFF") }
        try a.write { conn in
            if !childrenBefore { try conn.execute(insertChildren) }
            try conn.execute("DELETE FROM parent WHERE id = 'p1'")
        }
        #expect(try SyncTestKit.dump(a, children).count == 3)
        let limits = BatchLimits(maximumChanges: changesPerBatch)
        try sendChanges(from: a, to: b, limits: limits)
        #expect(try SyncTestKit.dump(b, children).isEmpty)
        try sendChanges(from: b, to: a, limits: limits)
        try sendChanges(from: a, to: b, limits: limits)
        #expect(try SyncTestKit.dump(a, children).isEmpty)
        #expect(try SyncTestKit.dump(b, children).isEmpty)
    }
}
