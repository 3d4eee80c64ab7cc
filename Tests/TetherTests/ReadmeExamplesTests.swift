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

struct Employee: Model, Equatable {
    var id: String
    var firstName: String
}

struct Address: Model, Equatable {
    var id: Int64
    var city: String
}

struct Employer: Model, Equatable {
    var id: String
    var fullName: String?
    var headquarters: Address
    var branch: Address?
    var employees: [Employee]
    static var constraints: [Constraint<Employer>] {
        [.mandatory("fullName"), .dropsMissingElements("employees")]
    }
}

struct Session: Model, Equatable {
    var id: String
    var user: String
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

    @Test func nestedModels() throws {
        let db = try Database.inMemory()
        try db.createTable(Employer.self)                     // and the tables of Employee and Address
        let employer = Employer(id: "E1", fullName: "Nour Sandid", headquarters: Address(id: 10, city: "Beirut"), branch: nil,
                                employees: [Employee(id: "e1", firstName: "Nour"), Employee(id: "e2", firstName: "Sami")])
        try db.insert(employer)
        #expect(try db.fetchRows("SELECT headquarters, employees FROM Employer").first?.values == [.integer(10), .text(#"["e1","e2"]"#)])

        try db.update(Employee(id: "e2", firstName: "Samir"))  // the parent reads the new name
        #expect(try db.fetch(Employer.self, key: PrimaryKey("E1"))?.employees.map(\.firstName) == ["Nour", "Samir"])
        let shallow = try db.fetch(Employer.self, key: PrimaryKey("E1"), loading: .depth(1))    // children, not theirs
        let keys = try db.linkedKeys(Employer.self, key: PrimaryKey("E1"), column: "employees")  // keys only
        #expect(shallow?.headquarters.city == "Beirut")
        #expect(keys == [PrimaryKey("e1"), PrimaryKey("e2")])
        try db.delete(employer, deletingChildren: true)       // or false: the children stay (SundeedQLite's deleteSubObjects)
        #expect(try db.count(Employee.self) == 0 && db.count(Address.self) == 0)
    }

    @Test func expiringRows() throws {
        let db = try Database.inMemory()
        try db.createTable(Session.self)
        try db.insert(Session(id: "s1", user: "arthur"), expiresAt: Date().addingTimeInterval(3600))
        try db.save(Session(id: "s2", user: "barbara"), expiresAt: Date().addingTimeInterval(-1))   // already past
        #expect(try db.fetchRows("SELECT id FROM Session").count == 1)
        #expect(try db.expiry(of: Session.self, key: PrimaryKey("s1")) != nil)
        try db.setExpiry(of: Session.self, key: PrimaryKey("s1"), to: nil)     // keep it after all
        #expect(try db.expiry(of: Session.self, key: PrimaryKey("s1")) == nil)
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
}
