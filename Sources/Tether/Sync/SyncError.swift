/// Errors of the replication engine.
public enum SyncError: Error, Sendable, CustomStringConvertible {
    /// A table cannot be synced as asked, and why.
    case invalidTable(String)
    /// A batch does not match this database's synced tables.
    case schemaMismatch(String)
    /// The table is not synced.
    case notSynced(String)
    /// A peer's clock is too far ahead of ours.
    case clockSkew(String)
    /// A sync file cannot be read.
    case invalidSyncFile(String)
    /// The engine's own metadata is damaged.
    case corruptMetadata(String)
    /// A table uses a custom merge, but none is registered in this process.
    case missingMergeFunction(String)
    /// A batch breaks a rule the batch alone shows (`ChangeBatch.validate()`): nothing of it was applied.
    case invalidBatch(BatchValidationError)
    /// A batch carries a version attributed to this database that this database never wrote (a
    /// timestamp later than its clock): a peer forges its changes. Nothing of the batch was applied.
    case forgedVersion(String)
    /// A batch left out values this database does not hold at their versions: nothing of it was
    /// applied; ask the sender for whole rows (`extractChanges(…, allowingPartialRows: false)`).
    case needsWholeRows(String)

    public var description: String {
        switch self {
        case let .invalidTable(reason): return "cannot sync table: \(reason)"
        case let .schemaMismatch(reason): return "schema mismatch: \(reason)"
        case let .notSynced(table): return "table \(table) is not synced"
        case let .clockSkew(reason): return "clock skew: \(reason)"
        case let .invalidSyncFile(reason): return "invalid sync file: \(reason)"
        case let .corruptMetadata(reason): return "damaged sync metadata: \(reason)"
        case let .invalidBatch(rule): return "invalid batch: \(rule)"
        case let .forgedVersion(reason): return "forged change: \(reason)"
        case let .needsWholeRows(reason): return "the batch needs whole rows: \(reason)"
        case let .missingMergeFunction(table): return "table \(table) resolves conflicts with a custom merge, but none is registered; call setConflictPolicy(.custom(…), for:) after opening"
        }
    }
}
