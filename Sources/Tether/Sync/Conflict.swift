/// A remote change that met a row with a pending or in-flight local change,
/// or a change that could not be applied as is: what both sides held and
/// what the engine did.
public struct Conflict: Sendable {
    /// How the engine settled the conflict, by the table's conflict policy.
    public enum Resolution: Sendable, Equatable {
        /// Per column, the later version won (some columns may come from each side).
        case lastWriterWins
        /// The local row was kept (localWins).
        case keptLocal
        /// The remote row replaced the local one (remoteWins).
        case tookRemote
        /// The custom merge function's result was written.
        case merged
        /// Two rows claimed the same unique value; the row with the later
        /// version of that value kept it, the other was deleted (its values
        /// stay in the tombstone) or kept aside.
        case uniqueRace(winner: [DatabaseValue], loser: [DatabaseValue])
    }

    /// The synced table of the row.
    public let table: String
    /// The row's identity key values, in key order (the same on every peer).
    public let key: [DatabaseValue]
    /// The peer the remote change came from.
    public let peer: InstanceKey
    /// Column name → value; nil when that side has no live row (deleted or absent).
    public let local: [String: DatabaseValue]?
    /// The remote change's values; nil when it deletes the row.
    public let remote: [String: DatabaseValue]?
    /// What the engine did.
    public let resolution: Resolution
}

/// What applying a batch did.
public struct ApplyReport: Sendable {
    /// Changes written (rows inserted, updated or deleted).
    public var applied = 0
    /// Changes that changed nothing (already known, or older than what is here).
    public var unchanged = 0
    /// Changes kept aside now, and still kept aside after retries (all batches).
    public var keptAside = 0
    /// Changes kept aside in this database after the apply, from this batch and earlier ones.
    public var stillKeptAside = 0
    /// Kept-aside changes (from earlier batches too) that applied on retry.
    public var resolvedFromKeptAside = 0
    /// Changes naming a table or columns this database does not sync (yet): applied without
    /// them, and kept whole until a migration adds them (`SyncEngine.applyKeptForSchema`).
    public var keptForSchema = 0
    /// Rows removed by evictions: they left this database's scope (partial replication).
    public var evicted = 0
    /// Rows the sender of a full resync held and no longer has (deleted there, their tombstones
    /// collected): deleted here as this database's own deletes, so that its other peers are told.
    public var deletedByResync = 0
    /// Changes refused because they reach outside the writer's scope (`apply(_:scope:)`): nothing
    /// of them was written. The writer is told, and records them (`recordRefusals(_:by:)`).
    public var refused: [RefusedChange] = []
    /// The conflicts met, each with what both sides held and how it was settled.
    public var conflicts: [Conflict] = []
    /// True when the whole batch had been applied before: nothing was done.
    public var wasDuplicate = false
    /// The peer's cursor after this batch.
    public var cursor: Int64 = 0
    /// This database's last sequence number just before the batch's changes were applied and
    /// just after, in the apply's transaction: the numbers in between were issued by this apply
    /// (the changes it made, and anything it resolved or evicted).
    public var sequenceBefore: Int64 = 0
    /// This database's last sequence number just after the batch's changes were applied (see
    /// `sequenceBefore`).
    public var sequenceAfter: Int64 = 0
}

/// A change that could not be applied (a missing parent row, a unique value
/// another row holds, a constraint of this database), kept to be retried.
public struct KeptAsideChange: Sendable {
    /// Identifies the kept-aside change in this database.
    public let id: Int64
    /// The synced table the change is to.
    public let table: String
    /// The row's identity key values.
    public let key: [DatabaseValue]
    /// The peer the change came from.
    public let peer: InstanceKey
    /// Why it could not be applied, at the last attempt (SQLite's or Tether's message).
    public let reason: String
    /// How many times applying it was tried.
    public let attempts: Int
}
