import CSQLite
import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Writes made outside this Database instance, captured by triggers.
@Suite struct SyncBehaviorExternalTests {
    func fileDatabase(in directory: TemporaryDirectory) throws -> (Database, String) {
        let path = directory.file("shared.sqlite")
        let db = try Database(path: path)
        try db.execute(SyncTestKit.schema)
        try db.enableSync(table: "t", capturingExternalWrites: true)
        return (db, path)
    }

    /// The library's own writes skip the capture triggers while they are the schema's only
    /// triggers; a trigger of the user's turns the schema's triggers back on (and runs for every
    /// write); dropping it turns them off again. Either way other programs' writes are captured.
    @Test func theLibrarysWritesSkipTheCaptureTriggersButNeverTheUsers() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (db, path) = try fileDatabase(in: directory)
        defer { try? db.close() }
        func queued() throws -> Int64? { try SyncTestKit.int(db, "SELECT count(*) FROM tether_external_changes") }
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1)")
        try db.execute("UPDATE t SET count = 2 WHERE id = 1")
        #expect(try queued() == 0)
        try db.execute("CREATE TABLE audit (id INTEGER, count INTEGER)")
        try db.write { conn in
            try conn.execute(
                "CREATE TRIGGER audit_t AFTER UPDATE ON t BEGIN INSERT INTO audit VALUES (NEW.id, NEW.count); END")
            // In the same transaction as its creation, the user's trigger runs for the library's writes.
            try conn.execute("UPDATE t SET count = 3 WHERE id = 1")
        }
        try db.execute("UPDATE t SET count = 4 WHERE id = 1")
        #expect(
            try db.fetchRows("SELECT count FROM audit ORDER BY rowid").map { try $0.get(0, as: Int64.self) } == [3, 4])
        #expect(try queued() == 0)
        try db.execute("DROP TRIGGER audit_t")
        try db.execute("UPDATE t SET count = 5 WHERE id = 1")
        #expect(try SyncTestKit.int(db, "SELECT count(*) FROM audit") == 2)
        // Another connection's write still goes through the capture triggers.
        let other = try Database(path: path)
        try other.execute("UPDATE t SET name = 'from other' WHERE id = 1")
        try other.close()
        let peer = try SyncTestKit.peers(1)[0]
        try SyncTestKit.sync(db, peer)
        #expect(try SyncTestKit.dump(peer) == ["1|'from other'|5"])
    }

    /// Another program's transactions are numbered in the order it wrote, across tables: a parent
    /// and a child written together keep their order whichever order the tables are held in (a
    /// peer judging the child by its parent, under a scope, then meets the parent first).
    @Test func anotherProgramsWritesAreNumberedInTheOrderWrittenAcrossTables() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("orders.sqlite")
        let db = try Database(path: path)
        defer { try? db.close() }
        try db.execute(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT); "
                + "CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER)"
        )
        for table in ["orders", "order_line"] { try db.enableSync(table: table, capturingExternalWrites: true) }
        // The sqlite3 shell's way: a plain connection, the triggers alone capture.
        var shell: OpaquePointer?
        #expect(sqlite3_open_v2(path, &shell, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK)
        defer { sqlite3_close(shell) }
        for script in [
            "BEGIN; INSERT INTO orders VALUES (1, 'north'); INSERT INTO order_line VALUES (11, 1); COMMIT;",
            "BEGIN; INSERT INTO order_line VALUES (12, 2); INSERT INTO orders VALUES (2, 'north'); COMMIT;",
        ] {
            #expect(sqlite3_exec(shell, script, nil, nil, nil) == SQLITE_OK)
        }
        try db.captureExternalWrites()
        func sequence(_ table: String, _ id: Int64) throws -> Int64? {
            try SyncTestKit.int(db, "SELECT seq FROM tether_rows_\(table) WHERE row_id = \(id)")
        }
        let order1 = try #require(try sequence("orders", 1)), line11 = try #require(try sequence("order_line", 11))
        let line12 = try #require(try sequence("order_line", 12)), order2 = try #require(try sequence("orders", 2))
        #expect(order1 < line11 && line11 < line12 && line12 < order2, "numbered \([order1, line11, line12, order2])")
    }

    @Test func writesByAnotherDatabaseInstanceOnTheSameFileReachPeers() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (db, path) = try fileDatabase(in: directory)
        defer { try? db.close() }
        let peer = try SyncTestKit.peers(1)[0]
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2)")
        try SyncTestKit.sync(db, peer)
        let before = try db.lastSequence()

        let other = try Database(path: path)
        try other.execute("INSERT INTO t (id, name, count) VALUES (3, 'from other', 3)")
        try other.execute("UPDATE t SET name = 'uno' WHERE id = 1")
        try other.execute("DELETE FROM t WHERE id = 2")
        try other.close()

        let batch = try db.extractChanges(
            for: peer.instanceKey, after: try peer.cursor(for: db.instanceKey).after, markInFlight: false)
        #expect(Set(batch.changes.map(\.key)) == [[.integer(1)], [.integer(2)], [.integer(3)]])
        #expect(batch.changes.allSatisfy { $0.sequence > before })
        #expect(try SyncTestKit.int(db, "SELECT count(*) FROM \(SyncTestKit.meta("t")) WHERE tether_seq IS NULL") == 0)
        try SyncTestKit.sync(db, peer)
        #expect(try SyncTestKit.dump(peer) == ["1|'uno'|1", "3|'from other'|3"])
        #expect(
            try SyncTestKit.dump(peer) == SyncTestKit.dump(db),
            "peer: \(String(describing: try? SyncTestKit.dump(peer)))")
    }

    @Test func writesByTheSQLiteShellGetSequenceNumbersAndReachPeers() throws {
        let shell = URL(fileURLWithPath: "/usr/bin/sqlite3")
        try #require(FileManager.default.isExecutableFile(atPath: shell.path), "the sqlite3 shell is not installed")
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (db, path) = try fileDatabase(in: directory)
        defer { try? db.close() }
        let peer = try SyncTestKit.peers(1)[0]
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        try SyncTestKit.sync(db, peer)
        let before = try db.lastSequence()

        let process = Process()
        process.executableURL = shell
        process.arguments = [
            path,
            """
            INSERT INTO t (id, name, count) VALUES (5, 'shell', 5);
            UPDATE t SET count = 10 WHERE id = 1;
            DELETE FROM t WHERE id = 2;
            """,
        ]
        let errors = Pipe()
        process.standardError = errors
        try process.run()
        process.waitUntilExit()
        let message = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        try #require(process.terminationStatus == 0, "sqlite3 failed: \(message)")

        let batch = try db.extractChanges(
            for: peer.instanceKey, after: try peer.cursor(for: db.instanceKey).after, markInFlight: false)
        #expect(Set(batch.changes.map(\.key)) == [[.integer(1)], [.integer(2)], [.integer(5)]])
        #expect(batch.changes.allSatisfy { $0.sequence > before })
        #expect(try SyncTestKit.status(db, id: 5) == .created)
        #expect(try SyncTestKit.status(db, id: 1) == .updated)
        #expect(try SyncTestKit.deadStatus(db, id: 2) == .deleted)
        let sequences = try db.fetchRows(
            "SELECT tether_seq FROM \(SyncTestKit.meta("t")) UNION ALL SELECT tether_seq FROM tether_dead_t"
        ).map { try $0.get(0, as: Int64.self) }
        #expect(Set(sequences).count == sequences.count)

        try SyncTestKit.sync(db, peer)
        #expect(try SyncTestKit.dump(peer) == ["1|'one'|10", "3|'three'|3", "5|'shell'|5"])
        #expect(
            try SyncTestKit.dump(db) == SyncTestKit.dump(peer), "db: \(String(describing: try? SyncTestKit.dump(db)))")
    }

    /// A row of `t` for the ORM's bulk insert.
    struct Item: Model, Equatable {
        var id: Int64
        var name: String
        var count: Int
        static let tableName = "t"
    }

    /// The library's own writes to a trigger-captured table are captured as any synced table's
    /// — a bulk insert as one insert range, an update by the hook — not queued by the triggers;
    /// nothing of the pause is committed, whatever savepoints rolled back, so the triggers still
    /// capture what another program writes.
    @Test func ownWritesSkipTheTriggersWhichStayArmedForOtherPrograms() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let (db, path) = try fileDatabase(in: directory)
        defer { try? db.close() }
        let peer = try SyncTestKit.peers(1)[0]
        func pausedCount() throws -> Int64? { try SyncTestKit.int(db, "SELECT count(*) FROM tether_capture_paused") }

        try db.insert(contentsOf: (1...100).map { Item(id: $0, name: "item \($0)", count: Int($0)) })
        #expect(try SyncTestKit.int(db, "SELECT count(*) FROM tether_insert_ranges WHERE table_name = 't'") == 1)
        #expect(
            try SyncTestKit.int(db, "SELECT count(*) FROM tether_rows_t") == 0,
            "the bulk-inserted rows belong to their range")
        #expect(try pausedCount() == 0)

        try db.update(Item(id: 1, name: "one", count: 1), columns: ["name"])
        struct Undo: Error {}
        try db.write { conn in
            try conn.execute("UPDATE t SET count = 20 WHERE id = 2")
            _ = try? conn.savepoint { () throws -> Void in
                try conn.execute("UPDATE t SET count = 30 WHERE id = 3")
                throw Undo()
            }
            try conn.execute("UPDATE t SET count = 40 WHERE id = 4")
        }
        // The first write of the transaction inside a savepoint that rolls back: the pause goes with it.
        try db.write { conn in
            _ = try? conn.savepoint { () throws -> Void in
                try conn.execute("UPDATE t SET count = 50 WHERE id = 5")
                throw Undo()
            }
            try conn.execute("UPDATE t SET count = 60 WHERE id = 6")
        }
        #expect(try pausedCount() == 0)
        #expect(try SyncTestKit.int(db, "SELECT count(*) FROM tether_external_changes") == 0)
        #expect(try SyncTestKit.status(db, id: 1) == .created)
        #expect(
            try SyncTestKit.dump(db, "SELECT id, count FROM t WHERE id BETWEEN 2 AND 6 ORDER BY id") == [
                "2|20", "3|3", "4|40", "5|5", "6|60",
            ])

        // Another program's write: the triggers capture it.
        var other: OpaquePointer?
        try #require(sqlite3_open_v2(path, &other, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK)
        defer { sqlite3_close_v2(other) }
        try #require(
            sqlite3_exec(
                other,
                """
                INSERT INTO t (id, name, count) VALUES (101, 'other', 101); UPDATE t SET name = 'by other' WHERE \
                id = 7
                """, nil, nil, nil) == SQLITE_OK)

        try SyncTestKit.sync(db, peer)
        #expect(try SyncTestKit.dump(peer) == SyncTestKit.dump(db))
        #expect(
            try SyncTestKit.dump(peer, "SELECT name FROM t WHERE id IN (1, 7, 101) ORDER BY id") == [
                "'one'", "'by other'", "'other'",
            ])
    }

    /// The engine's own metadata writes (marking rows in flight, acknowledging)
    /// are not changes: acknowledged rows must stay synced.
    @Test func acknowledgedRowsOfATriggerCapturedTableStaySynced() throws {
        let a = try SyncTestKit.peers(1, capturingExternalWrites: true)[0]
        let b = try SyncTestKit.peers(1)[0]
        try a.execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', 2), (3, 'three', 3)")
        try SyncTestKit.sync(a, b)
        #expect(try SyncTestKit.pendingCount(a) == 0)
        let cursor = try b.cursor(for: a.instanceKey).after

        try a.execute("INSERT INTO t (id, name, count) VALUES (4, 'four', 4)")
        #expect(try SyncTestKit.pendingCount(a) == 1, "rows 1...3 were acknowledged and have not changed since")
        let next = try a.extractChanges(for: b.instanceKey, after: cursor, markInFlight: false)
        #expect(next.changes.map(\.key) == [[.integer(4)]])
        #expect(try SyncTestKit.status(a, id: 1) == .synced)
    }
}
