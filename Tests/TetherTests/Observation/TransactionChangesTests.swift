import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// The broker's record of a transaction: bulk-inserted rows as runs, read back as the events
/// they stand for, in order, whatever was undone in between.
@Suite("Observation: a transaction's changes, bulk inserts as runs")
struct TransactionChangesTests {
    private func event(_ kind: DatabaseEvent.Kind, _ table: String, _ rowID: Int64) -> DatabaseEvent {
        DatabaseEvent(kind: kind, table: table, rowID: rowID, keyValues: nil, origin: .local)
    }

    @Test func runsReadBackAsTheirEventsInOrder() {
        var changes = TransactionChanges()
        changes.append(event(.update, "a", 9))
        changes.appendInserted(into: "b", rowids: 1...3, origin: .local)
        // Continues the run: joined to it.
        changes.appendInserted(into: "b", rowids: 4...5, origin: .local)
        // Another table, then a gap in the rowids: runs of their own.
        changes.appendInserted(into: "c", rowids: 6...6, origin: .local)
        changes.appendInserted(into: "c", rowids: 8...9, origin: .local)
        changes.append(event(.delete, "a", 9))
        let expected =
            [event(.update, "a", 9)] + (1...5).map { event(.insert, "b", $0) }
            + [6, 8, 9].map { event(.insert, "c", $0) } + [event(.delete, "a", 9)]
        #expect(changes.count == expected.count)
        #expect(Array(changes) == expected)
        // Random access agrees with iteration, wherever the index falls.
        #expect(changes.indices.map { changes[$0] } == expected)
        #expect(changes.tables == ["a", "b", "c"])
        // As collected: the runs joined where they continue each other.
        let runs = changes.runs.map { run -> String in
            switch run {
            case let .event(event): "\(event.kind) \(event.table) \(event.rowID ?? 0)"
            case let .inserted(table, rowids, _, _): "inserted \(table) \(rowids)"
            }
        }
        #expect(runs == ["update a 9", "inserted b 1...5", "inserted c 6...6", "inserted c 8...9", "delete a 9"])
    }

    @Test func undoingFromInsideARunKeepsItsStart() {
        var changes = TransactionChanges()
        changes.appendInserted(into: "b", rowids: 1...3, origin: .local)
        // A savepoint opened here (3 changes), then more rows that continue the run.
        changes.appendInserted(into: "b", rowids: 4...6, origin: .local)
        changes.append(event(.update, "b", 2))
        changes.removeChanges(from: 3)
        #expect(Array(changes) == (1...3).map { event(.insert, "b", $0) })
        // What comes next is counted from there.
        changes.appendInserted(into: "b", rowids: 10...11, origin: .local)
        #expect(changes.count == 5)
        #expect(changes[3] == event(.insert, "b", 10))
        changes.removeChanges(from: 0)
        #expect(changes.isEmpty)
        // Past the end: nothing to undo.
        changes.append(event(.insert, "a", 1))
        changes.removeChanges(from: 5)
        #expect(changes.count == 1)
    }

    @Test func aKeyReadLaterReplacesItsEventOnly() {
        var changes = TransactionChanges()
        changes.appendInserted(into: "b", rowids: 1...2, origin: .local)
        changes.append(event(.insert, "k", 7))
        let keyed = DatabaseEvent(kind: .insert, table: "k", rowID: 7, keyValues: [.text("seven")], origin: .local)
        changes.replaceEvent(at: 2, with: keyed)
        // An index inside a run names no event of its own: left as it is.
        changes.replaceEvent(at: 1, with: keyed)
        #expect(Array(changes) == [event(.insert, "b", 1), event(.insert, "b", 2), keyed])
        #expect(changes[2].key == PrimaryKey([.text("seven")]))
    }

    /// Through the database: a bulk insert that continues another across a savepoint rolled
    /// back reports the rows kept, each once.
    @Test func aSavepointRolledBackInsideABulkInsertsRunIsNotReported() async throws {
        struct Row: Model, Equatable {
            var id: Int64
            static let tableName = "row"
        }
        try await withTemporaryDirectory { directory in
            let db = try Database(path: directory.appendingPathComponent("db.sqlite").path)
            defer { try? db.close() }
            try db.createTable(Row.self)
            let keys = LockedBox<[Int64]>([])
            let done = LockedBox(false)
            let token = db.observe(.insert, of: Row.self) { event in
                keys.withLock { $0.append(event.rowID ?? -1) }
                if event.rowID == 99 { done.withLock { $0 = true } }
            }
            defer { token.cancel() }
            struct Undo: Error {}
            try await db.write { conn in
                try conn.insert(contentsOf: (1...3).map { Row(id: $0) })
                _ = try? conn.savepoint {
                    try conn.insert(contentsOf: (4...6).map { Row(id: $0) })
                    throw Undo()
                }
                try conn.insert(contentsOf: (4...5).map { Row(id: $0) })
            }
            try db.insert(Row(id: 99))
            #expect(try await eventually { done.withLock { $0 } })
            #expect(keys.withLock { $0 } == [1, 2, 3, 4, 5, 99])
        }
    }
}
