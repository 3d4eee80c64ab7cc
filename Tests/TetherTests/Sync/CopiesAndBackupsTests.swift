import Foundation
import Testing
import Tether
import TetherTestSupport

/// A copied database (a cloned node, a restored backup) carries the original's instance key.
/// Synced under it, its writes were silently never sent (a peer's cursor on that key already
/// covered their sequence numbers). Now the copy notices, refuses to sync until rekeyed, keeps
/// its writes meanwhile, and after a rekey every row reaches every node.
@Suite struct CopiesAndBackupsTests {
    enum CopyMethod: String, CaseIterable, CustomTestStringConvertible {
        /// `cp` of a file closed cleanly (checkpointed: no write-ahead log beside it).
        case fileCopy
        /// `sqlite3 a.db ".backup a2.db"` while the original is open.
        case sqliteShellBackup
        var testDescription: String { rawValue }
    }

    /// Syncs every pair both ways with `send`, twice (what one node received reaches the others).
    static func converge(
        _ nodes: [Database], sending send: (Database, Database) throws -> Void = { try sendChanges(from: $0, to: $1) }
    ) throws {
        for _ in 0..<2 {
            for source in nodes {
                for destination in nodes where destination !== source { try send(source, destination) }
            }
        }
    }

    static func isCopyRefusal(_ error: any Error) -> Bool {
        if case .copiedDatabase? = error as? SyncError { return true }
        return false
    }

    @Test(
        """
        a copy notices it is one, refuses to sync with an error naming the fix, keeps its writes, and after a \
        rekey every row is on every node
        """,
        arguments: CopyMethod.allCases)
    func aCopyIsNoticedAndRekeyed(method: CopyMethod) throws {
        let directory = try TemporaryDirectory()
        let originalPath = directory.file("a.db"), copyPath = directory.file("a2.db")
        var original = try NoteDatabase.open(originalPath)
        try NoteDatabase.insert(["n0"], into: original)
        switch method {
        case .fileCopy:
            try original.close()
            try FileManager.default.copyItem(atPath: originalPath, toPath: copyPath)
            original = try NoteDatabase.open(originalPath)
        case .sqliteShellBackup:
            let shell = Process()
            shell.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
            shell.arguments = [originalPath, ".backup '\(copyPath)'"]
            try shell.run()
            shell.waitUntilExit()
            #expect(shell.terminationStatus == 0)
        }
        let copy = try NoteDatabase.open(copyPath)
        let hub = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        #expect(copy.instanceKey == original.instanceKey)
        #expect(try original.detectedCopy() == nil)
        #expect(try copy.detectedCopy() != nil)

        try NoteDatabase.insert(["a1", "a2", "a3"], into: original)
        try NoteDatabase.insert(["b1", "b2", "b3"], into: copy)
        try sendChanges(from: original, to: hub)
        // Both directions are refused, by a message that names the fix; nothing is applied.
        do {
            try sendChanges(from: copy, to: hub)
            Issue.record("a copy synced under the original's key")
        } catch {
            #expect(Self.isCopyRefusal(error))
            #expect("\(error)".contains("tether rekey"))
        }
        #expect(throws: SyncError.self) { try sendChanges(from: hub, to: copy) }
        #expect(try NoteDatabase.ids(copy) == ["b1", "b2", "b3", "n0"])
        // Its writes go on meanwhile, and stay pending.
        try NoteDatabase.insert(["b4"], into: copy)

        let key = try copy.resetInstanceKey()
        #expect(key != original.instanceKey && copy.instanceKey == key)
        #expect(try copy.detectedCopy() == nil)
        try Self.converge([original, copy, hub])
        let everything = ["a1", "a2", "a3", "b1", "b2", "b3", "b4", "n0"]
        for node in [original, copy, hub] { #expect(try NoteDatabase.ids(node) == everything) }
        // A second pass moves nothing: nothing was duplicated or left in flight.
        for node in [original, copy, hub] {
            for peer in [original, copy, hub] where peer !== node {
                let cursor = try peer.cursor(for: node.instanceKey)
                #expect(
                    try node.extractChanges(for: peer.instanceKey, after: cursor.after, markInFlight: false).changes
                        .isEmpty)
            }
        }
        // Reopened, the rekeyed copy stays itself: the file it was rekeyed as is recorded.
        try copy.close()
        let reopened = try Database(path: copyPath)
        #expect(reopened.instanceKey == key)
        #expect(try reopened.detectedCopy() == nil)
    }

