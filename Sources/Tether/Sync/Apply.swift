import CSQLite
import Foundation

/// The local state of a row: live in its table, dead in its tombstone table, or absent.
private struct LocalRow {
    var rowid: Int64?          // nil when dead
    var values: [DatabaseValue]
    var versions: RowVersions
    var status: SyncStatus
    var inFlight: Bool
    var isAlive: Bool { rowid != nil }
    var isPending: Bool { status != .synced || inFlight }
}

/// How a batch's table maps onto the local one.
struct TableMapping {
    let table: SyncedTable
    /// Per remote value column (of those kept, see `projection`), the local value column.
    let localIndex: [Int]
    /// Every local value column, in the local order: a change binds straight into an insert.
    let isInOrder: Bool
    /// The remote value columns this database has, when it lacks some (nil: it has them all):
    /// changes are applied without the others, which are kept for when a migration adds them.
    let projection: [Int]?
    /// The remote columns this database lacks, for the record of what was kept.
    let unknownColumns: [String]

    init(table: SyncedTable, localIndex: [Int], projection: [Int]? = nil, unknownColumns: [String] = []) {
        self.table = table
        self.localIndex = localIndex
        self.projection = projection
        self.unknownColumns = unknownColumns
        isInOrder = localIndex.count == table.valueColumns.count && localIndex.indices.allSatisfy { localIndex[$0] == $0 }
    }

    /// `change` with only the columns of `projection`.
    func projected(_ change: RowChange) -> RowChange {
        projection.map(change.keepingValues(at:)) ?? change
    }
}

enum ChangeOutcome {
    case applied, unchanged
    case keptAside(String)
}

/// What one apply (or one retry of kept-aside changes) holds while it runs.
struct ApplyContext {
    /// The insert range being filled, not yet written to `tether_insert_ranges` (range lookups see it).
    var openRange: (table: SyncedTable, range: InsertRange)?
    /// Per table, where new insert ranges may start.
    var rangeFloors: [ObjectIdentifier: Int64] = [:]
    /// Local rows evicted by unique races.
    var evictions: [Conflict] = []
}

extension SyncEngine {
    /// Runs `body` as an apply: its direct writes are the engine's own (the capture takes only
    /// their cascades), with a context of its own; the local rows it evicted are reported as conflicts.
    func whileApplying(_ report: inout ApplyReport, _ body: (inout ApplyReport) throws -> Void) throws {
        let outer = applying
        applying = ApplyContext()
        defer { applying = outer }
        try body(&report)
        report.conflicts += applying?.evictions ?? []
    }

    /// Applies a batch from a peer in the current transaction, with the peer's cursor. A
    /// `backfill` batch (rows of columns or tables newly shared with the peer, §8.3) is applied
    /// whatever the cursor, and leaves it where it is.
    func apply(_ batch: ChangeBatch, backfill: Bool = false, connection: Connection) throws -> ApplyReport {
        // What the batch writes is the peer's change to observers (an import's batches stay an import's).
        if case .local = connection.changeOrigin {
            return try connection.withChangeOrigin(.peer(batch.source)) { try apply(batch, backfill: backfill, connection: connection) }
        }
        var report = ApplyReport()
        guard batch.source != instanceKey else {
            throw SyncError.schemaMismatch("the batch comes from this database itself (instance \(instanceKey))")
        }
        // Decoded batches were validated already; one built in code was not.
        do { try batch.validate() } catch { throw SyncError.invalidBatch(error) }
        try noticeExternalWrites(connection)
        if externalFoldNeeded { try foldExternalChanges(connection) }
        try prepareClock(connection)
        report.sequenceBefore = lastSequence
        report.sequenceAfter = lastSequence
        // Rows that expire on the peer expire here too: their expiries come in a table of ours
        // (synced wherever a table is), whose dates are read again after the apply.
        let carriesExpiry = batch.tables.contains { $0.name == ExpiryStore.syncedTable }
        // What needs this database's state is checked before anything is written, too.
        let mappings = try batch.tables.map { try mapping($0) }
        try observe(try latestTimestamp(of: batch))

        let peerData = Data(batch.source.bytes)
        try connection.execute("INSERT OR IGNORE INTO tether_peers (instance_key) VALUES (?)", [peerData])
        guard let peerRow = try connection.fetchRow("SELECT received_through, resync_from FROM tether_peers WHERE instance_key = ?", [peerData]) else {
            throw SyncError.corruptMetadata("peer \(batch.source) was not recorded")
        }
        let received = try peerRow.get(0, as: Int64.self)
        var resyncFrom = Int64.fromDatabaseValue(peerRow[1])
        report.cursor = received
        if !backfill && !batch.isResync && batch.through <= received && batch.after <= received {
            report.wasDuplicate = true
            return report
        }
        _ = try siteID(batch.source, connection)

        if batch.isResync && batch.after == 0 && !backfill {
            // A full resync starts: rows it does not mention will be removed at its end.
            resyncFrom = lastSequence
            try connection.execute("UPDATE tether_peers SET resync_from = ? WHERE instance_key = ?", [lastSequence, peerData])
            try connection.execute("DELETE FROM tether_resync_seen WHERE peer = ?", [peerData])
        }

        try whileApplying(&report) { report in
            try withTriggersPaused(tableList, connection) {
                try applyChanges(batch, mappings, resyncFrom: resyncFrom, peerData: peerData, connection, &report)
            }
        }
        // A batch that starts after the cursor leaves a gap: its changes are
        // applied (they merge by version) but the cursor waits for the gap.
        if !backfill && (batch.after <= received || batch.isResync) {
            report.cursor = batch.isResync && batch.after == 0 ? batch.through : max(received, batch.through)
            try connection.execute("UPDATE tether_peers SET received_through = ?, last_seen = ? WHERE instance_key = ?",
                                   [report.cursor, Date().timeIntervalSince1970, peerData])
        }
        if !backfill, batch.isLast, let resyncFrom, report.cursor >= batch.through {
            try whileApplying(&report) { _ in
                try withTriggersPaused(tableList, connection) { try finishResync(from: peerData, startedAt: resyncFrom, connection) }
            }
        }
        report.stillKeptAside = try connection.fetchValue("SELECT count(*) FROM tether_kept_aside", as: Int.self) ?? 0
        report.sequenceAfter = lastSequence
        if carriesExpiry { try ExpiryStore.load(self, connection) }
        return report
    }

