import CSQLite
import Foundation

/// One extraction: the changes a peer lacks after its cursor, in sequence order, without those
/// that came from the peer itself, cut to a batch's limits.
///
/// Each synced table is read source by source, each with a reader of its own: its rows with
/// metadata of their own and its tombstones (`Extraction+ChangedRows.swift`), its insert ranges
/// and the runs of their rows updated together (`Extraction+InsertRanges.swift`). Every row read
/// becomes a candidate, decided as it is read in one place (`admit`, `Extraction+Candidates.swift`):
/// sent, left out as an echo or by a backfill, or — for a scoped peer — evicted or left out by the
/// scope. The batch is cut from the candidates in sequence order (`cutBatch`); for a scoped peer,
/// what it holds is then recorded for the rows the batch reaches, and the evictions of rows this
/// database evicted join the batch (`ScopedExtraction+Finish.swift`).
///
/// With `backfill`, only the rows through `backfill.through` that hold a value other than the
/// default in one of its columns (or every row of a table listed without columns) are sent, and
/// the batch ends at `backfill.through` (§8.3 of Protocol/README.md).
struct Extraction {
    /// What an extraction is asked for.
    struct Request {
        /// The peer the batch goes to (nil: no echo is left out, nothing recorded).
        var peer: InstanceKey?
        /// The peer's cursor on this database.
        var cursor: Int64
        /// A full resync in progress goes on from `cursor`, echoes included.
        var resuming: Bool
        var limits: BatchLimits
        /// The pending rows sent become in flight until acknowledged.
        var markInFlight: Bool
        /// Records what `peer` was sent: how far (`PeerStore.recordSent`), or the backfill's
        /// columns (`PeerStore.recordBackfill`).
        var recordingPeer = true
        /// Rows inserted before the peer's complete point and updated since go with only the
        /// columns changed after their insert (see `HeldColumns`).
        var allowingPartialRows = false
        var backfill: BackfillScope?
        /// The peer holds only the rows of each scoped table inside it (see `ScopedExtraction`).
        var scope: CompiledScope?
    }

    /// A row read: the change it sends (none when it is left out), decided as it was read.
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

    let engine: SyncEngine
    /// The writer: what the extraction records, and the sync metadata it reads.
    let connection: Connection
    /// Where the changed rows and insert ranges are read: the writer, or the snapshot a catch-up
    /// is served from (`CatchUpSnapshot`), whose log ends where the snapshot was taken.
    let reader: Connection
    let request: Request
    /// Where the batch starts: the peer's cursor, or 0 for a full resync.
    let cursor: Int64
    /// Tombstones after the peer's cursor were collected: only a full resync is safe.
    let isResync: Bool
    /// The synced tables by name: a change's table is its index here.
    let tables: [SyncedTable]
    /// Each query's fetch limit: one row more than a batch holds tells that more follow.
    let fetchLimit: Int
    let echoes: EchoFilter
    /// Set when the batch may hold partial changes.
    var heldColumns: HeldColumns?
    /// Set for a scoped peer: each row of a scoped table is decided as it is read.
    let scoped: ScopedExtraction?

    /// The rows read so far, of every table and source, in the order read.
    var candidates: [Candidate] = []
    /// The highest sequence every query has read up to: a query that hit its fetch limit may hold
    /// unread rows above its last row, so the batch must not move past that row (echoes, which do
    /// not count against `maximumChanges`, can otherwise carry `through` beyond unread rows).
    var horizon = Int64.max
    /// No query stopped at a limit: without more rows anywhere, the cursor can move to the end of the log.
    var exhausted = true
    /// The end of the log: the last sequence number stored. Not the clock's, which keeps numbers a
    /// rolled-back transaction gave (a catch-up's applier that gave the writer up): a peer's cursor
    /// beyond the stored clock would claim numbers this database never gave once it reopens.
    let logEnd: Int64

    var limits: BatchLimits { request.limits }
    /// Rows past a backfill's end are not read.
    var backfillEnd: Int64 { request.backfill?.through ?? .max }

