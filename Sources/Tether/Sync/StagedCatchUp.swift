import Foundation

/// Where a catch-up from one source stands on this database: the batches received and held on
/// disk, not applied yet (see ``Database/receive(_:keepingMark:scope:)``).
public struct StagedCatchUp: Sendable, Equatable {
    /// The database the batches come from.
    public let source: InstanceKey
    /// The first staged batch follows this sequence of the source (this database's cursor on it).
    public let after: Int64
    /// The last staged batch ends at this sequence: the next pull starts after it.
    public let through: Int64
    /// How many batches are staged.
    public let batches: Int
    /// How many changes they hold.
    public let changes: Int
    /// The mark of the source's history that came with the newest batch that had one (§8.9).
    let mark: HistoryMark?
}

/// What became of a batch of a catch-up (``Database/receive(_:keepingMark:scope:)``).
public enum CatchUpStep: Sendable {
    /// Held on disk with the batches before it, to be applied with the catch-up's last batch.
    case staged(StagedCatchUp)
    /// Applied, with every batch staged before it, in one transaction.
    case applied(ApplyReport)
}

extension Database {
    /// Receives `batch`, one of a catch-up from its source: a batch that is not the last
    /// (`isLast` false) is staged on disk; the last is applied with every batch staged before it,
    /// in one transaction, so that readers (and observers, which see one commit) see only states
    /// the source held — each of its transactions whole, never a prefix of the catch-up, whose
    /// rows travel with their newest values. Staged batches survive a crash or a lost link:
    /// ``stagedCatchUp(from:)`` says where the next pull starts.
    ///
    /// A full resync's batches (`isResync`), and a batch that does not follow the cursor or the
    /// staged batches, are applied at once as ``apply(_:backfill:keepingMark:scope:)`` does (staged
    /// batches it does not follow are of no use any more, and go). If the apply fails, nothing
    /// is written and the staged batches go too (the catch-up starts again from the cursor),
    /// unless it failed for lack of room: they stay, to be applied once there is.
    public func receive(_ batch: ChangeBatch, keepingMark mark: HistoryMark? = nil, scope: SyncScope? = nil) throws
        -> CatchUpStep
    {
        let engine = try engine()
        let source = batch.source
        var (cursor, staged) = try read { conn in
            (
                try conn.peerStore.receiveCursor(of: source)?.receivedThrough ?? 0,
                try conn.stagedBatches.chain(from: source)
            )
        }
        if let chain = staged, batch.isResync || chain.after != cursor {
            // Of no use any more: a full resync starts from nothing, and a catch-up that no longer
            // starts at the cursor (another session moved it) is not this one.
            try discardStagedCatchUp(from: source)
            staged = nil
        }
        let follows = staged.map { $0.through == batch.after } ?? (batch.after == cursor)
        if batch.isResync || !follows {
            // Another session's batch beside a catch-up staged from the same source, or a batch
            // handed in out of order: applied alone. A staged catch-up no longer starting at the
            // cursor then goes (its session pulls again from the cursor).
            let report = try apply(batch, keepingMark: mark, scope: scope)
            if let staged, report.cursor != staged.after { try discardStagedCatchUp(from: source) }
            return .applied(report)
        }
        if !batch.isLast {
            let chain = try write { conn in
                try conn.stagedBatches.stage(batch, mark: mark)
                return try conn.stagedBatches.chain(from: source)
            }
            guard let chain else { throw SyncError.corruptMetadata("the batch staged from \(source) is gone") }
            return .staged(chain)
        }
        guard let staged else { return .applied(try apply(batch, keepingMark: mark, scope: scope)) }
        let report: ApplyReport
        do {
            report = try applyStaged(then: batch, keepingMark: mark ?? staged.mark, scope: scope, engine)
        } catch let error as DatabaseError where error.isStorageFailure {
            // Nothing was written, for lack of room: what was staged stays, applied once there is.
            throw error
        } catch {
            // Nothing was written; what was staged may be why (partial rows this database cannot
            // complete, a timestamp too far ahead): it goes, and the catch-up starts again.
            try? discardStagedCatchUp(from: source)
            throw error
        }
        if let observer = engine.conflictObserver {
            for conflict in report.conflicts { observer(conflict) }
        }
        logKeptAside(by: report, of: batch)
        return .applied(report)
    }

    /// The batches of a catch-up from `source` received and not applied yet; nil when none is.
    public func stagedCatchUp(from source: InstanceKey) throws -> StagedCatchUp? {
        try read { try $0.stagedBatches.chain(from: source) }
    }

    /// Drops the batches staged from `source` (the next catch-up fetches them again).
    public func discardStagedCatchUp(from source: InstanceKey) throws {
        try write { try $0.stagedBatches.discard(from: source) }
    }

    /// Applies the batches staged from `batch`'s source, then `batch`, in one transaction; the
    /// staged batches go with it. Short of room, once more after a checkpoint (as `apply` does).
    private func applyStaged(
        then batch: ChangeBatch, keepingMark mark: HistoryMark?, scope: SyncScope?, _ engine: SyncEngine
    ) throws -> ApplyReport {
        func applyAll(_ conn: Connection) throws -> ApplyReport {
            let store = conn.stagedBatches
            var report: ApplyReport?
            try engine.withWriterScope(scope, conn) {
                // One staged batch in memory at a time: a catch-up of millions of rows is read back
                // batch by batch.
                for id in try store.ids(from: batch.source) {
                    report.combine(with: try engine.apply(try store.batch(id), connection: conn))
                }
                report.combine(with: try engine.apply(batch, connection: conn))
            }
            if let mark { try conn.peerStore.recordHistoryMark(mark, of: batch.source) }
            try store.discard(from: batch.source)
            return report ?? ApplyReport()
        }
        do {
            return try write(applyAll)
        } catch let error as DatabaseError where error.isStorageFailure {
            guard try reclaimLogSpace() else { throw error }
            return try write(applyAll)
        }
    }
}

extension ApplyReport? {
    /// The report of a catch-up applied batch after batch: counts added, lists joined, the
    /// cursor and the sequence after from the newest, the sequence before from the first.
    mutating func combine(with next: ApplyReport) {
        guard var report = self else {
            self = next
            return
        }
        report.applied += next.applied
        report.unchanged += next.unchanged
        report.keptAside += next.keptAside
        report.stillKeptAside = next.stillKeptAside
        report.resolvedFromKeptAside += next.resolvedFromKeptAside
        report.keptForSchema += next.keptForSchema
        report.evicted += next.evicted
        report.deletedByResync += next.deletedByResync
        report.refused += next.refused
        report.conflicts += next.conflicts
        report.wasDuplicate = report.wasDuplicate && next.wasDuplicate
        report.cursor = next.cursor
        report.sequenceAfter = next.sequenceAfter
        self = report
    }
}
