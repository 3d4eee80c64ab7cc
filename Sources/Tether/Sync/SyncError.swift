/// Errors of the replication engine.
public enum SyncError: Error, Sendable, CustomStringConvertible {
    /// A table cannot be synced as asked, and why.
    case invalidTable(String)
    /// A batch does not match this database's synced tables.
    case schemaMismatch(String)
    /// The table is not synced.
    case notSynced(String)
    /// A peer's timestamp is `ahead` of this machine's wall clock, more than the `limit`
    /// (`Database.maximumClockSkew`) allows. Nothing of the batch was applied; the same change
    /// is accepted once this clock has caught up to within the limit, `ahead - limit` later.
    case clockSkew(ahead: Duration, limit: Duration)
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
    /// This database is a copy of another (a cloned node, a restored backup) that carries the
    /// same instance key: it does not sync under it until `Database.resetInstanceKey()` (or
    /// `confirmMove()`, for a database moved rather than copied). Its writes stay pending.
    case copiedDatabase(instanceKey: InstanceKey, reason: String)
    /// A peer has seen more of this database's instance key than this database ever wrote: two
    /// databases sync under one key (this one is a copy, or the original of a copy that synced
    /// first). Nothing was sent; rekey one of them.
    case instanceKeyReused(String)
    /// This database was restored to an earlier state in place (a file-system or VM snapshot
    /// rolled back, a file copied back over itself) and has since written other changes under
    /// sequence numbers a peer already holds from its instance key: two histories under one key.
    /// A peer's `HistoryMark` showed it (`reason` gives both histories' evidence, naming the peer),
    /// or the peer's mark is made up. It does not sync with that peer (nor any other whose mark
    /// shows it) until `Database.resetInstanceKey()`; other peers sync meanwhile.
    case historyDiverged(instanceKey: InstanceKey, reason: String)
    /// A peer presented `instanceKey`, which is pinned to another certificate (`pinnedTo`, the one
    /// that presented it first), with its certificate `presentedBy`: no peer may sync under
    /// another's key. Nothing of the session ran.
    case instanceKeyPinned(instanceKey: InstanceKey, pinnedTo: String, presentedBy: String)
    /// Change `change` of a batch is an expiry entry this database refuses (`reason`: a table it
    /// does not sync, one of Tether's or SQLite's own, a key that is not that table's): nothing of
    /// the batch was applied.
    case refusedExpiry(change: Int, reason: String)
    /// `peer` was forgotten (not seen within the horizon of garbage collection) and has not yet
    /// acknowledged the full resync it gets from this database: what it sends may bring back rows
    /// deleted here whose tombstones are gone. Nothing of the batch was applied; a session pulls
    /// it again once the peer has taken the resync.
    case awaitingResync(peer: InstanceKey)
    /// A value breaks its column's merge rule: a counter written with text or a blob here (the
    /// statement's transaction cannot commit), or a peer's counter state that is not one (the
    /// change was not applied).
    case invalidValue(String)

    public var description: String {
        switch self {
        case let .invalidTable(reason): return "cannot sync table: \(reason)"
        case let .schemaMismatch(reason): return "schema mismatch: \(reason)"
        case let .invalidValue(reason): return "invalid value: \(reason)"
        case let .notSynced(table): return "table \(table) is not synced"
        case let .clockSkew(ahead, limit):
            return """
                clock skew: a peer's timestamp is \(Self.seconds(ahead)) ahead of this machine's clock (limit \
                \(Self.seconds(limit)))
                """
        case let .invalidSyncFile(reason): return "invalid sync file: \(reason)"
        case let .corruptMetadata(reason): return "damaged sync metadata: \(reason)"
        case let .invalidBatch(rule): return "invalid batch: \(rule)"
        case let .forgedVersion(reason): return "forged change: \(reason)"
        case let .needsWholeRows(reason): return "the batch needs whole rows: \(reason)"
        case let .copiedDatabase(key, reason):
            return "this database is a copy of another that syncs under the same instance key \(key) (\(reason)); it "
                + "does not sync until it has a key of its own — run `tether rekey --db FILE` "
                + "(Database.resetInstanceKey()); its writes stay pending and are all sent after. If the file was "
                + "moved, not copied, run `tether rekey --db FILE --keep-key` (Database.confirmMove())"
        case let .instanceKeyReused(reason):
            return """
                two databases sync under one instance key: \(reason); run `tether rekey --db FILE` on the copy \
                (Database.resetInstanceKey())
                """
        case let .historyDiverged(key, reason):
            return "this database holds another history under instance key \(key) than its peer received (\(reason)); "
                + "it does not sync with that peer until it has a key of its own — run `tether rekey --db FILE` "
                + "(Database.resetInstanceKey()) on this database: its writes since the restore are all sent under "
                + "the new key, and its peers send back what the restore undid (if the peer's mark is made up, "
                + "nothing was restored: that peer alone is refused, other peers sync meanwhile)"
        case let .instanceKeyPinned(key, pinnedTo, presentedBy):
            return "instance key \(key) belongs to the peer with certificate \(pinnedTo), which presented it first; "
                + "the peer with certificate \(presentedBy) presented it too. Every database syncs under a key of "
                + "its own: if \(presentedBy)'s database is a copy of \(pinnedTo)'s, run `tether rekey --db FILE` on "
                + "it (Database.resetInstanceKey())"
        case let .refusedExpiry(change, reason): return "refused expiry: change \(change) \(reason)"
        case let .awaitingResync(peer):
            return "peer \(peer) was forgotten (not seen within the horizon of garbage collection): its changes are "
                + "taken once it has acknowledged the full resync it is sent, so that it cannot bring back rows "
                + "deleted here whose tombstones are gone"
        case let .missingMergeFunction(table):
            return """
                table \(table) resolves conflicts with a custom merge, but none is registered; call \
                setConflictPolicy(.custom(…), for:) after opening
                """
        }
    }

    /// `duration` in seconds, with a tenth when under a minute ("2.5 s", "7200 s").
    static func seconds(_ duration: Duration) -> String {
        let milliseconds = duration.wholeMilliseconds
        return milliseconds < 60_000 && milliseconds % 1000 != 0
            ? "\(milliseconds / 1000).\(milliseconds % 1000 / 100) s" : "\(milliseconds / 1000) s"
    }
}
