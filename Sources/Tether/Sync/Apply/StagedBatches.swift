// A catch-up's batches held on disk until its last batch arrives, then applied with it in one
// transaction: a reader never sees part of a source transaction, nor a mix of rows the source
// never held together.

import CSQLite
import Foundation

/// The file beside the database that holds the staged batches (`<database>-catchup`, an SQLite
/// database of one table), with its own connection: a batch is staged without the database's
/// writer, which a catch-up applied as it arrives holds meanwhile (`CatchUpApplier`). Opened at
/// the first batch staged; an in-memory database stages in memory.
///
/// What it holds only ever saves a refetch: a chain that does not start at this database's cursor
/// on its source is dropped as of no use (a file from another database, a crash between the
/// apply's commit and the chain's removal), and a file that cannot be read is set aside and made
/// again. Every use takes its lock; none waits for the database's writer while holding it (the
/// writer is always taken first).
final class StagingFile: @unchecked Sendable {
    /// Where the file is (`:memory:` beside an in-memory database).
    let path: String
    private let lock = ErrorCheckingLock()
    private var connection: Connection?  // guarded by lock
    private var isClosed = false  // guarded by lock

    /// The staging file of the database at `databasePath`.
    init(besideDatabaseAt databasePath: String, isMemory: Bool) {
        path = isMemory ? ":memory:" : databasePath + "-catchup"
    }

    /// Runs `body` on the staged batches, opening the file at the first use.
    func withStore<T>(_ body: (StagedBatchStore) throws -> T) throws -> T {
        guard lock.lock() else {
            throw DatabaseError(
                extendedCode: SQLITE_MISUSE, message: "the staging file \(path) was used from inside its own use")
        }
        defer { lock.unlock() }
        guard !isClosed else { throw DatabaseError.closed() }
        let connection = try self.connection ?? open()
        self.connection = connection
        return try body(StagedBatchStore(connection: connection))
    }

    /// Runs `body` on the staged batches if anything was ever staged here; nil, without making
    /// the file, if not (a database that only sends, or on a full disk, reads nothing staged).
    func withStoreIfAny<T>(_ body: (StagedBatchStore) throws -> T) throws -> T? {
        guard lock.lock() else {
            throw DatabaseError(
                extendedCode: SQLITE_MISUSE, message: "the staging file \(path) was used from inside its own use")
        }
        let exists = connection != nil || (path != ":memory:" && FileManager.default.fileExists(atPath: path))
        lock.unlock()
        return exists ? try withStore(body) : nil
    }

    /// Closes the file (the database closes); later uses throw.
    func close() {
        _ = lock.lock()
        defer { lock.unlock() }
        isClosed = true
        connection?.close()
        connection = nil
    }

    private func open() throws -> Connection {
        do {
            return try openFile()
        } catch let error as DatabaseError where [SQLITE_NOTADB, SQLITE_CORRUPT].contains(error.code) {
            // Not a staging file we can read (damaged, or not SQLite): what it held comes again.
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
            return try openFile()
        }
    }

    private func openFile() throws -> Connection {
        let connection = try Connection(path: path, flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
        if path != ":memory:" {
            // Before the switch to WAL, which needs the file to itself: a reader of the file (the
            // sqlite3 shell looking in) is waited for rather than failing the sync.
            if let db = connection.handle { sqlite3_busy_timeout(db, 5000) }
            _ = try connection.fetchValue("PRAGMA journal_mode = WAL", as: String.self)
            // Staged batches only save a refetch: a power cut may lose the last of them.
            try connection.execute("PRAGMA synchronous = NORMAL")
        }
        try connection.executeScript(StagedBatchStore.schema)
        return connection
    }
}

/// The batches of a catch-up received and not yet applied, in the staging file's
/// `tether_staged_batches`: the only code that reads or writes that table.
///
/// Each batch of a catch-up is one read of its source; the rows a batch holds travel with their
/// latest values, so a prefix of a catch-up mixes rows at the source's newest state with rows
/// older than the cursor. Only all of them together, up to a batch read when nothing followed it
/// (`isLast`), make a state the source held. They are staged here, in order, each one following
/// the one before; a crash or a lost link keeps them, and the next session pulls from the last
/// one's `through` (see `Database.stagedCatchUp(from:)`).
struct StagedBatchStore {
    let connection: Connection

    /// Where staged batches were kept before they had a file of their own: dropped from the
    /// database (what they held comes again from the cursor).
    static let formerTableSchema = "DROP TABLE IF EXISTS tether_staged_batches;"

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

    /// The ids of the batches staged from `source` (those ending at or before `through`), in the
    /// order they arrived.
    func ids(from source: InstanceKey, through: Int64 = .max) throws -> [Int64] {
        try connection.fetchRows(
            "SELECT id FROM tether_staged_batches WHERE source = ? AND through <= ? ORDER BY id",
            [Data(source.bytes), through]
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
