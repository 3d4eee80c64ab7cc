import Foundation
import Testing
import Tether

// Every code example of README.md, kept true by running it. When an example
// changes in the README, change it here (and the other way round).

@Model
struct Player: Equatable {
    enum Team: String, Codable, CaseIterable { case red, blue }
    var id: Int64
    var name: String
    var email: String
    var score: Int?
    var team: Team
    var tags: [String]
    var joined: Date

    static let tableName = "player"
    static var constraints: [Constraint<Player>] {
        [.unique("email"), .check("score >= 0"), .index(["name"]), .collate("name", .noCase)]
    }
}

struct Match: Model {
    var id: Int64
    var playerID: Int64
    var points: Int
    enum CodingKeys: String, CodingKey { case id, playerID = "player_id", points }
    static var constraints: [Constraint<Match>] {
        [.foreignKey("player_id", references: Player.self, onDelete: .cascade)]
    }
}

@Suite("README examples") struct ReadmeExamplesTests {
    @Test func tour() throws {
        // Opening and creating tables
        let db = try Database.inMemory()          // or Database(path: "app.sqlite"): WAL, pooled readers
        try db.createTable(Player.self)
        try db.createTable(Match.self)

        // Writing
        let arthur = Player(id: 1, name: "Arthur", email: "arthur@example.com", score: 100, team: .blue,
                            tags: ["captain"], joined: Date(timeIntervalSince1970: 0))
        try db.insert(arthur)
        try db.insert(contentsOf: [
            Player(id: 2, name: "Barbara", email: "barbara@example.com", score: 1000, team: .red, tags: [], joined: Date()),
            Player(id: 3, name: "Craig", email: "craig@example.com", score: nil, team: .red, tags: [], joined: Date()),
        ])
        do {
            try db.insert(Player(id: 4, name: "Impostor", email: "arthur@example.com", score: 0, team: .red, tags: [], joined: Date()))
        } catch let ModelError.duplicate(existing, _) {
            #expect((existing as? Player)?.name == "Arthur")
        }
        let failures = try db.insertEach([arthur])   // best effort: what failed, and why
        #expect(failures.map(\.index) == [0])

        // Queries: key paths or column names, one builder
        let strong = try db.fetchAll(Player.where(\.score >= 100 && \.team == .red).orderBy(\.name))
        let chained = try db.fetchAll(Player.query("name", "LIKE", "a%").and("score", "<=", 500).orderBy("score", ascending: false).limit(10))
        let anySet = try db.fetchAll(Player.where(.sets([[\Player.team == .red, .isNull(\Player.score)], [\Player.name == "Arthur"]])))
        #expect(strong.map(\.name) == ["Barbara"])
        #expect(chained.map(\.name) == ["Arthur"])
        #expect(Set(anySet.map(\.name)) == ["Arthur", "Craig"])
        let total = try db.aggregate(.sum(\Player.score), as: Int.self)
        let keys = try db.fetchKeys(Player.where(\.team == .red))
        #expect(total == 1100)
        #expect(keys.count == 2)

        // Updating and deleting
        try db.update(Player.self, key: PrimaryKey(3), set: [.set(\.score, to: 5), .set("tags", to: ["new"])])
        try db.update(Player.where(\.team == .red), set: [.set("team", to: Player.Team.blue)])
        try db.delete(Player.where(\.score < 10))
        #expect(try db.count(Player.self) == 2)

        // Raw SQL with bound arguments, rows by index and by name
        try db.execute("UPDATE player SET score = score + :bonus WHERE name = :name", ["bonus": 1, "name": "Arthur"])
        let row = try db.fetchRows("SELECT name, score FROM player WHERE id = ?", [1]).first
        #expect(try row?.get("score", as: Int.self) == 101)

        // Transactions: nested ones are savepoints; a throw rolls back
        try db.write { conn in
            try conn.insert(Match(id: 1, playerID: 1, points: 3))
            _ = try? conn.transaction {
                try conn.insert(Match(id: 2, playerID: 99, points: 1))   // foreign key violation: this part rolls back
            }
        }
        #expect(try db.count(Match.self) == 1)
    }

    @Test func asyncAccess() async throws {
        let db = try Database.inMemory()
        try await db.write { conn in
            try conn.createTable(Player.self)
            try conn.insert(Player(id: 1, name: "Arthur", email: "a@example.com", score: 1, team: .red, tags: [], joined: Date()))
        }
        let players = try await db.read { try $0.fetchAll(Player.self) }
        #expect(players.map(\.name) == ["Arthur"])
    }

