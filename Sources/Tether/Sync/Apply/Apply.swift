// Applying a peer's batch: the entry point, the checks made before anything is written, the
// cursor, and the loop over its changes. Each concept it uses has its own file in this folder.

import Foundation

enum ChangeOutcome {
    case applied, unchanged
    case keptAside(String)
}

extension SyncEngine {
    /// Applies a batch from a peer in the current transaction, with the peer's cursor. A
    /// `backfill` batch (rows of columns or tables newly shared with the peer, §8.3) is applied
    /// whatever the cursor, and leaves it where it is.
    ///
    /// `waiting`: the batch is one of a staged catch-up (`Database.receive`), and a scoped writer's
    /// changes it refuses are not refused yet: they wait there to be judged again once the whole
    /// catch-up is written (`judgeAgain`). Nil: what the batch refuses is refused for good.
    func apply(
        _ batch: ChangeBatch, backfill: Bool = false, connection: Connection,
        refusalsWaitIn waiting: WaitingRefusals? = nil
    ) throws -> ApplyReport {
        try asChange(of: batch.source, connection) {
            try ensureNotACopy()
            try ensureHistoryHolds(for: batch.source, connection)
            waiting?.startBatch()
            let report = try applyWithoutWritingClock(batch, backfill: backfill, connection: connection, waiting)
            // The clock the batch moved is written now, not as the transaction commits: a database
            // that syncs no table yet (its changes all kept for a later schema) has no capture
            // listening for the COMMIT, and the commit hook would refuse an unwritten clock
            // (SQLITE_CONSTRAINT_COMMITHOOK).
            try clock.write(connection)
            return report
        }
    }

    /// Runs `body` with what it writes counted as `writer`'s change by observers (an import's
    /// batches stay an import's).
    func asChange<T>(of writer: InstanceKey, _ connection: Connection, _ body: () throws -> T) throws -> T {
        guard case .local = connection.changeOrigin else { return try body() }
        return try connection.withChangeOrigin(.peer(writer), body)
    }

    private func applyWithoutWritingClock(
        _ batch: ChangeBatch, backfill: Bool, connection: Connection, _ waiting: WaitingRefusals?
    ) throws -> ApplyReport {
        var report = ApplyReport()
        guard batch.source != instanceKey else {
            throw SyncError.schemaMismatch("the batch comes from this database itself (instance \(instanceKey))")
        }
        // Decoded batches were validated already; one built in code was not.
        do { try batch.validate() } catch { throw SyncError.invalidBatch(error) }
        try capture.foldExternalWritesIfAny(connection)
        try prepareClock(connection)
        report.sequenceBefore = clock.lastSequence
        report.sequenceAfter = clock.lastSequence
        // Rows that expire on the peer expire here too: their expiries come in a table of ours
        // (synced wherever a table is), whose dates are read again after the apply.
        let carriesExpiry = batch.tables.contains { $0.name == ExpiryStore.syncedTable }
        // A table no database syncs is refused, not kept for a later schema that can never come.
        try checkTableNames(of: batch)
        // What needs this database's state is checked before anything is written, too.
        let mappings = try batch.tables.map { try mapping($0) }
        try ExpiryStore.checkEntries(of: batch, self)
        try clock.observe(try latestTimestamp(of: batch))

        let peers = connection.peerStore
        let collectedForSource = try HybridClock.collectedThrough(
            connection, forPeerAt: sites.knownID(of: batch.source, connection))
        if try peers.mustResyncBeforeSending(batch.source, collectedThrough: collectedForSource) {
            throw SyncError.awaitingResync(peer: batch.source)
        }
        let cursor = try peers.registeringReceiveCursor(of: batch.source)
        let received = cursor.receivedThrough
        var resyncFrom = cursor.resyncFrom
        report.cursor = received
        if !backfill && !batch.isResync && batch.through <= received && batch.after <= received {
            report.wasDuplicate = true
            return report
        }
        _ = try sites.id(of: batch.source, connection)

        if batch.isResync && batch.after == 0 && !backfill {
            // A full resync starts: rows it does not mention will be removed at its end.
            resyncFrom = clock.lastSequence
            try peers.startResync(from: batch.source, at: clock.lastSequence)
        }

        try whileApplying(&report, connection) { report in
            try connection.withoutCapture(.exceptCascades) {
                try applyChanges(
                    batch, mappings, resyncFrom: resyncFrom, backfill: backfill, refusalsWaitIn: waiting, connection,
                    &report)
            }
        }
        // A batch that starts after the cursor leaves a gap: its changes are
        // applied (they merge by version) but the cursor waits for the gap.
        if !backfill && (batch.after <= received || batch.isResync) {
            report.cursor = batch.isResync && batch.after == 0 ? batch.through : max(received, batch.through)
            try peers.recordReceived(from: batch.source, through: report.cursor)
        }
        if !backfill, batch.isLast, let resyncFrom, report.cursor >= batch.through {
            var deletedThere: [(table: SyncedTable, rowid: Int64)] = []
            try whileApplying(&report, connection) { _ in
                try connection.withoutCapture(.exceptCascades) {
                    deletedThere = try finishResync(from: batch.source, startedAt: resyncFrom, connection)
                }
            }
            // Captured as this database's own deletes: peers that still hold these rows are told.
            for (table, rowid) in deletedThere { try table.statement(.deleteLiveByRowid, connection).execute([rowid]) }
            report.deletedByResync = deletedThere.count
        }
        report.stillKeptAside = try connection.keptAside.count()
        report.sequenceAfter = clock.lastSequence
        if carriesExpiry { try ExpiryStore.load(self, connection) }
        return report
    }

