import CSQLite
import Foundation

/// What a backfill sends (§8.3 of Protocol/README.md): the rows, through `through`, of tables or
/// columns newly shared with a peer.
public struct BackfillScope: Sendable, Equatable {
    /// The last sequence number covered (the peer's cursor on this database when it began).
    public var through: Int64
    /// Per table, the value columns whose rows go: those holding a value other than the
    /// column's default. A table with no columns listed goes whole.
    public var columns: [String: [String]]

    /// A backfill of `columns` (a table with none listed: whole), through the sequence `through`.
    public init(through: Int64, columns: [String: [String]]) {
        self.through = through
        self.columns = columns
    }
}

/// Bounds of one batch.
public struct BatchLimits: Sendable {
    /// The most changes a batch holds.
    public var maximumChanges: Int
    /// An estimate of the encoded size; a single row larger than this still goes alone.
    public var maximumBytes: Int
    /// Limits of `maximumChanges` changes and about `maximumBytes` bytes per batch (1 at least each).
    public init(maximumChanges: Int = 2_000, maximumBytes: Int = 1 << 20) {
        self.maximumChanges = max(1, maximumChanges)
        self.maximumBytes = max(1, maximumBytes)
    }
}

extension SyncEngine {
    /// The range of `ranges` (sorted by rowid, disjoint) that covers `rowid`.
    static func range(containing rowid: Int64, in ranges: [InsertRange]) -> InsertRange? {
        var low = 0
        var high = ranges.count
        while low < high {
            let middle = (low + high) / 2
            if ranges[middle].lastRowid < rowid { low = middle + 1 } else { high = middle }
        }
        return low < ranges.count && ranges[low].firstRowid <= rowid ? ranges[low] : nil
    }

