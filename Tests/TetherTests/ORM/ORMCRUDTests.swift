import Foundation
import Testing
@testable import Tether

/// Insert, replace, save, update, delete and fetch, one model at a time.
@Suite struct ORMCRUDTests {

    @Test func insertReturnsTheRowidAndFetchFindsTheRow() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmUser.self)
        let user = OrmUser(id: 7, name: "Gus", email: "gus@x", age: 50, score: nil, nickname: nil)
        #expect(try db.insert(user) == 7)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(7)) == user)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(8)) == nil)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(Int64(7))) == user)
        #expect(try db.fetch(OrmUser.self, key: [7]) == user)
    }

    @Test func insertCollisionOnPrimaryKeyIsADuplicateWithTheStoredRow() throws {
        let db = try ormUserFixture()
        let before = try ormDump(db, "orm_user")
        let error = ormExpectModelError(.duplicate) {
            try db.insert(OrmUser(id: 3, name: "Impostor", email: "new@x", age: 1, score: 1, nickname: nil))
        }
        if case let .duplicate(existing, underlying)? = error {
            #expect(existing as? OrmUser == ormUsers[2])
            #expect(underlying.kind == .uniqueViolation)
            #expect(underlying.message.contains("orm_user.id"))
            #expect(error?.description.contains("orm_user") == true)
        }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func insertCollisionOnUniqueKeyIsADuplicateWithTheStoredRow() throws {
        let db = try ormUserFixture()
        let before = try ormDump(db, "orm_user")
        let error = ormExpectModelError(.duplicate) {
            try db.insert(OrmUser(id: 99, name: "Other", email: "dave@x", age: 1, score: nil, nickname: nil))
        }
        if case let .duplicate(existing, underlying)? = error {
            #expect(existing as? OrmUser == ormUsers[3])  // the row holding the email, not the one with the key
            #expect(underlying.kind == .uniqueViolation)
            #expect(underlying.message.contains("orm_user.email"))
        }
        #expect(try ormDump(db, "orm_user") == before)
        // Inside a write, the duplicate is reported the same way and the transaction goes on.
        try db.write { conn in
            let error = ormExpectModelError(.duplicate) {
                try conn.insert(OrmUser(id: 99, name: "Other", email: "alice@x", age: 1, score: nil, nickname: nil))
            }
            if case let .duplicate(existing, _)? = error { #expect(existing as? OrmUser == ormUsers[0]) }
            try conn.insert(OrmUser(id: 99, name: "Other", email: "other@x", age: 1, score: nil, nickname: nil))
        }
        #expect(try db.count(OrmUser.self) == ormUsers.count + 1)
    }

    @Test func otherConstraintFailuresOnInsertAreDatabaseErrors() throws {
        let db = try ormUserFixture()
        let before = try ormDump(db, "orm_user")
        ormExpectDatabaseError(.checkViolation) {
            try db.insert(OrmUser(id: 50, name: "Neg", email: "neg@x", age: -1, score: nil, nickname: nil))
        }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func replaceOverwritesTheCollidingRow() throws {
        let db = try ormUserFixture()
        let changed = OrmUser(id: 2, name: "Robert", email: "bob@x", age: 26, score: 3, nickname: "rob")
        try db.replace(changed)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(2)) == changed)
        #expect(try db.count(OrmUser.self) == ormUsers.count)
        // A row colliding on the unique email is replaced too (deleted, then the new row inserted).
        try db.replace(OrmUser(id: 20, name: "New Carol", email: "carol@x", age: 36, score: nil, nickname: nil))
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(3)) == nil)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(20))?.name == "New Carol")
        // replace of a new row inserts it.
        try db.replace(OrmUser(id: 30, name: "Fresh", email: "fresh@x", age: 1, score: nil, nickname: nil))
        #expect(try db.count(OrmUser.self) == ormUsers.count + 1)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(30))?.name == "Fresh")
        // A CHECK failure still throws and changes nothing.
        let before = try ormDump(db, "orm_user")
        ormExpectDatabaseError(.checkViolation) {
            try db.replace(OrmUser(id: 1, name: "x", email: "alice@x", age: -5, score: nil, nickname: nil))
        }
        #expect(try ormDump(db, "orm_user") == before)
    }

    /// As documented, replace deletes the colliding row first, with its ON
    /// DELETE actions: a parent's cascading children go with it. save does not.
    @Test func replaceRunsOnDeleteActionsButSaveDoesNot() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAuthor.self)
        try db.createTable(OrmBook.self)
        try db.insert(OrmAuthor(id: 1, name: "Ann"))
        try db.insert(contentsOf: [OrmBook(id: 1, authorId: 1, title: "a"), OrmBook(id: 2, authorId: 1, title: "b")])
        try db.save(OrmAuthor(id: 1, name: "Ann B."))
        #expect(try db.count(OrmBook.self) == 2)
        try db.replace(OrmAuthor(id: 1, name: "Ann C."))
        #expect(try db.fetchAll(OrmAuthor.self) == [OrmAuthor(id: 1, name: "Ann C.")])
        #expect(try db.count(OrmBook.self) == 0)

        // With a RESTRICT child, replace fails and changes nothing.
        try db.createTable(OrmReview.self)
        try db.insert(OrmReview(id: 1, authorId: 1, stars: 3))
        let before = try ormDump(db, "orm_author")
        ormExpectForeignKeyFailure { try db.replace(OrmAuthor(id: 1, name: "Ann D.")) }
        #expect(try ormDump(db, "orm_author") == before)
        #expect(try db.count(OrmReview.self) == 1)
    }

    @Test func saveInsertsThenUpdates() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmUser.self)
        var user = OrmUser(id: 1, name: "Ann", email: "ann@x", age: 20, score: nil, nickname: nil)
        try db.save(user)
        #expect(try db.fetchAll(OrmUser.self) == [user])
        user.name = "Annie"
        user.score = 12
        try db.save(user)
        #expect(try db.fetchAll(OrmUser.self) == [user])
        user.score = nil
        try db.save(user)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1))?.score == nil)

        // A save that breaks a constraint throws and changes nothing.
        try db.save(OrmUser(id: 2, name: "Ben", email: "ben@x", age: 30, score: nil, nickname: nil))
        let before = try ormDump(db, "orm_user")
        ormExpectDatabaseError(.checkViolation) {
            try db.save(OrmUser(id: 1, name: "Annie", email: "ann@x", age: -1, score: nil, nickname: nil))
        }
        #expect(try ormDump(db, "orm_user") == before)
        // Saving a row whose email belongs to another row fails (on the update path and the insert path).
        #expect(throws: (any Error).self) {
            try db.save(OrmUser(id: 1, name: "Annie", email: "ben@x", age: 20, score: nil, nickname: nil))
        }
        #expect(throws: (any Error).self) {
            try db.save(OrmUser(id: 3, name: "Cy", email: "ben@x", age: 20, score: nil, nickname: nil))
        }
        #expect(try ormDump(db, "orm_user") == before)
    }

    /// `insert` reports a unique-key collision as `ModelError.duplicate` with
    /// the stored row; `save` inserting a new row should too (it is an insert
    /// that collided on a key other than the primary key).
    @Test func saveCollisionOnUniqueKeyIsADuplicate() throws {
        let db = try ormUserFixture()
        let before = try ormDump(db, "orm_user")
        let error = ormExpectModelError(.duplicate) {
            try db.save(OrmUser(id: 99, name: "Cy", email: "bob@x", age: 20, score: nil, nickname: nil))
        }
        if case let .duplicate(existing, _)? = error { #expect(existing as? OrmUser == ormUsers[1]) }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func updateWholeModel() throws {
        let db = try ormUserFixture()
        var carol = ormUsers[2]
        carol.name = "Caroline"
        carol.score = nil
        carol.nickname = "line"
        try db.update(carol)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(3)) == carol)
        // Other rows are untouched.
        #expect(try db.fetchAll(OrmUser.where(\.id != 3).orderBy(\.id)) == ormUsers.filter { $0.id != 3 })

        // A missing row is notFound, and nothing changes.
        let before = try ormDump(db, "orm_user")
        let error = ormExpectModelError(.notFound) {
            try db.update(OrmUser(id: 404, name: "Nobody", email: "no@x", age: 1, score: nil, nickname: nil))
        }
        if case let .notFound(table, key)? = error {
            #expect(table == "orm_user")
            #expect(key == "404")
        }
        // A constraint failure throws and changes nothing.
        var dave = ormUsers[3]
        dave.email = "alice@x"
        #expect(throws: DatabaseError.self) { try db.update(dave) }
        dave.email = "dave@x"
        dave.age = -3
        ormExpectDatabaseError(.checkViolation) { try db.update(dave) }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func updateChosenColumnsOnly() throws {
        let db = try ormUserFixture()
        var alice = ormUsers[0]
        alice.name = "Alicia"
        alice.age = 99
        alice.score = nil
        try db.update(alice, columns: ["name"])
        var expected = ormUsers[0]
        expected.name = "Alicia"
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1)) == expected)

        try db.update(alice, columns: [.column(\.score), "age"])
        expected.score = nil
        expected.age = 99
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1)) == expected)

        let before = try ormDump(db, "orm_user")
        ormExpectModelError(.notFound) {
            try db.update(OrmUser(id: 404, name: "x", email: "x", age: 1, score: nil, nickname: nil), columns: ["name"])
        }
        ormExpectModelError(.unknownColumn) { try db.update(alice, columns: ["name", "nope"]) }
        ormExpectModelError(.invalidArgument) { try db.update(alice, columns: []) }
        ormExpectModelError(.invalidArgument) { try db.update(alice, columns: ["id"]) }
        alice.age = -1
        ormExpectDatabaseError(.checkViolation) { try db.update(alice, columns: ["age"]) }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func updateByKeyWithAssignments() throws {
        let db = try ormUserFixture()
        try db.update(
            OrmUser.self, key: PrimaryKey(1), set: [.set("name", to: "x"), .setNull("score"), .set(\.score, to: 3)])
        var expected = ormUsers[0]
        expected.name = "x"
        expected.score = 3  // the last assignment of a column wins
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1)) == expected)

        try db.update(
            OrmUser.self, key: PrimaryKey(1), set: [.setNull("score"), .setNull(\.nickname), .set(\.age, to: 31)])
        expected.score = nil
        expected.nickname = nil
        expected.age = 31
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1)) == expected)
        try db.update(OrmUser.self, key: PrimaryKey(1), set: [.set("score", to: Int?.none)])
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1))?.score == nil)
        #expect(try db.fetchAll(OrmUser.where(\.id != 1).orderBy(\.id)) == Array(ormUsers.dropFirst()))

        let before = try ormDump(db, "orm_user")
        let error = ormExpectModelError(.notFound) {
            try db.update(OrmUser.self, key: PrimaryKey(404), set: [.set("name", to: "x")])
        }
        if case let .notFound(table, key)? = error {
            #expect(table == "orm_user")
            #expect(key == "404")
        }
        ormExpectModelError(.invalidArgument) { try db.update(OrmUser.self, key: PrimaryKey(1), set: []) }
        ormExpectModelError(.invalidArgument) {
            try db.update(OrmUser.self, key: PrimaryKey([1, 2]), set: [.set("name", to: "x")])
        }
        ormExpectModelError(.unknownColumn) {
            try db.update(OrmUser.self, key: PrimaryKey(1), set: [.set("name", to: "y"), .set("nope", to: 1)])
        }
        ormExpectDatabaseError(.notNullViolation) {
            try db.update(OrmUser.self, key: PrimaryKey(1), set: [.setNull("name")])
        }
        ormExpectDatabaseError(.typeMismatch) {
            try db.update(OrmUser.self, key: PrimaryKey(1), set: [.set("age", to: "old")])
        }
        ormExpectDatabaseError(.uniqueViolation) {
            try db.update(OrmUser.self, key: PrimaryKey(1), set: [.set(\.email, to: "bob@x")])
        }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func deleteByModelKeyKeysQueryAndAll() throws {
        let db = try ormUserFixture()
        #expect(try db.delete(ormUsers[0]))
        #expect(try !db.delete(ormUsers[0]))  // already gone
        #expect(try db.delete(OrmUser.self, key: PrimaryKey(2)))
        #expect(try !db.delete(OrmUser.self, key: PrimaryKey(2)))
        #expect(try db.fetchAll(OrmUser.query.orderBy(\.id)).map(\.id) == [3, 4, 5, 6])

        #expect(try db.delete(OrmUser.self, keys: [PrimaryKey(3), PrimaryKey(404), PrimaryKey(4)]) == 2)
        #expect(try db.fetchAll(OrmUser.query.orderBy(\.id)).map(\.id) == [5, 6])

        // A bad key in the list: nothing deleted.
        let before = try ormDump(db, "orm_user")
        ormExpectModelError(.invalidArgument) {
            try db.delete(OrmUser.self, keys: [PrimaryKey(5), PrimaryKey([6, 1])])
        }
        ormExpectModelError(.invalidArgument) { try db.delete(OrmUser.self, key: PrimaryKey([5, 5])) }
        #expect(try ormDump(db, "orm_user") == before)

        #expect(try db.delete(OrmUser.where(\.name == "alan")) == 1)
        #expect(try db.delete(OrmUser.where(\.name == "nobody")) == 0)
        try db.insert(contentsOf: ormUsers.prefix(3))
        #expect(try db.deleteAll(OrmUser.self) == 4)
        #expect(try db.count(OrmUser.self) == 0)
        #expect(try db.deleteAll(OrmUser.self) == 0)
    }

    @Test func fetchFirstAllCountExistsAndKeys() throws {
        let db = try ormUserFixture()
        #expect(try db.fetchAll(OrmUser.self).count == 6)
        #expect(try db.fetchAll(OrmUser.query.orderBy(\.id)) == ormUsers)
        #expect(try db.fetchFirst(OrmUser.query.orderBy(\.age)) == ormUsers[4])
        #expect(try db.fetchFirst(OrmUser.query.orderBy(\.id).limit(3, offset: 2)) == ormUsers[2])
        #expect(try db.fetchFirst(OrmUser.where(\.age > 100)) == nil)
        #expect(try db.count(OrmUser.self) == 6)
        #expect(try db.count(OrmUser.where(\.age >= 30)) == 4)
        #expect(try db.count(OrmUser.query.orderBy(\.id).limit(2)) == 2)
        #expect(try db.exists(OrmUser.where(\.name == "Bob")))
        #expect(try !db.exists(OrmUser.where(\.name == "Zed")))
        #expect(try db.exists(OrmUser.self, key: PrimaryKey(6)))
        #expect(try !db.exists(OrmUser.self, key: PrimaryKey(60)))
        #expect(try db.fetchKeys(OrmUser.where(\.age >= 35).orderBy(\.id)) == [PrimaryKey(3), PrimaryKey(4)])
        #expect(try db.fetchKeys(OrmUser.query).count == 6)
        #expect(try db.fetchKeys(OrmUser.where(\.age > 100)).isEmpty)
    }

    /// fetchFirst is "the first row a query selects": a query limited to no row selects none.
    @Test func fetchFirstRespectsALimitOfZero() throws {
        let db = try ormUserFixture()
        #expect(try db.fetchAll(OrmUser.query.limit(0)).isEmpty)
        #expect(try db.fetchFirst(OrmUser.query.limit(0)) == nil)
    }

    @Test func compositeKeyOperations() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmPair.self)
        try db.insert(contentsOf: [
            OrmPair(a: 1, b: "a", value: 1), OrmPair(a: 1, b: "b", value: 2), OrmPair(a: 2, b: "a", value: 3),
        ])
        #expect(try db.fetch(OrmPair.self, key: PrimaryKey([1, "a"]))?.value == 1)
        #expect(try db.exists(OrmPair.self, key: PrimaryKey([2, "a"])))
        #expect(try !db.exists(OrmPair.self, key: PrimaryKey([2, "b"])))
        try db.update(OrmPair.self, key: PrimaryKey([1, "b"]), set: [.set(\.value, to: 20.5)])
        #expect(try db.fetch(OrmPair.self, key: [1, "b"])?.value == 20.5)
        try db.update(OrmPair(a: 2, b: "a", value: 30))
        #expect(try db.fetch(OrmPair.self, key: [2, "a"])?.value == 30)
        try db.save(OrmPair(a: 2, b: "a", value: 31))
        try db.save(OrmPair(a: 3, b: "c", value: 4))
        #expect(try db.count(OrmPair.self) == 4)
        #expect(try db.fetch(OrmPair.self, key: [2, "a"])?.value == 31)

        let before = try ormDump(db, "orm_pair")
        // Wrong number of key parts, in every API that takes a key.
        for error in [
            ormThrownModelError { try db.fetch(OrmPair.self, key: PrimaryKey(1)) },
            ormThrownModelError { try db.fetch(OrmPair.self, key: PrimaryKey([1, "a", "x"])) },
            ormThrownModelError { try db.exists(OrmPair.self, key: PrimaryKey(1)) },
            ormThrownModelError { try db.delete(OrmPair.self, key: PrimaryKey(1)) },
            ormThrownModelError { try db.delete(OrmPair.self, keys: [PrimaryKey([1, "a"]), PrimaryKey(1)]) },
            ormThrownModelError { try db.update(OrmPair.self, key: PrimaryKey(1), set: [.set("value", to: 0.0)]) },
        ] {
            #expect(error?.ormCase == .invalidArgument, "\(String(describing: error))")
        }
        ormExpectModelError(.notFound) { try db.update(OrmPair.self, key: [9, "z"], set: [.set("value", to: 0.0)]) }
        #expect(try ormDump(db, "orm_pair") == before)

        #expect(try db.delete(OrmPair.self, key: PrimaryKey([1, "a"])))
        #expect(try db.delete(OrmPair.self, keys: [[1, "b"], [2, "a"], [2, "zz"]]) == 2)
        #expect(try db.delete(OrmPair(a: 3, b: "c", value: 0)))
        #expect(try db.count(OrmPair.self) == 0)
    }

    @Test func crudOnAConnectionInsideWrite() throws {
        let db = try Database.inMemory()
        try db.write { conn in
            try conn.createTable(OrmUser.self)
            try conn.insert(ormUsers[0])
            try conn.save(ormUsers[1])
            try conn.update(OrmUser.self, key: PrimaryKey(1), set: [.set("age", to: 31)])
            #expect(try conn.fetch(OrmUser.self, key: PrimaryKey(1))?.age == 31)
            #expect(try conn.count(OrmUser.self) == 2)
        }
        #expect(try db.count(OrmUser.self) == 2)
        // A write that throws leaves nothing behind.
        struct Abort: Error {}
        let before = try ormDump(db, "orm_user")
        #expect(throws: Abort.self) {
            try db.write { conn in
                try conn.insert(ormUsers[2])
                try conn.delete(OrmUser.self, key: PrimaryKey(1))
                try conn.update(OrmUser.self, key: PrimaryKey(2), set: [.set("name", to: "changed")])
                throw Abort()
            }
        }
        #expect(try ormDump(db, "orm_user") == before)
        // Reads through db.read on an in-memory database.
        #expect(try db.read { conn in try conn.fetchAll(OrmUser.query.orderBy(\.id)).map(\.id) } == [1, 2])
    }
}