    /// Refuses a batch that names a table no database can sync (§7.2, rules checked by the receiver,
    /// 2): one of Tether's or SQLite's own (`tether_…`, `sqlite_…`, in any case) other than the synced
    /// expiry store, or a name holding U+0000, which no SQLite table has. A table that merely is
    /// not synced here (yet) is kept for the migration that syncs it.
    func checkTableNames(of batch: ChangeBatch) throws {
        for table in batch.tables where tables[table.name] == nil {
            if table.name.utf8.contains(0) {
                throw SyncError.invalidTable(
                    """
                    the batch names a table whose name holds U+0000, which no table can have; nothing of it was \
                    applied
                    """)
            }
            if SyncedTable.isInternal(table.name) && table.name != ExpiryStore.syncedTable {
                throw SyncError.invalidTable(
                    """
                    the batch names table \(table.name), one of Tether's or SQLite's own, which no database syncs;\
                     nothing of it was applied
                    """)
            }
        }
    }

    /// The batch's latest timestamp, for the clock to observe (which refuses one from the future
    /// of this machine's clock). A version attributed to this database that is later than its
    /// clock, which is at or after every timestamp this database issued, was never written here:
    /// the batch is refused whole (§7.2).
    func latestTimestamp(of batch: ChangeBatch) throws -> HybridTimestamp {
        var latest = HybridTimestamp.zero
        for (index, change) in batch.changes.enumerated() {
            func check(_ version: Version) throws {
                latest = max(latest, version.timestamp)
                guard version.origin != instanceKey || version.timestamp <= clock.latest else {
                    throw SyncError.forgedVersion(
                        "change \(index) to table \(batch.tables[change.table].name) carries a version of this "
                            + "database (instance \(instanceKey)) at \(version.timestamp), later than every "
                            + "timestamp it issued (its clock is at \(clock.latest))")
                }
            }
            try check(change.existence)
            for version in change.versions { try check(version) }
        }
        return latest
    }

    /// Whether every version of a change is this database's own: an echo of its own write, which it
    /// knows better than any peer (`latestTimestamp(of:)` refused those it never wrote).
    func isEcho(_ change: borrowing RowChange) -> Bool {
        change.existence.origin == instanceKey && change.versions.allSatisfy { $0.origin == instanceKey }
    }

