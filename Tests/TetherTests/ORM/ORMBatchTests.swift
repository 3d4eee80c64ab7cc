import Foundation
import Testing
@testable import Tether

/// Batches: all-or-nothing forms and best-effort forms.
@Suite struct ORMBatchTests {

    private func user(_ id: Int64, _ name: String, age: Int = 20) -> OrmUser {
        OrmUser(id: id, name: name, email: "\(name.lowercased())@batch", age: age, score: nil, nickname: nil)
    }

    // MARK: All or nothing

    @Test func insertContentsOfIsAllOrNothing() throws {
        let db = try ormUserFixture()
        try db.insert(contentsOf: [user(10, "Ten"), user(11, "Eleven")])
        #expect(try db.count(OrmUser.self) == 8)

        let before = try ormDump(db, "orm_user")
        // Collides with a stored row (key 1) in the middle.
        let error = ormExpectModelError(.duplicate) {
            try db.insert(contentsOf: [user(20, "A"), user(1, "B"), user(21, "C")])
        }
        if case let .duplicate(existing, _)? = error { #expect(existing as? OrmUser == ormUsers[0]) }
        // Collides with an earlier element of the same batch (same email).
        ormExpectModelError(.duplicate) { try db.insert(contentsOf: [user(30, "Same"), user(31, "Same")]) }
        // A CHECK failure as the last element.
        ormExpectDatabaseError(.checkViolation) { try db.insert(contentsOf: [user(40, "D"), user(41, "E", age: -1)]) }
        #expect(try ormDump(db, "orm_user") == before)
        // An empty batch is fine.
        try db.insert(contentsOf: [OrmUser]())
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func saveContentsOfIsAllOrNothing() throws {
        let db = try ormUserFixture()
        var alice = ormUsers[0]
        alice.name = "Alicia"
        try db.save(contentsOf: [alice, user(10, "Ten")])
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1))?.name == "Alicia")
        #expect(try db.exists(OrmUser.self, key: PrimaryKey(10)))

