import Foundation
import Testing
@testable import Tether
@testable import TetherSync
import TetherTestSupport
import TetherWire

/// Points of Protocol/README.md an independent implementer had to guess (issue 22), each as the
/// reference implementation does it: the receiver vectors of §12 in a session and from a sync
/// file, the shared schema's matching (§8.2), and the backfill's rules (§8.3).
@Suite("Protocol specification: the receiver's rules")
struct ProtocolSpecTests {
    typealias Session = SessionStateMachineTests.Session

    // MARK: The receiver vectors (§12)

    /// One valid vector of Protocol/vectors/manifest.json with a `receiver`, and its frame.
    struct ReceiverVector {
        var file: String
        var batch: ChangeBatch
        var session: String
        var syncFile: String
    }

    static let vectorDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Protocol/vectors")

    static func receiverVectors() throws -> [ReceiverVector] {
        struct Entry: Decodable {
            struct Receiver: Decodable { var session: String; var syncFile: String }
            var file: String
            var receiver: Receiver?
        }
        let entries = try JSONDecoder().decode(
            [Entry].self, from: Data(contentsOf: vectorDirectory.appendingPathComponent("manifest.json")))
        return try entries.compactMap { entry in
            guard let receiver = entry.receiver else { return nil }
            let text = try String(contentsOf: vectorDirectory.appendingPathComponent(entry.file), encoding: .utf8)
                .filter(\.isHexDigit)
            var bytes: [UInt8] = []
            var index = text.startIndex
            while index < text.endIndex {
                let next = text.index(index, offsetBy: 2)
                bytes.append(try #require(UInt8(text[index..<next], radix: 16)))
                index = next
            }
            guard case let .batch(batch) = try FrameDecoder.decode(frame: bytes) else {
                Issue.record("\(entry.file) is not a BATCH")
                return nil
            }
            return ReceiverVector(
                file: entry.file, batch: batch, session: receiver.session, syncFile: receiver.syncFile)
        }
    }

    static let item = TableDescriptor(name: "item", keyColumns: ["id"], valueColumns: ["name"])

    /// The receiver of §12: syncs `item` (and so the expiry store), has `secret` without syncing it.
    static func receiver() throws -> Database {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT)")
        try db.execute("CREATE TABLE secret (id INTEGER PRIMARY KEY, body TEXT)")
        try db.enableSync(table: "item")
        return db
    }

    @Test(
        """
        every receiver vector names what a session does with it: a table the receiver did not announce is ERROR \
        5, nothing applied
        """)
    func receiverVectorsInASession() throws {
        let vectors = try Self.receiverVectors()
        #expect(vectors.count >= 5)
        for vector in vectors {
            let peer = vector.batch.source
            var session = try Session(tables: [Self.item, SessionStateMachineTests.expiryStoreDescriptor], peer: peer)
            _ = session.pulling(after: 0)
            let actions = session.handle(.received(.batch(vector.batch)))
            switch vector.session {
            case "ERROR 5 tableNotAllowed":
                #expect(actions.errorCodes == [.tableNotAllowed], "\(vector.file): sent \(actions.sent)")
                #expect(actions.requests.isEmpty, "\(vector.file): asked for \(actions.requests)")
                #expect(actions.closes, "\(vector.file)")
            case "applied":
                #expect(actions.errorCodes.isEmpty, "\(vector.file): sent \(actions.sent)")
                guard case .apply? = actions.requests.first else {
                    Issue.record("\(vector.file): asked for \(actions.requests)"); continue
                }
            default:
                Issue.record("\(vector.file): unknown session outcome \(vector.session)")
            }
        }
    }

