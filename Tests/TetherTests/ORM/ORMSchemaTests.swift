import Foundation
import Testing
@testable import Tether

/// Models and the tables they describe: names, keys, columns, constraints.
@Suite struct ORMSchemaTests {

    @Test func structModelRoundTripsAndUsesItsTableName() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmUser.self)
        #expect(try db.tableExists("orm_user"))
        #expect(try !db.tableExists("OrmUser"))
        let user = OrmUser(id: 1, name: "Alice", email: "a@x", age: 30, score: nil, nickname: "al")
        #expect(try db.insert(user) == 1)
        #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1)) == user)
        // createTable is idempotent by default, and says so when asked not to be.
        try db.createTable(OrmUser.self)
        ormExpectDatabaseError(.sqlError) { try db.createTable(OrmUser.self, ifNotExists: false) }
        #expect(try db.fetchAll(OrmUser.self) == [user])
    }

    @Test func finalClassModelUsesItsTypeNameAsTableName() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmNote.self)
        #expect(try db.tableExists("OrmNote"))
        let note = OrmNote(id: 1, title: "Hello", body: nil)
        try db.insert(note)
        try db.insert(OrmNote(id: 2, title: "World", body: "text"))
        let fetched = try #require(try db.fetch(OrmNote.self, key: PrimaryKey(1)))
        #expect(fetched == note)
        #expect(try db.fetchAll(OrmNote.where(\.title == "World")).map(\.id) == [2])
        try db.update(OrmNote(id: 1, title: "Hello!", body: "b"))
        #expect(try db.fetch(OrmNote.self, key: PrimaryKey(1))?.title == "Hello!")
        #expect(try db.delete(note))
        #expect(try db.count(OrmNote.self) == 1)
    }

    @Test func singlePrimaryKeyIsTheRowidAlias() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmUser.self)
        let info = try ormTableInfo(db, "orm_user")
        #expect(info.map(\.name) == ["id", "name", "email", "age", "score", "nickname"])
        #expect(info.filter { $0.pk > 0 }.map(\.name) == ["id"])
        let sql = try #require(
            try db.fetchValue("SELECT sql FROM sqlite_master WHERE name = 'orm_user'", as: String.self))
        #expect(sql.contains("\"id\" INTEGER PRIMARY KEY"))
        try db.insert(OrmUser(id: 42, name: "x", email: "x", age: 1, score: nil, nickname: nil))
        #expect(try db.fetchValue("SELECT rowid FROM orm_user", as: Int64.self) == 42)
    }

    @Test func compositePrimaryKeyByColumnNames() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmPair.self)
        let info = try ormTableInfo(db, "orm_pair")
        #expect(info.map(\.name) == ["a", "b", "value"])
        #expect(info.map(\.pk) == [1, 2, 0])
        #expect(info.map(\.notNull) == [true, true, true])

        try db.insert(contentsOf: [
            OrmPair(a: 1, b: "a", value: 1.5), OrmPair(a: 1, b: "b", value: 2.5), OrmPair(a: 2, b: "a", value: 3.5),
        ])
        #expect(try db.fetch(OrmPair.self, key: PrimaryKey([1, "b"])) == OrmPair(a: 1, b: "b", value: 2.5))
        #expect(try db.fetch(OrmPair.self, key: PrimaryKey([2, "b"])) == nil)
        #expect(try db.exists(OrmPair.self, key: [2, "a"]))
        #expect(
            try db.fetchKeys(OrmPair.query.orderBy("a").orderBy("b")) == [
                PrimaryKey([1, "a"]), PrimaryKey([1, "b"]), PrimaryKey([2, "a"]),
            ])

        // The same key twice is a duplicate; the stored row is reported.
        let before = try ormDump(db, "orm_pair")
        let error = ormExpectModelError(.duplicate) { try db.insert(OrmPair(a: 1, b: "a", value: 99)) }
        if case let .duplicate(existing, underlying)? = error {
            #expect(existing as? OrmPair == OrmPair(a: 1, b: "a", value: 1.5))
            #expect(underlying.kind == .uniqueViolation)
        }
        #expect(try ormDump(db, "orm_pair") == before)
    }

    @Test func compositePrimaryKeyByKeyPaths() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmGridCell.self)
        let info = try ormTableInfo(db, "orm_grid_cell")
        #expect(info.map(\.name) == ["row", "col", "label"])
        #expect(info.map(\.pk) == [1, 2, 0])

        try db.insert(OrmGridCell(row: 0, col: 1, label: "b"))
        try db.insert(OrmGridCell(row: 1, col: 0, label: "c"))
        #expect(try db.fetch(OrmGridCell.self, key: [0, 1])?.label == "b")
        #expect(try db.fetch(OrmGridCell.self, key: [1, 0])?.label == "c")
        #expect(try db.fetch(OrmGridCell.self, key: [1, 1]) == nil)

        let before = try ormDump(db, "orm_grid_cell")
        let error = ormExpectModelError(.duplicate) { try db.insert(OrmGridCell(row: 1, col: 0, label: "new")) }
        if case let .duplicate(existing, _)? = error {
            #expect(existing as? OrmGridCell == OrmGridCell(row: 1, col: 0, label: "c"))
        }
        #expect(try ormDump(db, "orm_grid_cell") == before)
    }

    @Test func secondaryKeysBecomeUniqueConstraints() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmDevice.self)
        let unique = try ormIndexList(db, "orm_device").filter { $0.unique && $0.origin == "u" }
        #expect(unique.map(\.columns) == [["uid"]])

        let uid = UUID()
        let first = OrmDevice(id: nil, uid: uid, label: "first")
        let firstID = try db.insert(first)
        let before = try ormDump(db, "orm_device")
        let error = ormExpectModelError(.duplicate) { try db.insert(OrmDevice(id: nil, uid: uid, label: "second")) }
        if case let .duplicate(existing, underlying)? = error {
            #expect(existing as? OrmDevice == OrmDevice(id: firstID, uid: uid, label: "first"))
            #expect(underlying.kind == .uniqueViolation)
        }
        #expect(try ormDump(db, "orm_device") == before)
    }

    @Test func codingKeysRenameColumnsAndLeaveOutProperties() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmPerson.self)
        let info = try ormTableInfo(db, "orm_person")
        #expect(info.map(\.name) == ["id", "first_name", "last_name"])
        #expect(info.map(\.notNull) == [false, true, false] || info.map(\.notNull) == [true, true, false])

        var person = OrmPerson(id: 1, firstName: "Ann", lastName: nil)
        person.cache = "changed in memory"
        try db.insert(person)
        #expect(try db.fetchValue("SELECT first_name FROM orm_person WHERE id = 1", as: String.self) == "Ann")
        let fetched = try #require(try db.fetch(OrmPerson.self, key: PrimaryKey(1)))
        #expect(fetched.firstName == "Ann")
        #expect(fetched.lastName == nil)
        #expect(fetched.cache == "not stored")  // the default: the property was never stored

        // Queries reach the renamed column by key path and by its column name.
        try db.insert(OrmPerson(id: 2, firstName: "Bea", lastName: "Stone"))
        #expect(try db.fetchAll(OrmPerson.where(\.firstName == "Bea")).map(\.id) == [2])
        #expect(try db.fetchAll(OrmPerson.query("first_name", "=", "Bea")).map(\.id) == [2])
        #expect(try db.fetchAll(OrmPerson.where(\.lastName == nil)).map(\.id) == [1])
        #expect(try db.fetchAll(OrmPerson.query.orderBy(\.firstName, ascending: false)).map(\.id) == [2, 1])
        try db.update(OrmPerson.self, key: PrimaryKey(1), set: [.set(\.firstName, to: "Anna")])
        #expect(try db.fetchValue("SELECT first_name FROM orm_person WHERE id = 1", as: String.self) == "Anna")
    }

    @Test func tablesAreStrict() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmUser.self)
        let sql = try #require(
            try db.fetchValue("SELECT sql FROM sqlite_master WHERE name = 'orm_user'", as: String.self))
        #expect(sql.hasSuffix("STRICT"))
        try db.insert(ormUsers[0])
        let before = try ormDump(db, "orm_user")
        ormExpectDatabaseError(.typeMismatch) {
            try db.execute("INSERT INTO orm_user (id, name, email, age) VALUES (10, 'x', 'x@x', 'old')")
        }
        ormExpectDatabaseError(.typeMismatch) {
            try db.execute("UPDATE orm_user SET age = ? WHERE id = 1", [Data([1, 2])])
        }
        #expect(try ormDump(db, "orm_user") == before)
    }

    @Test func notNullDefaultCheckAndCollate() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmTag.self)
        let info = try ormTableInfo(db, "orm_tag")
        let weight = try #require(info.first { $0.name == "weight" })
        #expect(weight.notNull)  // .notNull on an optional property
        #expect(weight.defaultValue == .text("7"))  // PRAGMA reports the DEFAULT's SQL text

        // DEFAULT fills the column when an INSERT leaves it out.
        try db.execute("INSERT INTO orm_tag (id, name, kind, slug) VALUES (1, 'Swift', 'lang', 'swift')")
        #expect(try db.fetch(OrmTag.self, key: PrimaryKey(1))?.weight == 7)
        try db.insert(OrmTag(id: 2, name: "Rust", kind: "lang", slug: "rust", weight: 3))
        #expect(try db.fetch(OrmTag.self, key: PrimaryKey(2))?.weight == 3)

        // CHECK and NOT NULL violations throw and store nothing.
        let before = try ormDump(db, "orm_tag")
        ormExpectDatabaseError(.checkViolation) {
            try db.insert(OrmTag(id: 3, name: "Go", kind: "lang", slug: "", weight: 1))
        }
        ormExpectDatabaseError(.notNullViolation) {
            try db.update(OrmTag.self, key: PrimaryKey(2), set: [.setNull("weight")])
        }
        #expect(try ormDump(db, "orm_tag") == before)

        // COLLATE NOCASE: equality in a query ignores case.
        #expect(try db.fetchAll(OrmTag.where(\.name == "SWIFT")).map(\.id) == [1])
        #expect(try db.fetchAll(OrmTag.query("name", "=", "rUsT")).map(\.id) == [2])
        // …and so does the UNIQUE constraint on the column: "SWIFT" collides with "Swift".
        let error = ormExpectModelError(.duplicate) {
            try db.insert(OrmTag(id: 4, name: "SWIFT", kind: "other", slug: "s", weight: 1))
        }
        if case let .duplicate(existing, _)? = error {
            #expect((existing as? OrmTag)?.id == 1)
        }
        // Columns without a collation stay case-sensitive.
        #expect(try db.fetchAll(OrmTag.where(\.slug == "SWIFT")).isEmpty)
        #expect(try ormDump(db, "orm_tag") == before)
    }

    /// `.notNull` is documented as meant for "a column whose Swift type is
    /// optional (for example one filled by a default)": a nil property should
    /// then get the DEFAULT, not a NOT NULL violation.
    @Test func notNullOptionalColumnWithDefaultIsFilledByTheDefaultOnInsert() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmTag.self)
        try db.insert(OrmTag(id: 1, name: "Swift", kind: "lang", slug: "swift", weight: nil))
        #expect(try db.fetch(OrmTag.self, key: PrimaryKey(1))?.weight == 7)
    }

    @Test func indexesAndUniqueIndexes() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmTag.self)
        let indexes = try ormIndexList(db, "orm_tag")
        let named = try #require(indexes.first { $0.name == "orm_tag_kind_slug" })
        #expect(named.unique)
        #expect(named.origin == "c")
        #expect(named.columns == ["kind", "slug"])
        let plain = try #require(indexes.first { $0.name == "orm_tag_on_kind" })
        #expect(!plain.unique)
        #expect(plain.columns == ["kind"])
        // .unique("name") is a UNIQUE constraint (an automatic index).
        #expect(indexes.contains { $0.origin == "u" && $0.unique && $0.columns == ["name"] })

        // OrmUser's .index(["name"]) gets the default name.
        try db.createTable(OrmUser.self)
        let userIndexes = try ormIndexList(db, "orm_user")
        #expect(userIndexes.contains { $0.name == "orm_user_on_name" && !$0.unique && $0.columns == ["name"] })
        #expect(userIndexes.contains { $0.origin == "u" && $0.columns == ["email"] })

        // The unique index rejects a duplicate (kind, slug), reporting the stored row.
        try db.insert(OrmTag(id: 1, name: "a", kind: "k", slug: "s", weight: 1))
        let before = try ormDump(db, "orm_tag")
        let error = ormExpectModelError(.duplicate) {
            try db.insert(OrmTag(id: 2, name: "b", kind: "k", slug: "s", weight: 2))
        }
        if case let .duplicate(existing, _)? = error {
            #expect(existing as? OrmTag == OrmTag(id: 1, name: "a", kind: "k", slug: "s", weight: 1))
        }
        #expect(try ormDump(db, "orm_tag") == before)
        try db.insert(OrmTag(id: 2, name: "b", kind: "k", slug: "t", weight: 2))
        #expect(try db.count(OrmTag.self) == 2)
    }

    @Test func autoIncrementAssignsKeysAndNeverReusesThem() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmDevice.self)
        let sql = try #require(
            try db.fetchValue("SELECT sql FROM sqlite_master WHERE name = 'orm_device'", as: String.self))
        #expect(sql.contains("PRIMARY KEY AUTOINCREMENT"))

        let a = try db.insert(OrmDevice(id: nil, uid: UUID(), label: "a"))
        let b = try db.insert(OrmDevice(id: nil, uid: UUID(), label: "b"))
        #expect(a == 1)
        #expect(b == 2)
        #expect(try db.fetchAll(OrmDevice.query.orderBy(\.label)).map(\.id) == [1, 2])
        #expect(try db.fetch(OrmDevice.self, key: PrimaryKey(b))?.label == "b")

        #expect(try db.delete(OrmDevice.self, key: PrimaryKey(b)))
        let c = try db.insert(OrmDevice(id: nil, uid: UUID(), label: "c"))
        #expect(c == 3)  // AUTOINCREMENT: 2 is not reused
        #expect(try db.insert(OrmDevice(id: 10, uid: UUID(), label: "explicit")) == 10)
        #expect(try db.insert(OrmDevice(id: nil, uid: UUID(), label: "d")) == 11)

        // save() with a nil key inserts too.
        try db.save(OrmDevice(id: nil, uid: UUID(), label: "saved"))
        #expect(try db.fetchFirst(OrmDevice.where(\.label == "saved"))?.id == 12)
        // The key path to the optional key works in queries.
        #expect(try db.fetchAll(OrmDevice.where(\.id > 10).orderBy(\.id)).map(\.label) == ["d", "saved"])
    }

    @Test func foreignKeyCascadeAndSetNull() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAuthor.self)
        try db.createTable(OrmBook.self)
        try db.createTable(OrmLoan.self)
        try db.insert(contentsOf: [OrmAuthor(id: 1, name: "Ann"), OrmAuthor(id: 2, name: "Ben")])
        try db.insert(contentsOf: [
            OrmBook(id: 1, authorId: 1, title: "A1"), OrmBook(id: 2, authorId: 1, title: "A2"),
            OrmBook(id: 3, authorId: 2, title: "B1"),
        ])
        try db.insert(contentsOf: [OrmLoan(id: 1, authorId: 1, note: "x"), OrmLoan(id: 2, authorId: 1, note: "y")])

        let fks = try db.fetchRows(
            "SELECT \"table\", \"from\", \"to\", on_update, on_delete FROM pragma_foreign_key_list('orm_book')")
        #expect(fks.count == 1)
        #expect(
            fks.first?.values == [
                .text("orm_author"), .text("authorId"), .text("id"), .text("CASCADE"), .text("CASCADE"),
            ])

        // A child pointing nowhere is refused.
        let books = try ormDump(db, "orm_book")
        ormExpectDatabaseError(.foreignKeyViolation) { try db.insert(OrmBook(id: 9, authorId: 99, title: "orphan")) }
        #expect(try ormDump(db, "orm_book") == books)

        // ON UPDATE CASCADE follows a key change.
        try db.update(OrmAuthor.self, key: PrimaryKey(2), set: [.set("id", to: 20)])
        #expect(try db.fetch(OrmBook.self, key: PrimaryKey(3))?.authorId == 20)

        // ON DELETE CASCADE removes the children; SET NULL clears the reference.
        #expect(try db.delete(OrmAuthor.self, key: PrimaryKey(1)))
        #expect(try db.fetchAll(OrmBook.query.orderBy(\.id)).map(\.id) == [3])
        #expect(try db.fetch(OrmLoan.self, key: PrimaryKey(1)) == OrmLoan(id: 1, authorId: nil, note: "x"))
        #expect(try db.fetchAll(OrmLoan.where(\.authorId == nil)).count == 2)
        #expect(try db.fetchAll(OrmAuthor.self) == [OrmAuthor(id: 20, name: "Ben")])
    }

    @Test func foreignKeyRestrictThrowsAndChangesNothing() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAuthor.self)
        try db.createTable(OrmReview.self)
        try db.insert(contentsOf: [OrmAuthor(id: 1, name: "Ann"), OrmAuthor(id: 2, name: "Ben")])
        try db.insert(OrmReview(id: 1, authorId: 1, stars: 5))
        let authors = try ormDump(db, "orm_author")
        let reviews = try ormDump(db, "orm_review")

        ormExpectForeignKeyFailure { try db.delete(OrmAuthor(id: 1, name: "Ann")) }
        ormExpectForeignKeyFailure { try db.delete(OrmAuthor.self, key: PrimaryKey(1)) }
        ormExpectForeignKeyFailure { try db.deleteAll(OrmAuthor.self) }
        ormExpectForeignKeyFailure { try db.delete(OrmAuthor.where(\.name == "Ann")) }
        ormExpectForeignKeyFailure { try db.delete(OrmAuthor.self, keys: [PrimaryKey(2), PrimaryKey(1)]) }
        ormExpectForeignKeyFailure { try db.update(OrmAuthor.self, key: PrimaryKey(1), set: [.set("id", to: 10)]) }
        #expect(try ormDump(db, "orm_author") == authors)
        #expect(try ormDump(db, "orm_review") == reviews)

        // An author without reviews can go.
        #expect(try db.delete(OrmAuthor.self, key: PrimaryKey(2)))
        #expect(try db.count(OrmAuthor.self) == 1)
    }

    /// A RESTRICT action fails with SQLite's extended code
    /// SQLITE_CONSTRAINT_TRIGGER (1811), not SQLITE_CONSTRAINT_FOREIGNKEY (787);
    /// it is still a foreign key violation and `kind` should say so.
    @Test func restrictViolationKind() throws {
        let db = try Database.inMemory()
        try db.createTable(OrmAuthor.self)
        try db.createTable(OrmReview.self)
        try db.insert(OrmAuthor(id: 1, name: "Ann"))
        try db.insert(OrmReview(id: 1, authorId: 1, stars: 5))
        ormExpectDatabaseError(.foreignKeyViolation) { try db.delete(OrmAuthor.self, key: PrimaryKey(1)) }
        ormExpectDatabaseError(.foreignKeyViolation) {
            try db.update(OrmAuthor.self, key: PrimaryKey(1), set: [.set("id", to: 2)])
        }
        #expect(try db.count(OrmAuthor.self) == 1)
    }
}
