import Foundation
import Testing
@testable import Tether
@testable import TetherSync
import TetherWire

/// Peers on different schema versions (issue 12): a migration on one of two peers, sessions
/// before and after the other one runs it too.
@Suite("Rolling upgrades: peers of different schema versions")
struct RollingUpgradeTests {
    /// A peer syncing `t (id, name)`.
    static func peer() throws -> Database {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        try db.enableSync(table: "t")
        return db
    }

    static func migrate(_ db: Database, _ name: String, _ body: @escaping @Sendable (Migration) throws -> Void) throws {
        var migrator = Migrator()
        migrator.allowsUnknownMigrations = true  // each test registers only the next one
        migrator.register(name, body)
        try migrator.migrate(db)
    }

    /// One `syncOnce` of `client` with a server over `server`: the client's summary.
    static func sync(_ server: Database, _ client: Database, pki: TestPKI) async throws -> SyncSummary {
        try await withSyncServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext())
        }
    }

    static func rows(_ db: Database, _ sql: String) throws -> [String] {
        try db.fetchRows(sql).map { $0.values.map(\.description).joined(separator: "|") }
    }

    @Test(
        """
        a column one peer added: synced without it meanwhile, its values backfilled once both have it, and only \
        the rows that hold one
        """)
    func addedColumnIsBackfilled() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Self.peer(), b = try Self.peer()
        try a.execute(
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50) INSERT INTO t (id, name) \
            SELECT i, 'row ' || i FROM n
            """)
        _ = try await Self.sync(a, b, pki: pki)

        // A upgrades: the column has no value anywhere yet, so the migration changes no row.
        let before = try a.lastSequence()
        try Self.migrate(a, "color") { try $0.addColumn("color", to: "t", "TEXT") }
        #expect(try a.lastSequence() == before)
        try a.execute("UPDATE t SET color = 'red' WHERE id IN (1, 2)")
        try a.execute("INSERT INTO t (id, name, color) VALUES (51, 'new on a', 'blue')")
        try b.execute("UPDATE t SET name = 'renamed on b' WHERE id = 3")
        var summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesReceived == 3 && summary.changesSent == 1)
        #expect(try Self.rows(a, "SELECT name FROM t WHERE id = 3") == ["'renamed on b'"])
        #expect(try Self.rows(b, "SELECT name FROM t WHERE id = 51") == ["'new on a'"])
        #expect(try b.peerSchemas().first?.differences == ["table t: column color is synced by the peer, not here"])

        // B upgrades: the three rows holding a color come by backfill, nothing else does.
        try Self.migrate(b, "color") { try $0.addColumn("color", to: "t", "TEXT") }
        summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesReceived == 3, "\(summary)")
        let colors = "SELECT id, color FROM t WHERE color IS NOT NULL ORDER BY id"
        #expect(try Self.rows(b, colors) == ["1|'red'", "2|'red'", "51|'blue'"])
        #expect(try Self.rows(a, "SELECT * FROM t ORDER BY id") == Self.rows(b, "SELECT * FROM t ORDER BY id"))
        #expect(try b.peerSchemas().first?.differences == [])

        // From now on it syncs both ways like any column, and the backfill is not repeated.
        try b.execute("UPDATE t SET color = 'green' WHERE id = 4")
        summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesSent == 1 && summary.changesReceived == 0)
        #expect(try Self.rows(a, "SELECT color FROM t WHERE id = 4") == ["'green'"])
    }

    @Test("a nullable column added on every peer moves no row (no backfill storm)")
    func nullableColumnMovesNothing() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Self.peer(), b = try Self.peer()
        try a.execute(
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) INSERT INTO t (id, \
            name) SELECT i, 'row ' || i FROM n
            """)
        _ = try await Self.sync(a, b, pki: pki)
        for db in [a, b] {
            let before = try db.lastSequence()
            try Self.migrate(db, "note") { try $0.addColumn("note", to: "t", "TEXT") }
            try Self.migrate(db, "rank") { try $0.addColumn("rank", to: "t", "INTEGER NOT NULL DEFAULT 0") }
            #expect(try db.lastSequence() == before)
            #expect(try db.pendingChangeCount(tables: ["t"]) == 0)
            let summary = try await Self.sync(a, b, pki: pki)
            #expect(summary.changesSent == 0 && summary.changesReceived == 0, "\(summary)")
        }
    }

    @Test("a renamed column keeps syncing with a peer that still has the old name, and nothing is sent again")
    func renamedColumnKeepsSyncing() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Database.inMemory(), b = try Database.inMemory()
        for db in [a, b] {
            try db.execute("CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT, score INTEGER)")
            try db.enableSync(table: "player")
        }
        try a.execute("INSERT INTO player (id, name, score) VALUES (1, 'ann', 10), (2, 'bob', 20)")
        _ = try await Self.sync(a, b, pki: pki)

        try Self.migrate(a, "points") { try $0.renameColumn("score", to: "points", in: "player") }
        var summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesSent == 0 && summary.changesReceived == 0, "\(summary)")
        try a.execute("UPDATE player SET points = 11 WHERE id = 1")
        try b.execute("UPDATE player SET score = 22 WHERE id = 2")
        summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesSent == 1 && summary.changesReceived == 1)
        #expect(try Self.rows(a, "SELECT id, points FROM player ORDER BY id") == ["1|11", "2|22"])
        #expect(try Self.rows(b, "SELECT id, score FROM player ORDER BY id") == ["1|11", "2|22"])
        #expect(
            try b.peerSchemas().first?.differences == [
                "table player: column score here is points on the peer (renamed)"
            ])

        // B renames too: the same column, nothing to backfill.
        try Self.migrate(b, "points") { try $0.renameColumn("score", to: "points", in: "player") }
        summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesSent == 0 && summary.changesReceived == 0, "\(summary)")
        #expect(try b.peerSchemas().first?.differences == [])
    }

    @Test(
        """
        a renamed key column keeps syncing with a peer that still has the old name; a key that differs otherwise \
        is still ERROR 2
        """)
    func renamedKeyColumnKeepsSyncing() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Database.inMemory(), b = try Database.inMemory()
        for db in [a, b] {
            try db.execute("CREATE TABLE item (code TEXT PRIMARY KEY, label TEXT)")
            try db.enableSync(table: "item")
        }
        try a.execute("INSERT INTO item (code, label) VALUES ('x1', 'one'), ('x2', 'two')")
        _ = try await Self.sync(a, b, pki: pki)

        try Self.migrate(a, "sku") { try $0.renameColumn("code", to: "sku", in: "item") }
        var summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesSent == 0 && summary.changesReceived == 0, "\(summary)")
        try a.execute("UPDATE item SET label = 'ONE' WHERE sku = 'x1'")
        try a.execute("INSERT INTO item (sku, label) VALUES ('x3', 'three')")
        try b.execute("UPDATE item SET label = 'TWO' WHERE code = 'x2'")
        summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesSent == 1 && summary.changesReceived == 2, "\(summary)")
        #expect(
            try Self.rows(a, "SELECT sku, label FROM item ORDER BY sku") == [
                "'x1'|'ONE'", "'x2'|'TWO'", "'x3'|'three'",
            ])
        #expect(
            try Self.rows(b, "SELECT code, label FROM item ORDER BY code") == [
                "'x1'|'ONE'", "'x2'|'TWO'", "'x3'|'three'",
            ])
        #expect(
            try b.peerSchemas().first?.differences == ["table item: key column code here is sku on the peer (renamed)"])

        // B renames too: the same table again, nothing sent.
        try Self.migrate(b, "sku") { try $0.renameColumn("code", to: "sku", in: "item") }
        summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesSent == 0 && summary.changesReceived == 0, "\(summary)")
        #expect(try b.peerSchemas().first?.differences == [])

        // A key column that is not a rename of the other's still stops the session.
        let c = try Database.inMemory()
        try c.execute("CREATE TABLE item (ref TEXT PRIMARY KEY, label TEXT)")
        try c.enableSync(table: "item")
        do {
            _ = try await Self.sync(a, c, pki: pki)
            Issue.record("a peer identifying item by ref synced with one identifying it by sku")
        } catch let error as SyncSessionError {
            guard case let .schemaMismatch(table, _, message) = error else { Issue.record("\(error)"); return }
            #expect(table == "item" && message.contains("key columns differ"), "\(message)")
        }
    }

    @Test(
        """
        a migration while a session is open: each side sends what its peer announced at the handshake, and the \
        next session backfills the rest
        """,
        // Under a minute alone (and with the whole sync target); in the full suite on two cores its
        // cases wait behind the command-line tests for their thread, and once missed a minute's limit.
        .timeLimit(.minutes(3)), arguments: [false, true])
    func migrationDuringALiveSession(serverMigratedFirst: Bool) async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Self.peer(), b = try Self.peer()
        try a.execute("INSERT INTO t (id, name) VALUES (1, 'one'), (2, 'two')")
        _ = try await Self.sync(a, b, pki: pki)
        if serverMigratedFirst { try Self.migrate(a, "color") { try $0.addColumn("color", to: "t", "TEXT") } }
        let updatedOnA = Self.updates(in: a), updatedOnB = Self.updates(in: b)

        try await withSyncServer(a, pki: pki) { server in
            let connection = try await SyncClient.connect(
                database: b, host: "127.0.0.1", port: server.port, tls: try pki.clientContext())
            for db in serverMigratedFirst ? [b] : [a, b] {
                try Self.migrate(db, "color") { try $0.addColumn("color", to: "t", "TEXT") }
            }
            try b.execute("UPDATE t SET name = 'one on b', color = 'red' WHERE id = 1")
            connection.notifyLocalChanges()
            try a.execute("UPDATE t SET name = 'two on a', color = 'blue' WHERE id = 2")
            // Each side's own update and the other's, applied, in whichever order they came.
            var onA = updatedOnA.keys.makeAsyncIterator(), onB = updatedOnB.keys.makeAsyncIterator()
            #expect(Set([await onA.next(), await onA.next()]) == [PrimaryKey(1), PrimaryKey(2)])
            #expect(Set([await onB.next(), await onB.next()]) == [PrimaryKey(1), PrimaryKey(2)])
            _ = try await connection.stop()
        }
        updatedOnA.token.cancel()
        updatedOnB.token.cancel()
        // a announced the column at the handshake, so b sent it; b announced it only when the
        // schemas were equal from the start.
        #expect(try Self.rows(a, "SELECT name, color FROM t WHERE id = 1") == ["'one on b'|'red'"])
        #expect(
            try Self.rows(b, "SELECT name, color FROM t WHERE id = 2") == [
                serverMigratedFirst ? "'two on a'|NULL" : "'two on a'|'blue'"
            ])

        // The next session backfills what the open one left out.
        _ = try await Self.sync(a, b, pki: pki)
        #expect(try Self.rows(b, "SELECT color FROM t WHERE id = 2") == ["'blue'"])
        #expect(try Self.rows(a, "SELECT * FROM t ORDER BY id") == Self.rows(b, "SELECT * FROM t ORDER BY id"))
    }

    /// The keys of `t`'s rows updated in `db` from now on, as they are committed.
    static func updates(in db: Database) -> (keys: AsyncStream<PrimaryKey>, token: ObservationToken) {
        let (keys, continuation) = AsyncStream.makeStream(of: PrimaryKey.self)
        return (keys, db.observe(.update, in: "t") { continuation.yield($0.key) })
    }

    @Test("a dropped column stops syncing; the peer that still has it keeps its values")
    func droppedColumnStopsSyncing() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Database.inMemory(), b = try Database.inMemory()
        for db in [a, b] {
            try db.execute("CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT, legacy TEXT)")
            try db.enableSync(table: "player")
        }
        try a.execute("INSERT INTO player (id, name, legacy) VALUES (1, 'ann', 'x')")
        _ = try await Self.sync(a, b, pki: pki)
        try Self.migrate(a, "drop legacy") { try $0.dropColumn("legacy", from: "player") }
        try a.execute("INSERT INTO player (id, name) VALUES (2, 'bob')")
        try b.execute("UPDATE player SET legacy = 'y', name = 'anne' WHERE id = 1")
        let summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesSent == 1 && summary.changesReceived == 1)
        #expect(try Self.rows(a, "SELECT * FROM player ORDER BY id") == ["1|'anne'", "2|'bob'"])
        #expect(try Self.rows(b, "SELECT * FROM player ORDER BY id") == ["1|'anne'|'y'", "2|'bob'|NULL"])
    }

    @Test("a table one peer added: left out meanwhile, every row of it backfilled once both sync it")
    func addedTableIsBackfilled() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Self.peer(), b = try Self.peer()
        try a.execute("INSERT INTO t (id, name) VALUES (1, 'one')")
        _ = try await Self.sync(a, b, pki: pki)
        try a.execute("CREATE TABLE tag (id INTEGER PRIMARY KEY, label TEXT NOT NULL)")
        try a.enableSync(table: "tag")
        try a.execute("INSERT INTO tag (id, label) VALUES (1, 'x'), (2, 'y')")
        try a.execute("INSERT INTO t (id, name) VALUES (2, 'two')")
        var summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesReceived == 1)
        #expect(try a.pendingChangeCount(tables: ["tag"]) == 2)

        try b.execute("CREATE TABLE tag (id INTEGER PRIMARY KEY, label TEXT NOT NULL)")
        try b.enableSync(table: "tag")
        summary = try await Self.sync(a, b, pki: pki)
        #expect(summary.changesReceived == 2, "\(summary)")
        #expect(try Self.rows(b, "SELECT * FROM tag ORDER BY id") == ["1|'x'", "2|'y'"])
        #expect(try Self.rows(b, "SELECT * FROM t ORDER BY id") == ["1|'one'", "2|'two'"])
    }
}

