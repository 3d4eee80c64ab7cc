import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Nested models and expiring rows on synced tables: the children are rows like any other,
/// the links sync with their parents, an expiry reaches peers with its row, and the deletion
/// at the date is a change like any other.
@Suite struct SyncNestedAndExpiryTests {
    @Test func aNestedGraphReachesAPeerAndItsEditsFollow() throws {
        let a = try Database.inMemory()
        let b = try Database.inMemory()
        for db in [a, b] {
            try db.createTable(NestEmployer.self)
            try db.enableSync(for: NestEmployer.self)  // the children's tables too
            #expect(db.syncedTables == ["nest_address", "nest_employee", "nest_employer"])
        }
        try a.insert(nestEmployer())
        try SyncTestKit.sync(a, b)
        #expect(try b.fetch(NestEmployer.self, key: PrimaryKey("E1")) == nestEmployer())
        #expect(try b.count(NestEmployee.self) == 2)

        // A child edited on its own, on A: B's parent reads the new value.
        try a.update(NestEmployee(id: "e2", firstName: "Samir"))
        try SyncTestKit.sync(a, b)
        #expect(try b.fetch(NestEmployer.self, key: PrimaryKey("E1"))?.employees.map(\.firstName) == ["Nour", "Samir"])

        // B adds a child and moves the parent: the link and the new row reach A.
        var moved = try #require(try b.fetch(NestEmployer.self, key: PrimaryKey("E1")))
        moved.employees.append(NestEmployee(id: "e3", firstName: "Rana"))
        moved.branch = NestAddress(id: 11, city: "Tyre")
        try b.save(moved)
        try SyncTestKit.sync(b, a)
        #expect(try a.fetch(NestEmployer.self, key: PrimaryKey("E1")) == moved)

        // Deleting with the children on A deletes them on B.
        try a.delete(moved, deletingChildren: true)
        try SyncTestKit.sync(a, b)
        #expect(try b.count(NestEmployer.self) == 0)
        #expect(try b.count(NestEmployee.self) == 0)
        #expect(try b.count(NestAddress.self) == 0)
    }

    @Test(.timeLimit(.minutes(1))) func anExpiryReachesPeersAndEachDeletesTheRowAtItsDate() async throws {
        let a = try makeDatabase(syncing: ExpSession.self)
        let b = try makeDatabase(syncing: ExpSession.self)
        let c = try makeDatabase(syncing: ExpSession.self)
        let later = Date(timeIntervalSinceNow: 3600)
        try a.insert(ExpSession(id: "keep", user: "arthur"))
        try a.insert(ExpSession(id: "s1", user: "arthur"), expiresAt: later)
        try a.insert(ExpSession(id: "s2", user: "barbara"), expiresAt: Date(timeIntervalSinceNow: 0.4))
        // Tether's store of expiry dates syncs with every synced table, and is not listed as the user's.
        #expect(a.syncedTables == ["exp_session"])
        #expect(
            try a.fetchValue(
                "SELECT count(*) FROM tether_tables WHERE name = ?", [ExpiryStore.syncedTable], as: Int.self) == 1)
        let deletedOnB = deletions(in: b, of: ExpSession.tableName)
        try SyncTestKit.sync(a, b)

        // B holds the rows and their expiries.
        #expect(b.syncedTables == ["exp_session"])
        #expect(
            try b.expiry(of: ExpSession.self, key: PrimaryKey("s1"))?.timeIntervalSince1970
                == later.timeIntervalSince1970)
        #expect(try b.pendingChangeCount(tables: ["exp_session"]) == 0)

        // Offline from A, B deletes s2 at its date by itself, as a local change to send.
        var deleted = deletedOnB.keys.makeAsyncIterator()
        #expect(await deleted.next() == PrimaryKey("s2"))
        deletedOnB.token.cancel()
        #expect(try b.fetchAll(ExpSession.self).map(\.id) == ["keep", "s1"])
        #expect(try b.pendingChangeCount(tables: ["exp_session"]) == 1)
        let sent = try b.extractChanges(for: c.instanceKey, after: 0, markInFlight: false)
        let deletions = sent.changes.filter { sent.tables[$0.table].name == "exp_session" && !$0.isAlive }
        #expect(deletions.map(\.key) == [[.text("s2")]])

        // Every peer converges: the same rows, the same expiry for s1.
        try SyncTestKit.settle([a, b, c])
        for db in [a, b, c] {
            #expect(try db.fetchAll(ExpSession.self).map(\.id) == ["keep", "s1"])
            #expect(
                try db.expiry(of: ExpSession.self, key: PrimaryKey("s1"))?.timeIntervalSince1970
                    == later.timeIntervalSince1970)
            #expect(try db.fetchValue("SELECT count(*) FROM \(ExpiryStore.syncedTable)", as: Int.self) == 1)
        }
    }

    @Test func rowsImportedFromASyncFileKeepTheirExpiry() throws {
        let a = try makeDatabase(syncing: ExpSession.self)
        let b = try makeDatabase(syncing: ExpSession.self)
        let later = Date(timeIntervalSinceNow: 3600)
        try a.insert(ExpSession(id: "s1", user: "arthur"), expiresAt: later)
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let file = directory.url.appendingPathComponent("expiry.tether")
        try a.exportSyncFile(to: file, for: b.instanceKey, since: 0)
        try b.importSyncFile(from: file)
        #expect(try b.fetchAll(ExpSession.self) == [ExpSession(id: "s1", user: "arthur")])
        #expect(
            try b.expiry(of: ExpSession.self, key: PrimaryKey("s1"))?.timeIntervalSince1970
                == later.timeIntervalSince1970)

        // An expiry set later, already passed, deletes the row on both sides.
        try a.setExpiry(of: ExpSession.self, key: PrimaryKey("s1"), to: Date(timeIntervalSinceNow: -1))
        #expect(try a.count(ExpSession.self) == 0)
        try SyncTestKit.sync(a, b)
        #expect(try b.count(ExpSession.self) == 0)
        #expect(try b.fetchValue("SELECT count(*) FROM \(ExpiryStore.syncedTable)", as: Int.self) == 0)
    }
}
