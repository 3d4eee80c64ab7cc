// A catch-up's batches held on disk until its last batch arrives, then applied with it in one
// transaction: a reader never sees part of a source transaction, nor a mix of rows the source
// never held together.

import Foundation

/// The batches of a catch-up received and not yet applied, in `tether_staged_batches`: the only
/// code that reads or writes that table.
///
/// Each batch of a catch-up is one read of its source; the rows a batch holds travel with their
/// latest values, so a prefix of a catch-up mixes rows at the source's newest state with rows
/// older than the cursor. Only all of them together, up to a batch read when nothing followed it
/// (`isLast`), make a state the source held. They are staged here, in order, each one following
/// the one before; a crash or a lost link keeps them, and the next session pulls from the last
/// one's `through` (see `Database.stagedCatchUp(from:)`).
struct StagedBatchStore {
    let connection: Connection

    // Where a chain stands is read for every batch staged: from the index, which holds every column
    // but the batch (a column after the batch, read from the table, walks the batch's overflow pages).
    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_staged_batches (id INTEGER PRIMARY KEY, source BLOB NOT NULL, after \
        INTEGER NOT NULL, through INTEGER NOT NULL, changes INTEGER NOT NULL, batch BLOB NOT NULL, mark_through \
        INTEGER, mark_clock INTEGER) STRICT;
        DROP INDEX IF EXISTS tether_staged_batches_by_source;
        CREATE INDEX IF NOT EXISTS tether_staged_batches_chain ON tether_staged_batches (source, id, after, through, \
        changes, mark_through, mark_clock);
        """

    /// Stages `batch` as it travelled (the bytes it was decoded from, checked then; encoded again
    /// only when it was made otherwise), with the mark of its source's history it came with.
    func stage(_ batch: ChangeBatch, mark: HistoryMark?) throws {
        try connection.execute(
            """
            INSERT INTO tether_staged_batches (source, after, through, changes, batch, mark_through, mark_clock) \
            VALUES (?, ?, ?, ?, ?, ?, ?)
            """,
            [
                Data(batch.source.bytes), batch.after, batch.through, batch.changes.count,
                Data(batch.decodedFrom ?? BatchCoding.encode(batch)),
                mark.map { DatabaseValue.integer($0.through) } ?? DatabaseValue.null,
                mark.map { DatabaseValue.integer(Int64(bitPattern: $0.clock)) } ?? DatabaseValue.null,
            ])
    }

    /// Where the batches staged from `source` stand, nil when none is.
    func chain(from source: InstanceKey) throws -> StagedCatchUp? {
        let key = Data(source.bytes)
        guard
            let row = try connection.fetchRow(
                """
                SELECT min(after), max(through), count(*), sum(changes) FROM tether_staged_batches WHERE source = ?
                """, [key]), try row.get(2, as: Int.self) > 0
        else { return nil }
        let mark = try connection.fetchRow(
            """
            SELECT mark_through, mark_clock FROM tether_staged_batches WHERE source = ? AND mark_through IS NOT NULL \
            ORDER BY id DESC LIMIT 1
            """, [key]
        ).map {
            HistoryMark(
                through: try $0.get(0, as: Int64.self), clock: UInt64(bitPattern: try $0.get(1, as: Int64.self)))
        }
        return StagedCatchUp(
            source: source, after: try row.get(0, as: Int64.self), through: try row.get(1, as: Int64.self),
            batches: try row.get(2, as: Int.self), changes: try row.get(3, as: Int.self), mark: mark)
    }

    /// The ids of the batches staged from `source`, in the order they arrived.
    func ids(from source: InstanceKey) throws -> [Int64] {
        try connection.fetchRows(
            "SELECT id FROM tether_staged_batches WHERE source = ? ORDER BY id", [Data(source.bytes)]
        ).map { try $0.get(0, as: Int64.self) }
    }

    /// The staged batch `id`, decoded (the apply checks it as it checks every batch).
    func batch(_ id: Int64) throws -> ChangeBatch {
        try Self.decode(try encodedBatch(id), id: id)
    }

    /// The staged batch `id` as it was stored, to be decoded with ``decode(_:id:)``.
    func encodedBatch(_ id: Int64) throws -> [UInt8] {
        let bytes = try connection.fetchValue(
            "SELECT batch FROM tether_staged_batches WHERE id = ?", [id], as: Data.self)
        guard let bytes else { throw SyncError.corruptMetadata("staged batch \(id) is gone") }
        return [UInt8](bytes)
    }

    /// Decodes staged batch `id`'s bytes; needs no connection, so it can run on another thread.
    static func decode(_ bytes: [UInt8], id: Int64) throws -> ChangeBatch {
        // Checked as they arrived, in whichever format the session agreed on; what they expand to
        // was bounded then.
        let unbounded = ColumnarLimits(maxValues: .max, maxValueBytes: .max)
        do {
            return try BatchCoding.decodeWithoutValidating(
                bytes, maximumFormat: BatchCoding.latestFormat, columnarLimits: unbounded)
        } catch {
            throw SyncError.corruptMetadata("staged batch \(id) cannot be read: \(error)")
        }
    }

    /// The batches staged from `source` go unless they start at `cursor`: a catch-up that no longer
    /// starts at the cursor (another session moved it) is not this database's any more.
    func discard(from source: InstanceKey, unlessStartingAt cursor: Int64) throws {
        try connection.execute(
            """
            DELETE FROM tether_staged_batches WHERE source = ?1 \
            AND (SELECT min(after) FROM tether_staged_batches WHERE source = ?1) != ?2
            """, [Data(source.bytes), cursor])
    }

    /// The batches staged from `source` go: applied, or of no use any more.
    func discard(from source: InstanceKey) throws {
        try connection.execute("DELETE FROM tether_staged_batches WHERE source = ?", [Data(source.bytes)])
    }
}

extension Connection {
    /// The staged batches, read and written on this connection.
    var stagedBatches: StagedBatchStore { StagedBatchStore(connection: self) }
}