/// Values that reach a node after the column was added there, at the version of the row's insert
/// (issue 34): a later change to the row carries them, it does not leave them out as held.
extension RollingUpgradeTests {
    @Test("a line n1 ← n2 ← n3 upgraded from the far end: n1 ends with the value n3 wrote before n1 had the column")
    func lineUpgradedFromTheFarEnd() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let n1 = try Self.peer(), n2 = try Self.peer(), n3 = try Self.peer()
        func syncTheLine() async throws {
            _ = try await Self.sync(n1, n2, pki: pki)
            _ = try await Self.sync(n2, n3, pki: pki)
        }
        try n1.execute("INSERT INTO t (id, name) VALUES (1, 'v1-n1')")
        try await syncTheLine()
        try Self.migrate(n3, "color") { try $0.addColumn("color", to: "t", "TEXT") }
        try n3.execute("INSERT INTO t (id, name, color) VALUES (2, 'v2-n3', 'red')")
        try n3.execute("UPDATE t SET color = 'blue' WHERE id = 1")
        try await syncTheLine()
        try n1.execute("INSERT INTO t (id, name) VALUES (3, 'mid-n1')")
        try await syncTheLine()
        // n2 has the column first: n3's values come to it by backfill, at the versions of the
        // rows' inserts, which n1 got from n2 before either had the column.
        try Self.migrate(n2, "color") { try $0.addColumn("color", to: "t", "TEXT") }
        try await syncTheLine()
        try Self.migrate(n1, "color") { try $0.addColumn("color", to: "t", "TEXT") }
        try await syncTheLine()
        try n1.execute("UPDATE t SET color = 'green' WHERE id = 3")
        try await syncTheLine()
        try await syncTheLine()
        let all = "SELECT * FROM t ORDER BY id"
        #expect(try Self.rows(n3, all) == ["1|'v1-n1'|'blue'", "2|'v2-n3'|'red'", "3|'mid-n1'|'green'"])
        #expect(try Self.rows(n1, all) == Self.rows(n3, all))
        #expect(try Self.rows(n2, all) == Self.rows(n3, all))
    }

    @Test(
        """
        rows bulk-inserted with a value a peer lacked the column for, updated before it upgrades: the update \
        carries the value
        """)
    func backfilledColumnIsNotLeftOutOfLaterChanges() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        // a and c synced the column from the start: it is no column added there.
        let a = try Database.inMemory(), c = try Database.inMemory(), b = try Self.peer()
        for db in [a, c] {
            try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, color TEXT)")
            try db.enableSync(table: "t")
        }
        try a.execute("INSERT INTO t (id, name) VALUES (100, 'first')")
        _ = try await Self.sync(a, b, pki: pki)
        // Rows a receives together from c join one insert range there; b gets them without the column.
        try c.execute(
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20) INSERT INTO t (id, name, \
            color) SELECT i, 'row ' || i, 'c' || i FROM n
            """)
        _ = try await Self.sync(a, c, pki: pki)
        _ = try await Self.sync(a, b, pki: pki)
        #expect(try Self.rows(b, "SELECT count(*) FROM t") == ["21"])
        // A change after b's cursor, then b upgrades: its backfill reaches its cursor, the
        // updated rows come after it as changes of their own.
        try a.execute("UPDATE t SET name = 'renamed ' || id WHERE id <= 5")
        try Self.migrate(b, "color") { try $0.addColumn("color", to: "t", "TEXT") }
        _ = try await Self.sync(a, b, pki: pki)
        _ = try await Self.sync(a, b, pki: pki)
        let all = "SELECT * FROM t ORDER BY id"
        #expect(
            try Self.rows(b, "SELECT id, name, color FROM t WHERE id IN (1, 6) ORDER BY id") == [
                "1|'renamed 1'|'c1'", "6|'row 6'|'c6'",
            ])
        #expect(try Self.rows(b, all) == Self.rows(a, all))
    }

    @Test(
        """
        two nodes that add a column between two sessions, one of them then backfilled by a third: the other gets \
        the values
        """)
    func columnAddedOnBothThenFilledFromAThird() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let z = try Database.inMemory(), x = try Self.peer(), q = try Self.peer()
        try z.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, color TEXT)")
        try z.enableSync(table: "t")
        try x.execute("INSERT INTO t (id, name) VALUES (100, 'first')")
        _ = try await Self.sync(x, q, pki: pki)
        _ = try await Self.sync(x, z, pki: pki)
        try z.execute(
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20) INSERT INTO t (id, name, \
            color) SELECT i, 'row ' || i, 'c' || i FROM n
            """)
        _ = try await Self.sync(x, z, pki: pki)
        _ = try await Self.sync(x, q, pki: pki)
        // x and q add the column before they meet again: their schemas are the same, nothing to
        // backfill between them; x's backfill from z brings the values, at the inserts' versions.
        for db in [x, q] { try Self.migrate(db, "color") { try $0.addColumn("color", to: "t", "TEXT") } }
        _ = try await Self.sync(x, q, pki: pki)
        _ = try await Self.sync(x, z, pki: pki)
        _ = try await Self.sync(x, q, pki: pki)
        let all = "SELECT * FROM t ORDER BY id"
        #expect(try Self.rows(x, "SELECT count(*) FROM t WHERE color IS NOT NULL") == ["20"])
        #expect(try Self.rows(q, all) == Self.rows(x, all))
    }

    @Test(
        """
        a row inserted on a node without the column, later than the value written on one with it, holds the \
        column's default everywhere
        """,
        arguments: [false, true])
    func laterInsertWithoutTheColumnHoldsItsDefault(deletedFirst: Bool) async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Database.inMemory(), b = try Self.peer()
        try a.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, color TEXT)")
        try a.enableSync(table: "t")
        try a.execute("INSERT INTO t (id, name) VALUES (100, 'first')")
        _ = try await Self.sync(a, b, pki: pki)
        try a.execute("INSERT INTO t (id, name, color) VALUES (1, 'on a', 'red')")
        if deletedFirst {
            // b gets the row, deletes it and inserts it again: as on a node with the column, its
            // insert ends the value.
            _ = try await Self.sync(a, b, pki: pki)
            try b.execute("DELETE FROM t WHERE id = 1")
        }
        // b's insert is the later one, whether or not the clock moved since a's.
        let clockOfA = try #require(try a.fetchValue("SELECT timestamp FROM tether_clock WHERE id = 1", as: Int64.self))
        try b.execute("UPDATE tether_clock SET timestamp = max(timestamp, ?) WHERE id = 1", [clockOfA])
        try b.execute("INSERT INTO t (id, name) VALUES (1, 'on b')")
        _ = try await Self.sync(a, b, pki: pki)
        try Self.migrate(b, "color") { try $0.addColumn("color", to: "t", "TEXT") }
        _ = try await Self.sync(a, b, pki: pki)
        _ = try await Self.sync(a, b, pki: pki)
        let all = "SELECT * FROM t ORDER BY id"
        #expect(try Self.rows(a, all) == ["1|'on b'|NULL", "100|'first'|NULL"])
        #expect(try Self.rows(b, all) == Self.rows(a, all))
    }
}
