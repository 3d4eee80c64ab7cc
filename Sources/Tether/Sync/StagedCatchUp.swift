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
    /// A scoped writer's changes (`scope`) are judged with the whole catch-up: a change refused in
    /// its batch (a line whose order comes in a later batch) is judged again once every batch is
    /// written, in the same transaction; only what is still refused then is in the report.
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
        let staging = try stagingFile()
        let source = batch.source
        // Decided on the cursor and the staged batches, then decided again where it is carried out:
        // another session from the same source may move the cursor or the staged batches in
        // between; then it is decided anew (at worst the batch is applied alone, which is always safe).
        for _ in 0..<3 {
            let cursor = try read { try $0.receiveCursor(of: source) }
            let staged = try staging.withStoreIfAny { try $0.chain(from: source) } ?? nil
            let plan = CatchUpPlan(for: batch, staged: staged, cursor: cursor)
            switch plan {
            case let .applyAlone(besideStaged):
                return .applied(try applyAlone(batch, besideStaged: besideStaged, keepingMark: mark, scope: scope))
            case .stage:
                let chain = try staging.withStore { store -> StagedCatchUp? in
                    guard CatchUpPlan(for: batch, staged: try store.chain(from: source), cursor: cursor) == .stage
                    else { return nil }
                    try store.discard(from: source, unlessStartingAt: cursor)
                    try store.stage(batch, mark: mark)
                    return try store.chain(from: source)
                }
                guard let chain else { continue }
                // A scoped writer's catch-up is judged whole at its end (refusals wait for later
                // batches); an in-memory database's reads take its one connection, the writer.
                if scope == nil, !isMemory {
                    sync.catchUpAppliers.offer(batch, newestOf: chain, self, engine, staging: staging)
                }
                return .staged(chain)
            case .applyWithStaged:
                let report: ApplyReport?
                do {
                    if scope == nil, let applied = sync.catchUpAppliers.finish(batch, mark: mark) {
                        report = applied
                        try? staging.withStore { try $0.discard(from: source) }
                    } else {
                        report = try applyStaged(then: batch, keepingMark: mark, scope: scope, engine, staging)
                    }
                } catch let error as DatabaseError where error.isStorageFailure {
                    // Nothing was written, for lack of room: what was staged stays, applied once there is.
                    throw error
                } catch {
                    // Nothing was written; what was staged may be why (partial rows this database
                    // cannot complete, a timestamp too far ahead): it goes, and the catch-up starts again.
                    try? discardStagedCatchUp(from: source)
                    throw error
                }
                guard let report else { continue }
                if let observer = engine.conflictObserver {
                    for conflict in report.conflicts { observer(conflict) }
                }
                logKeptAside(by: report, of: batch)
                return .applied(report)
            }
        }
        return .applied(try applyAlone(batch, besideStaged: true, keepingMark: mark, scope: scope))
    }

    /// The batches of a catch-up from `source` received and not applied yet; nil when none is.
    public func stagedCatchUp(from source: InstanceKey) throws -> StagedCatchUp? {
        try stagingFile().withStoreIfAny { try $0.chain(from: source) } ?? nil
    }

    /// Drops the batches staged from `source` (the next catch-up fetches them again).
    public func discardStagedCatchUp(from source: InstanceKey) throws {
        sync.catchUpAppliers.stop(from: source)
        try stagingFile().withStoreIfAny { try $0.discard(from: source) }
    }

    /// The file the batches of catch-ups are staged in (`<database>-catchup`).
    func stagingFile() throws -> StagingFile {
        guard let staging = sync.staging else {
            throw DatabaseError(extendedCode: 8, message: "the database is open read-only: it cannot sync")
        }
        return staging
    }

    /// Applies `batch` on its own, as ``apply(_:backfill:keepingMark:scope:)`` does. When batches
    /// were staged from its source (`besideStaged`), those that no longer start at the cursor then
    /// go (its session pulls again from the cursor), and a full resync, which starts from nothing,
    /// drops them first. Nothing staged (every live batch): no more than the apply.
    private func applyAlone(
        _ batch: ChangeBatch, besideStaged: Bool, keepingMark mark: HistoryMark?, scope: SyncScope?
    ) throws -> ApplyReport {
        let source = batch.source
        if besideStaged, batch.isResync { try discardStagedCatchUp(from: source) }
        let report = try apply(batch, keepingMark: mark, scope: scope)
        if besideStaged, !batch.isResync {
            let cursor = try read { try $0.receiveCursor(of: source) }
            try stagingFile().withStoreIfAny { try $0.discard(from: source, unlessStartingAt: cursor) }
        }
        return report
    }

    /// Applies the batches staged from `batch`'s source, then `batch`, in one transaction; the
    /// staged batches go once it commits. Short of room, once more after a checkpoint (as `apply`
    /// does). Nil, with nothing written, when the staged batches changed since the plan was made.
    private func applyStaged(
        then batch: ChangeBatch, keepingMark mark: HistoryMark?, scope: SyncScope?, _ engine: SyncEngine,
        _ staging: StagingFile
    ) throws -> ApplyReport? {
        var recordedAcknowledgements: [PostponedAcknowledgements.Entry] = []
        func applyAll(_ conn: Connection) throws -> ApplyReport? {
            let source = batch.source
            let cursor = try conn.receiveCursor(of: source)
            let (staged, ids) = try staging.withStore { store in
                (try store.chain(from: source), try store.ids(from: source))
            }
            guard CatchUpPlan(for: batch, staged: staged, cursor: cursor) == .applyWithStaged, let staged else {
                return nil
            }
            let mark = mark ?? staged.mark
            var report: ApplyReport?
            try engine.withWriterScope(scope, conn) {
                // A scoped writer's changes are judged with the whole catch-up, as a transaction of
                // its source's is: what a batch refuses waits for the batches after it.
                let waiting = WaitingRefusals()
                // Two staged batches in memory at a time (the one applied, the next one decoding): a
                // catch-up of millions of rows is read back batch by batch.
                var readAhead = StagedBatchReadAhead(staging, ids: ids)
                while let staged = try readAhead.next() {
                    report.combine(with: try engine.apply(staged, connection: conn, refusalsWaitIn: waiting))
                    readAhead.release(consume staged)
                }
                report.combine(with: try engine.apply(batch, connection: conn, refusalsWaitIn: waiting))
                try engine.judgeAgain(waiting, of: source, into: &report, conn) { place in
                    place < ids.count ? try staging.withStore { try $0.batch(ids[place]) } : batch
                }
            }
            if let mark { try conn.peerStore.recordHistoryMark(mark, of: source) }
            // Those postponed for an applier that gave the writer up go with the catch-up.
            recordedAcknowledgements = try recordPostponedAcknowledgements(conn)
            return report ?? ApplyReport()
        }
        let report: ApplyReport?
        do {
            report = try write(applyAll)
        } catch let error as DatabaseError where error.isStorageFailure {
            guard try reclaimLogSpace() else { throw error }
            report = try write(applyAll)
        }
        if report != nil { sync.postponedAcknowledgements.recorded(recordedAcknowledgements) }
        // Applied: the staged batches are of no use any more (left behind by a crash now, they
        // would no longer start at the cursor, and go with the next batch).
        if report != nil { try? staging.withStore { try $0.discard(from: batch.source) } }
        return report
    }
}

