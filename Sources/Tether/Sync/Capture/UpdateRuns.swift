import CSQLite
import Foundation

/// Updates of consecutive rows of one insert range, the same columns each, in one transaction:
/// `UPDATE … WHERE id = ?` in a loop over bulk-inserted rows, or one `UPDATE` of many. Giving
/// each row metadata of its own (a row in `tether_rows_T` and an entry in its sequence index)
/// made an update of a synced row cost four times a plain one; a run is cut out of its range as a
/// range of its own instead (`InsertRange.updatedVersions`), its rows' sequence numbers
/// consecutive, all at this transaction's version (`ChangeCapture.localChangeVersion`).
///
/// The run grows in memory and is written (`closeUpdateRun`) before anything else reads or writes
/// the sync metadata — another kind of change, a statement touching Tether's tables, a savepoint,
/// a bulk insert, a schema change — and at the latest before COMMIT, in the same transaction: a
/// crash loses it with the updates themselves. A run shorter than `shortestRange` rows gives its
/// rows metadata of their own, as any other update: ranges are not cut into slivers.
///
/// A class: it grows by one row per update, in place, without copying what it holds.
final class UpdateRun {
    static let shortestRange: Int64 = 16

    let table: SyncedTable
    /// The insert range the rows belong to, as stored.
    let source: InsertRange
    let firstRowid: Int64
    var lastRowid: Int64
    let firstSequence: Int64
    /// Indices of the value columns each update changed.
    let changedColumns: [Int]
    let version: LocalVersion
    /// The versions of every row of the run: the range's, with the changed columns at `version`.
    let versions: RowVersions
    let status: SyncStatus
    /// The first rowid above the run's first with metadata of its own (that row is not the
    /// range's): read when the run first grows.
    var nextOwnedRowid: Int64?

    var lastSequence: Int64 { firstSequence + (lastRowid - firstRowid) }
    var rowCount: Int64 { lastRowid - firstRowid + 1 }

    init(
        table: SyncedTable, source: InsertRange, rowid: Int64, sequence: Int64, changedColumns: [Int],
        version: LocalVersion,
        versions: RowVersions, status: SyncStatus
    ) {
        self.table = table
        self.source = source
        firstRowid = rowid
        lastRowid = rowid
        firstSequence = sequence
        self.changedColumns = changedColumns
        self.version = version
        self.versions = versions
        self.status = status
    }
}

extension ChangeCapture {
    /// The version of the transaction's local changes: one timestamp for all of them, taken at
    /// the first, so that a run of updates shares it. While a peer's batch is applied, each
    /// statement takes its own: what its rows change in turn follows the remote versions the
    /// clock has just observed.
    func localChangeVersion() -> LocalVersion {
        if !writingPeerChanges, let transactionVersion { return transactionVersion }
        let version = engine.newLocalVersion()
        if !writingPeerChanges { transactionVersion = version }
        return version
    }

    /// Begins a run with the update of `rowid`, a row of `range` without metadata of its own.
    func openUpdateRun(
        _ table: SyncedTable, range: InsertRange, rowid: Int64, changedColumns: [Int], version: LocalVersion
    ) {
        var versions = range.rowVersions
        for column in changedColumns { versions.setColumn(column, to: version, columnCount: table.valueColumns.count) }
        updateRun = UpdateRun(
            table: table, source: range, rowid: rowid, sequence: clock.nextSequence(), changedColumns: changedColumns,
            version: version, versions: versions,
            status: SyncEngine.statusAfterUpdate(range.state(ofRowid: rowid).status))
    }