    /// The batch's latest timestamp, for the clock to observe (which refuses one from the future
    /// of this machine's clock). A version attributed to this database that is later than its
    /// clock, which is at or after every timestamp this database issued, was never written here:
    /// the batch is refused whole (§7.2).
    private func latestTimestamp(of batch: ChangeBatch) throws -> HybridTimestamp {
        var latest = HybridTimestamp.zero
        for (index, change) in batch.changes.enumerated() {
            func check(_ version: Version) throws {
                latest = max(latest, version.timestamp)
                guard version.origin != instanceKey || version.timestamp <= clock else {
                    throw SyncError.forgedVersion("change \(index) to table \(batch.tables[change.table].name) carries a version of this database "
                        + "(instance \(instanceKey)) at \(version.timestamp), later than every timestamp it issued (its clock is at \(clock))")
                }
            }
            try check(change.existence)
            for version in change.versions { try check(version) }
        }
        return latest
    }

    /// Whether every version of a change is this database's own: an echo of its own write, which it
    /// knows better than any peer (`latestTimestamp(of:)` refused those it never wrote).
    private func isEcho(_ change: RowChange) -> Bool {
        change.existence.origin == instanceKey && change.versions.allSatisfy { $0.origin == instanceKey }
    }

    private func applyChanges(_ batch: ChangeBatch, _ mappings: [TableMapping?], resyncFrom: Int64?, peerData: Data,
                              _ connection: Connection, _ report: inout ApplyReport) throws {
        for index in batch.changes.indices {
            var change = batch.changes[index]
            guard let mapping = mappings[change.table] else {
                // A table not synced here (yet): the change waits for a migration that syncs it.
                try keepForSchema(change, table: batch.tables[change.table], from: batch.source, missing: [], connection)
                report.keptForSchema += 1
                continue
            }
            if mapping.projection != nil {
                // Columns this database lacks (yet): kept whole, applied without them now.
                try keepForSchema(change, table: batch.tables[change.table], from: batch.source, missing: mapping.unknownColumns, connection)
                report.keptForSchema += 1
                change = mapping.projected(change)
            }
            // Echoes change nothing, but while this database asks for its own rows back (after a
            // full resync removed rows it could not tell from rows deleted long ago: `finishResync`).
            let outcome = isEcho(change) && resyncFrom != -1 ? .unchanged
                : try applyChange(change, mapping, from: batch.source, connection, &report)
            switch outcome {
            case .applied: report.applied += 1
            case .unchanged:
                report.unchanged += 1
                if resyncFrom != nil && change.isAlive { try markSeen(change, mapping.table, peerData, connection) }
            case let .keptAside(reason):
                // Kept as received: a retry maps it again (onto the columns there are then).
                try keepAside(batch.changes[index], table: batch.tables[change.table], from: batch.source, reason: reason, connection)
                report.keptAside += 1
            }
        }
        try closeOpenRange(connection)
        try retryKeptAside(connection, &report)
    }