        let before = try ormDump(db, "orm_user")
        var bob = ormUsers[1]
        bob.name = "Robert"
        ormExpectDatabaseError(.checkViolation) {
            try db.save(contentsOf: [bob, user(11, "Eleven"), user(12, "Bad", age: -1)])
        }
        #expect(try ormDump(db, "orm_user") == before)
        // A unique-key collision (a new row with a stored email) in the middle.
        #expect(throws: (any Error).self) {
            try db.save(contentsOf: [
                bob, OrmUser(id: 13, name: "X", email: "carol@x", age: 1, score: nil, nickname: nil), user(14, "Y"),
            ])
        }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func updateContentsOfIsAllOrNothing() throws {
        let db = try ormUserFixture()
        var a = ormUsers[0], b = ormUsers[1]
        a.score = 100
        b.score = 200
        try db.update(contentsOf: [a, b])
        #expect(try db.fetchAll(OrmUser.where(\.score >= 100).orderBy(\.id)) == [a, b])

        let before = try ormDump(db, "orm_user")
        a.score = 1
        b.score = 2
        let error = ormExpectModelError(.notFound) { try db.update(contentsOf: [a, user(404, "Missing"), b]) }
        if case let .notFound(_, key)? = error { #expect(key == "404") }
        var c = ormUsers[2]
        c.age = -1
        ormExpectDatabaseError(.checkViolation) { try db.update(contentsOf: [a, b, c]) }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func deleteContentsOfIsAllOrNothing() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAuthor.self)
        try db.createTable(OrmReview.self)
        let authors = (1...4).map { OrmAuthor(id: Int64($0), name: "A\($0)") }
        try db.insert(contentsOf: authors)
        try db.insert(OrmReview(id: 1, authorId: 3, stars: 4))
        #expect(try db.delete(contentsOf: [authors[0], OrmAuthor(id: 99, name: "absent")]) == 1)

        let before = try ormDump(db, "orm_author")
        let reviews = try ormDump(db, "orm_review")
        ormExpectForeignKeyFailure { try db.delete(contentsOf: [authors[1], authors[2], authors[3]]) }
        #expect(try ormDump(db, "orm_author") == before)
        #expect(try ormDump(db, "orm_review") == reviews)
        #expect(try db.delete(contentsOf: [authors[1], authors[3]]) == 2)
        #expect(try db.fetchAll(OrmAuthor.self) == [authors[2]])
    }

    // MARK: Best effort

    @Test func insertEachReportsFailuresAndStoresTheRest() throws {
        let db = try ormUserFixture()
        let batch = [
            user(10, "Ten"), user(1, "KeyTaken"), user(11, "Eleven"), user(12, "Negative", age: -1),
            OrmUser(id: 13, name: "EmailTaken", email: "bob@x", age: 1, score: nil, nickname: nil),
            user(14, "Fourteen"),
        ]
        let failures = try db.insertEach(batch)
        #expect(failures.map(\.index) == [1, 3, 4])
        #expect(failures.map(\.element) == [batch[1], batch[3], batch[4]])
        if failures.count == 3 {
            if case let .duplicate(existing, _)? = failures[0].error as? ModelError {
                #expect(existing as? OrmUser == ormUsers[0])
            } else {
                Issue.record("expected duplicate, got \(failures[0].error)")
            }
            #expect((failures[1].error as? DatabaseError)?.kind == .checkViolation)
            if case let .duplicate(existing, _)? = failures[2].error as? ModelError {
                #expect(existing as? OrmUser == ormUsers[1])
            } else {
                Issue.record("expected duplicate, got \(failures[2].error)")
            }
        }
        #expect(try db.fetchAll(OrmUser.where(\.id >= 10).orderBy(\.id)) == [batch[0], batch[2], batch[5]])
        #expect(try db.fetchAll(OrmUser.where(\.id < 10).orderBy(\.id)) == ormUsers)
        #expect(try db.insertEach([OrmUser]()).isEmpty)
    }

    @Test func saveEachReportsFailuresAndStoresTheRest() throws {
        let db = try ormUserFixture()
        var alice = ormUsers[0]
        alice.name = "Alicia"
        var bob = ormUsers[1]
        bob.age = -2
        let batch = [alice, bob, user(10, "Ten"), user(11, "Bad", age: -1)]
        let failures = try db.saveEach(batch)
        #expect(failures.map(\.index) == [1, 3])
        #expect(failures.map(\.element) == [bob, batch[3]])
        #expect(failures.allSatisfy { ($0.error as? DatabaseError)?.kind == .checkViolation })
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1)) == alice)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(2)) == ormUsers[1])
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(10)) == batch[2])
        #expect(try !db.exists(OrmUser.self, key: PrimaryKey(11)))
    }

    @Test func updateEachReportsFailuresAndStoresTheRest() throws {
        let db = try ormUserFixture()
        var carol = ormUsers[2]
        carol.score = 0
        var dave = ormUsers[3]
        dave.age = -4
        var anna = ormUsers[4]
        anna.nickname = "annie"
        let batch = [carol, user(404, "Ghost"), dave, anna]
        let failures = try db.updateEach(batch)
        #expect(failures.map(\.index) == [1, 2])
        #expect(failures.map(\.element) == [batch[1], dave])
        if failures.count == 2 {
            #expect((failures[0].error as? ModelError)?.ormCase == .notFound)
            #expect((failures[1].error as? DatabaseError)?.kind == .checkViolation)
        }
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(3)) == carol)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(4)) == ormUsers[3])
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(5)) == anna)
        #expect(try !db.exists(OrmUser.self, key: PrimaryKey(404)))
    }

    @Test func deleteEachReportsFailuresAndDeletesTheRest() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAuthor.self)
        try db.createTable(OrmReview.self)
        let authors = (1...4).map { OrmAuthor(id: Int64($0), name: "A\($0)") }
        try db.insert(contentsOf: authors)
        try db.insert(contentsOf: [OrmReview(id: 1, authorId: 2, stars: 1), OrmReview(id: 2, authorId: 4, stars: 2)])
        let reviews = try ormDump(db, "orm_review")
        let failures = try db.deleteEach(authors)
        #expect(failures.map(\.index) == [1, 3])
        #expect(failures.map(\.element) == [authors[1], authors[3]])
        #expect(failures.allSatisfy { ($0.error as? DatabaseError)?.message.contains("FOREIGN KEY") == true })
        #expect(try db.fetchAll(OrmAuthor.query.orderBy(\.id)) == [authors[1], authors[3]])
        #expect(try ormDump(db, "orm_review") == reviews)
    }

    // MARK: Inside an explicit write

    @Test func batchesOnAConnectionInsideWrite() throws {
        let db = try ormUserFixture()
        let before = try ormDump(db, "orm_user")
        let failures = try db.write { conn -> [BatchFailure<OrmUser>] in
            // A failing all-or-nothing batch rolls back only itself; the write goes on.
            ormExpectModelError(.duplicate) { try conn.insert(contentsOf: [user(10, "Ten"), user(2, "Dup")]) }
            #expect(try conn.exists(OrmUser.self, key: PrimaryKey(10)) == false)
            ormExpectModelError(.notFound) { try conn.update(contentsOf: [ormUsers[0], user(404, "Ghost")]) }
            ormExpectDatabaseError(.checkViolation) {
                try conn.save(contentsOf: [user(11, "Eleven"), user(12, "Bad", age: -1)])
            }
            #expect(try conn.exists(OrmUser.self, key: PrimaryKey(11)) == false)

            try conn.insert(contentsOf: [user(20, "Twenty"), user(21, "TwentyOne")])
            try conn.save(contentsOf: [user(22, "TwentyTwo")])
            try conn.update(contentsOf: [user(20, "Twenty", age: 40)])
            #expect(try conn.delete(contentsOf: [user(21, "TwentyOne")]) == 1)
            var failures = try conn.insertEach([user(30, "Thirty"), user(1, "Dup")])
            failures += try conn.updateEach([user(30, "Thirty", age: 33), user(405, "Ghost")])
            failures += try conn.saveEach([user(31, "ThirtyOne", age: -1), user(32, "ThirtyTwo")])
            failures += try conn.deleteEach([user(32, "ThirtyTwo")])
            return failures
        }
        #expect(failures.map(\.index) == [1, 1, 0])
        #expect(failures.map(\.element.id) == [1, 405, 31])
        #expect(
            try db.fetchAll(OrmUser.where(\.id >= 10).orderBy(\.id)).map { [$0.id, Int64($0.age)] } == [
                [20, 40], [22, 20], [30, 33],
            ])
        #expect(try db.fetchAll(OrmUser.where(\.id < 10).orderBy(\.id)) == ormUsers)

        // The same batches inside a write that throws at the end: nothing at all is kept.
        struct Abort: Error {}
        let now = try ormDump(db, "orm_user")
        #expect(throws: Abort.self) {
            try db.write { conn in
                try conn.insert(contentsOf: [user(50, "Fifty")])
                _ = try conn.insertEach([user(51, "FiftyOne"), user(1, "Dup")])
                try conn.deleteAll(OrmUser.self)
                throw Abort()
            }
        }
        #expect(try ormDump(db, "orm_user") == now)
        #expect(now != before)
    }
}
