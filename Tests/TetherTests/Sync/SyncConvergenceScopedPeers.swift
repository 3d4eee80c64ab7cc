import Foundation
import Testing

@testable import Tether
import TetherTestSupport

/// A peer of replica 0 that holds only part of the data (partial replication, issue 39): the
/// parents whose name sorts before its bound, and their children. It edits counters, high-water
/// marks and names (a name past the bound moves the row out of its scope: refused by replica 0),
/// and exchanges with replica 0 only, as a site with its hub; replica 0 relays its writes. During
/// a rolling upgrade it adds `parent.note` in its turn, and its sessions with replica 0 cut and
/// backfill the note as the replicas' do.
struct ScopedConvergencePeer {
    /// Which way a session's changes go.
    enum Direction { case fromHub, toHub }

    let db: Database
    let bound: String
    var hasNote = false
    /// The directions that went while the peer's schema and replica 0's differed (§8.3).
    var metDiffering: Set<Direction> = []
    /// The directions that backfilled the note since.
    var backfilled: Set<Direction> = []
    var scope: SyncScope {
        SyncScope(
            [
                "parent": .filter("name < :bound"),
                "child": .reference(column: "parent_id", parent: "parent"),
            ], parameters: ["bound": .text(bound)])
    }
}

extension ConvergenceScenario {
    /// Half of the scenarios get one or two scoped peers, filled from replica 0. Drawn from
    /// `scopeRandom`, so that the scenarios' other draws stay the ones they were.
    mutating func addScopedPeers() throws {
        guard Bool.random(using: &scopeRandom) else { return }
        for _ in 0..<Int.random(in: 1...2, using: &scopeRandom) {
            let bound = ["n3", "n6", "o"][Int.random(in: 0..<3, using: &scopeRandom)]
            scoped.append(ScopedConvergencePeer(db: try Self.replica(), bound: bound))
        }
    }

    /// Now and then a scoped peer edits, or exchanges with replica 0 in one direction; during a
    /// rolling upgrade it may add the note, or write one.
    mutating func randomScopedSteps() throws {
        guard !scoped.isEmpty, Int.random(in: 0..<3, using: &scopeRandom) == 0 else { return }
        let index = Int.random(in: 0..<scoped.count, using: &scopeRandom)
        let peer = scoped[index]
        let parent = "p\(Int.random(in: 0..<6, using: &scopeRandom))"
        let amount = Int.random(in: -5...9, using: &scopeRandom)
        let limits = BatchLimits(maximumChanges: Int.random(in: 1...6, using: &scopeRandom))
        if upgrading, Int.random(in: 0..<4, using: &scopeRandom) == 0 {
            if peer.hasNote {
                _ = try? peer.db.execute("UPDATE parent SET note = 'n' || ? WHERE id = ?", [amount, parent])
            } else {
                try upgradeScopedPeer(index)
            }
            return
        }
        let sql: String
        switch Int.random(in: 0..<10, using: &scopeRandom) {
        case 0, 1: sql = "UPDATE parent SET stock = stock + ? WHERE id = ?"
        case 2: sql = "UPDATE parent SET peak = max(coalesce(peak, ?1), ?1) WHERE id = ?2"
        case 3: sql = "UPDATE parent SET name = 'n' || ? WHERE id = ?"
        case 4: sql = "INSERT INTO parent (id, name) VALUES (?2, 'n' || ?1)"
        case 5: sql = "INSERT INTO child (id, parent_id, value) VALUES (abs(?) % 8, ?, 1)"
        case 6: sql = "DELETE FROM parent WHERE ? IS NOT NULL AND id = ?"
        case 7:
            try scopedSession(index, .toHub, limits: limits)
            return
        default:
            try scopedSession(index, .fromHub, limits: limits)
            return
        }
        // Local constraint failures are part of the game, as on the other replicas.
        _ = try? peer.db.execute(sql, [amount, parent])
    }

    /// After the replicas settled: every scoped peer's writes reach replica 0 (checked against its
    /// scope) and through it every replica; then each peer takes what it holds from replica 0 — until
    /// that leaves no peer a change of its own to send (taking a row may displace one of its rows
    /// that holds the same unique value, a delete it then sends).
    mutating func settleScopedPeers() throws {
        if upgrading {
            for index in scoped.indices where !scoped[index].hasNote { try upgradeScopedPeer(index) }
        }
        for round in 0..<10 {
            let pending = try scoped.contains { try $0.db.pendingChangeCount() > 0 }
            guard round == 0 || pending else { return }
            for index in scoped.indices { try scopedSession(index, .toHub) }
            try settle()
            for index in scoped.indices { try scopedSession(index, .fromHub) }
        }
    }