    /// How `descriptor` maps onto the local table; nil when the table is not synced here. Value
    /// columns only the peer has are left out of the mapping (see `TableMapping.projection`);
    /// local value columns the peer lacks keep their values (or, in a new row, get their default).
    func mapping(_ descriptor: TableDescriptor) throws -> TableMapping? {
        guard let table = tables[descriptor.name] else { return nil }
        guard descriptor.keyColumns == table.keyColumns else {
            throw SyncError.schemaMismatch("table \(table.name) is identified by (\(descriptor.keyColumns.joined(separator: ", "))) on the peer and by (\(table.keyColumns.joined(separator: ", "))) here")
        }
        if table.needsMergeFunction { throw SyncError.missingMergeFunction(table.name) }
        var localIndex: [Int] = []
        localIndex.reserveCapacity(descriptor.valueColumns.count)
        var projection: [Int] = []
        var unknown: [String] = []
        for (remoteIndex, name) in descriptor.valueColumns.enumerated() {
            if remoteIndex < table.valueColumns.count, table.valueColumns[remoteIndex] == name {
                localIndex.append(remoteIndex)
                projection.append(remoteIndex)
            } else if let index = table.valueColumns.firstIndex(of: name) {
                localIndex.append(index)
                projection.append(remoteIndex)
            } else {
                unknown.append(name)
            }
        }
        return TableMapping(table: table, localIndex: localIndex, projection: unknown.isEmpty ? nil : projection, unknownColumns: unknown)
    }

    // MARK: One change

    func applyChange(_ change: RowChange, _ mapping: TableMapping, from peer: InstanceKey, _ connection: Connection,
                             _ report: inout ApplyReport) throws -> ChangeOutcome {
        guard change.isPartial else { return try applyWholeChange(change, mapping, remoteHoldsLocal: true, from: peer, connection, &report) }
        // The columns left out are held here already (the sender knows this database received the
        // row whole): completed with this row's own values and versions, they change nothing.
        guard let local = try localRow(mapping.table, change.key, connection) else {
            throw SyncError.needsWholeRows("a change to \(mapping.table.name) leaves out values of a row this database does not hold")
        }
        let (completed, remoteHoldsLocal) = try completingPartial(change, mapping, local)
        return try applyWholeChange(completed, mapping, remoteHoldsLocal: remoteHoldsLocal, from: peer, connection, &report)
    }

    /// Applies a change that carries every value. `remoteHoldsLocal` is false when a column left
    /// out of a partial change was newer here than there: the merged row is then not the peer's
    /// state, even if it looks so (see `write`). The change is borrowed, not copied: a change
    /// holds four arrays, and copies cost their reference counting on every change of a batch.
    private func applyWholeChange(_ change: borrowing RowChange, _ mapping: TableMapping, remoteHoldsLocal: Bool, from peer: InstanceKey,
                                  _ connection: Connection, _ report: inout ApplyReport) throws -> ChangeOutcome {
        let table = mapping.table
        // Fast path: a new live row, the common case of a first sync.
        if change.isAlive && !table.mayHaveDeadRows, try insertIfAbsent(change, mapping, from: peer, connection) { return .applied }

        guard let local = try localRow(table, change.key, connection) else {
            return try write(change, mapping, nil, merged: remoteState(change, mapping, connection), status: .synced, from: peer,
                             remoteHoldsIt: remoteHoldsLocal, connection)
        }
        let remoteExistence = try localVersion(change.existence, connection)
        var state = MergedState(isAlive: local.isAlive, values: local.values, versions: local.versions)
        var status = local.status
        var resolution: Conflict.Resolution?

        if local.isPending {
            switch table.policy {
            case .localWins:
                resolution = .keptLocal
            case .remoteWins:
                state = try remoteState(change, mapping, over: local, connection)
                status = .synced
                resolution = .tookRemote
            case .lastWriterWins:
                try mergeLastWriterWins(change, mapping, remoteExistence, into: &state, connection)
                resolution = .lastWriterWins
            case let .custom(merge):
                try mergeLastWriterWins(change, mapping, remoteExistence, into: &state, connection)
                if local.isAlive && change.isAlive {
                    let merged = try merge(dictionary(table, change.key, local.values), dictionary(table, change.key, remoteValues(change, mapping, base: local.values)))
                    let version = LocalVersion(timestamp: nextTimestamp().rawValue, site: Self.localSite)
                    for (index, column) in table.valueColumns.enumerated() {
                        guard let value = merged[column], value != state.values[index] else { continue }
                        state.values[index] = value
                        state.versions.setColumn(index, to: version, columnCount: table.valueColumns.count)
                    }
                    status = .updated
                    resolution = .merged
                } else {
                    resolution = .lastWriterWins
                }
            }
        } else {
            try mergeLastWriterWins(change, mapping, remoteExistence, into: &state, connection)
        }

        let changed = state.isAlive != local.isAlive || state.values != local.values || state.versions != local.versions
        let lostEntirely = resolution == .lastWriterWins && !changed ? try remoteLost(change, mapping, to: local, remoteExistence, connection) : false
        if let resolution, changed || resolution != .lastWriterWins || lostEntirely {
            report.conflicts.append(Conflict(
                table: table.name, key: change.key, peer: peer,
                local: local.isAlive ? dictionary(table, change.key, local.values) : nil,
                remote: change.isAlive ? dictionary(table, change.key, remoteValues(change, mapping, base: local.values)) : nil,
                resolution: resolution))
        }
        guard changed else { return .unchanged }
        return try write(change, mapping, local, merged: state, status: status, from: peer, remoteHoldsIt: remoteHoldsLocal, connection)
    }

