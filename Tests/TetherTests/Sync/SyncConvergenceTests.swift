import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Replicas of a parent/child schema with a unique column, edited at random
/// and synced with batches delivered in random order, duplicated and delayed,
/// half of the scenarios with a rolling upgrade in the middle (a column added to
/// the parent on one replica after another), half of them with one or two
/// scoped peers of replica 0 among them. Whatever happens, once every replica
/// has exchanged everything, all hold exactly the same rows, and each scoped peer
/// exactly replica 0's rows in its scope.
/// The parent table as a model, for bulk inserts through the ORM (which log
/// insert ranges instead of per-row metadata).
struct ConvergenceParent: Model {
    var id: String
    var name: String?
    var code: String?
    static let tableName = "parent"
}

struct ConvergenceScenario {
    static let schema = """
        CREATE TABLE parent (id TEXT PRIMARY KEY NOT NULL, name TEXT, code TEXT UNIQUE, stock INTEGER NOT NULL \
        DEFAULT 0, peak INTEGER, low TEXT);
        CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id TEXT REFERENCES parent(id) ON DELETE CASCADE, value \
        INTEGER);
        """

    let seed: UInt64
    var random: SeededGenerator
    let replicas: [Database]
    /// Batches extracted but not delivered yet, delivered later in any order.
    var inTransit: [(to: Int, batch: ChangeBatch)] = []
    /// A rolling upgrade runs: replicas add `parent.note` one after another, at random (issue 34).
    var upgrading = false
    /// The replicas that added `parent.note`.
    var hasNote: Set<Int> = []
    /// Receiver then sender: pairs that exchanged while their schemas differed (a session records
    /// the peer's schema then, and backfills what becomes shared later, §8.3).
    var metDiffering: Set<[Int]> = []
    /// Receiver then sender: pairs whose receiver backfilled the note from the sender.
    var backfilled: Set<[Int]> = []
    /// Draws the edits of the parent's counter, `stock`, and of its `max` and `min` columns, `peak`
    /// and `low` (issue 39), apart from the others: the scenarios' other edits stay the ones they were.
    var counterRandom: SeededGenerator
    /// Scoped peers of replica 0, drawn apart (issue 39; see `ScopedConvergencePeer`).
    var scoped: [ScopedConvergencePeer] = []
    var scopeRandom: SeededGenerator

    init(seed: UInt64, replicaCount: Int) throws {
        self.seed = seed
        random = SeededGenerator(seed: seed)
        counterRandom = SeededGenerator(seed: seed ^ 0xC0_C0)
        scopeRandom = SeededGenerator(seed: seed ^ 0x5C_0BE)
        replicas = try (0..<replicaCount).map { _ in try Self.replica() }
    }

    static func replica() throws -> Database {
        let db = try Database.inMemory()
        try db.execute(schema)
        try db.enableSync(table: "parent", columnRules: ["stock": .counter, "peak": .maximum, "low": .minimum])
        // Add-wins (issue 39): a child updated where its delete was not seen comes back.
        try db.enableSync(table: "child", rowRule: .addWins)
        return db
    }

