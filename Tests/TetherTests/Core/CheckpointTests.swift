import Foundation
import Testing
@testable import Tether
import TetherTestSupport

@Suite("Core: checkpoints off the writer's commits")
struct CheckpointTests {
    /// Small commits that take the write-ahead log past SQLite's automatic threshold are folded
    /// into the file by the background checkpointer, not by the commit that crossed it; the data
    /// stays whole and the log restarts from its beginning.
    @Test func smallCommitsAreFoldedInTheBackground() throws {
        try withNewTable { db, path, fileSizeBefore, checkpointer in
            // Each commit writes at least a page of the table: 1,200 of them cross 1,000 pages.
            let payload = Data(repeating: 7, count: 3_000)
            for id in 1...1_200 {
                try db.execute("INSERT INTO t (id, payload) VALUES (?, ?)", [id, payload])
            }
            // A checkpoint that ran while commits went on folded only part of the log; the commits
            // after it asked again (the log still held 1,000 pages), so the last one folds it whole.
            #expect(eventually { checkpointer.completedCheckpoints >= 1 && checkpointer.isCaughtUpWithTheLog })
            // The pages are in the database file now, not only in the log (a checkpoint that met
            // the writer resetting the log is tried again a little later).
            #expect(try eventually { try fileSize(path) > fileSizeBefore + 1_000 * 3_000 })
            #expect(try db.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1_200)
            // The log restarts at a next write (it was folded whole): at the first one unless a
            // checkpoint still holds its read of the log then (a retry, under load; the CI saw one).
            var id = 1_200
            #expect(
                try eventually {
                    id += 1
                    try db.execute("INSERT INTO t (id, payload) VALUES (?, ?)", [id, payload])
                    let logPages = try db.writeWithoutTransaction {
                        try $0.fetchRow("PRAGMA wal_checkpoint(PASSIVE)")?.get(1, as: Int.self)
                    }
                    return (logPages ?? .max) < 100
                }, "the log never restarted from its beginning")
        }
    }

    /// One transaction that alone takes the log past the inline limit (a bulk load, a whole
    /// catch-up) is folded by the checkpointer too: its commit returns without copying and syncing
    /// the log, which it did before (and the checkpointer, never asked, then ran no checkpoint).
    @Test func aHugeTransactionIsFoldedInTheBackground() throws {
        try withNewTable { db, path, fileSizeBefore, checkpointer in
            // A row a page: more pages than the inline limit, in one commit.
            let rows = Int(BackgroundCheckpointer.inlineLimitPages) + 100
            let payload = Data(repeating: 3, count: 3_000)
            try db.write { conn in
                for id in 1...rows { try conn.execute("INSERT INTO t (id, payload) VALUES (?, ?)", [id, payload]) }
            }
            #expect(eventually { checkpointer.completedCheckpoints >= 1 && checkpointer.isCaughtUpWithTheLog })
            #expect(try eventually { try fileSize(path) > fileSizeBefore + rows * 3_000 })
            #expect(try db.fetchValue("SELECT count(*) FROM t", as: Int.self) == rows)
            // Another, once the first is folded: the log was short again, so this one too (a new
            // payload: SQLite writes no page a row's update leaves as it was).
            let folded = checkpointer.completedCheckpoints
            let newPayload = Data(repeating: 4, count: 3_000)
            try db.write { conn in
                for id in 1...rows { try conn.execute("UPDATE t SET payload = ? WHERE id = ?", [newPayload, id]) }
            }
            #expect(eventually { checkpointer.completedCheckpoints > folded && checkpointer.isCaughtUpWithTheLog })
        }
    }

    /// A reader holding an old snapshot keeps its pages in the log; the background checkpoint
    /// folds what it can and the reader still reads its snapshot, the writer the new rows.
    @Test func aReaderKeepsItsSnapshotWhileTheLogIsFolded() throws {
        try withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            defer { try? db.close() }
            try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload BLOB)")
            try db.execute("INSERT INTO t (id, payload) VALUES (0, x'00')")
            let payload = Data(repeating: 1, count: 3_000)
            try db.read { reader in
                #expect(try reader.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1)
                try reader.transaction {
                    #expect(try reader.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1)
                    for id in 1...1_100 {
                        try db.execute("INSERT INTO t (id, payload) VALUES (?, ?)", [id, payload])
                    }
                    let checkpointer = try #require(db.checkpointer)
                    #expect(eventually { checkpointer.completedCheckpoints >= 1 })
                    #expect(try reader.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1)
                }
            }
            #expect(try db.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1_101)
        }
    }

    /// In-memory and read-only databases have no log of their own to fold.
    @Test func onlyFilesOpenedForWritingHaveOne() throws {
        #expect(try Database.inMemory().checkpointer == nil)
        try withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("db.sqlite").path
            try Database(path: path).close()
            var configuration = Database.Configuration()
            configuration.readOnly = true
            let readOnly = try Database(path: path, configuration: configuration)
            defer { try? readOnly.close() }
            #expect(readOnly.checkpointer == nil)
        }
    }

    /// Closing folds the log and removes it, as SQLite does when its last connection closes:
    /// the checkpointer's connection is closed first.
    @Test func closingLeavesNoLog() throws {
        try withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("db.sqlite").path
            let db = try Database(path: path)
            try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload BLOB)")
            for id in 1...1_100 {
                try db.execute("INSERT INTO t (id, payload) VALUES (?, ?)", [id, Data(repeating: 2, count: 3_000)])
            }
            let checkpointer = try #require(db.checkpointer)
            #expect(eventually { checkpointer.completedCheckpoints >= 1 })
            try db.close()
            #expect(!FileManager.default.fileExists(atPath: path + "-wal"))
            let reopened = try Database(path: path)
            defer { try? reopened.close() }
            #expect(try reopened.fetchValue("SELECT count(*) FROM t", as: Int.self) == 1_100)
        }
    }

    /// Runs `body` on a new file database with table `t` (`id`, `payload`), with its path, the
    /// size of its file and its checkpointer, which has run no checkpoint yet.
    private func withNewTable(
        _ body: (Database, _ path: String, _ fileSize: Int, BackgroundCheckpointer) throws -> Void
    ) throws {
        try withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("db.sqlite").path
            let db = try Database(path: path)
            defer { try? db.close() }
            try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload BLOB)")
            let checkpointer = try #require(db.checkpointer)
            #expect(checkpointer.completedCheckpoints == 0)
            try body(db, path, try fileSize(path), checkpointer)
        }
    }

    private func fileSize(_ path: String) throws -> Int {
        try (FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue ?? 0
    }
}
