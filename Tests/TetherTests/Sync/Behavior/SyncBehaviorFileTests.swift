import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Sync files: export, import, damage, wrong target, unwritable destination.
@Suite struct SyncBehaviorFileTests {
    /// Everything that shows whether a database changed.
    func state(_ db: Database, peer: InstanceKey) throws -> [String] {
        try SyncTestKit.dump(
            db,
            """
            SELECT id, name, count, tether_seq, tether_status, hex(tether_versions) FROM \(SyncTestKit.meta("t")) \
            ORDER BY id
            """)
            + SyncTestKit.dump(db, "SELECT id, tether_seq FROM tether_dead_t ORDER BY id")
            + [
                "last \(try db.lastSequence())", "cursor \(try db.cursor(for: peer).after)",
                "peers \(try db.peers().count)",
                "kept \(try db.keptAsideChanges().count)",
            ]
    }

    @Test func exportAndImportCarryChangesAndReportProgress() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try SyncTestKit.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.write { conn in
            for id in 1...2_500 {
                try conn.execute("INSERT INTO t (id, name, count) VALUES (?, ?, ?)", [id, "row \(id)", id])
            }
        }
        let url = directory.url.appendingPathComponent("first.tethersync")
        let exportProgress = LockedBox<[SyncProgress]>([])
        let exported = try a.exportSyncFile(to: url, for: b.instanceKey, since: 0) { progress in
            exportProgress.withLock { $0.append(progress) }
        }
        #expect(exported.source == a.instanceKey)
        #expect(exported.target == b.instanceKey)
        #expect(exported.changes == 2_500)
        #expect(exported.batches >= 2)
        #expect(exported.nextSequence == (try a.lastSequence()))
        #expect(FileManager.default.fileExists(atPath: url.path))
        #expect(exportProgress.value.count >= 2)
        #expect(exportProgress.value.map(\.changesDone) == exportProgress.value.map(\.changesDone).sorted())
        #expect(exportProgress.value.last?.changesDone == 2_500)
        #expect(exportProgress.value.allSatisfy { $0.changesExpected >= $0.changesDone })

        let importProgress = LockedBox<[SyncProgress]>([])
        let imported = try b.importSyncFile(from: url) { progress in importProgress.withLock { $0.append(progress) } }
        #expect(imported == exported)
        #expect(try SyncTestKit.dump(b) == SyncTestKit.dump(a), "b: \(String(describing: try? SyncTestKit.dump(b)))")
        #expect(importProgress.value.count == exported.batches)
        #expect(importProgress.value.last?.changesDone == 2_500)
        #expect(try b.cursor(for: a.instanceKey).after == exported.nextSequence)

        // The next export, since nextSequence, holds only the newer changes.
        try a.execute("UPDATE t SET name = 'changed' WHERE id IN (1, 2)")
        try a.execute("DELETE FROM t WHERE id = 3")
        let second = directory.url.appendingPathComponent("second.tethersync")
        let next = try a.exportSyncFile(to: second, for: b.instanceKey, since: exported.nextSequence)
        #expect(next.changes == 3)
        #expect(next.batches == 1)
        try b.importSyncFile(from: second)
        #expect(try SyncTestKit.dump(b) == SyncTestKit.dump(a), "b: \(String(describing: try? SyncTestKit.dump(b)))")

