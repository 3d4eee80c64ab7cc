// A scoped writer's changes judged against its scope as they are applied: a change refused is
// judged again once the rest of its batch is written, and, in a staged catch-up, once the whole
// catch-up is; only then is a refusal final (reported, and what the writer held of the row forgotten).

import Foundation

/// A batch of a scoped writer's changes, with what applying them needs.
struct WriterBatch {
    let changes: ChangeBatch
    /// The mapping of each table of the batch (nil: not synced here).
    let mappings: [TableMapping?]
    /// Whether a change to each table of the batch is recorded as held by the writer.
    let holdsWritten: [Bool]
    let checks: WriterChecks
    let resyncFrom: Int64?
    let backfill: Bool
}

/// The changes of a scoped writer's staged catch-up refused so far, waiting to be judged again once
/// the whole catch-up is written (`SyncEngine.judgeAgain`), in its transaction: a child the capture
/// numbered before its parent may come a batch before it, and is inside the writer's scope only
/// once the parent is written.
///
/// Only where each change waits is held — its batch's place in the catch-up and its index there —
/// never the change, which is read again from its batch: a hostile writer's catch-up of millions of
/// refused changes costs 8 bytes each here, however large its rows.
final class WaitingRefusals {
    /// The indices of refused changes in the batch at `place` (0: the catch-up's first batch).
    struct Positions {
        let place: Int
        var indices: [Int]
    }

    /// How many batches of the catch-up were applied, the one being applied included.
    private var batchesApplied = 0
    /// The refused rows, by batch in the order they came, then the refused expiry entries (judged
    /// after the rows, as in a batch: an entry is judged by the row it names).
    private(set) var rows: [Positions] = []
    private(set) var entries: [Positions] = []

    var isEmpty: Bool { rows.isEmpty && entries.isEmpty }

    /// At most this many changes wait (8 MiB of indices): what a writer has refused beyond that
    /// (a hostile one refusing millions) is refused for good at its batch's end, as outside a catch-up.
    static let limit = 1 << 20
    private var count = 0

    /// Whether `more` refused changes may still wait.
    func hasRoom(for more: Int) -> Bool { count + more <= Self.limit }

    /// The next batch of the catch-up is being applied.
    func startBatch() { batchesApplied += 1 }

    /// Changes `indices` of the batch being applied were refused: they wait.
    func wait(_ indices: [Int], entries areEntries: Bool) {
        guard !indices.isEmpty else { return }
        count += indices.count
        let positions = Positions(place: batchesApplied - 1, indices: indices)
        if areEntries { entries.append(positions) } else { rows.append(positions) }
    }
}

extension SyncEngine {
    /// Applies `batch` change by change (no insert ranges: each is judged first); a change refused
    /// is judged again once the rest of the batch is written (a line numbered before its order,
    /// written in one transaction, is inside the writer's scope once the order is), its expiry
    /// entries last (an entry is judged by the row it names as the batch leaves it). What stays
    /// refused waits in `waiting` when it is given (the batch is one of a staged catch-up), and is
    /// refused for good otherwise.
    func applyJudging(
        _ batch: WriterBatch, refusalsWaitIn waiting: WaitingRefusals?, _ connection: Connection,
        _ report: inout ApplyReport
    ) throws {
        let entries = batch.changes.tables.firstIndex { $0.name == ExpiryStore.syncedTable }
        for entriesPass in [false, true] {
            // Passes are bounded by the depth of the scope's references, so a hostile batch
            // cannot make them quadratic.
            var left = batch.changes.changes.indices.filter {
                (batch.changes.changes[$0].table == entries) == entriesPass
            }
            var refusals: [(index: Int, reason: String)] = []
            for _ in 0...batch.checks.scope.rules.count {
                refusals = try applyJudgingOnce(left, of: batch, connection, &report)
                guard !refusals.isEmpty, refusals.count < left.count else { break }
                left = refusals.map(\.index)
            }
            if let waiting, waiting.hasRoom(for: refusals.count) {
                waiting.wait(refusals.map(\.index), entries: entriesPass)
            } else {
                try refuse(refusals, of: batch, connection, &report)
            }
        }
    }

