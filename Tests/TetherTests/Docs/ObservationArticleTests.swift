import Foundation
import Testing
import Tether
import TetherTestSupport

// The code of Sources/Tether/Tether.docc/Observation.md, run in the article's order (see
// `ArticleExamplesTests.everyArticleBlockIsCompiledAndRun`).

@Suite(.hangLimit) struct ObservationArticleTests {
    @Model
    struct Employee: Equatable {
        var id: Int64
        var name: String
        var title: String

        static let tableName = "employee"
    }

    @Test func observationArticle() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("staff.sqlite").path
            let db = try Database(path: path)
            try db.createTable(Employee.self)
            try db.enableSync(for: Employee.self)
            // What the article's listeners print, seen by listeners of the test's own.
            let keyEvents = LockedBox<[DatabaseEvent]>([])
            let recorder = db.observe(in: "employee") { event in keyEvents.withLock { $0.append(event) } }
            let modelEvents = LockedBox<[ModelEvent<Employee>]>([])
            let modelRecorder = try db.observe(of: Employee.self) { event in modelEvents.withLock { $0.append(event) } }

            // Listen to a table or a row.
            let token = db.observe(.changes, in: "employee") { event in
                print(event.kind, event.key, event.origin)  // insert, the key 1, local
            }
            let adaToken = db.observe(.update, in: "employee", key: PrimaryKey(Int64(1))) { event in
                print("Ada changed:", event.key)
            }
            try db.insert(Employee(id: 1, name: "Ada", title: "engineer"))
            token.cancel()  // or let the token go
            #expect(try await eventually { keyEvents.value.count == 1 })
            #expect(keyEvents.value.map(\.kind) == [.insert])

            // Listen to models.
            let titles = try db.observe(.insert, .update, of: Employee.self) { event in
                print(event.kind, event.model.name, event.model.title)  // update Ada lead
            }
            let departures = try db.observe(.delete, of: Employee.self) { event in
                print("gone:", event.model.name)  // the row as it was before the delete
            }
            try db.update(Employee(id: 1, name: "Ada", title: "lead"))
            #expect(try await eventually { modelEvents.value.count == 2 })
            #expect(modelEvents.value.map(\.model.title) == ["engineer", "lead"])

            let ada = Employee(id: 1, name: "Ada", title: "lead")
            let watch = try db.observe(.update, of: ada) { event in
                print("Ada is now", event.model.title)
            }

            let checked = try db.observe(
                of: Employee.self,
                onFailure: { failure in
                    print(failure)  // which row, and why it could not be read
                }
            ) { event in
                print(event.model)
            }

            // Committed transactions.
            var feed = try db.committedTransactions(tables: ["employee"]).makeAsyncIterator()
            try db.insert(Employee(id: 2, name: "Grace", title: "admiral"))
            let transaction = try await feed.next()  // its changes: insert employee 2
            #expect(transaction?.changes.map(\.key) == [PrimaryKey(Int64(2))])

            // Live queries.
            let staff = db.observe(Employee.where(\.title == "engineer")).removeDuplicates()
            var values = staff.makeAsyncIterator()
            let engineers = try await values.next()  // the engineers now
            try db.execute("UPDATE employee SET title = 'engineer' WHERE id = 2")
            let after = try await values.next()  // after that commit
            #expect(engineers == [])
            #expect(after == [Employee(id: 2, name: "Grace", title: "engineer")])

            // Where changes come from.
            let origins = db.observe(in: "employee") { event in
                switch event.origin {
                case .local: print("this process")
                case let .peer(key): print("a batch from peer", key)
                case let .syncFile(key): print("a sync file made by", key)
                case .external: print("another process or connection")
                }
            }

            // Other processes' writes: a second connection to the file stands for another process.
            var configuration = Database.Configuration()
            configuration.observationPollInterval = .milliseconds(20)
            let shared = try Database(path: path, configuration: configuration)
            let external = LockedBox<[ModelEvent<Employee>]>([])
            let externalRecorder = try shared.observe(.insert, of: Employee.self) { event in
                external.withLock { $0.append(event) }
            }
            try db.insert(Employee(id: 3, name: "Alan", title: "analyst"))
            #expect(try await eventually { external.value.count == 1 })
            #expect(external.value.map(\.origin) == [.external])
            #expect(external.value.map(\.model.name) == ["Alan"])
            #expect(try await eventually { modelEvents.value.count == 5 })
            #expect(modelEvents.value.map(\.kind) == [.insert, .update, .insert, .update, .insert])
            withExtendedLifetime(
                (recorder, modelRecorder, adaToken, titles, departures, watch, checked, origins, externalRecorder)
            ) {}
        }
    }
}