    /// The changes `peer` lacks after its cursor, in sequence order, without
    /// those that came from `peer` itself.
    ///
    /// With `backfill`, only the rows through `backfill.through` that hold a value other than
    /// the default in one of its columns (or every row of a table listed without columns) are
    /// sent, and the batch ends at `backfill.through` (§8.3 of Protocol/README.md). `recordingPeer`
    /// records what `peer` was sent: how far (`PeerStore.recordSent`), or the backfill's columns
    /// (`PeerStore.recordBackfill`).
    func extract(for peer: InstanceKey?, after requestedCursor: Int64, resuming resync: Bool, limits: BatchLimits,
                 markInFlight: Bool, recordingPeer: Bool = true, allowingPartialRows: Bool = false, backfill: BackfillScope? = nil,
                 scope: CompiledScope? = nil, connection: Connection) throws -> ChangeBatch {
        try ensureNotACopy()
        try ensureHistoryHolds(for: peer, connection)
        try capture.foldExternalWritesIfAny(connection)
        try prepareClock(connection)
        guard requestedCursor <= clock.lastSequence else {
            // The peer holds sequence numbers of this key that this database never gave.
            throw SyncError.instanceKeyReused("peer \(peer.map(\.description) ?? "(unnamed)") has this database's changes through "
                + "sequence \(requestedCursor) of instance key \(instanceKey), which has given only \(clock.lastSequence)")
        }
        if let backfill, let peer, recordingPeer {
            try connection.peerStore.recordBackfill(to: peer, columns: backfillColumns(backfill), through: backfill.through)
        }
        let collectedThrough = try HybridClock.collectedThrough(connection, forPeerAt: peer.flatMap { try sites.knownID(of: $0, connection) })
        // Tombstones after the cursor were collected: only a full resync is safe.
        let isResync = requestedCursor < collectedThrough && !resync && backfill == nil
        let cursor = isResync ? 0 : requestedCursor

        struct Candidate {
            let table: Int
            let sequence: Int64
            /// Moved into the batch (not copied: a change holds four arrays).
            var change: RowChange?
            /// The change's `estimatedSize` (0 for an echo), counted once for its stream's byte
            /// budget and once more for the batch's.
            var size = 0
            /// For a scoped peer, what the row does to what it holds (applied if the batch reaches it).
            var step: ScopedExtraction.Step?
        }
        /// A row of a scoped table that the scope leaves out of the batch, or sends as an eviction
        /// (`key` read only then).
        func decidedCandidate(_ decision: ScopedExtraction.Decision, table: Int, sequence: Int64, step: ScopedExtraction.Step?,
                              source: InstanceKey, key: @autoclosure () -> [DatabaseValue]) -> Candidate {
            guard decision.sent == .eviction else { return Candidate(table: table, sequence: sequence, change: nil, step: step) }
            let eviction = RowChange.eviction(table: table, key: key(), existence: Version(timestamp: .zero, origin: source), sequence: sequence)
            return Candidate(table: table, sequence: sequence, change: eviction, size: estimatedSize(eviction), step: step)
        }
        var candidates: [Candidate] = []
        candidates.reserveCapacity(min(limits.maximumChanges + 1, 1 << 16))
        let ordered = tableList.sorted { $0.name < $1.name }
        let fetchLimit = limits.maximumChanges + 1
        var exhausted = true
        // The highest sequence every query has read up to: a query that hit its
        // fetch limit may hold unread rows above its last row, so the batch
        // must not move past that row (echoes, which do not count against
        // maximumChanges, can otherwise carry `through` beyond unread rows).
        var horizon = Int64.max
        // A full resync sends every row, echoes included: the receiver deletes
        // the rows it does not hear about.
        let leavesOutEchoes = !(isResync || resync)
        // Rows received from the peer itself, unchanged since, are echoes too; not for a backfill,
        // which sends the values of columns the peer lacked when it sent the row.
        // Looked up, not registered: a peer never met sent this database nothing (and a full disk
        // must not keep this database from sending its changes).
        let peerSite = backfill == nil ? try peer.flatMap { try sites.knownID(of: $0, connection) } : nil
        /// Whether a row is one to leave out as an echo: its state was received from the peer, or
        /// everything in it came from the peer.
        func isEcho(via: Int32?, existence: Version, columnVersions: [Version]) -> Bool {
            leavesOutEchoes && peer.map { peer in
                (via != nil && via == peerSite) || (existence.origin == peer && columnVersions.allSatisfy { $0.origin == peer })
            } == true
        }
        // Each table's insert ranges holding rows after the cursor: read once,
        // for the extraction and for marking rows in flight.
        let tableRanges = try ordered.map { try insertRanges(of: $0, after: cursor, connection) }
        // Partial changes: a row born in an insert range whose sequence number the receiver's cursor
        // has passed was sent to it whole; its columns still at the range's version are left out.
        // Each table's ranges that started by the cursor, read when first needed, by rowid.
        // A scoped peer may lack a row it is sent (a move-in): changes to it go whole.
        let omitsHeldColumns = allowingPartialRows && leavesOutEchoes && cursor > 0 && scope == nil
        var heldRanges: [[InsertRange]?] = Array(repeating: nil, count: ordered.count)
        // A column is left out only if the receiver got its value with the row's insert: not one
        // added here since the table was synced, nor one the peer backfilled, for rows inserted by
        // then (either side lacked it when the row went). Per table, per value column: the last
        // insert sequence whose rows keep it (0: none).
        let keptThrough: [[Int64]] = try omitsHeldColumns ? keptColumnsThrough(ordered, for: peer, connection) : []
        // A scoped peer: each row of a scoped table is decided as it is read (see `ScopedExtraction`).
        let scoped: ScopedExtraction?
        if let scope {
            guard let peer else { throw ScopeError(table: "", reason: .needsPeer) }
            try prepareScopeRules(scope, peer: peer, cursor: cursor, connection)
            scoped = ScopedExtraction(scope, peer: peer, tables: ordered)
        } else {
            scoped = nil
        }
        let source = instanceKey
        for (tableIndex, table) in ordered.enumerated() {
            let scopedTable = scoped?.tables[tableIndex]
            // A backfill reads only its tables, and keeps the rows holding values of its columns.
            var backfillColumns: [Int]?
            if let backfill {
                guard let names = backfill.columns[table.name] else { continue }
                backfillColumns = names.compactMap { table.valueColumns.firstIndex(of: $0) }
                if !names.isEmpty && backfillColumns?.isEmpty == true { continue }
            }
            let backfillEnd = backfill?.through ?? .max
            func isBackfilled(_ values: [DatabaseValue]) -> Bool {
                guard let columns = backfillColumns, !columns.isEmpty else { return true }
                return columns.contains { values[$0] != table.valueDefaults[$0] }
            }
            /// Whether a row read (live, dead or of an insert range) is sent, and the row when the
            /// backfill check read it; nil when it is left out and nothing is to be decided of it
            /// (an echo, or a row a backfill does not send, of a table the scope does not name).
            func screen(isEcho: Bool, _ handle: OpaquePointer, keyCount: Int, valueCount: Int)
                -> (isSent: Bool, readRow: (key: [DatabaseValue], values: [DatabaseValue])?)? {
                if isEcho { return scopedTable == nil ? nil : (false, nil) }
                guard backfillColumns != nil else { return (true, nil) }
                let row = readKeyAndValues(handle, keyCount: keyCount, valueCount: valueCount)
                if isBackfilled(row.values) { return (true, row) }
                return scopedTable == nil ? nil : (false, row)
            }
            for query in [SyncedTable.Query.selectLiveChanges, .selectDeadChanges] {
                let statement: Statement
                if let scopedTable, let scoped {
                    statement = try connection.cachedStatement(query == .selectLiveChanges ? scopedTable.live : scopedTable.dead)
                    try scoped.bind(statement, table: tableIndex, [":tether_after": .integer(cursor), ":tether_limit": .integer(Int64(fetchLimit))])
                } else {
                    statement = try table.statement(query, connection)
                    try statement.bind([cursor, fetchLimit])
                }
                statement.isBusy = true
                defer { statement.isBusy = false; statement.reset() }
                var fetched = 0
                var lastFetched = cursor
                // Rows are read only up to the batch's byte budget too, not its change count alone:
                // 10,000 large rows read to send 1 MiB of them held ten times what the batch needed.
                var fetchedBytes = 0
                let keyCount = table.keyColumns.count
                let valueCount = table.valueColumns.count
                let alive = query == .selectLiveChanges
                let handle = statement.handle
                var reachedBackfillEnd = false
                // The scoped queries' added columns follow the metadata's (the rowid, for live rows).
                let scopeColumns = Int32(keyCount + valueCount) + (alive ? 5 : 4)
                while fetchedBytes < limits.maximumBytes, try statement.step() {
                    typealias Column = RowMetadataLayout.Changes
                    let base = Int32(keyCount + valueCount)
                    let sequence = sqlite3_column_int64(handle, Column.sequence(base))
                    if sequence > backfillEnd {
                        reachedBackfillEnd = true
                        break
                    }
                    fetched += 1
                    lastFetched = sequence
                    guard let bytes = sqlite3_column_blob(handle, Column.versions(base)),
                          let versions = RowVersions(encoded: UnsafeRawBufferPointer(start: bytes, count: Int(sqlite3_column_bytes(handle, Column.versions(base))))) else {
                        throw SyncError.corruptMetadata("row of \(table.name) with sequence \(sequence) has damaged versions in its sync metadata")
                    }
                    let existence = try version(versions.existence)
                    let columnVersions: [Version] = versions.columns == nil ? [] : try (0..<valueCount).map { try version(versions.column($0)) }
                    // Nothing to send back to where everything in this row came from,
                    // or to the peer this row's state was received from.
                    let via = sqlite3_column_type(handle, Column.via(base)) == SQLITE_NULL ? nil : Int32(truncatingIfNeeded: sqlite3_column_int64(handle, Column.via(base)))
                    guard let (isSent, readRow) = screen(isEcho: isEcho(via: via, existence: existence, columnVersions: columnVersions), handle, keyCount: keyCount, valueCount: valueCount) else {
                        candidates.append(Candidate(table: tableIndex, sequence: sequence, change: nil))
                        continue
                    }
                    var step: ScopedExtraction.Step?
                    if scopedTable != nil {
                        let (inScope, state) = ScopedExtraction.place(handle, first: scopeColumns, isAlive: alive)
                        let decision = ScopedExtraction.decide(isAlive: alive, inScope: inScope, state: state, isSent: isSent)
                        step = ScopedExtraction.step(of: decision, recordedKey: { ScopedExtraction.recordedKey(handle, first: scopeColumns, isAlive: alive) },
                                                     rowid: { sqlite3_column_int64(handle, Column.rowid(base)) })
                        if decision.sent != .asIs {
                            let candidate = decidedCandidate(decision, table: tableIndex, sequence: sequence, step: step, source: source,
                                                             key: readRow?.key ?? readKey(handle, keyCount: keyCount))
                            fetchedBytes += candidate.size
                            candidates.append(candidate)
                            continue
                        }
                    }
                    var (key, values) = readRow ?? readKeyAndValues(handle, keyCount: keyCount, valueCount: valueCount)
                    var omitted: [Bool] = []
                    if alive, omitsHeldColumns {
                        if heldRanges[tableIndex] == nil {
                            heldRanges[tableIndex] = try insertRanges(of: table, startingAtOrBefore: cursor, connection)
                        }
                        let rowid = sqlite3_column_int64(handle, Column.rowid(base))
                        if let range = Self.range(containing: rowid, in: heldRanges[tableIndex] ?? []), case let inserted = range.sequence(ofRowid: rowid),
                           inserted <= cursor {
                            omitted = Self.leavingOut((0..<valueCount).map { versions.column($0) == range.version && inserted > keptThrough[tableIndex][$0] },
                                                      of: &values)
                        }
                    }
                    let change = RowChange(table: tableIndex, key: key, isAlive: alive, existence: existence, values: values,
                                           versions: columnVersions, sequence: sequence, omitted: omitted)
                    let size = estimatedSize(change)
                    fetchedBytes += size
                    candidates.append(Candidate(table: tableIndex, sequence: sequence, change: change, size: size, step: step))
                }
                if !reachedBackfillEnd, fetched == fetchLimit || fetchedBytes >= limits.maximumBytes {
                    exhausted = false
                    horizon = min(horizon, lastFetched)
                }
            }
            // Rows of insert ranges, read range by range in sequence order: one
            // more stream, with the same fetch limit and horizon.
            var fetched = 0
            var lastFetched = cursor
            var fetchedBytes = 0
            ranges: for range in tableRanges[tableIndex] {
                let existence = try version(range.version)
                // Rows updated together hold their columns' versions: sent, and read for echoes, as a live row's.
                let columnVersions: [Version] = try range.updatedVersions.map { versions in
                    try (0..<table.valueColumns.count).map { try version(versions.column($0)) }
                } ?? []
                // The same for every row of the range.
                let rangeRowsAreEchoes = isEcho(via: range.via, existence: existence, columnVersions: columnVersions)
                let first = max(range.firstRowid, range.rowid(ofSequence: cursor + 1))
                let statement: Statement
                if let scopedTable, let scoped {
                    statement = try connection.cachedStatement(scopedTable.range)
                    try scoped.bind(statement, table: tableIndex, [":tether_first": .integer(first), ":tether_last": .integer(range.lastRowid)])
                } else {
                    statement = try table.statement(.selectRangeRows, connection)
                    try statement.bind([first, range.lastRowid])
                }
                statement.isBusy = true
                defer { statement.isBusy = false; statement.reset() }
                // The rows of the range that have metadata of their own are no longer the range's:
                // their rowids, in order, merged with the range's rows (cheaper than a lookup per row).
                let owned = try table.statement(.selectRowidsWithMetadata, connection)
                try owned.bind([first, range.lastRowid])
                owned.isBusy = true
                defer { owned.isBusy = false; owned.reset() }
                var nextOwned: Int64? = try owned.step() ? sqlite3_column_int64(owned.handle, 0) : nil
                // What a scoped peer holds of the range's rows, when not read by the range query itself.
                let members = try scoped?.members(of: tableIndex, from: first, through: range.lastRowid, connection)
                defer { members?.close() }
                let handle = statement.handle
                let keyCount = table.keyColumns.count
                let valueCount = table.valueColumns.count
                while fetched < fetchLimit, fetchedBytes < limits.maximumBytes, try statement.step() {
                    let rowid = sqlite3_column_int64(handle, Int32(keyCount + valueCount))
                    while let next = nextOwned, next < rowid { nextOwned = try owned.step() ? sqlite3_column_int64(owned.handle, 0) : nil }
                    if nextOwned == rowid { continue }
                    let sequence = range.sequence(ofRowid: rowid)
                    // Rows of a range go in sequence order: past the backfill's end, so are the rest.
                    if sequence > backfillEnd { break ranges }
                    fetched += 1
                    lastFetched = sequence
                    guard let (isSent, readRow) = screen(isEcho: rangeRowsAreEchoes, handle, keyCount: keyCount, valueCount: valueCount) else {
                        candidates.append(Candidate(table: tableIndex, sequence: sequence, change: nil))
                        continue
                    }
                    var step: ScopedExtraction.Step?
                    if scopedTable != nil {
                        let scopeColumns = Int32(keyCount + valueCount + 1)
                        let inScope = sqlite3_column_int64(handle, ScopedExtraction.Column.inScope(scopeColumns)) != 0
                        let held: (state: Int, recordedKey: String?) = try members?.held(rowid)
                            ?? (Int(sqlite3_column_int64(handle, ScopedExtraction.Column.state(scopeColumns, isAlive: true))), nil)
                        let decision = ScopedExtraction.decide(isAlive: true, inScope: inScope, state: held.state, isSent: isSent)
                        step = ScopedExtraction.step(of: decision, recordedKey: { members == nil ? ScopedExtraction.recordedKey(handle, first: scopeColumns, isAlive: true) : held.recordedKey },
                                                     rowid: { rowid })
                        if decision.sent != .asIs {
                            let candidate = decidedCandidate(decision, table: tableIndex, sequence: sequence, step: step, source: source,
                                                             key: readRow?.key ?? readKey(handle, keyCount: keyCount))
                            fetchedBytes += candidate.size
                            candidates.append(candidate)
                            continue
                        }
                    }
                    var (key, values) = readRow ?? readKeyAndValues(handle, keyCount: keyCount, valueCount: valueCount)
                    // Rows updated together that the receiver got when inserted: the columns still at the
                    // insert's version are left out, as for a row with metadata of its own.
                    var omitted: [Bool] = []
                    if omitsHeldColumns, let updated = range.updatedVersions, case let inserted = range.insertedSequence(ofRowid: rowid), inserted <= cursor {
                        omitted = Self.leavingOut((0..<valueCount).map { updated.column($0) == range.version && inserted > keptThrough[tableIndex][$0] },
                                                  of: &values)
                    }
                    let change = RowChange(table: tableIndex, key: key, isAlive: true, existence: existence, values: values,
                                           versions: columnVersions, sequence: sequence, omitted: omitted)
                    let size = estimatedSize(change)
                    fetchedBytes += size
                    candidates.append(Candidate(table: tableIndex, sequence: sequence, change: change, size: size, step: step))
                }
                if fetched == fetchLimit || fetchedBytes >= limits.maximumBytes {
                    exhausted = false
                    horizon = min(horizon, lastFetched)
                    break ranges
                }
            }
        }
        candidates.sort { $0.sequence < $1.sequence }

        var changes: [RowChange] = []
        changes.reserveCapacity(min(candidates.count, limits.maximumChanges))
        var bytes = 0
        var through = cursor
        var stoppedEarly = false
        // For a scoped peer: the membership steps of the rows the batch reaches, by table, and the
        // tables with a row in the window (sent or not).
        var steps: [[(sequence: Int64, step: ScopedExtraction.Step)]] = scoped == nil ? [] : Array(repeating: [], count: ordered.count)
        var windowTables: [Bool] = scoped == nil ? [] : Array(repeating: false, count: ordered.count)
        // Only the expiry store's entries can be refused below: its table found once, not per change.
        let expiryTable = ordered.firstIndex { $0.name == ExpiryStore.syncedTable }
        for index in candidates.indices {
            let sequence = candidates[index].sequence
            if sequence > horizon || changes.count >= limits.maximumChanges || (bytes >= limits.maximumBytes && !changes.isEmpty) {
                stoppedEarly = true
                break
            }
            through = sequence
            if scoped != nil {
                let table = candidates[index].table
                windowTables[table] = true
                if let step = candidates[index].step { steps[table].append((sequence, step)) }
            }
            guard let change = candidates[index].change.take() else { continue }
            // An expiry entry stored before entries were checked on arrival is never relayed.
            if change.table == expiryTable, ExpiryStore.refusal(of: change, describedBy: ordered[change.table].descriptor, self) != nil { continue }
            bytes += candidates[index].size
            changes.append(change)
        }
        // Without more rows anywhere, the cursor can move to the end of the log.
        let isLast = exhausted && !stoppedEarly
        if isLast { through = backfill.map { max(through, $0.through) } ?? max(through, clock.lastSequence) }

        if let scoped, through > cursor {
            try scoped.finish(steps: steps, windowTables: windowTables, changes: &changes, after: cursor, through: through, tables: ordered,
                              source: source, peerSite: try sites.knownID(of: scoped.peer, connection), connection)
        }

        if markInFlight && through > cursor {
            for table in ordered {
                for sql in table.layout.markInFlight { try connection.execute(sql, [cursor, through]) }
                try markRangesInFlight(of: table, after: cursor, through: through, connection)
            }
        }
        if let peer, recordingPeer, backfill == nil {
            try connection.peerStore.recordSent(to: peer, through: through)
        }
        return ChangeBatch(source: instanceKey, after: cursor, through: through, isLast: isLast, isResync: isResync,
                           tables: ordered.map(\.descriptor), changes: changes)
    }