    /// Prepares the extraction `request` asks of `engine`: checks the peer's cursor, records a
    /// backfill's columns and the scope the peer is sent under, and settles where the batch starts.
    init(_ request: Request, engine: SyncEngine, _ connection: Connection, reading reader: Connection? = nil) throws {
        let peer = request.peer
        try Self.prepare(engine, for: peer, connection)
        guard request.cursor <= engine.clock.lastSequence else {
            // The peer holds sequence numbers of this key that this database never gave.
            throw SyncError.instanceKeyReused(
                "peer \(peer.map(\.description) ?? "(unnamed)") has this database's "
                    + "changes through sequence \(request.cursor) of instance key \(engine.instanceKey), "
                    + "which has given only \(engine.clock.lastSequence)")
        }
        if let backfill = request.backfill, let peer, request.recordingPeer {
            try connection.peerStore.recordBackfill(
                to: peer, columns: Self.columns(of: backfill, engine),
                through: backfill.through)
        }
        let peerID = try peer.flatMap { try engine.sites.knownID(of: $0, connection) }
        let collectedThrough = try HybridClock.collectedThrough(connection, forPeerAt: peerID)
        isResync = request.cursor < collectedThrough && !request.resuming && request.backfill == nil
        logEnd = try HybridClock.storedSequence(reader ?? connection)
        cursor = isResync ? 0 : request.cursor
        self.engine = engine
        self.connection = connection
        self.reader = reader ?? connection
        self.request = request
        tables = engine.tablesInBatchOrder
        fetchLimit = request.limits.maximumChanges + 1
        // Rows received from the peer itself, unchanged since, are echoes too; not for a backfill,
        // which sends the values of columns the peer lacked when it sent the row. Looked up, not
        // registered: a peer never met sent this database nothing (and a full disk must not keep
        // this database from sending its changes).
        let leavesOutEchoes = !(isResync || request.resuming)
        echoes = EchoFilter(leavesOut: leavesOutEchoes, peer: peer, peerSite: request.backfill == nil ? peerID : nil)
        // A scoped peer may lack a row it is sent (a move-in): changes to it go whole.
        // Only rows the peer held at a complete point (a catch-up's end it applied) can go partial.
        var completePoint: Int64?
        if let peer, leavesOutEchoes, cursor > 0, request.backfill == nil, request.recordingPeer {
            completePoint = try connection.peerStore.completePoint(of: peer, pullingFrom: cursor)
        }
        if request.allowingPartialRows, request.scope == nil, let completePoint {
            heldColumns = try HeldColumns(
                tables, for: peer, completePoint: completePoint, engine: engine, reader ?? connection)
        }
        if let scope = request.scope {
            guard let peer else { throw ScopeError(table: "", reason: .needsPeer) }
            try ScopedExtraction.prepareRules(scope, peer: peer, cursor: cursor, engine: engine, connection)
            scoped = ScopedExtraction(scope, peer: peer, tables: tables)
        } else {
            scoped = nil
        }
        candidates.reserveCapacity(min(fetchLimit, 1 << 16))
    }

    /// What every extraction does first: refuses a copy not yet rekeyed and a peer whose history
    /// this database cannot serve, and reads what other programs wrote and the clock.
    static func prepare(_ engine: SyncEngine, for peer: InstanceKey?, _ connection: Connection) throws {
        try engine.ensureNotACopy()
        try engine.ensureHistoryHolds(for: peer, connection)
        try engine.capture.foldExternalWritesIfAny(connection)
        try engine.prepareClock(connection)
    }

    /// Reads every table, cuts the batch, and records what the peer was sent.
    mutating func run() throws -> ChangeBatch {
        for index in tables.indices {
            guard let table = TableRead(index, of: self) else { continue }
            try readChangedRows(of: table, alive: true)
            try readChangedRows(of: table, alive: false)
            try readInsertRanges(of: table)
        }
        candidates.sort { $0.sequence < $1.sequence }
        var batch = cutBatch()
        try engine.attachCounterStates(to: &batch.changes, tables: tables) {
            try statement(.selectCountersByKey, of: $0)
        }
        if let scoped, batch.through > cursor {
            let peerSite = try engine.sites.knownID(of: scoped.peer, connection)
            try scoped.finish(
                batch.window, changes: &batch.changes, after: cursor, through: batch.through,
                tables: tables, source: engine.instanceKey, peerSite: peerSite, connection)
        }
        // Not at or below what the peer acknowledged already (another session of its database did,
        // after pulling the same changes): an acknowledgement visits only the changes after the one
        // before it, so a row marked there would stay in flight.
        let acknowledged = try request.peer.flatMap { try connection.peerStore.acknowledgedThrough(by: $0) } ?? 0
        let markAfter = isResync || request.resuming ? cursor : max(cursor, acknowledged)
        if request.markInFlight && batch.through > markAfter {
            var markedRows = false
            for table in tables {
                for sql in table.layout.markInFlight {
                    try connection.execute(sql, [markAfter, batch.through])
                    markedRows = markedRows || connection.changes > 0
                }
                try engine.markRangesInFlight(of: table, after: markAfter, through: batch.through, connection)
            }
            // Only a row marked moves the bound: a batch of echoes (a relay's rows sent back to
            // their source are none) marks none, and its peer's acknowledgement need visit none.
            if markedRows {
                try InstanceIdentity.recordInFlightMarks(
                    through: batch.through, lastSequence: try HybridClock.storedSequence(connection), connection)
            }
        }
        if let peer = request.peer, request.recordingPeer, request.backfill == nil {
            try connection.peerStore.recordSent(to: peer, through: batch.through)
            try connection.peerStore.recordBatchEnd(
                to: peer, through: batch.through, complete: batch.isLast && request.scope == nil,
                scoped: request.scope != nil)
        }
        return ChangeBatch(
            source: engine.instanceKey, after: cursor, through: batch.through, isLast: batch.isLast,
            isResync: isResync, tables: tables.map(\.descriptor), changes: batch.changes)
    }