    /// Adds the update of `rowid` to the run when it follows it (the next row of its range, the
    /// same columns, the next sequence number, the same status after it); false otherwise.
    func extendUpdateRun(
        _ table: SyncedTable, rowid: Int64, changedColumns: [Int], version: LocalVersion,
        _ connection: Connection
    ) throws -> Bool {
        guard !writingPeerChanges, let run = updateRun, run.table === table, rowid == run.lastRowid + 1,
            rowid <= run.source.lastRowid,
            run.version == version, clock.lastSequence == run.lastSequence, run.changedColumns == changedColumns,
            SyncEngine.statusAfterUpdate(run.source.state(ofRowid: rowid).status) == run.status
        else { return false }
        if run.nextOwnedRowid == nil {
            // Read with the run set aside: the query touches the metadata, which would write it.
            updateRun = nil
            defer { updateRun = run }
            let owned = try table.statement(.selectRowidsWithMetadata, connection)
            try owned.bind([run.firstRowid + 1, run.source.lastRowid])
            defer { owned.reset() }
            run.nextOwnedRowid = try owned.step() ? sqlite3_column_int64(owned.handle, 0) : run.source.lastRowid + 1
        }
        guard rowid < run.nextOwnedRowid ?? rowid else { return false }
        _ = clock.nextSequence()
        run.lastRowid = rowid
        return true
    }

    /// Writes the run, if any: its rows as a range cut out of theirs, or, for a short run, each
    /// with metadata of its own. A write that fails (a full disk) leaves the run to write again:
    /// until then the transaction cannot commit (`transactionShouldCommit`).
    func closeUpdateRun(_ connection: Connection) throws {
        guard let run = updateRun else { return }
        // Set aside while written: the statements that write it touch the metadata.
        updateRun = nil
        do {
            try write(run, connection)
        } catch {
            updateRun = run
            throw error
        }
    }

    /// Writes `run` (again, after a failure: every write here can be repeated).
    private func write(_ run: UpdateRun, _ connection: Connection) throws {
        let source = run.source
        guard run.rowCount >= UpdateRun.shortestRange else {
            let versions = run.versions.encoded()
            for rowid in run.firstRowid...run.lastRowid {
                try engine.stamp(
                    run.table, rowid: rowid, status: run.status, versions: versions,
                    inserted: .earlier(source.insertedSequence(ofRowid: rowid)),
                    sequence: run.firstSequence + (rowid - run.firstRowid), connection)
            }
            return
        }
        var pieces: [InsertRange] = []
        if source.firstRowid < run.firstRowid {
            var before = source
            before.lastRowid = run.firstRowid - 1
            pieces.append(before)
        }
        pieces.append(
            InsertRange(
                firstRowid: run.firstRowid, lastRowid: run.lastRowid, firstSequence: run.firstSequence,
                version: source.version,
                status: run.status, updatedVersions: run.versions,
                insertedFirstSequence: source.insertedSequence(ofRowid: run.firstRowid)))
        if run.lastRowid < source.lastRowid {
            var after = source
            let offset = run.lastRowid + 1 - source.firstRowid
            after.firstRowid += offset
            after.firstSequence += offset
            after.insertedFirstSequence = source.insertedFirstSequence.map { $0 + offset }
            pieces.append(after)
        }
        try engine.replace(source, with: pieces, of: run.table, connection)
    }

    /// Whether metadata waits in memory: an update run, counter updates.
    var hasDeferredMetadata: Bool { updateRun != nil || !counterUpdates.isEmpty }

    /// Writes what waits in memory (`hasDeferredMetadata`).
    func closeDeferredMetadata(_ connection: Connection) throws {
        try closeUpdateRun(connection)
        try closeCounterUpdates(connection)
    }

    /// Writes what waits in memory before a statement that reads or writes Tether's tables (which
    /// would otherwise miss it); other statements leave it growing. What the capture triggers
    /// touch does not count: they are paused for this connection's writes.
    func closeDeferredMetadataBefore(_ statement: Statement, _ connection: Connection) throws {
        guard hasDeferredMetadata else { return }
        let note = note(on: statement)
        if note.touchesSyncMetadata == nil {
            note.touchesSyncMetadata = try connection.accessedTables(ofSQL: statement.sql).contains {
                $0.table.hasPrefix("tether_") && !($0.trigger?.hasPrefix("tether_") ?? false)
            }
        }
        if note.touchesSyncMetadata == true { try closeDeferredMetadata(connection) }
    }
}
