import Foundation
import Testing
import Tether
import TetherTestSupport
@testable import TetherSync
import TetherWire

@Suite("A peer's interest is evaluated within the server's time limit (SyncOptions.interestTimeLimit, §8.10)")
struct InterestBudgetSessionTests {
    @Test(
        """
        an extraction evaluating the peer's interest past the time limit ends that session with ERROR 2 naming \
        the table; nothing is sent, and the next peer is served
        """)
    func pastTheTimeLimit() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let hub = try Database.inMemory()
        try hub.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT NOT NULL, note TEXT)")
        try hub.enableSync(table: "orders")
        try await hub.write { conn in
            for id in 1...3_000 {
                try conn.execute("INSERT INTO orders (id, site, note) VALUES (?, 'north', ?)", [id, "order \(id)"])
            }
        }
        func site() throws -> Database {
            let db = try Database.inMemory()
            try db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, site TEXT NOT NULL, note TEXT)")
            try db.enableSync(table: "orders")
            return db
        }
        let interested = try site(), whole = try site()
        var options = SyncOptions.patientServer
        options.interestTimeLimit = .zero
        _ = try await runServer(hub, pki: pki, options: options) { server in
            var northOptions = SyncOptions()
            northOptions.interest = ["orders": .filter("note LIKE '%9%'")]
            do {
                _ = try await SyncClient.syncOnce(
                    database: interested, host: "127.0.0.1", port: server.port, tls: try pki.clientContext(),
                    options: northOptions)
                Issue.record("an interest evaluated past the time limit was served")
            } catch {
                let text = "\(error)"
                #expect(
                    text.contains("ERROR 2") && text.contains("scope of orders")
                        && text.contains("longer than its time limit"), "\(text)")
            }
            // Without an interest, no budget applies: the next peer gets every row.
            _ = try await SyncClient.syncOnce(
                database: whole, host: "127.0.0.1", port: server.port, tls: try pki.clientContext())
        }
        #expect(try interested.fetchValue("SELECT count(*) FROM orders", as: Int.self) == 0)
        #expect(try whole.fetchValue("SELECT count(*) FROM orders", as: Int.self) == 3_000)
    }
}