    func applyChanges(
        _ batch: ChangeBatch, _ mappings: [TableMapping?], resyncFrom: Int64?, backfill: Bool = false,
        refusalsWaitIn waiting: WaitingRefusals?, _ connection: Connection,
        _ report: inout ApplyReport
    ) throws {
        let holdsWritten = try holdsWritten(batch, mappings, connection)
        if let scope = writerScope {
            let judged = WriterBatch(
                changes: batch, mappings: mappings, holdsWritten: holdsWritten,
                checks: try writerChecks(scope: scope, writer: batch.source, connection), resyncFrom: resyncFrom,
                backfill: backfill)
            try applyJudging(judged, refusalsWaitIn: waiting, connection, &report)
        } else {
            // Runs of new rows go through `insertNewRows`; every other change through `applyChange(at:)`.
            try batch.changes.withUnsafeBufferPointer { changes in
                var index = 0
                while index < changes.count {
                    let (next, insertRefused) = try insertNewRows(
                        from: index, changes, of: batch, mappings, holdsWritten: holdsWritten,
                        resyncFrom: resyncFrom, connection, &report)
                    guard next < changes.count else { break }
                    let table = changes[next].table
                    try applyChange(
                        at: next, changes[next], of: batch, mappings[table], holdsWritten: holdsWritten[table],
                        insertRefused: insertRefused,
                        resyncFrom: resyncFrom, backfill: backfill, connection, &report)
                    index = next + 1
                }
            }
        }
        try closeOpenRange(connection)
        try retryKeptAside(connection, &report)
    }

    /// Whether a change to each table of `batch` is recorded as held by the batch's source: a table
    /// this database sends the source in part (or will: its writes are scoped), as what it sends
    /// there, the source holds. Decided per table of the batch, not per change.
    func holdsWritten(_ batch: ChangeBatch, _ mappings: [TableMapping?], _ connection: Connection) throws -> [Bool] {
        let tablesScopedForSource = Set(try connection.scopeMembership.rules(of: batch.source).keys)
        return mappings.map { mapping in
            mapping.map { tablesScopedForSource.contains($0.table.name) || writerScope?.rules[$0.table.name] != nil }
                ?? false
        }
    }

    /// Applies the changes from `first` on while each is a new row that joins an insert range when
    /// its key is free (a first sync's common case; see `joinsInsertRange`), capture suspended once
    /// for all of them rather than once per row. Returns the first change it left, and whether that
    /// one was refused as a new row (its key, or another unique value, is taken here).
    private func insertNewRows(
        from first: Int, _ changes: UnsafeBufferPointer<RowChange>, of batch: ChangeBatch, _ mappings: [TableMapping?],
        holdsWritten: [Bool], resyncFrom: Int64?, _ connection: Connection,
        _ report: inout ApplyReport
    ) throws -> (next: Int, insertRefused: Bool) {
        // What `applyChange(at:)` would do before inserting: nothing, for these (no scope to check,
        // nothing held for a scoped writer, no columns to keep for a later schema, not an echo).
        func rangeMapping(_ change: borrowing RowChange) -> TableMapping? {
            guard !holdsWritten[change.table], let mapping = mappings[change.table], mapping.projection == nil,
                joinsInsertRange(change, mapping), !(isEcho(change) && resyncFrom != -1)
            else { return nil }
            return mapping
        }
        guard first < changes.count, rangeMapping(changes[first]) != nil else { return (first, false) }
        var next = first
        var insertRefused = false
        try connection.withoutCapture(.everything) {
            while next < changes.count, let mapping = rangeMapping(changes[next]) {
                // `rangeMapping` checked what `insertIfAbsent` would: the row joins an insert range.
                willWrite(changes[next])
                guard mapping.localIndex.count == mapping.table.valueColumns.count,
                    try insertIntoRange(
                        key: changes[next].key, values: changes[next].values, existence: changes[next].existence,
                        mapping.table,
                        from: batch.source, connection)
                else {
                    insertRefused = true
                    return
                }
                report.applied += 1
                next += 1
            }
        }
        return (next, insertRefused)
    }