    /// The columns `backfill` sends, by table: those it names that this database syncs, or every
    /// value column of a table it asks for whole.
    private static func columns(of backfill: BackfillScope, _ engine: SyncEngine) -> [String: [String]] {
        var columns: [String: [String]] = [:]
        for (name, names) in backfill.columns {
            guard let table = engine.table(named: name) else { continue }
            columns[name] = names.isEmpty ? table.valueColumns : names.filter(table.valueColumns.contains)
        }
        return columns
    }
}

extension Extraction {
    /// `query` of `table` on the reader.
    func statement(_ query: SyncedTable.Query, of table: SyncedTable) throws -> Statement {
        reader === connection ? try table.statement(query, connection) : try table.statement(query, onReader: reader)
    }

    /// One table as the extraction reads it.
    struct TableRead {
        let index: Int
        let table: SyncedTable
        /// Set when the scope names the table.
        let scoped: ScopedExtraction.Table?
        /// For a backfill, the value columns whose rows go (by index; empty: every row); nil
        /// without a backfill.
        let backfillColumns: [Int]?
        let keyCount: Int
        let valueCount: Int

        /// Table `index` of `extraction`; nil when a backfill does not read it (it reads only its
        /// tables, and of those only the rows holding values of its columns).
        init?(_ index: Int, of extraction: Extraction) {
            let table = extraction.tables[index]
            if let backfill = extraction.request.backfill {
                guard let names = backfill.columns[table.name] else { return nil }
                let columns = names.compactMap { table.valueColumns.firstIndex(of: $0) }
                if !names.isEmpty && columns.isEmpty { return nil }
                backfillColumns = columns
            } else {
                backfillColumns = nil
            }
            self.index = index
            self.table = table
            scoped = extraction.scoped?.tables[index]
            keyCount = table.keyColumns.count
            valueCount = table.valueColumns.count
        }

        /// Whether a backfill sends a row of these `values`.
        func isBackfilled(_ values: [DatabaseValue]) -> Bool {
            guard let columns = backfillColumns, !columns.isEmpty else { return true }
            return columns.contains { values[$0] != table.valueDefaults[$0] }
        }
    }

    /// How far one source of a table has read (a change query, or the table's insert ranges): rows,
    /// up to which sequence, and the estimated bytes of the changes it collected. Rows are read only
    /// up to the batch's byte budget too, not its change count alone: 10,000 large rows read to send
    /// 1 MiB of them held ten times what the batch needed.
    struct Stream {
        var fetched = 0
        var lastFetched: Int64
        var bytes = 0

        mutating func read(_ sequence: Int64) {
            fetched += 1
            lastFetched = sequence
        }
    }

    /// Ends `stream`: one stopped by a limit may have unread rows, above which the batch must not
    /// move. Whether it stopped so.
    @discardableResult
    mutating func end(_ stream: Stream) -> Bool {
        guard stream.fetched == fetchLimit || stream.bytes >= limits.maximumBytes else { return false }
        exhausted = false
        horizon = min(horizon, stream.lastFetched)
        return true
    }
}

extension SyncEngine {
    /// The changes `request.peer` lacks after its cursor (see `Extraction`).
    /// The changes `request.peer` lacks after its cursor (see `Extraction`), read on `reader` when
    /// given (a catch-up's snapshot) and recorded on the writer, `connection`.
    func extract(_ request: Extraction.Request, _ connection: Connection, reading reader: Connection? = nil) throws
        -> ChangeBatch
    {
        var extraction = try Extraction(request, engine: self, connection, reading: reader)
        return try extraction.run()
    }
}