    /// Whether the remote row carries a value (or an existence) of another
    /// origin that differs from the pending local one and lost to it: a
    /// conflict the local row won entirely, which nothing else would report.
    private func remoteLost(_ change: RowChange, _ mapping: TableMapping, to local: LocalRow, _ remoteExistence: LocalVersion,
                            _ connection: Connection) throws -> Bool {
        if change.isAlive != local.isAlive && change.existence.origin != instanceKey && remoteExistence != local.versions.existence {
            return true
        }
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated() where change.values[remoteIndex] != local.values[localIndex] {
            let version = change.version(remoteIndex)
            if version.origin != instanceKey, try localVersion(version, connection) != local.versions.column(localIndex) { return true }
        }
        return false
    }

    private struct MergedState {
        var isAlive: Bool
        var values: [DatabaseValue]
        var versions: RowVersions
    }

    /// Per column, and for the row's existence, the later version wins.
    private func mergeLastWriterWins(_ change: RowChange, _ mapping: TableMapping, _ remoteExistence: LocalVersion,
                                     into state: inout MergedState, _ connection: Connection) throws {
        let count = mapping.table.valueColumns.count
        // Columns keep their own versions when the existence version changes.
        if state.versions.columns == nil { state.versions.columns = Array(repeating: state.versions.existence, count: count) }
        if try isLater(remoteExistence, than: state.versions.existence) {
            state.isAlive = change.isAlive
            state.versions.existence = remoteExistence
        }
        let hasAddedColumns = mapping.table.hasAddedColumns
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated() {
            let remote = try localVersion(change.version(remoteIndex), connection)
            let local = state.versions.column(localIndex)
            if try isLater(remote, than: local) {
                state.values[localIndex] = change.values[remoteIndex]
                state.versions.setColumn(localIndex, to: remote, columnCount: count)
            } else if hasAddedColumns, remote == local, state.values[localIndex] != change.values[remoteIndex],
                      state.values[localIndex] == mapping.table.valueDefaults[localIndex] {
                // One version, two values: the column was added after the row was written, and this
                // database got the row while it lacked the column (its default stands in for a value
                // it never saw). The value written wins over the default.
                state.values[localIndex] = change.values[remoteIndex]
            }
        }
        state.versions.normalize()
    }

    private func isLater(_ a: LocalVersion, than b: LocalVersion) throws -> Bool {
        if a.timestamp != b.timestamp { return a.timestamp > b.timestamp }
        if a.site == b.site { return false }
        return try siteKey(a.site) > siteKey(b.site)
    }

    /// The remote row as the new state (absent locally, or remoteWins).
    private func remoteState(_ change: RowChange, _ mapping: TableMapping, over local: LocalRow? = nil, _ connection: Connection) throws -> MergedState {
        let count = mapping.table.valueColumns.count
        let existence = try localVersion(change.existence, connection)
        // Columns the peer lacks keep their local values, or in a new row their defaults.
        var values = local?.values ?? mapping.table.valueDefaults
        var versions = RowVersions(existence: existence, columns: Array(repeating: existence, count: count))
        if let local { for index in 0..<count { versions.columns?[index] = local.versions.column(index) } }
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated() {
            values[localIndex] = change.values[remoteIndex]
            versions.columns?[localIndex] = try localVersion(change.version(remoteIndex), connection)
        }
        versions.normalize()
        return MergedState(isAlive: change.isAlive, values: values, versions: versions)
    }

    private func remoteValues(_ change: RowChange, _ mapping: TableMapping, base: [DatabaseValue]) -> [DatabaseValue] {
        var values = base
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated() { values[localIndex] = change.values[remoteIndex] }
        return values
    }