    @Test func sync() throws {
        let a = try Database.inMemory()
        let b = try Database.inMemory()
        for db in [a, b] {
            try db.createTable(Player.self)
            try db.enableSync(for: Player.self)                  // policy: .lastWriterWins by default
        }
        try a.insert(Player(id: 1, name: "Arthur", email: "a@example.com", score: 1, team: .red, tags: [], joined: Date()))

        // What b lacks from a, in batches; each applied in one transaction with its cursor.
        var cursor = try b.cursor(for: a.instanceKey)
        while true {
            let batch = try a.extractChanges(for: b.instanceKey, after: cursor.after, resuming: cursor.resyncing)
            let report = try b.apply(batch)                        // idempotent; conflicts in report.conflicts
            try a.acknowledge(peer: b.instanceKey, through: report.cursor)
            cursor = try b.cursor(for: a.instanceKey)
            if batch.isLast { break }
        }
        #expect(try b.fetch(Player.self, key: PrimaryKey(1))?.name == "Arthur")
        #expect(try a.count(Player.where(.pendingSync)) == 0)

        // Air-gapped: the same batches in a file
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("readme-\(UUID().uuidString).tether")
        defer { try? FileManager.default.removeItem(at: file) }
        try a.execute("UPDATE player SET score = 2 WHERE id = 1")
        let exported = try a.exportSyncFile(to: file, for: b.instanceKey, since: cursor.after)
        let imported = try b.importSyncFile(from: file)
        #expect(imported.source == a.instanceKey && imported.nextSequence == exported.nextSequence)
        #expect(try b.fetch(Player.self, key: PrimaryKey(1))?.score == 2)
    }

    @Test func observation() async throws {
        let db = try Database.inMemory()
        try db.createTable(Player.self)
        try db.enableSync(for: Player.self)
        try db.insert(Player(id: 1, name: "Arthur", email: "a@example.com", score: 0, team: .red, tags: [], joined: Date()))
        let heard = ReadmeEvents()
        let check = db.observe(.changes, of: Player.self) { heard.append($0) }

        // Listeners
        let token = db.observe(.changes, of: Player.self) { event in   // or in: "player", key: PrimaryKey(1)
            print(event)                                                // insert player 2 (local)
        }
        try db.insert(Player(id: 2, name: "Barbara", email: "b@example.com", score: 5, team: .blue, tags: [], joined: Date()))
        _ = try? await db.write { conn in
            try conn.delete(Player.self, key: PrimaryKey(2))
            throw CancellationError()                                   // rolled back: never reported
        }
        token.cancel()                                                  // or let it go

        // Committed transactions
        var feed = try db.committedTransactions(tables: ["player"]).makeAsyncIterator()
        try db.insert(Player(id: 3, name: "Chris", email: "c@example.com", score: 1, team: .red, tags: [], joined: Date()))
        let transaction = try await feed.next()                 // changes: [insert player 3], sequences: 2...2 when synced
        #expect(transaction?.changes.map(\.key) == [PrimaryKey(3)])
        #expect(transaction?.sequences?.count == 1)
        // The listener heard the two inserts, nothing of the rolled-back delete.
        #expect(await heard.wait(for: 2).map(\.kind) == [.insert, .insert])

        // Query observation
        let scores = db.observe(Player.where(\.score >= 1)).removeDuplicates()
        var values = scores.makeAsyncIterator()
        let now = try await values.next()                       // the players now
        try db.execute("UPDATE player SET score = 10 WHERE id = 3")
        let next = try await values.next()                      // after that commit
        let counts = db.observe(sql: "SELECT count(*) FROM player")   // or db.observe { conn in … }
        #expect(now?.map(\.id) == [2, 3])
        #expect(next?.first { $0.id == 3 }?.score == 10)
        var countValues = counts.makeAsyncIterator()
        #expect(try await countValues.next()?.first?[0] == .integer(3))
        _ = check
    }
}

/// What a README example's listener heard (listeners are called on another queue).
final class ReadmeEvents: @unchecked Sendable {
    private let lock = NSLock()
    private var events: [DatabaseEvent] = []
    private var waiters: [(count: Int, continuation: CheckedContinuation<[DatabaseEvent], Never>)] = []

    func append(_ event: DatabaseEvent) {
        lock.lock()
        events.append(event)
        let all = events
        let ready = waiters.filter { $0.count <= all.count }
        waiters.removeAll { $0.count <= all.count }
        lock.unlock()
        for waiter in ready { waiter.continuation.resume(returning: all) }
    }

    /// The events once there are at least `count` of them.
    func wait(for count: Int) async -> [DatabaseEvent] {
        await withCheckedContinuation { continuation in
            lock.lock()
            if events.count >= count {
                let all = events
                lock.unlock()
                continuation.resume(returning: all)
            } else {
                waiters.append((count, continuation))
                lock.unlock()
            }
        }
    }
}