        // Importing a file again changes nothing.
        let before = try state(b, peer: a.instanceKey)
        try b.importSyncFile(from: url)
        try b.importSyncFile(from: second)
        #expect(try state(b, peer: a.instanceKey) == before)
        // An export with nothing new is still a valid file.
        let empty = try a.exportSyncFile(
            to: directory.url.appendingPathComponent("empty.tethersync"), for: b.instanceKey, since: next.nextSequence)
        #expect(empty.changes == 0)
        try b.importSyncFile(from: directory.url.appendingPathComponent("empty.tethersync"))
    }

    /// §7.2, rules checked by the receiver, 2: a table the receiver does not sync is no error.
    @Test func importIntoADatabaseThatDoesNotSyncATableKeepsItsChangesForTheMigrationThatSyncsIt() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let a = try SyncTestKit.peers(1)[0]
        let b = try makeDatabase(schema: SyncTestKit.schema)  // has `t`, syncs no table
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2)")
        let url = directory.url.appendingPathComponent("for-b.tethersync")
        try a.exportSyncFile(to: url, for: b.instanceKey, since: 0)

        let imported = try b.importSyncFile(from: url)
        #expect(imported.keptForSchema == 2)
        #expect(imported.tablesNotSynced == ["t"])
        #expect(try SyncTestKit.dump(b).isEmpty)
        #expect(try b.cursor(for: a.instanceKey).after == imported.nextSequence)
        // Importing it again keeps nothing twice.
        try b.importSyncFile(from: url)
        #expect(try SyncTestKit.int(b, "SELECT count(*) FROM tether_kept_for_schema") == 2)

        // Syncing the table applies what was kept.
        try b.enableSync(table: "t")
        #expect(try SyncTestKit.dump(b) == ["1|'one'|1", "2|'two'|2"])
        #expect(try SyncTestKit.int(b, "SELECT count(*) FROM tether_kept_for_schema") == 0)
    }

    @Test func importRefusesFilesForAnotherDatabaseDamagedFilesAndOtherFiles() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try SyncTestKit.peers(3)
        let (a, b, c) = (peers[0], peers[1], peers[2])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        try a.execute("DELETE FROM t WHERE id = 2")
        let url = directory.url.appendingPathComponent("for-b.tethersync")
        try a.exportSyncFile(to: url, for: b.instanceKey, since: 0)
        let bytes = [UInt8](try Data(contentsOf: url))
        #expect(bytes.count > 60)

        // Made for b: c refuses it.
        let cBefore = try state(c, peer: a.instanceKey)
        #expect(SyncTestKit.syncErrorCase { try c.importSyncFile(from: url) } == "invalidSyncFile")
        #expect(try state(c, peer: a.instanceKey) == cBefore)

        let bBefore = try state(b, peer: a.instanceKey)
        let damaged = directory.url.appendingPathComponent("damaged.tethersync")
        func expectRefused(_ content: [UInt8], _ what: String) throws {
            try Data(content).write(to: damaged)
            let outcome = SyncTestKit.syncErrorCase { try b.importSyncFile(from: damaged) }
            #expect(outcome == "invalidSyncFile", "\(what): \(outcome)")
        }
        // Truncated anywhere.
        for length in 0..<bytes.count { try expectRefused(Array(bytes.prefix(length)), "truncated to \(length) bytes") }
        // Any byte flipped.
        for index in bytes.indices {
            var flipped = bytes
            flipped[index] ^= 0x5A
            try expectRefused(flipped, "byte \(index) flipped")
        }
        // A byte added.
        try expectRefused(bytes + [0], "a byte appended")
        // Not sync files at all.
        try expectRefused(Array("hello, world\n".utf8), "a text file")
        try expectRefused(Array(repeating: 0, count: 4_096), "zeros")
        try expectRefused(Array("TETHERSYNC".utf8) + [1] + Array(repeating: 7, count: 60), "a header and garbage")
        #expect(
            SyncTestKit.syncErrorCase {
                try b.importSyncFile(from: directory.url.appendingPathComponent("missing.tethersync"))
            } == "invalidSyncFile")
        #expect(try state(b, peer: a.instanceKey) == bBefore)

        // The intact file still imports.
        try b.importSyncFile(from: url)
        #expect(try SyncTestKit.dump(b) == ["1|'one'|1", "3|'three'|3"])
    }

    /// A sync file replaces an older sync file, never a directory and what it holds.
    @Test func exportOntoAnExistingDirectoryThrowsAndKeepsTheDirectory() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try SyncTestKit.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1)")
        let occupied = directory.url.appendingPathComponent("occupied.tethersync", isDirectory: true)
        try FileManager.default.createDirectory(at: occupied, withIntermediateDirectories: true)
        try Data("keep".utf8).write(to: occupied.appendingPathComponent("inside"))
        #expect(SyncTestKit.error { try a.exportSyncFile(to: occupied, for: b.instanceKey, since: 0) } != nil)
        #expect(
            FileManager.default.fileExists(atPath: occupied.appendingPathComponent("inside").path),
            "the directory's contents were deleted")
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter {
            $0 != "occupied.tethersync"
        }
        #expect(leftovers.isEmpty, "partial files left behind: \(leftovers)")
    }

    @Test func exportReplacesAnExistingFile() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try SyncTestKit.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1)")
        let url = directory.url.appendingPathComponent("again.tethersync")
        let first = try a.exportSyncFile(to: url, for: b.instanceKey, since: 0)
        try a.execute("INSERT INTO t (id, name, count) VALUES (2, 'two', 2)")
        // The same path again: the new file replaces the old one.
        let outcome = SyncTestKit.error { try a.exportSyncFile(to: url, for: b.instanceKey, since: 0) }
        #expect(outcome == nil, "exporting over an existing file failed: \(String(describing: outcome))")
        #expect(FileManager.default.fileExists(atPath: url.path), "the existing file is gone")
        if FileManager.default.fileExists(atPath: url.path) {
            let summary = try b.importSyncFile(from: url)
            #expect(summary.changes == 2)
            #expect(summary.nextSequence > first.nextSequence)
            #expect(try SyncTestKit.dump(b) == ["1|'one'|1", "2|'two'|2"])
        }
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter {
            $0 != "again.tethersync"
        }
        #expect(leftovers.isEmpty, "partial files left behind: \(leftovers)")
    }

    @Test func exportToAnUnwritablePlaceThrowsAndLeavesNoFile() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try SyncTestKit.peers(2)
        let (a, b) = (peers[0], peers[1])
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1)")

        let missing = directory.url.appendingPathComponent("no-such-directory").appendingPathComponent("out.tethersync")
        #expect(SyncTestKit.error { try a.exportSyncFile(to: missing, for: b.instanceKey, since: 0) } != nil)
        #expect(!FileManager.default.fileExists(atPath: missing.path))

        // The parent is a regular file (unwritable even for root).
        let blocker = directory.url.appendingPathComponent("a-file")
        try Data("not a directory".utf8).write(to: blocker)
        let underFile = blocker.appendingPathComponent("out.tethersync")
        #expect(SyncTestKit.error { try a.exportSyncFile(to: underFile, for: b.instanceKey, since: 0) } != nil)
        #expect(try Data(contentsOf: blocker) == Data("not a directory".utf8))
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0 != "a-file" }
        #expect(leftovers.isEmpty, "partial files left behind: \(leftovers)")

        // Nothing was marked in flight or sent by the failed exports.
        #expect(try SyncTestKit.inFlight(a, id: 1) == false)
        let url = directory.url.appendingPathComponent("good.tethersync")
        try a.exportSyncFile(to: url, for: b.instanceKey, since: 0)
        try b.importSyncFile(from: url)
        #expect(try SyncTestKit.dump(b) == ["1|'one'|1"])
    }
}
