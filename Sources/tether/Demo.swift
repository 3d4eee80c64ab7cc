import ArgumentParser
import Foundation
import Tether

/// A tour of Tether: two related models, written, queried, updated and
/// deleted, then two databases brought in sync. Prints what it does.
struct Demo: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run a short demonstration and print what happens.")

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
            [.foreignKey("author_id", references: Author.self, onDelete: .cascade), .index(["author_id"]), .check("year > 0")]
        }
    }

    func run() throws {
        let started = Date()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-demo-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("library.sqlite").path

        let db = try Database(path: path)
        say("Opened \(path) (WAL), instance key \(db.instanceKey)")
        try db.createTable(Author.self)
        try db.createTable(Book.self)
        say("Created tables author and book (book.author_id references author ON DELETE CASCADE)")

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

        // Replication between two databases, without the network.
        let copy = try Database(path: directory.appendingPathComponent("copy.sqlite").path)
        for database in [db, copy] {
            try database.createTable(Author.self)
            try database.createTable(Book.self)
            try database.enableSync(for: Author.self)
            try database.enableSync(for: Book.self)
        }
        try copy.insert(Author(id: 10, name: "Octavia E. Butler", country: "US"))
        try sync(from: db, to: copy)
        try sync(from: copy, to: db)
        say("Synced the library with a second database: both now hold \(try db.count(Author.self)) authors and \(try db.count(Book.self)) books")
        try db.execute("UPDATE author SET country = 'Poland' WHERE id = 2")
        try copy.execute("UPDATE author SET name = 'Stanislaw Lem' WHERE id = 2")
        try sync(from: db, to: copy)
        try sync(from: copy, to: db)
        let merged = try copy.fetch(Author.self, key: PrimaryKey(2))
        say("Concurrent edits of two columns of one row merge: \(merged?.name ?? "?"), \(merged?.country ?? "?")")
        say(String(format: "Done in %.0f ms", Date().timeIntervalSince(started) * 1000))
    }

    private func sync(from source: Database, to target: Database) throws {
        var cursor = try target.cursor(for: source.instanceKey)
        while true {
            let batch = try source.extractChanges(for: target.instanceKey, after: cursor.after, resuming: cursor.resyncing)
            try target.apply(batch)
            try source.acknowledge(peer: target.instanceKey, through: batch.through)
            cursor = try target.cursor(for: source.instanceKey)
            if batch.isLast { return }
        }
    }

    private func say(_ line: String) { print("• \(line)") }
}