    mutating func randomEdit() {
        if Int.random(in: 0..<3, using: &counterRandom) == 0 {
            // The counter: an increment, or an assignment (the difference it makes), on any replica;
            // or `peak` / `low` set (refused when it makes them worse) or moved by max() / min().
            let db = replicas[Int.random(in: 0..<replicas.count, using: &counterRandom)]
            let parent = "p\(Int.random(in: 0..<6, using: &counterRandom))"
            let amount = Int.random(in: -5...9, using: &counterRandom)
            let sql: String
            switch Int.random(in: 0..<6, using: &counterRandom) {
            case 0: sql = "UPDATE parent SET stock = stock + ? WHERE id = ?"
            case 1: sql = "UPDATE parent SET stock = ? WHERE id = ?"
            case 2: sql = "UPDATE parent SET peak = ? WHERE id = ?"
            case 3: sql = "UPDATE parent SET peak = max(coalesce(peak, ?1), ?1) WHERE id = ?2"
            case 4: sql = "UPDATE parent SET low = 'v' || ? WHERE id = ?"
            default: sql = "UPDATE parent SET low = min(coalesce(low, 'v' || ?1), 'v' || ?1) WHERE id = ?2"
            }
            _ = try? db.execute(sql, [amount, parent])
            return
        }
        if upgrading {
            if Int.random(in: 0..<8, using: &random) == 0,
                let next = replicas.indices.filter({ !hasNote.contains($0) }).randomElement(using: &random)
            {
                do { try upgrade(next) } catch {
                    Issue.record("seed \(seed): replica \(next) could not add the note: \(error)")
                }
                return
            }
            let index = Int.random(in: 0..<replicas.count, using: &random)
            if hasNote.contains(index), Int.random(in: 0..<4, using: &random) == 0 {
                let parent = "p\(Int.random(in: 0..<6, using: &random))",
                    note = "note\(Int.random(in: 0..<100, using: &random))"
                if Bool.random(using: &random) {
                    _ = try? replicas[index].execute("UPDATE parent SET note = ? WHERE id = ?", [note, parent])
                } else {
                    _ = try? replicas[index].execute(
                        "INSERT INTO parent (id, name, note) VALUES (?, ?, ?)", [parent, "with \(note)", note])
                }
                return
            }
        }
        let db = replicas[Int.random(in: 0..<replicas.count, using: &random)]
        let parent = "p\(Int.random(in: 0..<6, using: &random))"
        let code = "c\(Int.random(in: 0..<4, using: &random))"
        let child = Int.random(in: 0..<8, using: &random)
        let value = Int.random(in: 0..<100, using: &random)
        // Local constraint failures are part of the game: the edit just does not happen.
        if Int.random(in: 0..<6, using: &random) == 0 {
            // A bulk insert through the ORM: all of it or nothing.
            let count = Int.random(in: 1...3, using: &random)
            let parents = (0..<count).map { offset in
                ConvergenceParent(
                    id: "p\((Int(parent.dropFirst()) ?? 0) + offset)", name: "bulk\(value)",
                    code: offset == 0 ? code : nil)
            }
            _ = try? db.insert(contentsOf: parents)
            return
        }
        switch Int.random(in: 0..<9, using: &random) {
        case 0, 1:
            _ = try? db.execute("INSERT INTO parent (id, name, code) VALUES (?, ?, ?)", [parent, "n\(value)", code])
        case 2: _ = try? db.execute("UPDATE parent SET name = ? WHERE id = ?", ["n\(value)", parent])
        case 3: _ = try? db.execute("UPDATE parent SET code = ? WHERE id = ?", [code, parent])
        case 4: _ = try? db.execute("DELETE FROM parent WHERE id = ?", [parent])
        case 5, 6:
            _ = try? db.execute("INSERT INTO child (id, parent_id, value) VALUES (?, ?, ?)", [child, parent, value])
        case 7: _ = try? db.execute("UPDATE child SET value = ? WHERE id = ?", [value, child])
        default: _ = try? db.execute("DELETE FROM child WHERE id = ?", [child])
        }
    }

    /// One batch from a random peer to another, delivered now, later, or twice.
    mutating func randomExchange() throws {
        let from = Int.random(in: 0..<replicas.count, using: &random)
        var to = Int.random(in: 0..<replicas.count - 1, using: &random)
        if to >= from { to += 1 }
        try backfillIfNewlyShared(from: from, to: to)
        let cursor = try replicas[to].cursor(for: replicas[from].instanceKey)
        var batch = try replicas[from].extractChanges(
            for: replicas[to].instanceKey, after: cursor.after, resuming: cursor.resyncing,
            limits: BatchLimits(maximumChanges: Int.random(in: 1...6, using: &random)),
            allowingPartialRows: Bool.random(using: &random))
        // To a replica without the note: cut as a session does, or whole as a sync file goes (its
        // notes are kept for the migration that adds the column).
        if upgrading, hasNote.contains(from), !hasNote.contains(to), Bool.random(using: &random) {
            batch = Self.withoutNote(batch)
        }
        // Through the wire encoding, as on the network.
        let delivered = try BatchCoding.decode(BatchCoding.encode(batch))
        switch Int.random(in: 0..<4, using: &random) {
        case 0: inTransit.append((to, delivered))
        case 1:
            try deliver(delivered, to: to)
            try deliver(delivered, to: to)
        default: try deliver(delivered, to: to)
        }
        if !inTransit.isEmpty && Bool.random(using: &random) {
            let late = inTransit.remove(at: Int.random(in: 0..<inTransit.count, using: &random))
            try deliver(late.batch, to: late.to)
        }
    }

    /// Applies `batch`; one with partial changes the replica cannot complete is refused whole
    /// (on the network, whole rows are then pulled; here a later exchange sends them).
    func deliver(_ batch: ChangeBatch, to index: Int) throws {
        do {
            try replicas[index].apply(batch)
        } catch let error as SyncError {
            guard case .needsWholeRows = error else { throw error }
        }
    }

    /// Every pair exchanges everything until a whole round changes nothing (a rolling upgrade
    /// completes first: every replica has the note).
    mutating func settle() throws {
        for late in inTransit { try deliver(late.batch, to: late.to) }
        inTransit.removeAll()
        if upgrading {
            for index in replicas.indices where !hasNote.contains(index) { try upgrade(index) }
        }
        for round in 0..<50 {
            var changed = false
            for from in replicas.indices {
                for to in replicas.indices where to != from {
                    try backfillIfNewlyShared(from: from, to: to)
                    let sent = try sendChanges(from: replicas[from], to: replicas[to], acknowledging: false)
                    if sent.contains(where: { $0.report.applied > 0 || $0.report.resolvedFromKeptAside > 0 }) {
                        changed = true
                    }
                }
            }
            if !changed && round > 0 { return }
        }
        Issue.record("seed \(seed): replicas still exchanging changes after 50 rounds")
    }