    private func dictionary(_ table: SyncedTable, _ key: [DatabaseValue], _ values: [DatabaseValue]) -> [String: DatabaseValue] {
        var result: [String: DatabaseValue] = [:]
        for (name, value) in zip(table.keyColumns, key) { result[name] = value }
        for (name, value) in zip(table.valueColumns, values) { result[name] = value }
        return result
    }

    // MARK: Reading and writing rows

    /// `change` with the columns it left out filled in from `local`, which must hold each of them
    /// at the version the change gives or a later one (then the merge keeps them as they are);
    /// and whether every one of them is at that very version here (the sender holds them).
    private func completingPartial(_ change: RowChange, _ mapping: TableMapping, _ local: LocalRow) throws -> (RowChange, Bool) {
        var sameVersions = true
        var complete = change
        complete.omitted = []
        if complete.versions.isEmpty { complete.versions = Array(repeating: change.existence, count: change.values.count) }
        for (index, left) in change.omitted.enumerated() where left {
            let localIndex = mapping.localIndex.indices.contains(index) ? mapping.localIndex[index] : -1
            guard local.values.indices.contains(localIndex) else { continue }
            let held = try version(local.versions.column(localIndex))
            guard held >= change.version(index) else {
                throw SyncError.needsWholeRows("column \(mapping.table.valueColumns[localIndex]) of a row of \(mapping.table.name) is older here than the value left out")
            }
            if held != change.version(index) { sameVersions = false }
            complete.values[index] = local.values[localIndex]
            complete.versions[index] = held
        }
        return (complete, sameVersions)
    }

    private func localRow(_ table: SyncedTable, _ key: [DatabaseValue], _ connection: Connection) throws -> LocalRow? {
        let valueCount = table.valueColumns.count
        let live = try table.statement(.selectLiveByKey, connection)
        try live.bind(StatementArguments(values: key))
        defer { live.reset() }
        if try live.step() {
            typealias Column = RowMetadataLayout.LiveByKey
            let handle = live.handle
            let rowid = sqlite3_column_int64(handle, Column.rowid)
            let values = (0..<valueCount).map { DatabaseValue(statement: handle, index: Column.value($0)) }
            let versionsColumn = Column.versions(valueCount: valueCount)
            if sqlite3_column_type(handle, versionsColumn) != SQLITE_NULL {
                return LocalRow(rowid: rowid, values: values, versions: try versions(handle, versionsColumn, table),
                                status: try status(sqlite3_column_int64(handle, Column.status(valueCount: valueCount)), table),
                                inFlight: sqlite3_column_int64(handle, Column.inFlight(valueCount: valueCount)) != 0)
            }
            // A row of an insert range has no metadata of its own: the range's. A row with neither
            // was written before the table was synced (or by a program not captured): as a new row.
            guard let range = try insertRange(of: table, containing: rowid, connection) else {
                return LocalRow(rowid: rowid, values: values, versions: .uniform(LocalVersion(timestamp: 0, site: Self.localSite)),
                                status: .created, inFlight: false)
            }
            let state = range.state(ofRowid: rowid)
            return LocalRow(rowid: rowid, values: values, versions: .uniform(range.version), status: state.status, inFlight: state.inFlight)
        }
        guard table.mayHaveDeadRows else { return nil }
        let dead = try table.statement(.selectDeadByKey, connection)
        try dead.bind(StatementArguments(values: key))
        defer { dead.reset() }
        guard try dead.step() else { return nil }
        typealias Column = RowMetadataLayout.DeadByKey
        let handle = dead.handle
        return LocalRow(rowid: nil,
                        values: (0..<valueCount).map { DatabaseValue(statement: handle, index: Column.value($0)) },
                        versions: try versions(handle, Column.versions(valueCount: valueCount), table),
                        status: try status(sqlite3_column_int64(handle, Column.status(valueCount: valueCount)), table),
                        inFlight: sqlite3_column_int64(handle, Column.inFlight(valueCount: valueCount)) != 0)
    }

    private func status(_ stored: Int64, _ table: SyncedTable) throws -> SyncStatus {
        guard let status = SyncStatus(rawValue: Int(stored)) else {
            throw SyncError.corruptMetadata("a row of \(table.name) has the unknown sync status \(stored)")
        }
        return status
    }

    private func versions(_ handle: OpaquePointer, _ column: Int32, _ table: SyncedTable) throws -> RowVersions {
        guard let bytes = sqlite3_column_blob(handle, column),
              let versions = RowVersions(encoded: UnsafeRawBufferPointer(start: bytes, count: Int(sqlite3_column_bytes(handle, column)))) else {
            throw SyncError.corruptMetadata("a row of \(table.name) has damaged versions in its sync metadata")
        }
        return versions
    }

