import Foundation
import Testing
import Tether
import TetherTestSupport
@testable import TetherSync
import TetherWire

// A peer's interest (SCOPE, §6.12) is text a node evaluates in its own queries. Against a hub
// scoping north to its own site, each hostile interest north can send is refused with ERROR 2
// naming the table and the reason, before any row moves: north gets nothing outside its policy,
// the hub's data does not change, and another peer is served as usual (issue 33, items 4, 5, 7, 11).

/// A hub of orders of two sites, with their lines: orders 1–3 north's, 4–7 south's (south's notes
/// hold a secret), two lines per order.
private func makeHub() throws -> Database {
    let db = try makeOrdersAndLines()
    try db.write { conn in
        for id in 1...7 {
            let site = id <= 3 ? "north" : "south"
            try conn.execute(
                "INSERT INTO orders (id, site, note) VALUES (?, ?, ?)",
                [id, site, site == "south" ? "secret of \(id)" : "order \(id)"])
            for line in 0..<2 {
                try conn.execute(
                    "INSERT INTO order_line (id, order_id, qty) VALUES (?, ?, ?)", [id * 2 - 1 + line, id, line + 1])
            }
        }
    }
    return db
}

private func makeOrdersAndLines() throws -> Database {
    let db = try Database.inMemory()
    try db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT NOT NULL, note TEXT)")
    try db.execute("CREATE TABLE order_line (id INTEGER PRIMARY KEY, order_id INTEGER, qty INTEGER)")
    try db.enableSync(table: "orders")
    try db.enableSync(table: "order_line")
    return db
}

/// Every row of every table of `db` but Tether's own, table by table: what "the data" is.
private func fullDump(_ db: Database) throws -> [String] {
    let tables = try db.fetchRows(
        """
        SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'tether%' AND name NOT LIKE \
        'sqlite%' ORDER BY name
        """
    )
    .map { try $0.get(0, as: String.self) }
    return try tables.flatMap { table in
        try db.fetchRows("SELECT * FROM \"\(table)\" ORDER BY rowid").map { row in
            table + ": " + (0..<row.count).map { "\(row[$0])" }.joined(separator: "|")
        }
    }
}

/// The hub's policies: north holds its site's orders and their lines; any other peer everything.
private var hubOptions: SyncOptions {
    var options = SyncOptions.patientServer
    options.peers[.name("north")] = PeerPolicy(scopes: [
        "orders": .filter("site = :peer_name"),
        "order_line": .reference(column: "order_id", parent: "orders"),
    ])
    return options
}

/// A sync of north stating `interest` with a hub of `hubOptions`, and of an unscoped peer after it.
/// Checks what must hold whatever the interest: ERROR 2 naming `table` and `reason`, north holds
/// nothing outside its policy, the hub's data is unchanged, the unscoped peer gets every row.
private func expectRefused(
    _ interest: String, in table: String = "orders", naming reason: String,
    sourceLocation: SourceLocation = #_sourceLocation
) async throws {
    let pki = try TestPKI()
    defer { pki.directory.remove() }
    let north = try pki.issue(commonName: "north", as: "north")
    let hub = try makeHub()
    let northDB = try makeOrdersAndLines()
    let wholeDB = try makeOrdersAndLines()
    let before = try fullDump(hub)
    let sequenceBefore = try hub.lastSequence()
    _ = try await runServer(hub, pki: pki, options: hubOptions) { server in
        var options = SyncOptions()
        options.interest = [table: .filter(interest)]
        let failure: String?
        do {
            _ = try await SyncClient.syncOnce(
                database: northDB, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(north),
                options: options)
            failure = nil
        } catch {
            failure = "\(error)"
        }
        let text = try #require(
            failure, "north's hostile interest \(interest) was accepted", sourceLocation: sourceLocation)
        #expect(
            text.contains("ERROR 2") && text.contains("scope of \(table)") && text.contains(reason), "\(text)",
            sourceLocation: sourceLocation)
        // Another peer is served afterwards, by the same server.
        _ = try await SyncClient.syncOnce(
            database: wholeDB, host: "127.0.0.1", port: server.port, tls: try pki.clientContext())
    }
    #expect(
        try northDB.fetchValue("SELECT count(*) FROM orders WHERE site <> 'north'", as: Int.self) == 0,
        sourceLocation: sourceLocation)
    #expect(
        try northDB.fetchValue("SELECT count(*) FROM order_line WHERE order_id > 3", as: Int.self) == 0,
        sourceLocation: sourceLocation)
    #expect(try fullDump(hub) == before, "the hub's data is unchanged", sourceLocation: sourceLocation)
    #expect(try hub.lastSequence() == sequenceBefore, sourceLocation: sourceLocation)
    #expect(try fullDump(wholeDB) == before, "the unscoped peer got every row", sourceLocation: sourceLocation)
}

@Suite("A peer's interest is checked, never pasted (§8.10): hostile interests are ERROR 2, before any row moves")
struct HostileInterestTests {
    @Test("an interest closing the parenthesis it is pasted in (1=1) OR (1=1) is refused: it is not one expression")
    func parenthesisInjection() async throws {
        try await expectRefused("1=1) OR (1=1", naming: "not one expression")
    }

    @Test("an interest escaping its parentheses to widen with LIKE (id > 0) OR site LIKE '%' OR (1) is refused")
    func likeInjection() async throws {
        try await expectRefused(
            "id > 0) OR site LIKE '%' OR (1", naming: "closes a parenthesis the interest did not open")
    }

