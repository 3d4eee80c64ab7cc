// What one apply holds while it runs, and how a piece of work runs as an apply.

import Foundation

/// What one apply (or one retry of kept-aside changes) holds while it runs.
struct ApplyContext {
    /// The insert range being filled, not yet written to `tether_insert_ranges` (range lookups see it).
    var openRange: (table: SyncedTable, range: InsertRange)?
    /// Per table, where new insert ranges may start.
    var rangeFloors: [ObjectIdentifier: Int64] = [:]
    /// The insert range the last range lookup read, for the rows after it: the changes of a batch
    /// often follow one another through one range (a scattered update of rows loaded together),
    /// and reading it takes two searches of `tether_insert_ranges` a change. Forgotten by every
    /// write to the ranges (`forgetReachedRange`); an apply writes them only through the engine.
    var reachedRange: (table: SyncedTable, range: InsertRange)?
    /// Local rows evicted by unique races.
    var evictions: [Conflict] = []
    /// The version of the changes the apply makes as this database's own (merged rows, rows that
    /// lost a unique race): one for the apply, as one local transaction has one.
    var ownVersion: LocalVersion?
}

extension SyncEngine {
    /// Runs `body` as an apply: its direct writes are the engine's own (the capture takes only
    /// their cascades), with a context of its own; the local rows it evicted are reported as conflicts.
    func whileApplying(
        _ report: inout ApplyReport, _ connection: Connection, _ body: (inout ApplyReport) throws -> Void
    ) throws {
        let outer = applying, outerRecorder = sourceTransactionRecorder
        applying = ApplyContext()
        sourceTransactionRecorder = connection.sourceTransactionRecorder
        defer {
            sourceTransactionRecorder?.sourceTransaction = nil
            applying = outer
            // The ranges the inner apply wrote may be the one the outer apply last read.
            applying?.reachedRange = nil
            sourceTransactionRecorder = outerRecorder
        }
        try capture.whileWritingPeerChanges { try body(&report) }
        report.conflicts += applying?.evictions ?? []
    }

    /// The insert range the apply is filling, when it holds `rowid` of `table`: not written yet,
    /// range lookups see it first.
    func openAppliedRange(of table: SyncedTable, containing rowid: Int64) -> InsertRange? {
        Self.range(applying?.openRange, of: table, containing: rowid)
    }

    /// The range the apply last read, when it holds `rowid` of `table` (see `ApplyContext.reachedRange`).
    func reachedRange(of table: SyncedTable, containing rowid: Int64) -> InsertRange? {
        Self.range(applying?.reachedRange, of: table, containing: rowid)
    }

    /// `held`'s range, when it is of `table` and holds `rowid`.
    private static func range(
        _ held: (table: SyncedTable, range: InsertRange)?, of table: SyncedTable, containing rowid: Int64
    ) -> InsertRange? {
        guard let held, held.table === table, rowid >= held.range.firstRowid, rowid <= held.range.lastRowid
        else { return nil }
        return held.range
    }

    /// The range a lookup just read, kept for the next while an apply runs (outside one: nothing).
    func rememberReachedRange(_ range: InsertRange, of table: SyncedTable) {
        if applying != nil { applying?.reachedRange = (table, range) }
    }

    /// Every write to `tether_insert_ranges` goes through here first: during an apply, the range it
    /// last read may be the one written.
    func forgetReachedRange() {
        if applying?.reachedRange != nil { applying?.reachedRange = nil }
    }

    /// The version of a change this apply makes as this database's own (see `ApplyContext.ownVersion`).
    func ownChangeVersion() -> LocalVersion {
        if let version = applying?.ownVersion { return version }
        let version = newLocalVersion()
        applying?.ownVersion = version
        return version
    }

    /// Observers learn which source transaction the change about to be written belongs to.
    @inline(__always)
    func willWrite(_ change: borrowing RowChange) {
        guard let recorder = sourceTransactionRecorder else { return }
        recorder.sourceTransaction = change.isEvicted ? nil : change.sourceTransaction
    }

    /// The range the apply was filling is dropped unwritten (its transaction is being abandoned).
    func dropOpenAppliedRange() {
        applying?.openRange = nil
    }
}