    /// Scoped peer `index` runs the migration that adds `parent.note`.
    mutating func upgradeScopedPeer(_ index: Int) throws {
        var migrator = Migrator()
        migrator.register("note") { try $0.addColumn("note", to: "parent", "TEXT") }
        try migrator.migrate(scoped[index].db)
        scoped[index].hasNote = true
    }

    /// One session's worth of changes between scoped peer `index` and replica 0, one way: the
    /// note cut when the receiver lacks it, recorded when their schemas differ, and backfilled
    /// first once both have it (§8.3), within the peer's scope.
    mutating func scopedSession(
        _ index: Int, _ direction: ScopedConvergencePeer.Direction, limits: BatchLimits = BatchLimits()
    ) throws {
        let hubHasNote = hasNote.contains(0)
        if upgrading {
            if hubHasNote && scoped[index].hasNote {
                if scoped[index].metDiffering.contains(direction),
                    scoped[index].backfilled.insert(direction).inserted
                {
                    try backfillNote(scoped[index], direction)
                }
            } else if hubHasNote != scoped[index].hasNote {
                scoped[index].metDiffering.insert(direction)
            }
        }
        let peer = scoped[index]
        let cuts = direction == .fromHub ? hubHasNote && !peer.hasNote : peer.hasNote && !hubHasNote
        let adapt: (ChangeBatch) -> ChangeBatch = { cuts ? Self.withoutNote($0) : $0 }
        switch direction {
        case .fromHub:
            _ = try sendScopedChanges(
                from: replicas[0], to: peer.db, scope: peer.scope, limits: limits, adapting: adapt)
        case .toHub:
            _ = try sendScopedWrites(from: peer.db, to: replicas[0], scope: peer.scope, limits: limits, adapting: adapt)
        }
    }

    /// The receiver backfills the note from the sender through its cursor: replica 0 sends only
    /// the rows in the peer's scope, and checks the peer's against it.
    func backfillNote(_ peer: ScopedConvergencePeer, _ direction: ScopedConvergencePeer.Direction) throws {
        let (source, destination) = direction == .fromHub ? (replicas[0], peer.db) : (peer.db, replicas[0])
        let backfill = BackfillScope(
            through: try destination.cursor(for: source.instanceKey).after, columns: ["parent": ["note"]])
        var after: Int64 = 0
        while true {
            let batch = try source.extractChanges(
                for: destination.instanceKey, after: after, limits: BatchLimits(maximumChanges: 3),
                backfill: backfill, scope: direction == .fromHub ? peer.scope : nil)
            try destination.apply(
                try BatchCoding.decode(BatchCoding.encode(batch), maximumFormat: BatchCoding.latestFormat),
                backfill: true,
                scope: direction == .toHub ? peer.scope : nil)
            if batch.isLast { return }
            after = batch.through
        }
    }

    /// Each scoped peer holds exactly replica 0's rows in its scope, with nothing left to send.
    func expectScopedPeersHoldTheirRows() throws {
        for (index, peer) in scoped.enumerated() {
            let parents = "SELECT id, name, code, stock, peak, low\(upgrading ? ", note" : "") FROM parent"
            let children = "SELECT id, parent_id, value FROM child"
            let inScope = "parent_id IN (SELECT id FROM parent WHERE name < ?)"
            let expected = try dump(
                replicas[0].fetchRows("\(parents) WHERE name < ? ORDER BY id", [peer.bound])
                    + replicas[0].fetchRows("\(children) WHERE \(inScope) ORDER BY id", [peer.bound]))
            let held = try dump(
                peer.db.fetchRows("\(parents) ORDER BY id") + peer.db.fetchRows("\(children) ORDER BY id"))
            #expect(
                held == expected,
                """
                seed \(seed): scoped peer \(index) (name < \(peer.bound)) differs from replica 0's rows in its scope
                --- replica 0:
                \(expected)
                --- peer:
                \(held)
                """)
            #expect(try peer.db.pendingChangeCount() == 0, "seed \(seed): scoped peer \(index) has changes left")
        }
    }
}