    /// Judges again the changes of a staged catch-up from `writer` that its batches refused, now
    /// that the whole catch-up is written (its rows first, then its expiry entries), in the
    /// catch-up's transaction; what stays refused is refused for good. `batch` reads the
    /// catch-up's batch at a place again (one at a time: a catch-up may be far larger than memory).
    func judgeAgain(
        _ waiting: WaitingRefusals, of writer: InstanceKey, into catchUpReport: inout ApplyReport?,
        _ connection: Connection, batch: (Int) throws -> ChangeBatch
    ) throws {
        guard let scope = writerScope, !waiting.isEmpty, var report = catchUpReport else { return }
        let checks = try writerChecks(scope: scope, writer: writer, connection)
        let resyncFrom = try connection.peerStore.receiveCursor(of: writer)?.resyncFrom
        func read(_ place: Int) throws -> WriterBatch {
            let changes = try batch(place)
            let mappings = try changes.tables.map { try mapping($0) }
            return WriterBatch(
                changes: changes, mappings: mappings, holdsWritten: try holdsWritten(changes, mappings, connection),
                checks: checks, resyncFrom: resyncFrom, backfill: false)
        }
        try asChange(of: writer, connection) {
            try whileApplying(&report, connection) { report in
                try connection.withoutCapture(.exceptCascades) {
                    for phase in [waiting.rows, waiting.entries] {
                        try judgeAgain(phase, passes: scope.rules.count + 1, read, connection, &report)
                    }
                    try closeOpenRange(connection)
                    try retryKeptAside(connection, &report)
                }
            }
            try clock.write(connection)
        }
        report.stillKeptAside = try connection.keptAside.count()
        report.sequenceAfter = clock.lastSequence
        catchUpReport = report
    }

    /// Judges again the changes at `waiting`, in at most `passes` passes as a batch's are: a pass
    /// that accepts nothing ends them, after one more that finds the same and refuses for good —
    /// so that the reasons are never held for all the waiting changes at once. Each pass reads
    /// again only the batches that hold waiting changes.
    private func judgeAgain(
        _ waiting: [WaitingRefusals.Positions], passes: Int, _ read: (Int) throws -> WriterBatch,
        _ connection: Connection, _ report: inout ApplyReport
    ) throws {
        var left = waiting
        var accepted = true
        for pass in 1...passes where !left.isEmpty {
            let isFinal = pass == passes || !accepted
            var refused: [WaitingRefusals.Positions] = []
            accepted = false
            for positions in left {
                let batch = try read(positions.place)
                let refusals = try applyJudgingOnce(positions.indices, of: batch, connection, &report)
                accepted = accepted || refusals.count < positions.indices.count
                if isFinal {
                    try refuse(refusals, of: batch, connection, &report)
                } else if !refusals.isEmpty {
                    refused.append(.init(place: positions.place, indices: refusals.map(\.index)))
                }
            }
            left = isFinal ? [] : refused
        }
    }

    /// Applies the changes of `batch` at `indices`, each judged first; returns those refused
    /// (nothing of them written), with why.
    private func applyJudgingOnce(
        _ indices: [Int], of batch: WriterBatch, _ connection: Connection, _ report: inout ApplyReport
    ) throws -> [(index: Int, reason: String)] {
        var refusals: [(index: Int, reason: String)] = []
        for index in indices {
            let change = batch.changes.changes[index]
            if let reason = try applyChange(
                at: index, change, of: batch.changes, batch.mappings[change.table],
                holdsWritten: batch.holdsWritten[change.table], checks: batch.checks,
                resyncFrom: batch.resyncFrom, backfill: batch.backfill, connection, &report)
            {
                refusals.append((index, reason))
            }
        }
        return refusals
    }

    /// Refuses `refusals` of `batch` for good: outside the writer's scope, or claiming another peer's
    /// key, they were not written; they are reported for the writer to record, and what this
    /// database held of their rows for the writer is forgotten.
    private func refuse(
        _ refusals: [(index: Int, reason: String)], of batch: WriterBatch, _ connection: Connection,
        _ report: inout ApplyReport
    ) throws {
        guard !refusals.isEmpty else { return }
        // Each refusal names its source transaction and how much of it the batch refused: the rest
        // of the transaction was accepted (judged with the whole batch written, `applyJudging`).
        var sizes: [SourceTransaction: Int] = [:], refusedOf: [SourceTransaction: Int] = [:]
        for change in batch.changes.changes { sizes[change.sourceTransaction, default: 0] += 1 }
        for (index, _) in refusals { refusedOf[batch.changes.changes[index].sourceTransaction, default: 0] += 1 }
        for (index, reason) in refusals {
            let change = batch.changes.changes[index]
            guard let mapping = batch.mappings[change.table] else { continue }
            let transaction = change.sourceTransaction
            let refused = refusedOf[transaction] ?? 1, size = sizes[transaction] ?? 1
            let extent =
                refused == size
                ? "refused whole (\(size) change\(size == 1 ? "" : "s") in the batch)"
                : "\(refused) of its \(size) changes in the batch refused, the others accepted"
            report.refused.append(
                RefusedChange(
                    table: mapping.table.name, key: change.key, sequence: change.sequence,
                    reason: "\(reason) [transaction \(transaction): \(extent)]", sourceTransaction: transaction))
            try forgetRefused(change, table: mapping.table, writer: batch.changes.source, connection)
        }
    }
}