    /// Per table of `tables`, per value column, through which insert sequence a row's value of it
    /// is sent even if at the insert's version: every row for a column added since the table was
    /// synced (rows inserted before hold its default standing in for a value, which a peer may
    /// send later at the same version), the rows `peer` backfilled for a column it backfilled.
    private func keptColumnsThrough(_ tables: [SyncedTable], for peer: InstanceKey?, _ connection: Connection) throws -> [[Int64]] {
        let backfilled = try peer.map { try connection.peerStore.backfills(to: $0) } ?? [:]
        return tables.map { table in
            table.valueColumns.enumerated().map { index, column in
                table.addedColumns[index] ? .max : backfilled[table.name]?[column] ?? 0
            }
        }
    }

    /// The columns `backfill` sends, by table: those it names that this database syncs, or every
    /// value column of a table it asks for whole.
    private func backfillColumns(_ backfill: BackfillScope) -> [String: [String]] {
        var columns: [String: [String]] = [:]
        for (name, names) in backfill.columns {
            guard let table = tables[name] else { continue }
            columns[name] = names.isEmpty ? table.valueColumns : names.filter(table.valueColumns.contains)
        }
        return columns
    }

    /// Leaves out of `values` the columns the receiver holds (`held`); returns the omitted flags
    /// of a partial change, none when it holds none.
    private static func leavingOut(_ held: [Bool], of values: inout [DatabaseValue]) -> [Bool] {
        guard held.contains(true) else { return [] }
        for (index, left) in held.enumerated() where left { values[index] = .null }
        return held
    }

