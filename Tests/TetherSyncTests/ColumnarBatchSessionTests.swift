import Foundation
import Testing
import Tether
@testable import TetherSync
import TetherTestSupport
import TetherWire

/// Batch format 3 in sessions (capability `columnarBatches`, Protocol/README.md §7.5): two nodes
/// that both announce it send their batches in columns, and a node that does not announce it
/// (as one of an earlier version would not) still syncs with one that does, both ways.
@Suite("Columnar batches in sessions")
struct ColumnarBatchSessionTests {
    static func node() throws -> Database {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, n INTEGER NOT NULL)")
        try db.enableSync(table: "t")
        return db
    }

    static func insert(_ db: Database, _ range: ClosedRange<Int>, prefix: String) throws {
        try db.write { conn in
            for id in range {
                try conn.execute("INSERT INTO t (id, name, n) VALUES (?, ?, ?)", [id, "\(prefix)-\(id)", id % 1000])
            }
        }
    }

    static func rows(_ db: Database) throws -> [String] {
        try db.fetchRows("SELECT id, name, n FROM t ORDER BY id").map {
            $0.values.map(\.description).joined(separator: "|")
        }
    }

    static func options(offeringColumnar: Bool, _ base: SyncOptions = SyncOptions()) -> SyncOptions {
        var options = base
        options.testHooks.offersColumnarBatches = offeringColumnar
        return options
    }

    /// Two syncs of a server and a client, each offering `columnarBatches` or not: 2,000 rows
    /// each way, then an update of two columns on each side (partial changes) and deletes. Returns
    /// the client's summaries; both sides end with the same rows, nothing pending.
    static func syncTwice(serverOffers: Bool, clientOffers: Bool, pki: TestPKI) async throws -> [SyncSummary] {
        let server = try node(), client = try node()
        try insert(server, 1...2_000, prefix: "server")
        try insert(client, 3_001...5_000, prefix: "client")
        let serverOptions = options(offeringColumnar: serverOffers, .patientServer)
        let clientOptions = options(offeringColumnar: clientOffers)
        return try await withSyncServer(server, pki: pki, options: serverOptions) { syncServer in
            func sync() async throws -> SyncSummary {
                try await SyncClient.syncOnce(
                    database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                    options: clientOptions)
            }
            let first = try await sync()
            #expect(first.changesReceived == 2_000 && first.changesSent == 2_000, "\(first)")
            try server.execute("UPDATE t SET name = name || '-v2', n = n + 1 WHERE id <= 1000")
            try client.execute("UPDATE t SET name = name || '-v2', n = n + 1 WHERE id > 4000")
            try server.execute("DELETE FROM t WHERE id BETWEEN 3001 AND 3010")
            try client.execute("DELETE FROM t WHERE id BETWEEN 1991 AND 2000")
            let second = try await sync()
            #expect(second.changesReceived == 1_010 && second.changesSent == 1_010, "\(second)")
            let serverRows = try rows(server)
            #expect(serverRows.count == 4_000 - 20)
            #expect(
                serverRows == (try rows(client)), "server offers columnar: \(serverOffers), client: \(clientOffers)")
            #expect(serverRows.contains("1000|'server-1000-v2'|1") && serverRows.contains("5000|'client-5000-v2'|1"))
            #expect(try server.pendingChangeCount(tables: ["t"]) == 0 && client.pendingChangeCount(tables: ["t"]) == 0)
            return [first, second]
        }
    }

    @Test(
        """
        a node that does not announce columnarBatches syncs both ways with one that does, in the row formats; two \
        that do send columns, a fraction of the bytes
        """)
    func columnarAndRowNodesInteroperate() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let columnar = try await Self.syncTwice(serverOffers: true, clientOffers: true, pki: pki)
        let oldServer = try await Self.syncTwice(serverOffers: false, clientOffers: true, pki: pki)
        let oldClient = try await Self.syncTwice(serverOffers: true, clientOffers: false, pki: pki)

        // The same rows, the same changes: only the batch format differs. Without it on either
        // side, the bytes are the row format's both times; with it on both, columns take a fraction.
        for (index, summary) in columnar.enumerated() {
            for rows in [oldServer[index], oldClient[index]] {
                #expect(
                    Double(summary.bytesReceived) < 0.5 * Double(rows.bytesReceived),
                    "sync \(index + 1): \(summary.bytesReceived) bytes received against \(rows.bytesReceived)")
                #expect(
                    Double(summary.bytesSent) < 0.5 * Double(rows.bytesSent),
                    "sync \(index + 1): \(summary.bytesSent) bytes sent against \(rows.bytesSent)")
            }
            // Whichever side lacks the capability, the session is the same: rows both ways.
            #expect(Double(oldServer[index].bytesReceived) > 0.8 * Double(oldClient[index].bytesReceived))
            #expect(Double(oldServer[index].bytesReceived) < 1.25 * Double(oldClient[index].bytesReceived))
        }
    }

    /// A flights-like table: whole reals, texts that repeat.
    static func flightsNode() throws -> Database {
        let db = try Database.inMemory()
        try db.execute(
            "CREATE TABLE f (id INTEGER PRIMARY KEY, carrier TEXT, origin TEXT, delay REAL, distance REAL)")
        try db.enableSync(table: "f")
        return db
    }

    @Test(
        """
        two nodes announcing compactColumns send batch format 4 (whole reals as integers, repeated texts as \
        dictionaries); with a node that does not, format 3 both ways; the same rows either way
        """)
    func compactAndPlainColumnarNodesInteroperate() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        func sync(serverCompact: Bool, clientCompact: Bool) async throws -> SyncSummary {
            let server = try Self.flightsNode(), client = try Self.flightsNode()
            try server.execute(
                """
                WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000) \
                INSERT INTO f SELECT x, 'C' || (x * 7 % 16), \
                CASE x % 3 WHEN 0 THEN 'EWR' WHEN 1 THEN 'JFK' ELSE 'LGA' END, \
                (x * 37 % 331) - 30, 80 + (x * 101 % 4900) FROM c
                """)
            var serverOptions = SyncOptions.patientServer
            serverOptions.testHooks.offersCompactColumns = serverCompact
            var clientOptions = SyncOptions()
            clientOptions.testHooks.offersCompactColumns = clientCompact
            let summary = try await withSyncServer(server, pki: pki, options: serverOptions) { syncServer in
                try await SyncClient.syncOnce(
                    database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                    options: clientOptions)
            }
            let query = "SELECT id, carrier, origin, delay, typeof(delay), distance FROM f ORDER BY id"
            let rows = try client.fetchRows(query).map(\.values)
            #expect(rows.count == 3_000)
            #expect(rows == (try server.fetchRows(query).map(\.values)))
            #expect(rows.allSatisfy { $0[4] == .text("real") })
            return summary
        }
        let compact = try await sync(serverCompact: true, clientCompact: true)
        let plainServer = try await sync(serverCompact: false, clientCompact: true)
        let plainClient = try await sync(serverCompact: true, clientCompact: false)
        #expect(compact.changesReceived == 3_000)
        for plain in [plainServer, plainClient] {
            #expect(
                Double(compact.bytesReceived) < 0.8 * Double(plain.bytesReceived),
                "format 4: \(compact.bytesReceived) bytes, format 3: \(plain.bytesReceived)")
        }
    }

    @Test("the capability is offered unless a test hook removes it, and negotiated only when both offer it")
    func capabilityNegotiation() {
        #expect(Capabilities.supported.contains(.columnarBatches))
        #expect(Capabilities.columnarBatches.rawValue == 1 << 5)
        #expect(Capabilities.supported.negotiated(with: [.lz4, .columnarBatches]) == [.lz4, .columnarBatches])
        #expect(Capabilities.supported.negotiated(with: [.lz4, .version3]) == [.lz4, .version3])
        #expect(SyncOptions().testHooks.offersColumnarBatches)
        #expect(Capabilities.supported.contains(.compactColumns))
        #expect(Capabilities.compactColumns.rawValue == 1 << 6)
        #expect(Capabilities.supported.negotiated(with: [.columnarBatches]) == [.columnarBatches])
        #expect(SyncOptions().testHooks.offersCompactColumns)
    }
}
