import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import Tether
import TetherSync

/// A tour of Tether: two related models written, queried, updated and deleted
/// on one node, then three nodes on loopback, with TLS certificates made for
/// the occasion, in a line alpha – beta – gamma: each writes, and all three
/// converge through beta. Prints what happens and how long it took.
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run three sync nodes on loopback with TLS, write on each, and show them converge.")

    struct Author: Model {
        var id: Int64
        var name: String
        var country: String?
        static let tableName = "author"
    }

    struct Book: Model {
        var id: Int64
        var authorID: Int64
        var title: String
        var year: Int
        var tags: [String]
        enum CodingKeys: String, CodingKey { case id, authorID = "author_id", title, year, tags }
        static let tableName = "book"
        static var constraints: [Constraint<Book>] {
            [
                .foreignKey("author_id", references: Author.self, onDelete: .cascade), .index(["author_id"]),
                .check("year > 0"),
            ]
        }
    }

    func run() async throws {
        let started = Date()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "tether-demo-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }

        // Three nodes, each its own database file, certificate and key, all signed by one CA.
        let names = ["alpha", "beta", "gamma"]
        let ca = try CertificateAuthority.create(commonName: "Tether demo CA", validity: 86_400)
        let caFile = directory.appendingPathComponent("ca.pem").path
        try Data(ca.certificatePEM.utf8).write(to: URL(fileURLWithPath: caFile))
        var nodes: [DemoNode] = []
        for name in names {
            let credentials = try CertificateAuthority.issue(commonName: name, signedBy: ca, validity: 86_400)
            let certificate = directory.appendingPathComponent("\(name).pem").path
            let key = directory.appendingPathComponent("\(name)-key.pem").path
            try CertificateAuthority.write(credentials, certificatePath: certificate, privateKeyPath: key)
            let db = try Database(path: directory.appendingPathComponent("\(name).sqlite").path)
            try db.createTable(Author.self)
            try db.createTable(Book.self)
            try db.enableSync(for: Author.self)
            try db.enableSync(for: Book.self)
            nodes.append(
                DemoNode(
                    name: name, database: db,
                    serverTLS: try TLSContext(
                        configuration: .server(
                            certificateChainFile: certificate, privateKeyFile: key,
                            trustedCAFile: caFile)),
                    clientTLS: try TLSContext(
                        configuration: .client(
                            certificateChainFile: certificate, privateKeyFile: key,
                            trustedCAFile: caFile))))
        }
        say("Made a CA and a certificate for each of \(names.joined(separator: ", ")) in \(directory.path)")

        // The ORM, on alpha.
        let db = nodes[0].database
        say("alpha: created tables author and book (book.author_id references author ON DELETE CASCADE), synced")

        try db.insert(contentsOf: [
            Author(id: 1, name: "Ursula K. Le Guin", country: "US"),
            Author(id: 2, name: "Stanisław Lem", country: "PL"),
            Author(id: 3, name: "Italo Calvino", country: nil),
        ])
        try db.insert(contentsOf: [
            Book(id: 1, authorID: 1, title: "The Dispossessed", year: 1974, tags: ["utopia", "physics"]),
            Book(id: 2, authorID: 1, title: "The Left Hand of Darkness", year: 1969, tags: ["gender"]),
            Book(id: 3, authorID: 2, title: "Solaris", year: 1961, tags: ["ocean", "contact"]),
            Book(id: 4, authorID: 3, title: "Invisible Cities", year: 1972, tags: ["cities"]),
        ])
        say("Inserted \(try db.count(Author.self)) authors and \(try db.count(Book.self)) books in two transactions")

        let seventies = try db.fetchAll(Book.where(\.year >= 1970).orderBy(\.year))
        say("Books from 1970 on, by year: \(seventies.map { "\($0.title) (\($0.year))" }.joined(separator: ", "))")
        let byLeGuin = try db.fetchAll(Book.query("author_id", "=", 1).orderBy("title"))
        say("Books by author 1: \(byLeGuin.map(\.title).joined(separator: ", "))")

        do {
            try db.insert(Author(id: 2, name: "Someone Else", country: nil))
        } catch let ModelError.duplicate(existing, _) {
            say("Inserting author 2 again is refused; the row already there is \((existing as? Author)?.name ?? "?")")
        }
        do {
            try db.insert(Book(id: 9, authorID: 42, title: "Orphan", year: 2000, tags: []))
        } catch let error as DatabaseError {
            say("A book by an unknown author is refused: \(error.message)")
        }

        try db.update(Book.self, key: PrimaryKey(3), set: [.set(\.title, to: "Solaris (1961)")])
        say("Renamed book 3: \(try db.fetch(Book.self, key: PrimaryKey(3))?.title ?? "?")")
        let changed = try db.update(Author.where(.isNull(\Author.country)), set: [.set("country", to: "IT")])
        say("Filled in \(changed) missing country")

        try db.delete(Author.self, key: PrimaryKey(1))
        say("Deleted author 1; the cascade leaves \(try db.count(Book.self)) books")
        let years = try db.aggregate(.average(\Book.year), as: Double.self) ?? 0
        say("Average publication year of the rest: \(Int(years))")

        // Three nodes in a line: beta connects to alpha, gamma to beta. Every applied batch is
        // reported here, so that convergence is awaited, not guessed.
        let (applied, appliedContinuation) = AsyncStream<Void>.makeStream()
        var options = SyncOptions()
        options.onBatchApplied = { _ in appliedContinuation.yield() }
        let networkStarted = Date()
        var running: [SyncNode] = []
        let patience = Task {
            try? await Task.sleep(for: .seconds(Self.patience))
            appliedContinuation.finish()
        }
        defer {
            patience.cancel()
            appliedContinuation.finish()
        }
        do {
            for (index, node) in nodes.enumerated() {
                let peers = index == 0 ? [] : [PeerAddress(host: "127.0.0.1", port: running[index - 1].port)]
                running.append(
                    try await SyncNode.start(
                        database: node.database, host: "127.0.0.1", port: 0, serverTLS: node.serverTLS,
                        clientTLS: node.clientTLS, peers: peers, options: options))
                say(
                    "\(node.name): listening on 127.0.0.1:\(running[index].port) (TLS 1.3, mutual)"
                        + (peers.isEmpty ? "" : ", connected to \(nodes[index - 1].name)"))
            }
            var waiting = applied.makeAsyncIterator()
            try await awaitConvergence(of: nodes, events: &waiting)
            say("beta and gamma caught up with alpha's library: \(try summary(of: nodes[2].database))")

            // Each node writes; gamma and alpha edit different columns of one row at the same time.
            try nodes[1].database.insert(Book(id: 20, authorID: 2, title: "The Cyberiad", year: 1965, tags: ["robots"]))
            try nodes[2].database.insert(Author(id: 10, name: "Octavia E. Butler", country: "US"))
            try nodes[2].database.insert(Book(id: 21, authorID: 10, title: "Kindred", year: 1979, tags: ["time"]))
            try nodes[2].database.execute("UPDATE author SET name = 'Stanislaw Lem' WHERE id = 2")
            try nodes[0].database.execute("UPDATE author SET country = 'Poland' WHERE id = 2")
            try nodes[0].database.delete(Book.self, key: PrimaryKey(4))
            say(
                """
                beta added a book; gamma added an author and her book and renamed author 2; alpha set author 2's \
                country and deleted a book
                """)
            let writesDone = Date()
            for node in running { node.notifyLocalChanges() }
            try await awaitConvergence(of: nodes, events: &waiting)
            say(
                String(
                    format: "All three converged %.0f ms after the writes: %@",
                    Date().timeIntervalSince(writesDone) * 1000,
                    try summary(of: nodes[0].database)))
            let merged = try nodes[0].database.fetch(Author.self, key: PrimaryKey(2))
            say("Concurrent edits of two columns of one row merged: \(merged?.name ?? "?"), \(merged?.country ?? "?")")
            for (node, server) in zip(nodes, running) {
                let totals = server.totals
                say(
                    "\(node.name): \(totals.sessions) session(s), sent \(totals.changesSent), received "
                        + "\(totals.changesReceived), "
                        + "conflicts \(totals.conflicts), \(totals.bytesSent + totals.bytesReceived) bytes on the wire")
            }
        } catch {
            for node in running.reversed() { try? await node.stop() }
            throw error
        }
        for node in running.reversed() { try await node.stop() }
        say(
            String(
                format: "Network part %.0f ms; done in %.0f ms", Date().timeIntervalSince(networkStarted) * 1000,
                Date().timeIntervalSince(started) * 1000))
    }

    /// A node's database and TLS contexts.
    struct DemoNode {
        let name: String
        let database: Database
        let serverTLS: TLSContext
        let clientTLS: TLSContext
    }

    /// How long the demo waits for the nodes to converge, in seconds, before it gives up.
    static let patience = 30

    /// Waits, batch by batch, until every node holds the same authors and books; throws when
    /// `events` ends first (after `patience`).
    private func awaitConvergence(of nodes: [DemoNode], events: inout AsyncStream<Void>.Iterator) async throws {
        while try Set(nodes.map { try contents(of: $0.database) }).count > 1 {
            guard await events.next() != nil else {
                throw CLIError(.software, "the demo nodes did not converge within \(Self.patience) s")
            }
        }
    }

    /// Every author and book, in a canonical form.
    private func contents(of db: Database) throws -> String {
        let authors = try db.fetchAll(Author.query.orderBy(\.id)).map { "\($0.id)|\($0.name)|\($0.country ?? "-")" }
        let books = try db.fetchAll(Book.query.orderBy(\.id)).map { "\($0.id)|\($0.authorID)|\($0.title)|\($0.year)" }
        return (authors + books).joined(separator: "\n")
    }

    private func summary(of db: Database) throws -> String {
        "\(try db.count(Author.self)) authors, \(try db.count(Book.self)) books"
    }

    private func say(_ line: String) { print("• \(line)") }
}