/// What to do with a batch of a catch-up, given this database's cursor on its source and the
/// batches staged from it.
private enum CatchUpPlan: Equatable {
    /// Not the last batch, and it follows the cursor or the staged batches: staged.
    case stage
    /// The last batch, following staged batches that start at the cursor: applied with them.
    case applyWithStaged
    /// A full resync's batch, a last batch with nothing staged, or a batch that follows neither
    /// the cursor nor the staged batches (another session's, beside this catch-up): applied alone;
    /// `besideStaged` when batches were staged from its source, of which some may then go.
    case applyAlone(besideStaged: Bool)

    init(for batch: ChangeBatch, staged chain: StagedCatchUp?, cursor: Int64) {
        guard !batch.isResync else {
            self = .applyAlone(besideStaged: chain != nil)
            return
        }
        // Staged batches that no longer start at the cursor (another session moved it) are not
        // this catch-up: the batch is judged as if none were staged.
        let staged = chain.flatMap { $0.after == cursor ? $0 : nil }
        guard batch.after == (staged?.through ?? cursor) else {
            self = .applyAlone(besideStaged: chain != nil)
            return
        }
        if !batch.isLast {
            self = .stage
        } else {
            self = staged == nil ? .applyAlone(besideStaged: chain != nil) : .applyWithStaged
        }
    }
}

extension Connection {
    /// This database's cursor on `source`: the sequence its changes were applied through.
    fileprivate func receiveCursor(of source: InstanceKey) throws -> Int64 {
        try peerStore.receiveCursor(of: source)?.receivedThrough ?? 0
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
