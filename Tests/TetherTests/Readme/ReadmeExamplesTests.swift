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

// Stored types and converters
enum Color: String, Codable, DatabaseValueConvertible { case red, green }

struct Email: Codable, DatabaseValueConvertible {  // a converter with a strict parser
    let address: String
    init?(_ address: String) {
        guard address.contains("@") else { return nil }
        self.address = address
    }
    static var columnType: ColumnType { .text }
    var databaseValue: DatabaseValue { .text(address) }
    static func fromDatabaseValue(_ value: DatabaseValue) -> Email? {
        String.fromDatabaseValue(value).flatMap(Email.init)
    }
}

struct Swatch: Model {
    var id: Int64
    var color: Color
    var owner: Email
}

// Coming from other libraries
struct LogLine: Model, Equatable {
    var level: String
    var message: String
    static var primaryKey: [ColumnRef<LogLine>] { [] }
}

struct Thing: SyncableModel {
    var id: Int64
    var serverID: String
    var name: String
    var syncStatus: SyncStatus = .created
    var inFlight = false
    enum CodingKeys: String, CodingKey {
        case id, serverID = "server_id", name
        case syncStatus = "tether_status", inFlight = "tether_in_flight"
    }
    static var secondaryKeys: [[ColumnRef<Thing>]] { [["server_id"]] }
    static var constraints: [Constraint<Thing>] { [.autoIncrement] }
    init(id: Int64, serverID: String, name: String) {
        self.id = id
        self.serverID = serverID
        self.name = name
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
    static var defaultOrder: [Ordering<Employer>] { [.ascending("fullName")] }  // SundeedQLite's <<
}

struct Session: Model, Equatable {
    var id: String
    var user: String
}

@Suite("README examples") struct ReadmeExamplesTests {
    @Test func tour() throws {
        // Opening and creating tables
        let db = try Database.inMemory()  // or Database(path: "app.sqlite"): WAL, pooled readers
        try db.createTable(Player.self)
        try db.createTable(Match.self)

        let arthur = Player(
            id: 1, name: "Arthur", email: "arthur@example.com", score: 100, team: .blue,
            tags: ["captain"], joined: Date(timeIntervalSince1970: 0))
        try db.insert(arthur)
        try db.insert(contentsOf: [
            Player(
                id: 2, name: "Barbara", email: "barbara@example.com", score: 1000, team: .red, tags: [],
                joined: Date()),
            Player(id: 3, name: "Craig", email: "craig@example.com", score: nil, team: .red, tags: [], joined: Date()),
        ])
        do {
            try db.insert(
                Player(
                    id: 4, name: "Impostor", email: "arthur@example.com", score: 0, team: .red, tags: [], joined: Date()
                ))
        } catch let ModelError.duplicate(existing, _) {
            #expect((existing as? Player)?.name == "Arthur")
        }
        let failures = try db.insertEach([arthur])  // best effort: what failed, and why
        #expect(failures.map(\.index) == [0])

        // Queries: key paths or column names, one builder
        let strong = try db.fetchAll(Player.where(\.score >= 100 && \.team == .red).orderBy(\.name))
        let chained = try db.fetchAll(
            Player.query("name", "LIKE", "a%").and("score", "<=", 500).orderBy("score", ascending: false).limit(10))
        let anySet = try db.fetchAll(
            Player.where(.sets([[\Player.team == .red, .isNull(\Player.score)], [\Player.name == "Arthur"]])))
        let total = try db.aggregate(.sum(\Player.score), as: Int.self)
        let keys = try db.fetchKeys(Player.where(\.team == .red))
        let scored = try db.fetchAll(Player.query("score", "IS NOT", nil).orderBy("team, name desc"))
        let sum = try db.aggregate(.sum("score"), of: Player.self, as: Int.self)
        #expect(strong.map(\.name) == ["Barbara"])
        #expect(chained.map(\.name) == ["Arthur"])
        #expect(Set(anySet.map(\.name)) == ["Arthur", "Craig"])
        #expect(total == 1100)
        #expect(keys.count == 2)
        #expect(scored.map(\.name) == ["Arthur", "Barbara"])
        #expect(sum == 1100)

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
                try conn.insert(Match(id: 2, playerID: 99, points: 1))  // foreign key violation: this part rolls back
            }
        }
        #expect(try db.count(Match.self) == 1)
    }

    @Test func nestedModels() throws {
        let db = try Database.inMemory()
        try db.createTable(Employer.self)  // and the tables of Employee and Address (updateSchema(toMatch:) too)
        let employer = Employer(
            id: "E1", fullName: "Nour Sandid", headquarters: Address(id: 10, city: "Beirut"), branch: nil,
            employees: [Employee(id: "e1", firstName: "Nour"), Employee(id: "e2", firstName: "Sami")])
        try db.insert(employer)
        #expect(
            try db.fetchRows("SELECT headquarters, employees FROM Employer").first?.values == [
                .integer(10), .text(#"["e1","e2"]"#),
            ])

        try db.update(Employee(id: "e2", firstName: "Samir"))  // the parent reads the new name
        #expect(try db.fetch(Employer.self, key: PrimaryKey("E1"))?.employees.map(\.firstName) == ["Nour", "Samir"])
        let shallow = try db.fetch(Employer.self, key: PrimaryKey("E1"), loading: .depth(1))  // children, not theirs
        let keys = try db.linkedKeys(Employer.self, key: PrimaryKey("E1"), column: "employees")  // keys only
        // With false, the children stay (SundeedQLite's deleteSubObjects).
        try db.delete(employer, deletingChildren: true)
        #expect(shallow?.headquarters.city == "Beirut")
        #expect(keys == [PrimaryKey("e1"), PrimaryKey("e2")])
        #expect(try db.count(Employee.self) == 0 && db.count(Address.self) == 0)
    }

    /// The counter column: two sales made at once both count, on both databases.
    @Test func counterColumn() throws {
        let a = try Database.inMemory(), b = try Database.inMemory()
        for db in [a, b] {
            try db.execute("CREATE TABLE inventory (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)")
            try db.enableSync(table: "inventory", columnRules: ["stock": .counter])
        }
        func send(_ from: Database, _ to: Database) throws {
            let cursor = try to.cursor(for: from.instanceKey)
            try to.apply(try from.extractChanges(for: to.instanceKey, after: cursor.after, resuming: cursor.resyncing))
        }
        try a.execute("INSERT INTO inventory VALUES ('apple', 10)")
        try send(a, b)
        try a.execute("UPDATE inventory SET stock = stock - 3")
        try b.execute("UPDATE inventory SET stock = stock - 4")
        try send(a, b)
        try send(b, a)
        for db in [a, b] { #expect(try db.fetchValue("SELECT stock FROM inventory", as: Int64.self) == 3) }
    }

    @Test func highWaterMark() throws {
        let a = try Database.inMemory(), b = try Database.inMemory()
        for db in [a, b] {
            try db.execute("CREATE TABLE devices (id TEXT PRIMARY KEY, last_seen INTEGER, first_seen INTEGER)")
            try db.enableSync(table: "devices", columnRules: ["last_seen": .maximum, "first_seen": .minimum])
        }
        try a.execute("INSERT INTO devices VALUES ('d1', 100, 100)")
        try b.apply(try a.extractChanges(for: b.instanceKey, after: 0))
        try a.execute("UPDATE devices SET last_seen = 500")
        try b.execute("UPDATE devices SET last_seen = 300")
        #expect(throws: SyncError.self) { try a.execute("UPDATE devices SET last_seen = 400") }
        try b.apply(try a.extractChanges(for: b.instanceKey, after: b.cursor(for: a.instanceKey).after))
        try a.apply(try b.extractChanges(for: a.instanceKey, after: a.cursor(for: b.instanceKey).after))
        for db in [a, b] { #expect(try db.fetchValue("SELECT last_seen FROM devices", as: Int64.self) == 500) }
    }

    @Test func expiringRows() throws {
        let db = try Database.inMemory()
        try db.createTable(Session.self)
        try db.insert(Session(id: "s1", user: "arthur"), expiresAt: Date().addingTimeInterval(3600))
        try db.save(Session(id: "s2", user: "barbara"), expiresAt: Date().addingTimeInterval(-1))  // already past
        #expect(try db.fetchRows("SELECT id FROM Session").count == 1)
        #expect(try db.expiry(of: Session.self, key: PrimaryKey("s1")) != nil)
        try db.setExpiry(of: Session.self, key: PrimaryKey("s1"), to: nil)  // keep it after all
        #expect(try db.expiry(of: Session.self, key: PrimaryKey("s1")) == nil)
    }

    @Test func storedTypesAndConverters() throws {
        let db = try Database.inMemory()
        try db.createTable(Swatch.self)  // color TEXT, owner TEXT
        if let owner = Email("ann@example.com") {
            try db.insert(Swatch(id: 1, color: .green, owner: owner))
        }
        let green = try db.fetchAll(Swatch.where(\.color == .green))
        #expect(green.map(\.owner.address) == ["ann@example.com"])
        #expect(
            try db.fetchRows("SELECT color, owner FROM Swatch").map(\.values) == [
                [.text("green"), .text("ann@example.com")]
            ])
        // STRICT: '77' on an INTEGER column is stored as 77; 'abc' is refused.
        try db.execute("CREATE TABLE counts (n INTEGER) STRICT")
        try db.execute("INSERT INTO counts VALUES ('77'), (' 77 '), (2.0)")
        #expect(
            try db.fetchRows("SELECT typeof(n), n FROM counts").map(\.values)
                == [
                    [.text("integer"), .integer(77)], [.text("integer"), .integer(77)],
                    [.text("integer"), .integer(2)],
                ])
        for refused in ["'abc'", "'7.5'", "7.5", "x'01'"] {
            #expect(throws: DatabaseError.self) { try db.execute("INSERT INTO counts VALUES (\(refused))") }
        }
    }

    @Test func comingFromOtherLibraries() throws {
        let db = try Database.inMemory()
        try db.createTable(Player.self)
        try db.createTable(Match.self)
        try db.insert(contentsOf: [
            Player(id: 1, name: "Arthur", email: "a@example.com", score: 1, team: .blue, tags: [], joined: Date()),
            Player(id: 2, name: "Barbara", email: "b@example.com", score: 2, team: .blue, tags: [], joined: Date()),
        ])
        // AgileDB: values by table and key without a model; a column per member, added when first needed
        try db.setValue(["name": "Groceries", "budget": 120.5, "tags": ["food"]], inTable: "categories", forKey: "c1")
        try db.setValue(json: #"{"name": "Rent", "budget": 900}"#, inTable: "categories", forKey: "c2")
        let groceries = try db.value(fromTable: "categories", forKey: "c1")  // ["name": .text("Groceries"), …]
        let rent = try db.jsonValue(fromTable: "categories", forKey: "c2")  // {"budget":900,"name":"Rent"}
        let byName = try db.keys(inTable: "categories", sortOrder: "name desc")  // [.text("c2"), .text("c1")]
        let both = try db.tableHasAllKeys("categories", keys: ["c1", "c2"])  // true
        let big = try db.keys(
            inTable: "categories", matching: [[.greater("budget", 500)], [.equal("owner", "ann")]],
            ignoringSetsWithUnknownColumns: true)  // validateObjects: no column owner, so that set is left out
        try db.deleteValue(fromTable: "categories", forKey: "c2")
        try db.enableSync(allExcept: ["categories"])  // unsyncedTables: every other table syncs
        let unreadable = try db.validateRows(Player.self)  // rows the model cannot read: key, and why
        let lazy = try db.lazyFetch(Player.where(\.team == .blue))  // keys now, each Player read on access
        #expect(groceries?["name"] == .text("Groceries") && groceries?["tags"] == .text(#"["food"]"#))
        #expect(rent == #"{"budget":900,"name":"Rent"}"#)
        #expect(byName == [.text("c2"), .text("c1")])
        #expect(both)
        #expect(big == [.text("c2")])
        #expect(db.syncedTables == ["Match", "player"])
        #expect(try db.unsyncedTables() == ["categories"])
        #expect(try !db.tableHasKey("categories", key: "c2"))
        #expect(unreadable.isEmpty)
        #expect(lazy.keys == [PrimaryKey(1), PrimaryKey(2)] && lazy.map { $0?.name } == ["Arthur", "Barbara"])

        // SQLiteORM-Swift: insert under a key SQLite assigns; tables without a primary key
        let id = try db.insert(Match(id: 0, playerID: 1, points: 2), assigningNewKey: true)
        try db.createTable(LogLine.self)  // static var primaryKey: [ColumnRef<LogLine>] { [] }
        try db.insert(LogLine(level: "info", message: "up"))
        try db.update(LogLine.where(\.level == "info"), set: [.set("message", to: "started")])
        #expect(id == 1)
        #expect(try db.fetchAll(Match.self).map(\.id) == [1])
        #expect(try db.fetchAll(LogLine.self) == [LogLine(level: "info", message: "started")])
        try db.delete(LogLine.where(\.level == "info"))
        #expect(try db.count(LogLine.self) == 0)

        // AHDataModel: best-effort delete by keys, with what failed and why
        let failed = try db.deleteEach(Player.self, keys: [PrimaryKey(1), PrimaryKey(99)])  // 99: ModelError.notFound
        #expect(failed.map(\.element) == [PrimaryKey(99)])
        #expect(try db.fetchAll(Player.self).map(\.id) == [2])

        // SundeedQLite: a child saved by naming its parent's key; the rows no parent links to
        try db.createTable(Employer.self)
        try db.insert(
            Employer(
                id: "E2", fullName: "Nour Sandid", headquarters: Address(id: 20, city: "Tyre"), branch: nil,
                employees: []))
        // save(withForeignKey:)
        try db.save(Employee(id: "e3", firstName: "Rami"), linkedTo: \Employer.employees, of: PrimaryKey("E2"))
        try db.insert(Employee(id: "e4", firstName: "Lina"))
        // [Lina]: retrieve(excludeIfIsForeign: true)
        let independent = try db.fetchAll(Employee.query.excludingNestedChildren())
        #expect(try db.fetch(Employer.self, key: PrimaryKey("E2"))?.employees.map(\.firstName) == ["Rami"])
        #expect(independent.map(\.firstName) == ["Lina"])

        // sModel: statements made now, run together in one transaction (createSaveStatement, executeStatements)
        let barbara = Player(
            id: 2, name: "Barbara B.", email: "b@example.com", score: 2, team: .blue, tags: [], joined: Date())
        try db.execute([
            barbara.saveStatement(), Match(id: 9, playerID: 2, points: 1).saveStatement(),
            .sql("UPDATE player SET score = ?", [3]),
        ])
        #expect(try db.fetchAll(Player.self).map { "\($0.name) \($0.score ?? 0)" } == ["Barbara B. 3"])
        #expect(try db.fetchAll(Match.self).map(\.id) == [9])  // match 1 went with player 1 (ON DELETE CASCADE)

        // sModel: blindlyReplaceDuplicates, database-wide
        var configuration = Database.Configuration()
        configuration.replacesDuplicates = true
        let replacing = try Database.inMemory(configuration: configuration)
        try replacing.createTable(Player.self)
        try replacing.insert(
            Player(id: 1, name: "Arthur", email: "a@example.com", score: 1, team: .blue, tags: [], joined: Date()))
        try replacing.insert(
            Player(id: 2, name: "Arturo", email: "a@example.com", score: 1, team: .blue, tags: [], joined: Date()))
        #expect(try replacing.fetchAll(Player.self).map(\.name) == ["Arturo"])
    }

    @Test func sModelSaveRule() throws {
        let server = try Database.inMemory()
        let client = try Database.inMemory()
        for db in [server, client] {
            try db.createTable(Thing.self)
            try db.enableSync(for: Thing.self)
        }
        try server.insert(Thing(id: 7, serverID: "s1", name: "from the server"))
        _ = try client.apply(server.extractChanges(for: client.instanceKey, after: 0))

        // Thing: a SyncableModel with a local AUTOINCREMENT id and the secondary key server_id.
        let synced = try client.fetchFirst(Thing.where(\.serverID == "s1"))  // a row the server sent
        try client.save(Thing(id: 0, serverID: "s1", name: "renamed"))  // updates it…
        #expect(try client.fetchFirst(Thing.where(\.serverID == "s1"))?.id == synced?.id)  // …keeping its local key
        #expect(try client.fetchAll(Thing.self).map(\.name) == ["renamed"])
        #expect(synced != nil)
    }

    @Test func asyncAccess() async throws {
        let db = try Database.inMemory()
        try await db.write { conn in
            try conn.createTable(Player.self)
            try conn.insert(
                Player(id: 1, name: "Arthur", email: "a@example.com", score: 1, team: .red, tags: [], joined: Date()))
        }
        let players = try await db.read { try $0.fetchAll(Player.self) }
        #expect(players.map(\.name) == ["Arthur"])
    }

    @Test func sync() throws {
        let a = try Database.inMemory()
        let b = try Database.inMemory()
        for db in [a, b] {
            try db.createTable(Player.self)
            try db.enableSync(for: Player.self)  // policy: .lastWriterWins by default
        }
        try a.insert(
            Player(id: 1, name: "Arthur", email: "a@example.com", score: 1, team: .red, tags: [], joined: Date()))

        // What b lacks from a, in batches; each applied in one transaction with its cursor.
        var cursor = try b.cursor(for: a.instanceKey)
        while true {
            let batch = try a.extractChanges(for: b.instanceKey, after: cursor.after, resuming: cursor.resyncing)
            let report = try b.apply(batch)  // idempotent; conflicts in report.conflicts
            try a.acknowledge(peer: b.instanceKey, through: report.cursor)
            cursor = try b.cursor(for: a.instanceKey)
            if batch.isLast { break }
        }
        #expect(try b.fetch(Player.self, key: PrimaryKey(1))?.name == "Arthur")
        #expect(try a.count(Player.where(.pendingSync)) == 0)

        // Air-gapped: the same batches in a file
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("readme-\(UUID().uuidString).tether")
        try a.execute("UPDATE player SET score = 2 WHERE id = 1")
        let exported = try a.exportSyncFile(to: file, for: b.instanceKey, since: cursor.after)
        let imported = try b.importSyncFile(from: file)
        try? FileManager.default.removeItem(at: file)
        #expect(imported.source == a.instanceKey && imported.nextSequence == exported.nextSequence)
        #expect(try b.fetch(Player.self, key: PrimaryKey(1))?.score == 2)
    }

    @Test func observation() async throws {
        let db = try Database.inMemory()
        try db.createTable(Player.self)
        try db.enableSync(for: Player.self)
        try db.insert(
            Player(id: 1, name: "Arthur", email: "a@example.com", score: 0, team: .red, tags: [], joined: Date()))
        let heard = ReadmeEvents()
        let check = db.observe(.changes, of: Player.self) { heard.append($0) }

        // Listeners
        let token = db.observe(.changes, of: Player.self) { event in  // or in: "player", key: PrimaryKey(1)
            print(event)  // insert player 2 (local)
        }
        try db.insert(
            Player(id: 2, name: "Barbara", email: "b@example.com", score: 5, team: .blue, tags: [], joined: Date()))
        _ = try? await db.write { conn in
            try conn.delete(Player.self, key: PrimaryKey(2))
            throw CancellationError()  // rolled back: never reported
        }
        token.cancel()  // or let it go

        // Committed transactions
        var feed = try db.committedTransactions(tables: ["player"]).makeAsyncIterator()
        try db.insert(
            Player(id: 3, name: "Chris", email: "c@example.com", score: 1, team: .red, tags: [], joined: Date()))
        let transaction = try await feed.next()  // changes: [insert player 3], sequences: 2...2 when synced
        #expect(transaction?.changes.map(\.key) == [PrimaryKey(3)])
        #expect(transaction?.sequences?.count == 1)
        // The listener heard the two inserts, nothing of the rolled-back delete.
        #expect(await heard.wait(for: 2).map(\.kind) == [.insert, .insert])

        // Query observation
        let scores = db.observe(Player.where(\.score >= 1)).removeDuplicates()
        var values = scores.makeAsyncIterator()
        let now = try await values.next()  // the players now
        try db.execute("UPDATE player SET score = 10 WHERE id = 3")
        let next = try await values.next()  // after that commit
        let counts = db.observe(sql: "SELECT count(*) FROM player")  // or db.observe { conn in … }
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
