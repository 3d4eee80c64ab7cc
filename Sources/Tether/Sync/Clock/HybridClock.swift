import CSQLite
import Foundation

/// The database's hybrid logical clock and its changelog sequence, kept in `tether_clock` (the
/// only code that reads or writes that table): the timestamps of its versions, and the numbers
/// that order its changes for peers.
///
/// Reloaded from the table at the first change of each transaction (another process may have
/// written since) and written back before the COMMIT that follows changes. Used under the
/// writer's lock, like the engine that holds it (hence its per-change state is
/// `@exclusivity(unchecked)`, as the engine's is).
final class HybridClock: @unchecked Sendable {
    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_clock (id INTEGER PRIMARY KEY CHECK (id = 1), sequence INTEGER NOT NULL, \
        timestamp INTEGER NOT NULL, collected_through INTEGER NOT NULL DEFAULT 0) STRICT;
        CREATE TABLE IF NOT EXISTS tether_collected_echoes (site INTEGER PRIMARY KEY, through INTEGER NOT NULL) STRICT;
        CREATE TABLE IF NOT EXISTS tether_resumed_writes (sequence INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL) \
        STRICT;
        """

    /// Where this clock stands in recording the first transaction it numbered (`tether_resumed_writes`).
    enum ResumeRecord {
        /// No number given yet.
        case waiting
        /// The first number given, by a transaction not written yet.
        case pending(Int64)
        /// Written before a COMMIT, which may still fail.
        case written
        case recorded
    }

    /// How many of the first transactions of the latest openings `tether_resumed_writes` keeps.
    static let resumedWritesKept = 64

    /// The last sequence number given.
    @exclusivity(unchecked) private(set) var lastSequence: Int64 = 0
    /// The latest timestamp issued or received.
    private(set) var latest = HybridTimestamp.zero
    /// Whether numbers or timestamps were given since the last write.
    @exclusivity(unchecked) private(set) var isDirty = false
    /// Set when the stored clock must be read again before the next change.
    @exclusivity(unchecked) private(set) var needsReload = true
    /// How far ahead of this machine's wall clock a peer's timestamps may be.
    var maximumSkew: Duration = .seconds(3600)
    @exclusivity(unchecked) private var resumeRecord = ResumeRecord.waiting

    /// Makes the clock's row of a new database.
    static func create(_ connection: Connection) throws {
        try connection.execute("INSERT OR IGNORE INTO tether_clock (id, sequence, timestamp) VALUES (1, 0, 0)")
    }

    /// Reads the stored clock, unless it is current.
    func reload(_ connection: Connection) throws {
        guard needsReload else { return }
        let statement = try connection.cachedStatement("SELECT sequence, timestamp FROM tether_clock WHERE id = 1")
        try statement.bind(StatementArguments())
        defer { statement.reset() }
        guard try statement.step() else { throw SyncError.corruptMetadata("tether_clock has no row") }
        // max: a rolled-back transaction may have used numbers beyond what is
        // stored; skipping them is harmless, and the clock never goes back.
        lastSequence = max(lastSequence, sqlite3_column_int64(statement.handle, 0))
        latest = max(latest, HybridTimestamp(rawValue: UInt64(bitPattern: sqlite3_column_int64(statement.handle, 1))))
        needsReload = false
    }

    /// The next transaction reads the stored clock again (it may have changed, or been undone).
    func invalidate() { needsReload = true }

    /// Forgets that numbers were given: a rollback undid them, and no COMMIT must write them.
    func discardUnwritten() {
        isDirty = false
        needsReload = true
        if case .recorded = resumeRecord {} else { resumeRecord = .waiting }
    }

    @inline(__always)
    func nextSequence() -> Int64 {
        lastSequence += 1
        isDirty = true
        if case .recorded = resumeRecord {} else { noteResume() }
        return lastSequence
    }

    /// A number given before the first transaction this clock numbered is recorded; or after it committed.
    private func noteResume() {
        switch resumeRecord {
        case .waiting: resumeRecord = .pending(lastSequence)
        case .written: resumeRecord = .recorded
        case .pending, .recorded: break
        }
    }

    /// A timestamp after every one issued or received.
    func nextTimestamp() -> HybridTimestamp {
        let wall = HybridTimestamp.wallClock()
        latest = wall > latest ? wall : HybridTimestamp(rawValue: latest.rawValue + 1)
        isDirty = true
        return latest
    }

    /// Moves the clock past a received timestamp; refuses one too far ahead of the wall clock.
    func observe(_ timestamp: HybridTimestamp) throws {
        guard timestamp > latest else { return }
        let wall = HybridTimestamp.wallClock().milliseconds
        let limit = maximumSkew.wholeMilliseconds
        if timestamp.milliseconds > wall, timestamp.milliseconds - wall > UInt64(max(0, limit)) {
            throw SyncError.clockSkew(
                ahead: .milliseconds(Int64(clamping: timestamp.milliseconds - wall)), limit: maximumSkew)
        }
        latest = timestamp
        isDirty = true
    }

    /// Writes the clock back; runs before every COMMIT that follows changes.
    func write(_ connection: Connection) throws {
        guard isDirty else { return }
        try connection.cachedStatement(
            "UPDATE tether_clock SET sequence = max(sequence, ?), timestamp = max(timestamp, ?) WHERE id = 1"
        )
        .execute([lastSequence, Int64(bitPattern: latest.rawValue)])
        isDirty = false
        if case let .pending(first) = resumeRecord { try recordResume(first, connection) }
    }

    /// Records that this opening of the database first numbered `first`, in a transaction whose
    /// clock is `latest`: a database restored in place and opened again numbers anew sequences
    /// its peers hold, and this tells it even when the rows it wrote were all written again since
    /// (`SyncEngine.checkHistory`). One row per opening that writes, the latest kept.
    private func recordResume(_ first: Int64, _ connection: Connection) throws {
        try connection.execute(
            "INSERT OR REPLACE INTO tether_resumed_writes (sequence, timestamp) VALUES (?, ?)",
            [first, Int64(bitPattern: latest.rawValue)])
        try connection.execute(
            """
            DELETE FROM tether_resumed_writes WHERE sequence < (SELECT min(sequence) FROM (SELECT sequence FROM \
            tether_resumed_writes ORDER BY sequence DESC LIMIT ?))
            """, [Self.resumedWritesKept])
        resumeRecord = .written
    }

    /// The first transaction of an opening that numbered a sequence at or before `through` and
    /// wrote a clock later than `clock` (the latest such), if any.
    static func resumedWrite(atOrBefore through: Int64, after clock: UInt64, _ connection: Connection) throws
        -> (sequence: Int64, timestamp: UInt64)?
    {
        try connection.fetchRow(
            """
            SELECT sequence, timestamp FROM tether_resumed_writes WHERE sequence <= ? AND timestamp > ? ORDER BY \
            timestamp DESC LIMIT 1
            """, [through, Int64(bitPattern: clock)]
        ).map { (try $0.get(0, as: Int64.self), UInt64(bitPattern: try $0.get(1, as: Int64.self))) }
    }

    // MARK: Stored values, on any connection

    /// The last sequence number committed (on a reader, or another process's).
    static func storedSequence(_ connection: Connection) throws -> Int64 {
        try connection.fetchValue("SELECT sequence FROM tether_clock WHERE id = 1", as: Int64.self) ?? 0
    }

    /// The last sequence number and the latest timestamp committed (on a reader, or another
    /// process's): every version of the rows at or before that sequence is at or before that
    /// timestamp (what a peer keeps as this database's `HistoryMark`).
    static func storedClock(_ connection: Connection) throws -> (sequence: Int64, timestamp: HybridTimestamp) {
        guard let row = try connection.fetchRow("SELECT sequence, timestamp FROM tether_clock WHERE id = 1") else {
            return (0, .zero)
        }
        return (
            try row.get(0, as: Int64.self),
            HybridTimestamp(rawValue: UInt64(bitPattern: try row.get(1, as: Int64.self)))
        )
    }

    /// Tombstones through this sequence were collected that the peer at `site` may need: a peer
    /// whose cursor is behind it needs a full resync. The tombstones of deletes received from that
    /// peer (collected without waiting for its acknowledgement, `CollectionRule`) do not count: it
    /// is never sent them back. Without `site`, every collection counts.
    static func collectedThrough(_ connection: Connection, forPeerAt site: Int32? = nil) throws -> Int64 {
        try connection.fetchValue(
            """
            SELECT max(coalesce((SELECT collected_through FROM tether_clock WHERE id = 1), 0),
                       coalesce((SELECT max(through) FROM tether_collected_echoes WHERE site IS NOT ?), 0))
            """, [site], as: Int64.self) ?? 0
    }

    /// Tombstones through `sequence` were collected: all of them, or with `site` only those of
    /// deletes received from that site.
    static func recordCollected(through sequence: Int64, echoesOf site: Int32? = nil, _ connection: Connection) throws {
        guard let site else {
            return try connection.execute(
                "UPDATE tether_clock SET collected_through = max(collected_through, ?) WHERE id = 1", [sequence])
        }
        try connection.execute(
            """
            INSERT INTO tether_collected_echoes (site, through) VALUES (?, ?)
            ON CONFLICT (site) DO UPDATE SET through = max(through, excluded.through)
            """, [site, sequence])
    }
}