    @Test(
        """
        every receiver vector names what a sync file's import does with it: kept for a later schema, applied, or \
        refused whole
        """)
    func receiverVectorsFromASyncFile() throws {
        let vectors = try Self.receiverVectors()
        #expect(Set(vectors.map(\.syncFile)) == ["applied", "kept for a later schema", "refused"])
        for vector in vectors {
            let db = try Self.receiver()
            let before = try db.lastSequence()
            switch vector.syncFile {
            case "applied":
                let report = try db.apply(vector.batch)
                #expect(
                    report.applied == vector.batch.changes.count && report.keptForSchema == 0,
                    "\(vector.file): \(report)")
            case "kept for a later schema":
                let report = try db.apply(vector.batch)
                #expect(
                    report.keptForSchema == vector.batch.changes.count && report.applied == 0,
                    "\(vector.file): \(report)")
                #expect(
                    try db.fetchValue("SELECT count(*) FROM tether_kept_for_schema", as: Int.self)
                        == vector.batch.changes.count)
            case "refused":
                #expect(throws: SyncError.self, "\(vector.file)") { try db.apply(vector.batch) }
                #expect(
                    try db.fetchValue("SELECT count(*) FROM tether_kept_for_schema", as: Int.self) == 0,
                    "\(vector.file)")
                #expect(
                    try db.fetchValue("SELECT count(*) FROM tether_synced_expiry", as: Int.self) == 0, "\(vector.file)")
                #expect(try db.lastSequence() == before, "\(vector.file)")
            default:
                Issue.record("\(vector.file): unknown sync file outcome \(vector.syncFile)")
            }
            #expect(
                try db.fetchValue("SELECT count(*) FROM sqlite_master WHERE name = 'item'", as: Int.self) == 1,
                "\(vector.file)")
        }
    }

    @Test(
        """
        an expiry entry travels as a row of tether_synced_expiry: row_key the JSON array of the key, expires_at \
        Unix seconds
        """)
    func expiryVectorSetsTheRowsExpiry() throws {
        let vector = try #require(try Self.receiverVectors().first { $0.file.hasSuffix("-batch-expiry.hex") })
        let db = try Self.receiver()
        try db.apply(vector.batch)
        let entry = try db.fetchRows("SELECT table_name, row_key, expires_at FROM tether_synced_expiry").map {
            $0.values
        }
        #expect(entry == [[.text("item"), .text("[1]"), .real(1_893_456_000)]])
        // The row's own expiry, as the application reads it: the same date.
        #expect(try db.fetchValue("SELECT json_array(id) FROM item", as: String.self) == "[1]")
        // And what this database sends of it is the same entry, byte for byte the same fields.
        let sent = try db.extractChanges(for: .random(), after: 0, markInFlight: false)
        let store = try #require(sent.tables.firstIndex { $0.name == "tether_synced_expiry" })
        #expect(sent.tables[store] == SessionStateMachineTests.expiryStoreDescriptor)
        #expect(sent.changes.filter { $0.table == store }.map(\.values) == [[.real(1_893_456_000)]])
        #expect(sent.changes.filter { $0.table == store }.map(\.key) == [[.text("item"), .text("[1]")]])
    }

    @Test(
        """
        a change kept for a table named like SQL is applied once a table of that (quoted) name is synced; item is \
        untouched
        """)
    func tableNamedLikeSQLIsAnOrdinaryName() throws {
        let vector = try #require(
            try Self.receiverVectors().first { $0.file.hasSuffix("-batch-table-named-like-sql.hex") })
        let db = try Self.receiver()
        try db.execute("INSERT INTO item (id, name) VALUES (7, 'stays')")
        _ = try db.apply(vector.batch)
        try db.execute("CREATE TABLE \"bulk; DROP TABLE item\" (id INTEGER PRIMARY KEY, v TEXT)")
        try db.enableSync(table: "bulk; DROP TABLE item")
        #expect(
            try db.fetchRows("SELECT id, v FROM \"bulk; DROP TABLE item\"").map(\.values) == [
                [.integer(1), .text("x")]
            ])
        #expect(try db.fetchRows("SELECT id, name FROM item").map(\.values) == [[.integer(7), .text("stays")]])
    }

    @Test(
        """
        a sync file's batch naming one of Tether's or SQLite's own tables (any case) is refused with an error \
        naming it
        """)
    func internalTableIsRefusedFromAFile() throws {
        for name in ["tether_peers", "TETHER_meta", "sqlite_sequence", "tether_kept_for_schema"] {
            let db = try Self.receiver()
            let version = Version(timestamp: HybridTimestamp(milliseconds: 1_000, counter: 0), origin: .random())
            let batch = ChangeBatch(
                source: version.origin, after: 0, through: 1, isLast: true,
                tables: [TableDescriptor(name: name, keyColumns: ["id"], valueColumns: [])],
                changes: [
                    RowChange(
                        table: 0, key: [.integer(1)], isAlive: true, existence: version, values: [], versions: [],
                        sequence: 1)
                ])
            do {
                let report = try db.apply(batch)
                Issue.record("\(name): applied (\(report))")
            } catch let error as SyncError {
                guard case let .invalidTable(reason) = error else { Issue.record("\(name): \(error)"); continue }
                #expect(reason.contains("table \(name),") && reason.contains("no database syncs"), "\(reason)")
            }
            #expect(try db.fetchValue("SELECT count(*) FROM tether_kept_for_schema", as: Int.self) == 0)
        }
    }

    @Test("an alive expiry entry whose expires_at is not a number is refused whole, not kept aside for ever")
    func expiryThatIsNotANumberIsRefused() throws {
        let db = try Self.receiver()
        let version = Version(timestamp: HybridTimestamp(milliseconds: 1_000, counter: 0), origin: .random())
        let batch = ChangeBatch(
            source: version.origin, after: 0, through: 1, isLast: true,
            tables: [SessionStateMachineTests.expiryStoreDescriptor],
            changes: [
                RowChange(
                    table: 0, key: [.text("item"), .text("[1]")], isAlive: true, existence: version,
                    values: [.text("tomorrow")], versions: [], sequence: 1)
            ])
        let error = #expect(throws: SyncError.self) { try db.apply(batch) }
        guard case let .refusedExpiry(change, reason)? = error else {
            Issue.record("\(String(describing: error))"); return
        }
        #expect(change == 0 && reason.contains("not to a number of seconds"), "\(reason)")
        #expect(try db.keptAsideChanges().isEmpty)
    }

    // MARK: Equal versions (§7.3)

    @Test(
        """
        a value written at the row's own version replaces the default a database holds for a column its first \
        source lacked
        """)
    func valueAtTheRowsVersionReplacesTheDefault() throws {
        // S inserts the row with c; P lacks c; R has always had c, and gets the row from P first.
        let withC = "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, c INTEGER NOT NULL DEFAULT 0)"
        let s = try makeDatabase(schema: withC, syncing: ["t"]), r = try makeDatabase(schema: withC, syncing: ["t"])
        let p = try makeDatabase(schema: "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)", syncing: ["t"])
        try s.execute("INSERT INTO t (id, name, c) VALUES (1, 'one', 5)")
        try p.apply(try s.extractChanges(for: p.instanceKey, after: 0, markInFlight: false))
        try r.apply(try p.extractChanges(for: r.instanceKey, after: 0, markInFlight: false))
        #expect(try r.fetchValue("SELECT c FROM t WHERE id = 1", as: Int.self) == 0)
        // The same write, with the value: one version, two values, and the default gives way.
        try r.apply(try s.extractChanges(for: r.instanceKey, after: 0, markInFlight: false))
        #expect(try r.fetchValue("SELECT c FROM t WHERE id = 1", as: Int.self) == 5)
        // A value that differs from the default is kept against one that equals it at the same version.
        try r.apply(try p.extractChanges(for: r.instanceKey, after: 0, markInFlight: false))
        #expect(try r.fetchValue("SELECT c FROM t WHERE id = 1", as: Int.self) == 5)
    }

    // MARK: Several sessions under one instance key (§8.8)

    @Test(
        """
        two sessions of one database with one server at once are both served: every row reaches each side, what \
        both changed settles with the next session, which applies nothing
        """)
    func twoSessionsUnderOneInstanceKey() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase(), client = try makeDatabase()
        for (db, range) in [(server, 1...1_500), (client, 1_001...2_500)] {
            try await db.write { conn in
                for id in range {
                    try conn.execute("INSERT INTO t (id, name, n) VALUES (?, ?, ?)", [id, "\(db.instanceKey)", id])
                }
            }
        }
        try server.execute("UPDATE t SET n = n + 1 WHERE id % 7 = 0")
        try client.execute("DELETE FROM t WHERE id % 11 = 0")
        func options() -> SyncOptions {
            var options = SyncOptions.patientServer
            options.batchLimits = BatchLimits(maximumChanges: 150, maximumBytes: 1 << 20)
            return options
        }
        let summaries = try await withSyncServer(server, pki: pki, options: options()) { syncServer in
            async let first = SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                options: options())
            async let second = SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                options: options())
            return try await [first, second]
        }
        #expect(summaries.allSatisfy { $0.peer == server.instanceKey })
        let dump = "SELECT id, name, n FROM t ORDER BY id"
        let rows = try server.fetchRows(dump).map(\.values)
        let deletedByClient = (1_001...2_500).filter { $0 % 11 == 0 }.count
        #expect(rows.count == 2_500 - deletedByClient)
        #expect(try client.fetchRows(dump).map(\.values) == rows)
        // A row both sides changed, merged on one side while its own change was in flight, has a new
        // sequence number the peer's ACK does not reach: it may stay pending until the next session,
        // which applies nothing (the peer holds it already; SyncSessionTests.catchUpBothWays).
        func session() async throws -> SyncSummary {
            try await withSyncServer(server, pki: pki, options: options()) { syncServer in
                try await SyncClient.syncOnce(
                    database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                    options: options())
            }
        }
        let settling = try await session()
        #expect(settling.applied == 0 && settling.keptAside == 0, "\(settling)")
        #expect(try server.fetchRows(dump).map(\.values) == rows)
        #expect(try client.fetchRows(dump).map(\.values) == rows)
        let pendingClient = try client.pendingChangeCount(tables: ["t"]),
            pendingServer = try server.pendingChangeCount(tables: ["t"])
        #expect(
            pendingClient == 0 && pendingServer == 0,
            "pending: client \(pendingClient), server \(pendingServer); \(summaries), then \(settling)")
        // And a session after them has nothing to move.
        let after = try await session()
        #expect(after.changesSent == 0 && after.changesReceived == 0, "\(after)")
    }

    // MARK: The shared schema (§8.2)

    static func schema(_ tables: [TableDescriptor], renames: [ColumnRename] = []) throws -> LocalSchema {
        LocalSchema(
            instanceKey: .random(), tables: tables, fingerprint: try LocalSchema.fingerprint(of: tables),
            renames: renames)
    }

    @Test("a column of the same name is that column, whatever a rename says, in whichever order the columns sort")
    func sameNameWinsOverARename() throws {
        // The peer renamed points to score; this side has both, points sorting first.
        let peerTables = [TableDescriptor(name: "player", keyColumns: ["id"], valueColumns: ["score"])]
        let peer = try Self.schema(peerTables, renames: [ColumnRename(table: "player", from: "points", to: "score")])
        let mine = try Self.schema([
            TableDescriptor(name: "player", keyColumns: ["id"], valueColumns: ["points", "score"])
        ])
        let hello = Hello(
            instanceKey: peer.instanceKey, schemaFingerprint: peer.fingerprint, capabilities: .supported,
            tables: peer.tables, renames: peer.renames)
        let shared = try SharedSchema.negotiate(mine: mine, theirs: hello, peerRole: "peer").get()
        #expect(shared.tables?["player"] == [SharedSchema.Column(mine: "score", theirs: "score")])
        #expect(
            shared.differences.contains("table player: column points is synced here, not by the peer"),
            "\(shared.differences)")
        // The peer's side agrees: its score is this side's score.
        let back = Hello(
            instanceKey: mine.instanceKey, schemaFingerprint: mine.fingerprint, capabilities: .supported,
            tables: mine.tables)
        let theirs = try SharedSchema.negotiate(mine: peer, theirs: back, peerRole: "peer").get()
        #expect(
            theirs.tables == nil || theirs.tables?["player"] == [SharedSchema.Column(mine: "score", theirs: "score")])
    }

    // MARK: Backfill (§8.3)

    @Test("a backfill asking only for columns not shared sends nothing of that table (not the whole table)")
    func backfillOfUnsharedColumnsIsIgnored() throws {
        let mine = try Self.schema([
            TableDescriptor(name: "player", keyColumns: ["id"], valueColumns: ["color", "name"]), Self.item,
        ])
        let peer = try Self.schema([
            TableDescriptor(name: "player", keyColumns: ["id"], valueColumns: ["name", "size"])
        ])
        let hello = Hello(
            instanceKey: peer.instanceKey, schemaFingerprint: peer.fingerprint, capabilities: .supported,
            tables: peer.tables)
        let shared = try SharedSchema.negotiate(mine: mine, theirs: hello, peerRole: "peer").get()
        let scope = shared.scope(
            of: Backfill(
                through: 9,
                tables: [
                    Backfill.Table(name: "player", columns: ["color", "size"]),
                    Backfill.Table(name: "item", columns: []),
                    Backfill.Table(name: "nowhere", columns: []),
                ]))
        #expect(scope.columns.isEmpty, "\(scope)")
        let named = shared.scope(
            of: Backfill(through: 9, tables: [Backfill.Table(name: "player", columns: ["name", "size"])]))
        #expect(named.columns == ["player": ["name"]])
    }

    @Test(
        """
        a backfill through a sequence beyond this database's latest is refused: the peer holds numbers of this \
        key it never gave
        """)
    func backfillBeyondTheLatestIsRefused() throws {
        let db = try Self.receiver()
        try db.execute("INSERT INTO item (id, name) VALUES (1, 'one')")
        let latest = try db.lastSequence()
        let restriction = ExtractRestriction(allowedTables: nil, shared: .everything, marksInFlight: false)
        func pull(through: Int64) -> DatabaseRequest {
            .extract(
                peer: .random(),
                pull: Pull(
                    after: 0, maxChanges: 10, maxBytes: 1 << 20,
                    backfill: Backfill(through: through, tables: [Backfill.Table(name: "item", columns: [])])),
                restriction: restriction)
        }
        guard case let .extracted(batch, _, _) = try pull(through: latest).perform(on: db, metrics: SyncMetrics())
        else {
            Issue.record("no batch"); return
        }
        #expect(batch.changes.count == 1 && batch.through == latest && batch.isLast)
        let error = #expect(throws: SyncError.self) {
            _ = try pull(through: latest + 1).perform(on: db, metrics: SyncMetrics())
        }
        guard case let .instanceKeyReused(reason)? = error else { Issue.record("\(String(describing: error))"); return }
        #expect(reason.contains("backfill through sequence \(latest + 1)"), "\(reason)")
    }

    @Test("a backfill batch is never acknowledged: an ACK of one is ERROR 6 when no ordinary batch reaches that far")
    func ackOfABackfillBatchIsRefused() throws {
        var session = try Session()
        _ = session.open()
        let pull = Pull(
            after: 0, maxChanges: 10, maxBytes: 1 << 20,
            backfill: Backfill(through: 5, tables: [Backfill.Table(name: "t", columns: [])]))
        let asked = session.handle(.received(.pull(pull)))
        guard case .extract? = asked.requests.last else { Issue.record("asked for \(asked.requests)"); return }
        let backfill = ChangeBatch(
            source: session.local, after: 0, through: 5, isLast: true, tables: session.schema.tables, changes: [])
        let sent = session.handle(.databaseCompleted(.extracted(backfill, latest: 5)))
        #expect(sent.sent.contains { if case .batch = $0 { true } else { false } })
        let acked = session.handle(.received(.ack(through: 5)))
        #expect(acked.errorCodes == [.malformedFrame], "sent \(acked.sent)")
        #expect(acked.closes)
    }

    @Test("DEFERRED when deferrals were not negotiated is ERROR 6")
    func deferredWithoutDeferralsIsAProtocolViolation() throws {
        var session = try Session()
        _ = session.open(
            hello: Hello(
                instanceKey: session.peer, schemaFingerprint: session.schema.fingerprint,
                capabilities: [.lz4, .livePush], tables: session.schema.tables))
        let actions = session.handle(
            .received(
                .deferred(Deferral(after: 0, through: 5, reason: .clockSkew, retryAfterMilliseconds: 100, message: "")))
        )
        guard case let .error(code, message)? = actions.sent.last else { Issue.record("sent \(actions.sent)"); return }
        #expect(code == .malformedFrame && message.contains("deferrals"), "\(message)")
        #expect(actions.closes)
    }
}
