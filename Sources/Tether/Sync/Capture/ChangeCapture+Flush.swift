import CSQLite
import Foundation

extension ChangeCapture {
    /// `flush` when a statement captured changes or a trigger recorded some.
    @inline(__always)
    func flushIfNeeded(_ connection: Connection) throws {
        if !pending.isEmpty || externalWrites.foldNeeded { try flush(connection) }
    }

    /// Gives the changes of the statement that just finished their sequence
    /// numbers, versions and status, in the same transaction.
    func flush(_ connection: Connection) throws {
        if let refusal {
            self.refusal = nil
            pending.removeAll()
            forgetCounterWrites()
            throw refusal
        }
        // A counter's contribution is the difference from the value before: other programs' writes
        // to it, committed since the last look, are folded first (their differences are queued).
        if !counterWrites.isEmpty, tables.list.contains(where: { $0.hasCounters && $0.capturesExternalWrites }) {
            try noticeExternalWrites(connection)
        }
        if externalWrites.foldNeeded {
            // The statement's changes wait aside: the fold's own statements end in `flushIfNeeded`
            // too, and must not stamp them before what other programs wrote earlier.
            var waiting: [CapturedChange] = []
            swap(&waiting, &pending)
            defer { pending = waiting + pending }
            try closeDeferredMetadata(connection)
            try foldExternalChanges(connection)
        }
        guard !pending.isEmpty else { return }
        // Taken whole (its buffer handed back below): a copy would allocate per statement.
        var changes: [CapturedChange] = []
        swap(&changes, &pending)
        defer {
            if pending.isEmpty {
                changes.empty()
                swap(&changes, &pending)
            }
        }
        try engine.prepareClock(connection)
        let version = localChangeVersion()
        for change in changes {
            if case let .updated(table, rowid, oldRowid, changedColumns) = change, rowid == oldRowid {
                if table.hasCounters, !writingPeerChanges {
                    try closeUpdateRun(connection)
                    try deferCounterUpdate(table, rowid: rowid, changedColumns: changedColumns, version: version)
                    continue
                }
                if try extendUpdateRun(
                    table, rowid: rowid, changedColumns: changedColumns, version: version, connection)
                {
                    continue
                }
            }
            try closeDeferredMetadata(connection)
            switch change {
            case let .inserted(table, rowid):
                try engine.stampInserted(
                    table, rowid: rowid, versions: RowVersions.uniform(version).encoded(), connection)
            case let .updated(table, rowid, oldRowid, changedColumns):
                let stored = try engine.storedState(table, rowid: oldRowid, connection)
                if rowid == oldRowid, !writingPeerChanges, case let .inRange(range, _)? = stored {
                    openUpdateRun(table, range: range, rowid: rowid, changedColumns: changedColumns, version: version)
                    continue
                }
                let before = stored?.state
                var versions = before?.versions ?? .uniform(version)
                for column in changedColumns {
                    versions.setColumn(column, to: version, columnCount: table.valueColumns.count)
                }
                // A row whose rowid moved keeps its counters' states.
                let carried =
                    oldRowid != rowid && table.hasCounters
                    ? try engine.rowCounters(table, rowid: oldRowid, connection) : nil
                if oldRowid != rowid { try table.statement(.deleteRowMetadata, connection).execute([oldRowid]) }
                try engine.stamp(
                    table, rowid: rowid, status: SyncEngine.statusAfterUpdate(before?.status ?? .created),
                    versions: versions.encoded(),
                    inserted: .earlier(before?.insertedSequence), connection)
                if table.hasCounters {
                    try recordCounterWrites(
                        table, rowid: rowid, carrying: carried, before: before?.versions, version: version, connection)
                }
            case let .moved(table, from, to):
                try table.statement(.moveRowMetadata, connection).execute([to, from])
            case let .deleted(table, rowid, key, values):
                try bury(table, rowid: rowid, key: key, values: values, at: version, connection)
            }
        }
        // Writes to rows the statement then deleted (or moved by their key) count for nothing.
        forgetCounterWrites()
    }

    /// A live row deleted locally: its key and values go to its tombstone with a deletion
    /// version, its own metadata goes.
    func bury(
        _ table: SyncedTable, rowid: Int64, key: [DatabaseValue], values: [DatabaseValue], at version: LocalVersion,
        _ connection: Connection
    ) throws {
        var versions = try engine.rowState(table, rowid: rowid, connection)?.versions ?? .uniform(version)
        versions.markDeleted(at: version, columnCount: table.valueColumns.count)
        try table.statement(.upsertDead, connection)
            .execute(
                StatementArguments(
                    values: key + values + [
                        .integer(clock.nextSequence()), .integer(Int64(SyncStatus.deleted.rawValue)),
                        .integer(0), .blob(Data(versions.encoded())), .null,
                    ]))
        try table.statement(.deleteRowMetadata, connection).execute([rowid])
        table.mayHaveDeadRows = true
    }
}
