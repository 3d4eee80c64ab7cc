import Foundation
import Testing
@testable import Tether

struct SmokePlayer: Model, Equatable {
    enum Team: String, Codable, CaseIterable { case red, blue }
    var id: Int64
    var name: String
    var email: String
    var score: Int?
    var team: Team
    var tags: [String]
    var joined: Date
    var uid: UUID

    static let tableName = "player"
    static var constraints: [Constraint<SmokePlayer>] { [.unique("email"), .check("score >= 0"), .index(["name"])] }
}

@Suite struct SmokeTests {
    @Test func roundTrip() throws {
        let db = try Database.inMemory()
        try db.createTable(SmokePlayer.self)
        let p = SmokePlayer(id: 1, name: "Arthur", email: "a@x", score: 10, team: .blue, tags: ["x", "y"], joined: Date(timeIntervalSince1970: 1000), uid: UUID())
        try db.insert(p)
        #expect(try db.fetch(SmokePlayer.self, key: PrimaryKey(1)) == p)
        let sql = try db.fetchValue("SELECT sql FROM sqlite_master WHERE name = 'player'", as: String.self)
        print(sql ?? "")
        do {
            try db.insert(SmokePlayer(id: 2, name: "B", email: "a@x", score: 1, team: .red, tags: [], joined: Date(), uid: UUID()))
            Issue.record("expected duplicate")
        } catch let ModelError.duplicate(existing, _) {
            #expect(existing as? SmokePlayer == p)
        }
        let found = try db.fetchAll(SmokePlayer.where(\.score > 5 && \.team == .blue).orderBy(\.name))
        #expect(found == [p])
        let chained = try db.fetchAll(SmokePlayer.query("name", "LIKE", "A%").and("score", "<=", 77).orderBy("score", ascending: false).limit(3))
        #expect(chained == [p])
        #expect(try db.count(SmokePlayer.query) == 1)
        #expect(try db.aggregate(.sum(\SmokePlayer.score), as: Int.self) == 10)
    }
}