    @Test(
        """
        an interest reading south's orders in a subquery (a one-bit oracle) is refused: an interest reads only \
        its own row
        """)
    func subqueryOracle() async throws {
        try await expectRefused(
            "EXISTS (SELECT 1 FROM orders AS other WHERE other.id = 4 AND other.note LIKE 'secret%')",
            naming: "holds a subquery or a WITH")
    }

    @Test("an interest on lines reading the orders table through IN (SELECT …) is refused")
    func subqueryIntoAnotherTable() async throws {
        try await expectRefused(
            "order_id IN (SELECT id FROM orders WHERE site = 'south')", in: "order_line",
            naming: "holds a subquery or a WITH")
    }

    @Test(
        """
        an endless recursive WITH is refused at once, and the hub serves another peer meanwhile (its database \
        queue is not held)
        """)
    func recursiveWith() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let north = try pki.issue(commonName: "north", as: "north")
        let hub = try makeHub()
        let northDB = try makeOrdersAndLines()
        let wholeDB = try makeOrdersAndLines()
        let before = try fullDump(hub)
        let endless =
            "id IN (WITH RECURSIVE forever(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM forever) SELECT n FROM forever)"
        // What both sides logged, shown if the guard ends the wait: which side left north's session open.
        let hubLog = LogRecorder(), northLog = LogRecorder()
        var options = hubOptions
        options.logger = hubLog.logger(label: "hub")
        _ = try await runServer(hub, pki: pki, options: options) { server in
            let port = server.port
            let northTLS = try pki.clientContext(north), wholeTLS = try pki.clientContext()
            // Both at once; the unscoped peer must be done long before a client's idle timeout (the
            // guard below only turns a hub that never answers into a failure instead of a hang).
            let outcomes = try await withThrowingTaskGroup(of: (String, String).self) { group in
                group.addTask {
                    var options = SyncOptions()
                    options.interest = ["orders": .filter(endless)]
                    options.logger = northLog.logger(label: "north")
                    do {
                        _ = try await SyncClient.syncOnce(
                            database: northDB, host: "127.0.0.1", port: port, tls: northTLS, options: options)
                        return ("north", "synced")
                    } catch {
                        return ("north", "\(error)")
                    }
                }
                group.addTask {
                    _ = try await SyncClient.syncOnce(database: wholeDB, host: "127.0.0.1", port: port, tls: wholeTLS)
                    return ("whole", "synced")
                }
                // Generous: in a full test run, a client's return has taken over 20 s after both
                // sides logged its session's end (other tests kept the process's threads busy).
                group.addTask {
                    try await Task.sleep(for: .seconds(60))
                    return ("guard", "the hub answered neither session within 60 s")
                }
                let start = ContinuousClock.now
                var outcomes: [String: String] = [:]
                while outcomes["north"] == nil || outcomes["whole"] == nil, let (who, outcome) = try await group.next()
                {
                    outcomes[who] = outcome
                    if who == "guard" { break }
                    outcomes[who + " returned after"] = "\(ContinuousClock.now - start)"
                }
                group.cancelAll()
                return outcomes
            }
            #expect(
                outcomes["guard"] == nil,
                "\(outcomes)\nhub: \(hubLog.entries.map(\.description))\nnorth: \(northLog.entries.map(\.description))")
            #expect(outcomes["whole"] == "synced")
            let north = try #require(outcomes["north"])
            #expect(
                north.contains("ERROR 2") && north.contains("scope of orders")
                    && north.contains("holds a subquery or a WITH"), "\(north)")
        }
        #expect(try northDB.fetchValue("SELECT count(*) FROM orders", as: Int.self) == 0)
        #expect(try fullDump(hub) == before)
        #expect(try fullDump(wholeDB) == before)
    }

    @Test("an interest calling load_extension is refused with ERROR 2 naming the function (it was ERROR 11)")
    func loadExtension() async throws {
        try await expectRefused(
            "load_extension('/nonexistent/libevil') IS NULL", naming: "calls function load_extension")
    }

    @Test("an interest calling randomblob (100 MB per row) is refused before anything is evaluated")
    func randomblob() async throws {
        try await expectRefused("length(randomblob(100000000)) > 0", naming: "calls function randomblob")
    }

    @Test("an interest calling zeroblob is refused")
    func zeroblob() async throws {
        try await expectRefused("length(zeroblob(100000000)) > 0", naming: "calls function zeroblob")
    }

    @Test("an interest opening a comment it never closes is refused: a peer's text has no comment")
    func unbalancedComment() async throws {
        try await expectRefused("site = 'north' /* ) OR (1", naming: "a comment at offset 15")
    }

    @Test("an interest using :peer_name is refused: an interest takes no parameters")
    func parameter() async throws {
        try await expectRefused("site = :peer_name", naming: "an interest takes no parameters")
    }

    @Test("an interest of the accepted forms narrows north's policy, and north still holds no row outside it")
    func acceptedInterestStillNarrowsThePolicy() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let north = try pki.issue(commonName: "north", as: "north")
        let hub = try makeHub()
        let northDB = try makeOrdersAndLines()
        _ = try await runServer(hub, pki: pki, options: hubOptions) { server in
            var options = SyncOptions()
            options.interest = ["orders": .filter("(id > 1) AND (note <> ')' OR lower(site) LIKE 'n%')")]
            _ = try await SyncClient.syncOnce(
                database: northDB, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(north),
                options: options)
        }
        #expect(
            try northDB.fetchRows("SELECT id FROM orders ORDER BY id").map { try $0.get(0, as: Int.self) } == [2, 3])
        #expect(
            try northDB.fetchRows("SELECT id FROM order_line ORDER BY id").map { try $0.get(0, as: Int.self) } == [
                3, 4, 5, 6,
            ])
    }
}