    /// The key columns at the start of the current row.
    private func readKey(_ handle: OpaquePointer, keyCount: Int) -> [DatabaseValue] {
        readColumns(handle, from: 0, count: keyCount)
    }

    /// The key columns then the value columns at the start of the current row.
    private func readKeyAndValues(_ handle: OpaquePointer, keyCount: Int, valueCount: Int) -> (key: [DatabaseValue], values: [DatabaseValue]) {
        (readColumns(handle, from: 0, count: keyCount), readColumns(handle, from: keyCount, count: valueCount))
    }

    /// `count` columns of the current row from column `first`. Up to four are written as an array
    /// literal, whose storage is allocated at its size in one call: this runs twice per change
    /// extracted, and growing an array (or allocating one of a size known only at run time) goes
    /// through the generic paths, which cost more than reading the values.
    private func readColumns(_ handle: OpaquePointer, from first: Int, count: Int) -> [DatabaseValue] {
        func column(_ offset: Int) -> DatabaseValue { DatabaseValue(statement: handle, index: Int32(first + offset)) }
        switch count {
        case 0: return []
        case 1: return [column(0)]
        case 2: return [column(0), column(1)]
        case 3: return [column(0), column(1), column(2)]
        case 4: return [column(0), column(1), column(2), column(3)]
        default: return (0..<count).map(column)
        }
    }

    private func estimatedSize(_ change: RowChange) -> Int {
        func size(_ value: DatabaseValue) -> Int {
            switch value {
            case .null: return 1
            case .integer: return 5
            case .real: return 9
            case let .text(text): return 2 + text.utf8.count
            case let .blob(data): return 2 + data.count
            }
        }
        var total = 12 + change.versions.count * 10
        for value in change.key { total += size(value) }
        for value in change.values { total += size(value) }
        return total
    }
}
