import Dispatch
import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Typed listeners (`ModelEvent`): each committed change of a model's table comes with the row as
/// that commit left it, whatever made the change, and nothing once the token is gone.
@Suite(.hangLimit) struct ModelEventTests {
    struct Employee: Model, Equatable {
        var id: Int64
        var name: String
        var title: String
        var level: Int
        static let tableName = "employee"
    }

    /// The same table, read with a title that must be one of a few: another title cannot be read.
    struct RankedEmployee: Model {
        enum Title: String, Codable { case engineer, lead }
        var id: Int64
        var name: String
        var title: Title
        var level: Int
        static let tableName = "employee"
    }

    /// A model whose table was never created.
    struct Ghost: Model {
        var id: Int64
        static let tableName = "ghost"
    }

    @Test func ormInsertUpdateAndDeleteCarryTheCommittedModel() async throws {
        let db = try makeDatabase(syncing: Employee.self)
        let inbox = ModelEventInbox<Employee>()
        let token = try db.observe(of: Employee.self) { inbox.add($0) }
        let ada = Employee(id: 1, name: "Ada", title: "engineer", level: 2)
        try db.insert(ada)
        try db.update(Employee(id: 1, name: "Ada", title: "lead", level: 3))
        #expect(try db.delete(Employee(id: 1, name: "Ada", title: "lead", level: 3)))
        let seen = await inbox.next(3)
        #expect(seen.map(\.kind) == [.insert, .update, .delete])
        #expect(seen.map(\.model.title) == ["engineer", "lead", "lead"])  // the delete: the row as it was before it
        #expect(
            seen.allSatisfy { $0.key == PrimaryKey(Int64(1)) && $0.origin == .local && $0.event.table == "employee" })
        token.cancel()
    }

    @Test func rawSQLChangesCarryTheCommittedModelInAndOutOfTransactions() async throws {
        let db = try makeDatabase(syncing: Employee.self)
        let inbox = ModelEventInbox<Employee>()
        let token = try db.observe(.insert, .update, .delete, of: Employee.self) { inbox.add($0) }
        // Outside a transaction (each statement its own commit).
        try db.execute("INSERT INTO employee (id, name, title, level) VALUES (7, 'Grace', 'admiral', 9)")
        try db.execute("UPDATE employee SET level = 10 WHERE id = 7")
        // In one transaction: a row changed twice comes twice, each time as committed.
        try await db.write { connection in
            try connection.execute("INSERT INTO employee (id, name, title, level) VALUES (8, 'Alan', 'analyst', 1)")
            try connection.execute("UPDATE employee SET title = 'cryptanalyst' WHERE id = 8")
            try connection.execute("DELETE FROM employee WHERE id = 7")
        }
        let seen = await inbox.next(5)
        #expect(seen.map(\.kind) == [.insert, .update, .insert, .update, .delete])
        #expect(
            seen.map(\.model) == [
                Employee(id: 7, name: "Grace", title: "admiral", level: 9),
                Employee(id: 7, name: "Grace", title: "admiral", level: 10),
                Employee(id: 8, name: "Alan", title: "cryptanalyst", level: 1),
                Employee(id: 8, name: "Alan", title: "cryptanalyst", level: 1),
                Employee(id: 7, name: "Grace", title: "admiral", level: 10),
            ])
        token.cancel()
    }

    /// The race of issue 25: a listener that fetched the row itself read the value of a later
    /// commit. The listener is held inside the first event until a second commit changed the row.
    @Test func aListenerSeesItsCommitsRowEvenWhenALaterCommitChangedItBeforeTheListenerRan() async throws {
        let db = try makeDatabase(syncing: Employee.self)
        try db.insert(Employee(id: 1, name: "Ada", title: "engineer", level: 1))
        let (started, startedContinuation) = AsyncStream.makeStream(of: Void.self)
        let proceed = DispatchSemaphore(value: 0)
        let inbox = ModelEventInbox<Employee>()
        let fetchedInListener = LockedBox<[String?]>([])
        let token = try db.observe(.update, of: Employee.self) { event in
            if event.model.title == "first" {
                startedContinuation.yield()
                proceed.wait()
            }
            // What a key listener had to do: fetch the row, which is no longer this commit's.
            let fetched = try? db.fetch(Employee.self, key: event.key)?.title
            fetchedInListener.withLock { $0.append(fetched) }
            inbox.add(event)
        }
        try db.update(Employee(id: 1, name: "Ada", title: "first", level: 1))
        var starts = started.makeAsyncIterator()
        _ = await starts.next()  // the listener now waits inside the first commit's event
        try db.update(Employee(id: 1, name: "Ada", title: "second", level: 1))
        proceed.signal()
        let seen = await inbox.next(2)
        #expect(seen.map(\.model.title) == ["first", "second"])
        #expect(fetchedInListener.value == ["second", "second"])
        token.cancel()
    }

    @Test func aPeersAppliedBatchCarriesTheModelsWithThePeerAsOrigin() async throws {
        let source = try makeDatabase(syncing: Employee.self)
        let destination = try makeDatabase(syncing: Employee.self)
        let inbox = ModelEventInbox<Employee>()
        let token = try destination.observe(of: Employee.self) { inbox.add($0) }
        try source.insert(Employee(id: 1, name: "Ada", title: "engineer", level: 1))
        try source.insert(Employee(id: 2, name: "Bob", title: "clerk", level: 1))
        try sendChanges(from: source, to: destination)
        try source.update(Employee(id: 1, name: "Ada", title: "lead", level: 2))
        #expect(try source.delete(Employee.self, key: PrimaryKey(Int64(2))))
        try sendChanges(from: source, to: destination)
        let seen = await inbox.next(4)
        #expect(seen.allSatisfy { $0.origin == .peer(source.instanceKey) })
        #expect(Set(seen.prefix(2).map(\.model.name)) == ["Ada", "Bob"])
        #expect(seen.prefix(2).allSatisfy { $0.kind == .insert })
        let later = Dictionary(uniqueKeysWithValues: seen.suffix(2).map { ($0.kind, $0.model) })
        #expect(later[.update] == Employee(id: 1, name: "Ada", title: "lead", level: 2))
        #expect(later[.delete] == Employee(id: 2, name: "Bob", title: "clerk", level: 1))
        token.cancel()
    }

    @Test func anImportedSyncFileCarriesTheModelsWithTheFileAsOrigin() async throws {
        try await withTemporaryDirectory { directory in
            let source = try makeDatabase(syncing: Employee.self)
            let destination = try makeDatabase(syncing: Employee.self)
            let inbox = ModelEventInbox<Employee>()
            let token = try destination.observe(.insert, of: Employee.self) { inbox.add($0) }
            try source.insert(Employee(id: 4, name: "Linus", title: "maintainer", level: 5))
            let file = directory.appendingPathComponent("source.tether")
            try source.exportSyncFile(to: file, for: destination.instanceKey, since: 0)
            try destination.importSyncFile(from: file)
            let seen = await inbox.next(1)
            #expect(seen.map(\.origin) == [.syncFile(source.instanceKey)])
            #expect(seen.map(\.model) == [Employee(id: 4, name: "Linus", title: "maintainer", level: 5)])
            token.cancel()
        }
    }

    @Test func aRowListenerHearsOnlyItsRow() async throws {
        let db = try makeDatabase(syncing: Employee.self)
        let ada = Employee(id: 1, name: "Ada", title: "engineer", level: 1)
        try db.insert(ada)
        try db.insert(Employee(id: 2, name: "Bob", title: "clerk", level: 1))
        let forAda = ModelEventInbox<Employee>()
        let forAll = ModelEventInbox<Employee>()
        let adaToken = try db.observe(.update, of: ada) { forAda.add($0) }
        let allToken = try db.observe(.update, of: Employee.self) { forAll.add($0) }
        try db.update(Employee(id: 2, name: "Bob", title: "manager", level: 2))
        try db.update(Employee(id: 1, name: "Ada", title: "lead", level: 2))
        #expect(await forAll.next(2).map(\.model.name) == ["Bob", "Ada"])
        // Listeners are called in order on one queue: Ada's listener was offered both already.
        #expect(forAda.received.map(\.model.title) == ["lead"])
        adaToken.cancel()
        allToken.cancel()
    }

    @Test func aCancelledOrReleasedListenerHearsNothingMore() async throws {
        let db = try makeDatabase(syncing: Employee.self)
        let cancelled = ModelEventInbox<Employee>()
        let released = ModelEventInbox<Employee>()
        let token = try db.observe(.insert, of: Employee.self) { cancelled.add($0) }
        var releasedToken: ObservationToken? = try db.observe(.insert, of: Employee.self) { released.add($0) }
        try db.insert(Employee(id: 1, name: "Ada", title: "engineer", level: 1))
        #expect(await cancelled.next(1).map(\.key) == [PrimaryKey(Int64(1))])
        #expect(await released.next(1).map(\.key) == [PrimaryKey(Int64(1))])
        token.cancel()
        releasedToken = nil
        let barrier = ModelEventInbox<Employee>()
        let barrierToken = try db.observe(.insert, of: Employee.self) { barrier.add($0) }
        try db.insert(Employee(id: 2, name: "Bob", title: "clerk", level: 1))
        #expect(await barrier.next(1).map(\.key) == [PrimaryKey(Int64(2))])
        #expect(cancelled.received.count == 1)
        #expect(released.received.count == 1)
        #expect(releasedToken == nil)
        barrierToken.cancel()
    }

    @Test func aRowInsertedAndDeletedInOneTransactionComesOnlyAsItsDelete() async throws {
        let db = try makeDatabase(syncing: Employee.self)
        let inbox = ModelEventInbox<Employee>()
        let token = try db.observe(of: Employee.self) { inbox.add($0) }
        try await db.write { connection in
            try connection.insert(Employee(id: 5, name: "Temp", title: "contractor", level: 1))
            _ = try connection.delete(Employee.self, key: PrimaryKey(Int64(5)))
            try connection.insert(Employee(id: 6, name: "Kept", title: "engineer", level: 1))
        }
        let seen = await inbox.next(2)
        #expect(seen.map(\.kind) == [.delete, .insert])
        #expect(seen.map(\.model.name) == ["Temp", "Kept"])
        token.cancel()
    }

    @Test func nothingOfARolledBackSavepointReachesTheModel() async throws {
        let db = try makeDatabase(syncing: Employee.self)
        let inbox = ModelEventInbox<Employee>()
        let token = try db.observe(of: Employee.self) { inbox.add($0) }
        struct Undo: Error {}
        try await db.write { connection in
            try connection.insert(Employee(id: 1, name: "Ada", title: "engineer", level: 1))
            try connection.savepoint { try connection.execute("UPDATE employee SET title = 'released' WHERE id = 1") }
            _ = try? connection.savepoint {
                try connection.execute("UPDATE employee SET title = 'rolled back' WHERE id = 1")
                try connection.savepoint { try connection.execute("UPDATE employee SET level = 99 WHERE id = 1") }
                throw Undo()
            }
        }
        let seen = await inbox.next(2)
        #expect(seen.map(\.kind) == [.insert, .update])
        #expect(
            seen.map(\.model) == Array(repeating: Employee(id: 1, name: "Ada", title: "released", level: 1), count: 2))
        token.cancel()
    }

    @Test func otherProcessesWritesCarryTheRowAsReadBack() async throws {
        try await withTemporaryDirectory { directory in
            var configuration = Database.Configuration()
            configuration.observationPollInterval = .milliseconds(10)
            let path = directory.appendingPathComponent("shared.sqlite").path
            let db = try Database(path: path, configuration: configuration)
            try db.createTable(Employee.self)
            try db.enableSync(for: Employee.self)
            let inbox = ModelEventInbox<Employee>()
            let token = try db.observe(of: Employee.self) { inbox.add($0) }
            // Another connection to the file stands for another process.
            let other = try Database(path: path)
            try other.insert(Employee(id: 3, name: "Eve", title: "auditor", level: 4))
            let seen = await inbox.next(1)
            #expect(seen.map(\.origin) == [.external])
            #expect(seen.map(\.model) == [Employee(id: 3, name: "Eve", title: "auditor", level: 4)])
            // Another process's delete is read back after the row is gone: key listeners get it,
            // typed listeners do not (as documented); a later insert shows that nothing is pending.
            let keyEvents = LockedBox<[DatabaseEvent]>([])
            let keyToken = db.observe(.delete, in: "employee") { event in keyEvents.withLock { $0.append(event) } }
            #expect(try other.delete(Employee.self, key: PrimaryKey(Int64(3))))
            try other.insert(Employee(id: 4, name: "Mallory", title: "intern", level: 0))
            #expect(await inbox.next(1).map(\.model.name) == ["Mallory"])
            #expect(keyEvents.value.map(\.key) == [PrimaryKey(Int64(3))])
            #expect(inbox.received.map(\.kind) == [.insert, .insert])
            keyToken.cancel()
            token.cancel()
        }
    }

    @Test func aRowThatCannotBeReadAsTheModelIsReportedAsAFailure() async throws {
        let db = try makeDatabase(syncing: Employee.self)
        let failures = LockedBox<[ModelEventFailure]>([])
        let (failed, failedContinuation) = AsyncStream.makeStream(of: Void.self)
        let inbox = ModelEventInbox<RankedEmployee>()
        let token = try db.observe(
            of: RankedEmployee.self,
            onFailure: { failure in
                failures.withLock { $0.append(failure) }
                failedContinuation.yield()
            }
        ) { inbox.add($0) }
        try db.execute("INSERT INTO employee (id, name, title, level) VALUES (1, 'Ada', 'astronaut', 1)")
        var iterator = failed.makeAsyncIterator()
        _ = await iterator.next()
        #expect(failures.value.map(\.event.kind) == [.insert])
        #expect(failures.value.first?.model.contains("RankedEmployee") == true)
        #expect(inbox.received.isEmpty)
        // A readable row after it still comes as a model.
        try db.execute("INSERT INTO employee (id, name, title, level) VALUES (2, 'Bob', 'lead', 1)")
        #expect(await inbox.next(1).map(\.model.title) == [.lead])
        token.cancel()
    }

    @Test func aModelWithoutATableOrAFetchListenerIsATypedError() throws {
        let db = try makeDatabase(syncing: Employee.self)
        #expect {
            _ = try db.observe(.insert, of: Ghost.self) { (_: ModelEvent<Ghost>) in }
        } throws: { error in
            guard case let ModelError.tableNotFound(model, table) = error else { return false }
            return model.contains("Ghost") && table == "ghost"
        }
        #expect {
            _ = try db.observe(.fetch, of: Employee.self) { (_: ModelEvent<Employee>) in }
        } throws: { error in
            guard case ModelError.invalidArgument = error else { return false }
            return true
        }
    }
}

/// Model events handed over by a listener, awaited in order.
final class ModelEventInbox<M: Model>: Sendable {
    private let events = LockedBox<[ModelEvent<M>]>([])
    private let arrivals: AsyncStream<Void>
    private let arrival: AsyncStream<Void>.Continuation
    private let taken = LockedBox(0)

    init() { (arrivals, arrival) = AsyncStream.makeStream(of: Void.self) }

    func add(_ event: ModelEvent<M>) {
        events.withLock { $0.append(event) }
        arrival.yield()
    }

    /// Every event received so far.
    var received: [ModelEvent<M>] { events.value }

    /// The next `count` events after those already taken (the suite's time limit bounds the wait).
    func next(_ count: Int) async -> [ModelEvent<M>] {
        let start = taken.value
        var iterator = arrivals.makeAsyncIterator()
        while events.value.count < start + count, await iterator.next() != nil {}
        taken.withLock { $0 = start + count }
        let all = events.value
        return Array(all[start..<min(all.count, start + count)])
    }
}