    /// Inserts a row that is new here; false when the key is taken (or any
    /// other constraint fails): the full path then settles it. On a simple
    /// table this is INSERT OR FAIL without the capture hook (an insert there
    /// cannot cascade), the cheapest write SQLite has.
    private func insertIfAbsent(_ change: borrowing RowChange, _ mapping: TableMapping, from peer: InstanceKey, _ connection: Connection) throws -> Bool {
        let table = mapping.table
        guard mapping.localIndex.count == table.valueColumns.count else { return false }
        let inOrder = mapping.isInOrder
        if table.isSimple && inOrder && change.versions.isEmpty {
            // Every column at the row's version: the row can join an insert range.
            let version = try localVersion(change.existence, connection)
            let statement = try table.statement(.insertNewLive, connection)
            do {
                try withoutCaptureHook(connection) {
                    try statement.run { binder in
                        try binder.bind(change.key)
                        try binder.bind(change.values)
                    }
                }
            } catch let error as DatabaseError where error.isConstraintViolation {
                return false
            }
            try logAppliedInsert(rowid: connection.lastInsertedRowID, version: version, via: try siteID(peer, connection), in: table, connection)
            return true
        }
        let statement = try table.statement(.insertNewLive, connection)
        // The common case of a first sync: columns in the same order, every
        // one at the row's version. Bind straight from the change.
        let state = inOrder && change.versions.isEmpty
            ? MergedState(isAlive: true, values: change.values, versions: .uniform(try localVersion(change.existence, connection)))
            : try remoteState(change, mapping, connection)
        do {
            let key = change.key
            let insert = { try self.insertLive(statement, key: key, values: state.values, connection) }
            if table.isSimple { try withoutCaptureHook(connection, insert) } else { try insert() }
        } catch let error as DatabaseError where error.isConstraintViolation {
            return false
        }
        try writeMetadata(table, rowid: connection.lastInsertedRowID, state: state, status: .synced, via: try siteID(peer, connection), connection)
        return true
    }

    /// Runs an INSERT of a live row's key and values.
    private func insertLive(_ statement: Statement, key: [DatabaseValue], values: [DatabaseValue], _ connection: Connection) throws {
        try statement.run { binder in
            try binder.bind(key)
            try binder.bind(values)
        }
    }

    /// Writes a live row's metadata: a new sequence number, its status and versions.
    private func writeMetadata(_ table: SyncedTable, rowid: Int64, state: MergedState, status: SyncStatus, via: Int32?,
                               _ connection: Connection) throws {
        try stamp(table, rowid: rowid, status: status, versions: state.versions.encoded(), via: via, connection)
    }

    /// Writes a tombstone: key, values and metadata.
    private func writeDead(_ table: SyncedTable, key: [DatabaseValue], state: MergedState, status: SyncStatus, via: Int32?,
                           _ connection: Connection) throws {
        try table.statement(.upsertDead, connection).run { binder in
            try binder.bind(key)
            try binder.bind(state.values)
            try binder.bind(nextSequence())
            try binder.bind(Int64(status.rawValue))
            try binder.bind(Int64(0))
            try binder.bind(blob: state.versions.encoded())
            try binder.bind(via.map { DatabaseValue.integer(Int64($0)) } ?? .null)
        }
        table.mayHaveDeadRows = true
    }

    /// Whether a merged row is exactly the row the peer sent (every column and
    /// the existence at the peer's versions): then the peer has it, and it is
    /// not sent back there.
    private func isExactly(_ change: RowChange, _ mapping: TableMapping, _ state: MergedState, _ connection: Connection) throws -> Bool {
        // Columns the peer lacks do not count: it holds every one it has at these versions.
        guard state.isAlive == change.isAlive, state.versions.existence == (try localVersion(change.existence, connection)) else { return false }
        for (remoteIndex, localIndex) in mapping.localIndex.enumerated()
        where state.versions.column(localIndex) != (try localVersion(change.version(remoteIndex), connection)) {
            return false
        }
        return true
    }