    @Test(
        """
        a backup takes a new key when first opened; restored, it syncs with peers that wrote after the backup: \
        nothing refused, nothing lost
        """)
    func aRestoredBackupKeepsSyncing() throws {
        let directory = try TemporaryDirectory()
        let original = try NoteDatabase.open(directory.file("a.db"))
        let peer = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        try NoteDatabase.insert(["r1"], into: original)
        try Self.converge([original, peer])
        try original.backup(to: directory.file("backup.db"))
        #expect(throws: DatabaseError.self) { try original.backup(to: directory.file("backup.db")) }
        // Written after the backup, and received by the peer.
        try NoteDatabase.insert(["r2"], into: original)
        try Self.converge([original, peer])
        try original.close()

        let restored = try Database(path: directory.file("backup.db"))
        #expect(restored.instanceKey != peer.instanceKey)
        #expect(restored.instanceKey != original.instanceKey)
        #expect(try restored.detectedCopy() == nil)
        #expect(try NoteDatabase.ids(restored) == ["r1"])
        try NoteDatabase.insert(["r3"], into: restored)
        try Self.converge([restored, peer])
        #expect(try NoteDatabase.ids(restored) == ["r1", "r2", "r3"])
        #expect(try NoteDatabase.ids(peer) == ["r1", "r2", "r3"])
    }

    @Test(
        "a peer that holds more of this key than this database ever wrote is refused: two databases sync under one key")
    func aPeerAheadOfThisKeyIsRefused() throws {
        let db = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        let peer = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        try NoteDatabase.insert(["x"], into: db)
        let latest = try db.lastSequence()
        do {
            _ = try db.extractChanges(for: peer.instanceKey, after: latest + 3)
            Issue.record("a cursor beyond every sequence given was served")
        } catch let SyncError.instanceKeyReused(reason) {
            #expect(reason.contains("\(latest + 3)") && reason.contains("\(latest)"))
        }
        #expect(try db.extractChanges(for: peer.instanceKey, after: latest).changes.isEmpty)
    }

    @Test(
        """
        a renamed file is the same database; a moved one (copied, the original gone) keeps its key once the move \
        is confirmed
        """)
    func aMoveKeepsTheKey() throws {
        let directory = try TemporaryDirectory()
        let db = try NoteDatabase.open(directory.file("a.db"))
        try NoteDatabase.insert(["m1"], into: db)
        let key = db.instanceKey
        try db.close()
        try FileManager.default.moveItem(atPath: directory.file("a.db"), toPath: directory.file("renamed.db"))
        let renamed = try Database(path: directory.file("renamed.db"))
        #expect(try renamed.detectedCopy() == nil)
        try renamed.close()

        // Another machine: the same bytes in a new file, the old one gone.
        try FileManager.default.copyItem(atPath: directory.file("renamed.db"), toPath: directory.file("moved.db"))
        try FileManager.default.removeItem(atPath: directory.file("renamed.db"))
        let moved = try Database(path: directory.file("moved.db"))
        #expect(try moved.detectedCopy() != nil)
        try moved.confirmMove()
        #expect(try moved.detectedCopy() == nil)
        #expect(moved.instanceKey == key)
        let peer = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        try Self.converge([moved, peer])
        #expect(try NoteDatabase.ids(peer) == ["m1"])
    }

    // MARK: Restored in place

    static func inode(_ path: String) throws -> UInt64? {
        (try FileManager.default.attributesOfItem(atPath: path)[.systemFileNumber] as? NSNumber)?.uint64Value
    }

    @Test(
        """
        measured: a database restored in place, then written past its peers' cursors, loses rows on every node \
        without history marks
        """)
    func restoredInPlaceWithoutMarks() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("a.db")
        var a = try NoteDatabase.open(path)
        let c = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        let d = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        try NoteDatabase.insert(["r1", "r2"], into: a)
        try a.close()
        let snapshot = try Data(contentsOf: URL(fileURLWithPath: path))
        let inode = try Self.inode(path)
        a = try NoteDatabase.open(path)
        try NoteDatabase.insert(["r3", "r4", "r5"], into: a)
        try Self.converge([a, c])
        try Self.converge([c, d])
        try a.close()

