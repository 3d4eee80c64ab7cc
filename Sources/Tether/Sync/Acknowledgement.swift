// A peer's ACK recorded: the rows it acknowledges become synced, and the peer's record moves on.
// An ACK that changes no row may wait for a catch-up that holds the writer, rather than make it
// roll back.

import Foundation
import Synchronization

extension Database {
    /// `peer` has applied this database's changes through `sequence`: rows
    /// sent to it become synced, unless they changed again since.
    ///
    /// While a catch-up applied as it arrives holds the writer (or is about to take it), an
    /// acknowledgement that would mark no row synced (nothing of this database's is in flight up
    /// to it) is recorded with that catch-up, or with the next acknowledgement, whichever comes
    /// first: taking the writer would roll the catch-up back. Lost if the database closes first,
    /// it leaves only the peer's record behind, which its next acknowledgement brings up to date.
    public func acknowledge(peer: InstanceKey, through sequence: Int64) throws {
        let engine = try engine()
        // An applier is running from the staging of its first batch on: one whose thread has not
        // taken the writer yet would be made to give it up as soon as it did.
        if writerWaits.someoneHoldsForLong || sync.catchUpAppliers.anyRunning,
            try read({ conn in try Self.acknowledgementMovesOnlyTheRecord(of: peer, through: sequence, conn) })
        {
            // Through 0 no change is acknowledged (sequences start at 1), and the record holds it already.
            if sequence > 0 { sync.postponedAcknowledgements.postpone(peer, through: sequence) }
            return
        }
        let recorded = try write { conn in
            let earlier = try recordPostponedAcknowledgements(conn)
            try Self.recordAcknowledgement(by: peer, through: sequence, engine, conn)
            return earlier
        }
        sync.postponedAcknowledgements.recorded(recorded)
    }

    /// Records the acknowledgements postponed while the writer was held (see `acknowledge`), in
    /// the transaction of `connection`, the writer's: what was recorded, to be passed to
    /// `PostponedAcknowledgements.recorded` once that transaction commits.
    func recordPostponedAcknowledgements(_ connection: Connection) throws -> [PostponedAcknowledgements.Entry] {
        let postponed = sync.postponedAcknowledgements.pending
        guard !postponed.isEmpty else { return [] }
        let engine = try engine()
        for earlier in postponed {
            try Self.recordAcknowledgement(by: earlier.peer, through: earlier.through, engine, connection)
        }
        return postponed
    }

    private static func recordAcknowledgement(
        by peer: InstanceKey, through sequence: Int64, _ engine: SyncEngine, _ conn: Connection
    ) throws {
        // Only the changes after this peer's previous acknowledgement are visited (those before
        // were cleared then): a long catch-up acknowledged batch by batch stays linear. An
        // acknowledgement that goes back (a full resync) visits everything. None above the
        // highest sequence ever marked in flight is.
        let peers = conn.peerStore
        let visited = try visitedSequences(
            previous: try peers.acknowledgedThrough(by: peer), through: sequence, conn)
        for table in engine.tableList {
            if let visited {
                for sql in table.layout.acknowledge { try conn.execute(sql, [visited.after, visited.through]) }
            }
            try engine.acknowledgeRanges(of: table, through: sequence, conn)
        }
        // The peer applied changes beyond a batch it had deferred: the deferral is over.
        try peers.recordAcknowledgement(by: peer, through: sequence)
        // A forgotten peer that holds every delete not kept as a tombstone counts again.
        if sequence >= (try HybridClock.collectedThrough(conn, forPeerAt: engine.sites.knownID(of: peer, conn))) {
            try peers.remember(peer)
        }
        // Rows it was told to evict or delete are gone from it.
        try conn.scopeMembership.acknowledge(peer, through: sequence)
    }

    /// The sequences (after, through] whose rows an acknowledgement through `sequence` visits, after
    /// one through `previous`; nil when none can be in flight.
    private static func visitedSequences(previous: Int64?, through sequence: Int64, _ conn: Connection) throws
        -> (after: Int64, through: Int64)?
    {
        let after = previous.flatMap { $0 < sequence ? $0 : nil } ?? Int64.min
        let through = min(sequence, try InstanceIdentity.inFlightMarkedThrough(conn) ?? .max)
        // Sequences start at 1: through 0 or below, no row.
        return through > max(after, 0) ? (after, through) : nil
    }

    /// Whether acknowledging `sequence` for `peer` would change nothing but the peer's record of
    /// what it acknowledged (and when it was last seen): no row or insert range in flight up to it,
    /// no deferral it ends, no eviction it confirms, the peer known and not forgotten.
    private static func acknowledgementMovesOnlyTheRecord(
        of peer: InstanceKey, through sequence: Int64, _ conn: Connection
    ) throws -> Bool {
        let peers = conn.peerStore
        guard let previous = try peers.acknowledgedThrough(by: peer), try peers.forgotten(peer) == nil else {
            return false
        }
        guard try visitedSequences(previous: previous, through: sequence, conn) == nil else { return false }
        return try !SyncEngine.insertRangesAwaitAcknowledgement(through: sequence, conn)
            && !peers.hasDeferral(of: peer, endingBefore: sequence)
            && !conn.scopeMembership.awaitsAcknowledgement(of: peer, through: sequence)
    }
}

/// Acknowledgements that changed no row, postponed while a catch-up held the writer (see
/// `Database.acknowledge`): the newest per peer, until recorded.
final class PostponedAcknowledgements: Sendable {
    struct Entry: Sendable, Equatable {
        var peer: InstanceKey
        var through: Int64
    }

    private let entries = Mutex<[InstanceKey: Int64]>([:])

    func postpone(_ peer: InstanceKey, through sequence: Int64) {
        entries.withLock { $0[peer] = max($0[peer] ?? .min, sequence) }
    }

    /// Those not recorded yet.
    var pending: [Entry] { entries.withLock { $0.map { Entry(peer: $0.key, through: $0.value) } } }

    /// `recorded` were committed: each goes unless a later one of its peer came meanwhile.
    func recorded(_ recorded: [Entry]) {
        guard !recorded.isEmpty else { return }
        entries.withLock { entries in
            for entry in recorded where entries[entry.peer].map({ $0 <= entry.through }) == true {
                entries[entry.peer] = nil
            }
        }
    }
}