    /// `remoteHoldsIt`: false when the change was completed with values newer than the peer's,
    /// so that the row is not taken for the peer's own state (which `tether_via` records, to send
    /// nothing back to it).
    private func write(_ change: RowChange, _ mapping: TableMapping, _ local: LocalRow?, merged state: MergedState,
                       status: SyncStatus, from peer: InstanceKey, remoteHoldsIt: Bool = true, _ connection: Connection) throws -> ChangeOutcome {
        let table = mapping.table
        let via = try remoteHoldsIt && isExactly(change, mapping, state, connection) ? siteID(peer, connection) : nil
        do {
            switch (state.isAlive, local?.rowid) {
            case let (true, rowid?):
                if !table.valueColumns.isEmpty {
                    try table.statement(.updateLive, connection).run { binder in
                        try binder.bind(state.values)
                        try binder.bind(rowid)
                    }
                }
                try writeMetadata(table, rowid: rowid, state: state, status: status, via: via, connection)
            case (true, nil):
                try insertLive(table.statement(.insertLive, connection), key: change.key, values: state.values, connection)
                try writeMetadata(table, rowid: connection.lastInsertedRowID, state: state, status: status, via: via, connection)
                if local != nil { try table.statement(.deleteDeadByKey, connection).execute(StatementArguments(values: change.key)) }
            case let (false, rowid?):
                try table.statement(.deleteLiveByRowid, connection).execute([rowid])
                try table.statement(.deleteRowMetadata, connection).execute([rowid])
                try writeDead(table, key: change.key, state: state, status: status, via: via, connection)
            case (false, nil):
                try writeDead(table, key: change.key, state: state, status: status, via: via, connection)
            }
        } catch let error as DatabaseError where error.isConstraintViolation {
            if error.kind == .uniqueViolation, state.isAlive,
               let outcome = try settleUniqueRace(error, change, mapping, state, status: status, from: peer, remoteHoldsIt: remoteHoldsIt, connection) {
                return outcome
            }
            return .keptAside(error.message)
        }
        return .applied
    }

    // MARK: Unique races

    /// Two rows claim one unique value: the row whose unique columns have the
    /// later version keeps it. A losing local row is deleted as a local change
    /// (its values stay in its tombstone, and peers learn of it); a losing
    /// remote row is kept aside until that deletion reaches it.
    private func settleUniqueRace(_ error: DatabaseError, _ change: RowChange, _ mapping: TableMapping, _ state: MergedState,
                                  status: SyncStatus, from peer: InstanceKey, remoteHoldsIt: Bool, _ connection: Connection) throws -> ChangeOutcome? {
        let table = mapping.table
        guard let failed = error.message.range(of: "failed: ") else { return nil }
        let columns = error.message[failed.upperBound...].split(separator: ",").compactMap { part -> Int? in
            let name = part.split(separator: ".").last.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
            return table.valueColumns.firstIndex(of: name)
        }
        guard !columns.isEmpty else { return nil }
        let condition = columns.map { "\(quoteIdentifier(table.valueColumns[$0])) = ?" }.joined(separator: " AND ")
        let keys = table.keyColumns.map(quoteIdentifier).joined(separator: ", ")
        guard let holder = try connection.fetchRow("SELECT \(keys) FROM \(table.quotedName) WHERE \(condition)",
                                                   StatementArguments(values: columns.map { state.values[$0] })),
              let holderRow = try localRow(table, Array(holder.values), connection) else { return nil }
        func latest(_ versions: RowVersions) throws -> LocalVersion {
            try columns.map { versions.column($0) }.reduce(versions.column(columns[0])) { try isLater($1, than: $0) ? $1 : $0 }
        }
        let incomingWins = try isLater(latest(state.versions), than: latest(holderRow.versions))
        guard incomingWins, let holderRowid = holderRow.rowid else {
            return .keptAside("\(error.message): the row \(holder.values.map(\.description).joined(separator: ", ")) holds the value with a later version")
        }
        // Evict the holder as a local delete, then write the incoming row.
        var versions = holderRow.versions
        if versions.columns == nil { versions.columns = Array(repeating: versions.existence, count: table.valueColumns.count) }
        versions.existence = LocalVersion(timestamp: nextTimestamp().rawValue, site: Self.localSite)
        versions.normalize()
        try table.statement(.deleteLiveByRowid, connection).execute([holderRowid])
        try table.statement(.deleteRowMetadata, connection).execute([holderRowid])
        try writeDead(table, key: Array(holder.values), state: MergedState(isAlive: false, values: holderRow.values, versions: versions),
                      status: .deleted, via: nil, connection)
        applying?.evictions.append(Conflict(table: table.name, key: change.key, peer: peer,
                                  local: dictionary(table, Array(holder.values), holderRow.values),
                                  remote: dictionary(table, change.key, state.values),
                                  resolution: .uniqueRace(winner: change.key, loser: Array(holder.values))))
        let local = try localRow(table, change.key, connection)
        return try write(change, mapping, local, merged: state, status: status, from: peer, remoteHoldsIt: remoteHoldsIt, connection)
    }

    // MARK: Full resync

