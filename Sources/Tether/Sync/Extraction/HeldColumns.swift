/// Partial changes (`Extraction.Request.allowingPartialRows`): a row inserted at or before a
/// complete point of the receiver (a catch-up's end it applied, `PeerStore.completePoint`) is
/// held there; the columns of its later changes still at its insert's version are left out. Not
/// for a scoped peer, which may lack a row it is sent (a move-in), nor for a full resync. A
/// point short of a catch-up's end would not do: a row inserted before it and changed again
/// before the batch reaching its insert was read has not been sent at all.
struct HeldColumns {
    private let engine: SyncEngine
    private let connection: Connection
    private let completePoint: Int64
    /// A column is left out only if the receiver got its value with the row's insert: not one
    /// added here since the table was synced, nor one the peer backfilled, for rows inserted by
    /// then (either side lacked it when the row went). Per table, per value column: the last
    /// insert sequence whose rows keep it (0: none).
    private let keptThrough: [[Int64]]
    /// Each table's ranges that started by the complete point, read when first needed, by rowid.
    private var startedRanges: [[InsertRange]?]

    /// For a batch of `tables` to `peer`, which held every row at `completePoint`.
    init(
        _ tables: [SyncedTable], for peer: InstanceKey?, completePoint: Int64, engine: SyncEngine,
        _ connection: Connection
    ) throws {
        self.engine = engine
        self.connection = connection
        self.completePoint = completePoint
        keptThrough = try Self.keptColumnsThrough(tables, for: peer, connection)
        startedRanges = Array(repeating: nil, count: tables.count)
    }

    /// The columns of the live row `rowid` of `table` with metadata of its own (`versions`) that
    /// the receiver holds: the omitted flags of the partial change, none when it holds none. Read
    /// before the row's values, which are then read only for the columns sent.
    ///
    /// A row born in an insert range is judged by the range; any other by its own insert
    /// (`inserted`, the sequence number its metadata keeps; nil when unknown): a row loaded by
    /// SQL or by another program has metadata of its own from its insert, and the columns still at
    /// the version it was inserted with (its existence's) are the receiver's once its complete
    /// point has passed that insert.
    mutating func omitted(
        ofRow rowid: Int64, versions: RowVersions, insertedAt inserted: Int64?, _ table: Extraction.TableRead
    ) throws -> [Bool] {
        if startedRanges[table.index] == nil {
            startedRanges[table.index] = try engine.insertRanges(
                of: table.table, startingAtOrBefore: completePoint,
                connection)
        }
        if let range = Self.range(containing: rowid, in: startedRanges[table.index] ?? []) {
            return omitted(versions, insertedAt: range.sequence(ofRowid: rowid), withVersion: range.version, table)
        }
        guard let inserted else { return [] }
        return omitted(versions, insertedAt: inserted, withVersion: versions.existence, table)
    }

    /// The same for the row `rowid` of `range`, when it is a run of rows updated together.
    func omitted(
        ofRangeRow rowid: Int64, in range: InsertRange, _ table: Extraction.TableRead
    ) -> [Bool] {
        guard let updated = range.updatedVersions else { return [] }
        return omitted(updated, insertedAt: range.insertedSequence(ofRowid: rowid), withVersion: range.version, table)
    }

    /// The columns of a row of `versions`, inserted at `inserted` with version `insert`, that the
    /// receiver holds: those still at the insert's version, if the receiver's complete point has passed the insert.
    private func omitted(
        _ versions: RowVersions, insertedAt inserted: Int64, withVersion insert: LocalVersion,
        _ table: Extraction.TableRead
    ) -> [Bool] {
        guard inserted <= completePoint else { return [] }
        let kept = keptThrough[table.index]
        let held = (0..<table.valueCount).map { versions.column($0) == insert && inserted > kept[$0] }
        return held.contains(true) ? held : []
    }

    /// Per table of `tables`, per value column, through which insert sequence a row's value of it
    /// is sent even if at the insert's version: every row for a column added since the table was
    /// synced (rows inserted before hold its default standing in for a value, which a peer may
    /// send later at the same version), the rows `peer` backfilled for a column it backfilled.
    private static func keptColumnsThrough(
        _ tables: [SyncedTable], for peer: InstanceKey?,
        _ connection: Connection
    ) throws -> [[Int64]] {
        let backfilled = try peer.map { try connection.peerStore.backfills(to: $0) } ?? [:]
        return tables.map { table in
            table.valueColumns.enumerated().map { index, column in
                table.addedColumns[index] ? .max : backfilled[table.name]?[column] ?? 0
            }
        }
    }

    /// The range of `ranges` (sorted by rowid, disjoint) that covers `rowid`.
    private static func range(containing rowid: Int64, in ranges: [InsertRange]) -> InsertRange? {
        var low = 0
        var high = ranges.count
        while low < high {
            let middle = (low + high) / 2
            if ranges[middle].lastRowid < rowid { low = middle + 1 } else { high = middle }
        }
        return low < ranges.count && ranges[low].firstRowid <= rowid ? ranges[low] : nil
    }
}