        try restoreInPlace(path, from: snapshot)
        #expect(try Self.inode(path) == inode)
        a = try NoteDatabase.open(path)
        #expect(try a.detectedCopy() == nil)
        #expect(try NoteDatabase.ids(a) == ["r1", "r2"])
        try NoteDatabase.insert(["n1", "n2", "n3", "n4", "n5", "n6"], into: a)
        try Self.converge([a, c])
        try Self.converge([c, d])
        print(
            """
            restored in place, no marks: a \(try NoteDatabase.ids(a)); c \(try NoteDatabase.ids(c)); d \
            \(try NoteDatabase.ids(d))
            """)
        #expect(try NoteDatabase.ids(a) == ["n1", "n2", "n3", "n4", "n5", "n6", "r1", "r2"])
        #expect(try NoteDatabase.ids(c) == ["n4", "n5", "n6", "r1", "r2", "r3", "r4", "r5"])
        #expect(try NoteDatabase.ids(d) == ["n4", "n5", "n6", "r1", "r2", "r3", "r4", "r5"])
    }

    /// `sendChanges` as a sync session with `histories` does it (Protocol/README.md §8.9): the
    /// destination shows the mark it keeps of the source's history first, and keeps the mark
    /// each batch comes with.
    static func sendKeepingMarks(from source: Database, to destination: Database) throws {
        if let mark = try destination.historyMark(of: source.instanceKey) {
            try source.checkHistory(mark, heldBy: destination.instanceKey)
        }
        for _ in 0..<100 {
            let cursor = try destination.cursor(for: source.instanceKey)
            let batch = try source.extractChanges(
                for: destination.instanceKey, after: cursor.after, resuming: cursor.resyncing)
            let mark = try source.historyMark(through: batch.through)
            let report = try destination.apply(batch, keepingMark: mark)
            try source.acknowledge(peer: destination.instanceKey, through: report.cursor)
            if batch.isLast { return }
        }
        Issue.record("the exchange did not end")
    }

    static func convergeKeepingMarks(_ nodes: [Database]) throws {
        try converge(nodes, sending: { try sendKeepingMarks(from: $0, to: $1) })
    }

    static func isDivergence(_ error: any Error) -> Bool {
        if case .historyDiverged? = error as? SyncError { return true }
        return false
    }

    @Test(
        """
        a database restored in place and written since is noticed by its peer's history mark, refuses to sync \
        until rekeyed, and then every row is on every node
        """)
    func restoredInPlaceIsNoticed() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("a.db")
        var a = try NoteDatabase.open(path)
        let c = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        let d = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        try NoteDatabase.insert(["r1", "r2"], into: a)
        try NoteDatabase.insert(["c1"], into: c)
        try Self.convergeKeepingMarks([a, c])
        try a.close()
        let snapshot = try Data(contentsOf: URL(fileURLWithPath: path))
        a = try NoteDatabase.open(path)
        // One history, marks shown at every exchange: updates, deletes and other peers' rows refuse nothing.
        try NoteDatabase.insert(["r3", "r4", "r5", "gone"], into: a)
        try Self.convergeKeepingMarks([a, c])
        try a.execute("UPDATE note SET body = 'edited' WHERE id = 'r1'")
        try a.execute("DELETE FROM note WHERE id = 'gone'")
        try c.execute("UPDATE note SET body = 'edited on c' WHERE id = 'r2'")
        try Self.convergeKeepingMarks([a, c])
        try Self.convergeKeepingMarks([c, d])
        #expect(try a.detectedCopy() == nil)
        try a.close()

        try restoreInPlace(path, from: snapshot)
        a = try NoteDatabase.open(path)
        #expect(try a.detectedCopy() == nil)
        try NoteDatabase.insert(["n1", "n2", "n3", "n4", "n5", "n6"], into: a)
        do {
            try Self.sendKeepingMarks(from: a, to: c)
            Issue.record(
                "a database restored in place sent changes under sequence numbers its peer holds of another history")
        } catch {
            #expect(Self.isDivergence(error))
            #expect("\(error)".contains("tether rekey") && "\(error)".contains("\(a.instanceKey)"))
            #expect("\(error)".contains("peer \(c.instanceKey)"))
        }
        #expect(try a.detectedCopy()?.kind == .restored)
        // Every exchange is refused both ways until the rekey, and a move cannot be claimed.
        #expect(throws: SyncError.self) { try Self.sendKeepingMarks(from: c, to: a) }
        #expect(throws: SyncError.self) { try sendChanges(from: a, to: c) }
        #expect(throws: SyncError.self) { try a.confirmMove() }
        #expect(try NoteDatabase.ids(c) == ["c1", "r1", "r2", "r3", "r4", "r5"])
        // Its writes go on meanwhile, and stay pending.
        try NoteDatabase.insert(["n7"], into: a)

        let oldKey = a.instanceKey
        try a.resetInstanceKey()
        #expect(try a.detectedCopy() == nil)
        // Its writes since the restore go out under the new key; the rows of before keep the old one.
        let origins = Dictionary(
            try a.extractChanges(for: InstanceKey.random(), after: 0, markInFlight: false).changes.map {
                ($0.key.first?.description ?? "", $0.existence.origin)
            }, uniquingKeysWith: { first, _ in first })
        #expect(
            origins["'n1'"] == a.instanceKey && origins["'n7'"] == a.instanceKey && origins["'r1'"] == oldKey,
            "\(origins)")
        try Self.convergeKeepingMarks([a, c])
        try Self.convergeKeepingMarks([c, d])
        let everything = ["c1", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "r1", "r2", "r3", "r4", "r5"]
        for node in [a, c, d] { #expect(try NoteDatabase.ids(node) == everything) }
        for node in [a, c, d] {
            #expect(try node.fetchValue("SELECT body FROM note WHERE id = 'r2'", as: String.self) == "edited on c")
        }
        // A second pass moves nothing, and the marks kept since refuse nothing.
        try Self.convergeKeepingMarks([a, c])
        for (node, peer) in [(a, c), (c, a), (c, d), (d, c)] {
            let cursor = try peer.cursor(for: node.instanceKey)
            #expect(
                try node.extractChanges(for: peer.instanceKey, after: cursor.after, markInFlight: false).changes.isEmpty
            )
        }
    }

    @Test(
        """
        a database restored in place whose writes since all moved past its peer's mark is noticed by the first \
        transaction of its opening, and after the rekey what the restore undid comes back
        """)
    func restoredInPlaceWithEveryRowWrittenAgain() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("a.db")
        var a = try NoteDatabase.open(path)
        let c = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        try NoteDatabase.insert(["r1", "r2"], into: a)
        try Self.convergeKeepingMarks([a, c])
        try a.close()
        let snapshot = try Data(contentsOf: URL(fileURLWithPath: path))
        a = try NoteDatabase.open(path)
        try NoteDatabase.insert(["r3", "r4"], into: a)
        try a.execute("UPDATE note SET body = 'edited' WHERE id = 'r1'")
        try Self.convergeKeepingMarks([a, c])
        try a.close()

        try restoreInPlace(path, from: snapshot)
        a = try NoteDatabase.open(path)
        // One row, written in more transactions than the original wrote after the backup: its
        // sequence number ends past the peer's mark, where the rows' check does not look.
        for edit in 1...5 { try a.execute("UPDATE note SET body = ? WHERE id = 'r2'", ["n\(edit)"]) }
        do {
            try Self.sendKeepingMarks(from: a, to: c)
            Issue.record("a database restored in place and written since was not noticed")
        } catch {
            #expect(Self.isDivergence(error))
            #expect("\(error)".contains("the first transaction after an opening"), "\(error)")
        }
        try a.resetInstanceKey()
        try Self.convergeKeepingMarks([a, c])
        for node in [a, c] {
            #expect(try NoteDatabase.ids(node) == ["r1", "r2", "r3", "r4"])
            #expect(
                try node.fetchRows("SELECT body FROM note WHERE id IN ('r1', 'r2') ORDER BY id").map {
                    try $0.get(0, as: String.self)
                } == ["edited", "n5"])
        }
        try a.close()
    }

    @Test("a history mark holds through the sender's own later changes, and one of another history is refused")
    func historyMarks() throws {
        let a = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        let b = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        try NoteDatabase.insert(["x", "y", "w"], into: a)
        let mark = try a.historyMark(through: try a.lastSequence())
        #expect(mark.through == (try a.lastSequence()))
        // Beyond what is committed, a mark says only what is.
        #expect(try a.historyMark(through: mark.through + 10).through == mark.through)
        try a.execute("UPDATE note SET body = 'later' WHERE id = 'x'")
        try a.execute("DELETE FROM note WHERE id = 'y'")
        try NoteDatabase.insert(["z"], into: a)
        try a.checkHistory(mark, heldBy: b.instanceKey)
        // The same sequence numbers at an earlier clock: another history wrote them (w, still at
        // the sequence number it was written under, was written after that clock).
        let earlier = HistoryMark(through: mark.through, clock: mark.clock - 1)
        // From a peer whose word is not taken (a read-only one): refused, nothing recorded.
        #expect(throws: SyncError.self) { try a.checkHistory(earlier, heldBy: b.instanceKey, recording: false) }
        #expect(try a.detectedCopy() == nil)
        #expect(throws: SyncError.self) { try a.checkHistory(earlier, heldBy: b.instanceKey) }
        #expect(try a.detectedCopy()?.kind == .restored)
        #expect(try a.detectedCopy()?.reason.contains("sequence \(mark.through)") == true)
    }
}