    /// Replica `index` runs the migration that adds `parent.note`.
    mutating func upgrade(_ index: Int) throws {
        var migrator = Migrator()
        migrator.register("note") { try $0.addColumn("note", to: "parent", "TEXT") }
        try migrator.migrate(replicas[index])
        hasNote.insert(index)
    }

    /// What a session's handshake does about schemas (§8.2, §8.3): a pair whose schemas differ
    /// is recorded; once both have the note, the receiver backfills it from the sender through
    /// its cursor, before anything else.
    mutating func backfillIfNewlyShared(from: Int, to: Int) throws {
        guard upgrading else { return }
        guard hasNote.contains(from) && hasNote.contains(to) else {
            if hasNote.contains(from) != hasNote.contains(to) { metDiffering.insert([to, from]) }
            return
        }
        guard metDiffering.contains([to, from]), backfilled.insert([to, from]).inserted else { return }
        let scope = BackfillScope(
            through: try replicas[to].cursor(for: replicas[from].instanceKey).after, columns: ["parent": ["note"]])
        var after: Int64 = 0
        while true {
            let batch = try replicas[from].extractChanges(
                for: replicas[to].instanceKey, after: after, limits: BatchLimits(maximumChanges: 3),
                backfill: scope)
            try replicas[to].apply(try BatchCoding.decode(BatchCoding.encode(batch)), backfill: true)
            if batch.isLast { return }
            after = batch.through
        }
    }

    /// `batch` without the parent's note, as a session sends it to a peer that lacks the column.
    static func withoutNote(_ batch: ChangeBatch) -> ChangeBatch {
        batch.cut(tables: { descriptor in
            guard descriptor.name == "parent", let note = descriptor.valueColumns.firstIndex(of: "note") else {
                return ChangeBatch.TableCut(descriptor: descriptor, keptValues: nil)
            }
            let kept = descriptor.valueColumns.indices.filter { $0 != note }
            return ChangeBatch.TableCut(
                descriptor: TableDescriptor(
                    name: descriptor.name, keyColumns: descriptor.keyColumns,
                    valueColumns: kept.map { descriptor.valueColumns[$0] }),
                keptValues: kept)
        })
    }

    func dump(_ db: Database) throws -> String {
        let parents = try db.fetchRows(
            upgrading
                ? "SELECT id, name, code, stock, peak, low, note FROM parent ORDER BY id"
                : "SELECT id, name, code, stock, peak, low FROM parent ORDER BY id")
        let children = try db.fetchRows("SELECT id, parent_id, value FROM child ORDER BY id")
        return dump(parents + children)
    }

    /// `rows`, a line each, their values joined by `|`.
    func dump(_ rows: [Row]) -> String {
        rows.map { $0.values.map(\.description).joined(separator: "|") }.joined(separator: "\n")
    }
}

@Suite struct SyncConvergenceTests {
    /// Seeds per run: thousands by default; TETHER_LONG_TESTS=1 runs many more.
    static let caseCount = ProcessInfo.processInfo.environment["TETHER_LONG_TESTS"] == nil ? 2_000 : 50_000
    static let shards = Array(0..<20)

    @Test(arguments: shards)
    func replicasConverge(shard: Int) throws {
        let perShard = Self.caseCount / Self.shards.count
        for index in 0..<perShard {
            let seed = UInt64(shard * perShard + index)
            try Self.run(seed: seed)
        }
    }

    static func run(seed: UInt64) throws {
        var sizes = SeededGenerator(seed: seed ^ 0xABCD)
        let replicaCount = Int.random(in: 2...8, using: &sizes)
        var scenario = try ConvergenceScenario(seed: seed, replicaCount: replicaCount)
        // Drawn apart, so that the scenarios without an upgrade stay the ones they were.
        var upgrades = SeededGenerator(seed: seed ^ 0x06_CA1E)
        scenario.upgrading = Bool.random(using: &upgrades)
        try scenario.addScopedPeers()
        let steps = Int.random(in: 5...40, using: &sizes)
        for _ in 0..<steps {
            if Int.random(in: 0..<3, using: &scenario.random) == 0 {
                try scenario.randomExchange()
            } else {
                scenario.randomEdit()
            }
            try scenario.randomScopedSteps()
        }
        try scenario.settle()
        try scenario.settleScopedPeers()
        let reference = try scenario.dump(scenario.replicas[0])
        for (index, replica) in scenario.replicas.enumerated().dropFirst() {
            let dump = try scenario.dump(replica)
            #expect(
                dump == reference,
                "seed \(seed): replica \(index) differs from replica 0\n--- 0:\n\(reference)\n--- \(index):\n\(dump)")
            if dump != reference { return }
        }
        try scenario.expectScopedPeersHoldTheirRows()
    }
}
