import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// The ORM from async code and from several tasks, and the reader pool of a
/// database file.
@Suite struct ORMAsyncTests {

    private static func user(_ id: Int64) -> OrmUser {
        OrmUser(id: id, name: "U\(id)", email: "u\(id)@async", age: Int(id % 50), score: Int(id), nickname: nil)
    }

    @Test func asyncWriteAndRead() async throws {
        let db = try Database.inMemory()
        try await db.write { conn in try conn.createTable(OrmUser.self) }
        let user = Self.user(1)
        let rowid = try await db.write { conn in try conn.insert(user) }
        #expect(rowid == 1)
        let fetched = try await db.read { conn in try conn.fetch(OrmUser.self, key: PrimaryKey(1)) }
        #expect(fetched == user)

        // A failing async write is rolled back as a whole and rethrown.
        await #expect(throws: ModelError.self) {
            try await db.write { conn in
                try conn.insert(Self.user(2))
                try conn.insert(user)  // duplicate key
            }
        }
        let all = try await db.read { conn in try conn.fetchAll(OrmUser.self) }
        #expect(all == [user])
    }

    @Test func concurrentWritesFromManyTasksAreAllStored() async throws {
        let db = try Database.inMemory()
        try db.createTable(OrmUser.self)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for id in Int64(1)...40 {
                group.addTask {
                    _ = try await db.write { conn in try conn.insert(Self.user(id)) }
                }
            }
            try await group.waitForAll()
        }
        #expect(try db.count(OrmUser.self) == 40)
        #expect(try db.fetchKeys(OrmUser.query.orderBy(\.id)) == (1...40).map { PrimaryKey(Int64($0)) })
    }

    @Test func concurrentReadsOfAFileSeeWholeTransactions() async throws {
        try await withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("orm.sqlite").path)
            try db.createTable(OrmUser.self)
            try db.insert(contentsOf: ormUsers)
            let batch = (Int64(100)..<200).map(Self.user)

            let counts = try await withThrowingTaskGroup(of: [Int].self) { group in
                group.addTask {
                    try await db.write { conn in try conn.insert(contentsOf: batch) }
                    return []
                }
                for _ in 0..<12 {
                    group.addTask {
                        try await db.read { conn in
                            // Two reads in one snapshot agree, whatever the writer does meanwhile.
                            let count = try conn.count(OrmUser.self)
                            let rows = try conn.fetchAll(OrmUser.query).count
                            let sum =
                                try conn.aggregate(.sum(\.score), of: OrmUser.where(\.id >= 100), as: Int.self) ?? 0
                            return [count, rows, sum]
                        }
                    }
                }
                var all: [[Int]] = []
                for try await result in group where !result.isEmpty { all.append(result) }
                return all
            }
            #expect(counts.count == 12)
            let batchSum = (100..<200).reduce(0, +)
            for reading in counts {
                #expect(reading == [6, 6, 0] || reading == [106, 106, batchSum], "\(reading)")
            }
            #expect(try db.count(OrmUser.self) == 106)
            let names = try await db.read { conn in
                try conn.fetchAll(OrmUser.where(.in(\.id, [1, 150])).orderBy(\.id)).map(\.name)
            }
            #expect(names == ["Alice", "U150"])
            try db.close()
        }
    }

    @Test func aReadKeepsItsSnapshotWhileAWriteCommits() throws {
        try withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("orm.sqlite").path)
            try db.createTable(OrmUser.self)
            try db.insert(contentsOf: ormUsers)
            try db.read { conn in
                #expect(try conn.count(OrmUser.self) == 6)
                // A write on the writer connection commits while this read is open…
                try db.write { writer in
                    try writer.insert(Self.user(100))
                    try writer.update(OrmUser.self, key: PrimaryKey(1), set: [.set("name", to: "Changed")])
                }
                // …and this read still sees its snapshot.
                #expect(try conn.count(OrmUser.self) == 6)
                #expect(try conn.fetch(OrmUser.self, key: PrimaryKey(1))?.name == "Alice")
                #expect(try conn.fetch(OrmUser.self, key: PrimaryKey(100)) == nil)
            }
            // A new read sees the commit.
            #expect(try db.count(OrmUser.self) == 7)
            #expect(try db.fetch(OrmUser.self, key: PrimaryKey(1))?.name == "Changed")
            try db.close()
        }
    }

    @Test func ormWritesInsideAReadThrowAndChangeNothing() throws {
        try withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("orm.sqlite").path)
            try db.createTable(OrmUser.self)
            try db.insert(contentsOf: ormUsers)
            let before = try ormDump(db, "orm_user")
            try db.read { conn in
                ormExpectDatabaseError(.readOnly) { try conn.insert(Self.user(100)) }
                ormExpectDatabaseError(.readOnly) {
                    try conn.update(OrmUser.self, key: PrimaryKey(1), set: [.set("age", to: 1)])
                }
                ormExpectDatabaseError(.readOnly) { try conn.delete(OrmUser.where(\.age > 0)) }
                ormExpectDatabaseError(.readOnly) { try conn.save(ormUsers[0]) }
            }
            #expect(try ormDump(db, "orm_user") == before)
            try db.close()
        }
    }
}