    /// Applies change `index` of `batch`, `change`, mapped by `mapping` (nil: a table not synced here).
    /// `insertRefused`: the change was tried as a new row, and refused. `checks`: the writer is
    /// scoped, and its change is checked first.
    /// Returns why the writer's change is refused (nothing written), nil when it was applied.
    @discardableResult
    func applyChange(
        at index: Int, _ change: borrowing RowChange, of batch: ChangeBatch, _ mapping: TableMapping?,
        holdsWritten: Bool,
        insertRefused: Bool = false, checks: WriterChecks? = nil, resyncFrom: Int64?, backfill: Bool,
        _ connection: Connection, _ report: inout ApplyReport
    ) throws -> String? {
        if change.isEvicted {
            // A row that left this database's scope: nothing to keep for a later schema either.
            if let mapping, try evict(change, mapping.table, from: batch.source, connection) { report.evicted += 1 }
            return nil
        }
        if let checks, let mapping {
            switch try writerVerdict(of: change, mapping, checks, connection) {
            case .applied: break
            case .nothingToWrite:
                report.unchanged += 1
                return nil
            case let .refused(reason): return reason
            }
        }
        if change.isAlive, holdsWritten, let mapping {
            try holdWritten(change, table: mapping.table, writer: batch.source, connection)
        }
        guard let mapping else {
            // A table not synced here (yet): the change waits for a migration that syncs it.
            try keepForSchema(change, table: batch.tables[change.table], from: batch.source, missing: [], connection)
            report.keptForSchema += 1
            return nil
        }
        guard mapping.projection == nil else {
            // Columns this database lacks (yet): kept whole, applied without them now.
            try keepForSchema(
                change, table: batch.tables[change.table], from: batch.source, missing: mapping.unknownColumns,
                connection)
            report.keptForSchema += 1
            try settle(
                mapping.projected(change), at: index, of: batch, mapping, resyncFrom: resyncFrom, backfill: backfill,
                connection, &report)
            return nil
        }
        try settle(
            change, at: index, of: batch, mapping, insertRefused: insertRefused, resyncFrom: resyncFrom,
            backfill: backfill, connection, &report)
        return nil
    }

    /// Merges `change` (change `index` of `batch`, mapped onto the columns there are here) into the
    /// local row, and counts what came of it.
    private func settle(
        _ change: borrowing RowChange, at index: Int, of batch: ChangeBatch, _ mapping: TableMapping,
        insertRefused: Bool = false,
        resyncFrom: Int64?, backfill: Bool, _ connection: Connection, _ report: inout ApplyReport
    ) throws {
        // Echoes change nothing, but while this database asks for its own rows back (after a
        // full resync removed rows it could not tell from rows deleted long ago: `finishResync`).
        // A backfill's echo of a row this database no longer has (evicted when it left this
        // database's scope, or dropped when refused) is the row coming back: applied.
        // A counter's state may hold contributions this database lacks, whoever wrote it last.
        let isKnownEcho =
            try isEcho(change) && resyncFrom != -1 && !carriesCounterStates(change, mapping)
            && !(backfill && change.isAlive && localRow(mapping.table, change.key, connection) == nil)
        let outcome =
            isKnownEcho
            ? .unchanged
            : try applyChange(change, mapping, from: batch.source, insertRefused: insertRefused, connection, &report)
        switch outcome {
        case .applied: report.applied += 1
        case .unchanged:
            report.unchanged += 1
            if resyncFrom != nil && change.isAlive { try markSeen(change, mapping.table, by: batch.source, connection) }
        case let .keptAside(reason):
            // Kept as received: a retry maps it again (onto the columns there are then).
            try connection.keptAside.keep(
                batch.changes[index], table: batch.tables[change.table], from: batch.source, reason: reason)
            report.keptAside += 1
        }
    }
}