    /// During a resync, rows the sender confirms without changing them keep
    /// their sequence number: remember them so they survive the end of the resync.
    private func markSeen(_ change: RowChange, _ table: SyncedTable, _ peer: Data, _ connection: Connection) throws {
        guard let row = try localRow(table, change.key, connection), let rowid = row.rowid else { return }
        try connection.execute("INSERT OR IGNORE INTO tether_resync_seen (peer, table_name, row_id) VALUES (?, ?, ?)", [peer, table.name, rowid])
    }

    /// Ends a full resync: a synced row the sender did not mention, unchanged
    /// since the resync began, was deleted there long ago (its tombstone is
    /// collected): remove it here too. It is removed without a tombstone, and
    /// every other peer's cursor restarts, so that a row the sender merely had
    /// not received yet comes back from where it lives.
    ///
    /// The other peers restart with `resync_from = -1`: `cursor(for:)` reports
    /// them as resyncing, so that they are asked with `resuming: true` and send
    /// this database's own rows too (no echo filter), which the resync may
    /// have removed. At the end of such a refetch nothing is removed.
    private func finishResync(from peer: Data, startedAt resyncFrom: Int64, _ connection: Connection) throws {
        guard resyncFrom >= 0 else {
            try connection.execute("DELETE FROM tether_resync_seen WHERE peer = ?", [peer])
            try connection.execute("UPDATE tether_peers SET resync_from = NULL WHERE instance_key = ?", [peer])
            return
        }
        for table in tableList {
            let unconfirmed = try connection.fetchRows(table.layout.selectUnconfirmedRows, [resyncFrom, peer, table.name])
            for row in unconfirmed {
                let rowid = try row.get(0, as: Int64.self)
                try table.statement(.deleteLiveByRowid, connection).execute([rowid])
                try table.statement(.deleteRowMetadata, connection).execute([rowid])
            }
        }
        try connection.execute("DELETE FROM tether_resync_seen WHERE peer = ?", [peer])
        try connection.execute("UPDATE tether_peers SET resync_from = NULL WHERE instance_key = ?", [peer])
        try connection.execute("UPDATE tether_peers SET received_through = 0, resync_from = coalesce(resync_from, -1) WHERE instance_key != ?", [peer])
    }

    // MARK: Kept aside

    private func keepAside(_ change: RowChange, table: TableDescriptor, from peer: InstanceKey, reason: String, _ connection: Connection) throws {
        var single = change
        single.table = 0
        let batch = ChangeBatch(source: peer, after: 0, through: 0, isLast: true, tables: [table], changes: [single])
        try connection.execute("""
            INSERT INTO tether_kept_aside (table_name, key, peer, change, reason, first_seen) VALUES (?, ?, ?, ?, ?, ?)
            """, [table.name, change.key.map(\.description).joined(separator: ", "), Data(peer.bytes), Data(BatchCoding.encode(batch)), reason,
                  Date().timeIntervalSince1970])
    }

    /// Retries every kept-aside change until a pass applies none.
    func retryKeptAside(_ connection: Connection, _ report: inout ApplyReport) throws {
        defer { applying?.openRange = nil }
        try withTriggersPaused(tableList, connection) { try retryKeptAsideOnce(connection, &report) }
    }

    private func retryKeptAsideOnce(_ connection: Connection, _ report: inout ApplyReport) throws {
        var progress = true
        while progress {
            progress = false
            let entries = try connection.fetchRows("SELECT id, peer, change FROM tether_kept_aside ORDER BY id")
            for entry in entries {
                let id = try entry.get(0, as: Int64.self)
                let bytes = [UInt8](try entry.get(2, as: Data.self))
                let batch: ChangeBatch
                do { batch = try BatchCoding.decodeWithoutValidating(bytes) } catch {
                    throw SyncError.corruptMetadata("kept-aside change \(id) cannot be decoded: \(error)")
                }
                guard let change = batch.changes.first, let descriptor = batch.tables.first else { continue }
                let found: TableMapping?
                do { found = try self.mapping(descriptor) } catch { continue }  // the table is no longer synced as it was
                guard let mapping = found else { continue }
                let outcome = try connection.withChangeOrigin(.peer(batch.source)) {
                    try applyChange(mapping.projected(change), mapping, from: batch.source, connection, &report)
                }
                switch outcome {
                case .applied, .unchanged:
                    try connection.execute("DELETE FROM tether_kept_aside WHERE id = ?", [id])
                    report.resolvedFromKeptAside += 1
                    progress = true
                case let .keptAside(reason):
                    try connection.execute("UPDATE tether_kept_aside SET attempts = attempts + 1, reason = ? WHERE id = ?", [reason, id])
                }
            }
        }
        try closeOpenRange(connection)
    }
}
