import Foundation
import Testing
@testable import Tether
@testable import TetherSync
import TetherWire

/// Column merge rules over sessions (issue 39): agreed in SCOPE, counters adding up over TLS.
@Suite("Merge rules in sessions: counters add up, and peers must agree on every shared column's rule")
struct MergeRuleSessionTests {
    static func node(_ rules: [String: ColumnMergeRule]) throws -> Database {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)")
        try db.enableSync(table: "inventory", columnRules: rules)
        return db
    }

    static func sync(_ server: Database, _ client: Database, pki: TestPKI, options: SyncOptions = SyncOptions())
        async throws -> SyncSummary
    {
        try await withSyncServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                options: options)
        }
    }

    static func stock(_ db: Database) throws -> Int64? {
        try db.fetchValue("SELECT stock FROM inventory WHERE sku = 'apple'", as: Int64.self)
    }

    @Test("the inventory example: two concurrent sales both count, on both peers")
    func concurrentSalesAddUp() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Self.node(["stock": .counter]), b = try Self.node(["stock": .counter])
        try a.execute("INSERT INTO inventory VALUES ('apple', 10)")
        _ = try await Self.sync(a, b, pki: pki)
        #expect(try Self.stock(b) == 10)
        try a.execute("UPDATE inventory SET stock = stock - 3")
        try b.execute("UPDATE inventory SET stock = stock - 4")
        _ = try await Self.sync(a, b, pki: pki)
        #expect(try Self.stock(a) == 3)
        #expect(try Self.stock(b) == 3)
    }

    @Test("a peer merging a shared column by another rule is refused, the column named; nothing is sent")
    func differentRulesAreRefused() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Self.node(["stock": .counter]), b = try Self.node([:])
        try a.execute("INSERT INTO inventory VALUES ('apple', 10)")
        do {
            _ = try await Self.sync(a, b, pki: pki)
            Issue.record("a counter synced with a last-writer-wins column")
        } catch let error as SyncSessionError {
            guard case let .schemaMismatch(table, column, message) = error else { Issue.record("\(error)"); return }
            #expect(table == "inventory" && column == "stock", "\(message)")
            #expect(message.contains("counter") && message.contains("lastWriterWins"), "\(message)")
        }
        #expect(try Self.stock(b) == nil)
    }

    @Test("a peer that merges by no rule (an earlier version) is refused when a shared column has one")
    func aPeerWithoutRulesIsRefused() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Self.node(["stock": .counter]), b = try Self.node(["stock": .counter])
        try a.execute("INSERT INTO inventory VALUES ('apple', 10)")
        var older = SyncOptions()
        older.testHooks.offersMergeRules = false
        do {
            _ = try await Self.sync(a, b, pki: pki, options: older)
            Issue.record("a counter synced with a peer that knows no merge rules")
        } catch let error as SyncSessionError {
            guard case let .schemaMismatch(table, column, message) = error else { Issue.record("\(error)"); return }
            #expect(table == "inventory" && column == "stock", "\(message)")
        }
        #expect(try Self.stock(b) == nil)
        // Without rules on either side, such a peer syncs as before.
        let c = try Self.node([:]), d = try Self.node([:])
        try c.execute("INSERT INTO inventory VALUES ('apple', 10)")
        _ = try await Self.sync(c, d, pki: pki, options: older)
        #expect(try Self.stock(d) == 10)
    }

    @Test("a high-water mark over TLS: the greater of two concurrent writes wins on both; max against min is refused")
    func maximumOverASession() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let a = try Self.node(["stock": .maximum]), b = try Self.node(["stock": .maximum])
        try a.execute("INSERT INTO inventory VALUES ('apple', 10)")
        _ = try await Self.sync(a, b, pki: pki)
        try a.execute("UPDATE inventory SET stock = 40")
        try b.execute("UPDATE inventory SET stock = 25")  // the later write, and the smaller
        _ = try await Self.sync(a, b, pki: pki)
        _ = try await Self.sync(a, b, pki: pki)
        #expect(try Self.stock(a) == 40)
        #expect(try Self.stock(b) == 40)
        let c = try Self.node(["stock": .minimum])
        do {
            _ = try await Self.sync(a, c, pki: pki)
            Issue.record("a max column synced with a min column")
        } catch let error as SyncSessionError {
            guard case let .schemaMismatch(table, column, message) = error else { Issue.record("\(error)"); return }
            #expect(table == "inventory" && column == "stock", "\(message)")
            #expect(message.contains("max") && message.contains("min"), "\(message)")
        }
        #expect(try Self.stock(c) == nil)
    }

    @Test("add-wins rows over TLS: an update the delete did not see brings the row back; delete-wins is refused")
    func addWinsOverASession() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        func node(_ rule: RowMergeRule) throws -> Database {
            let db = try Database.inMemory()
            try db.execute("CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)")
            try db.enableSync(table: "inventory", rowRule: rule)
            return db
        }
        let a = try node(.addWins), b = try node(.addWins)
        try a.execute("INSERT INTO inventory VALUES ('apple', 10)")
        _ = try await Self.sync(a, b, pki: pki)
        try a.execute("DELETE FROM inventory")
        try b.execute("UPDATE inventory SET stock = 12")
        _ = try await Self.sync(a, b, pki: pki)
        _ = try await Self.sync(a, b, pki: pki)
        #expect(try Self.stock(a) == 12)
        #expect(try Self.stock(b) == 12)
        let c = try node(.deleteWins)
        do {
            _ = try await Self.sync(a, c, pki: pki)
            Issue.record("add-wins rows synced with delete-wins rows")
        } catch let error as SyncSessionError {
            guard case let .schemaMismatch(table, _, message) = error else { Issue.record("\(error)"); return }
            #expect(table == "inventory", "\(message)")
            #expect(message.contains("addWins") && message.contains("deleteWins"), "\(message)")
        }
        #expect(try Self.stock(c) == nil)
    }
}
