import Foundation

/// Partial replication on `Database`: checking a scope, and the backfill a scope change needs.
/// The changes themselves come from `extractChanges(for:after:…scope:)`.
///
/// A sync with a scoped peer, in order:
/// 1. `extractChanges(for: peer, after: cursor, scope: scope)` batch after batch, applied there with
///    `apply(_:)` and acknowledged as usual: the changes inside the scope, evictions of rows that
///    left it, deletes of rows the peer held;
/// 2. then `extractScopeBackfill(for: peer, after: cursor, scope: scope)` until `isLast`, applied
///    there with `apply(_:backfill: true)`: after a scope change (or a parent's move into or out of
///    the scope), the rows the peer lacks and the evictions of those it must no longer hold, for
///    rows whose last change precedes the cursor. Nothing when nothing moved.
extension Database {
    /// Checks `scope` against the synced tables, as its use would: every table named is synced,
    /// every filter a condition over its table's columns whose parameters the scope gives and whose
    /// subqueries read synced tables only, every reference a column of its table leading to a
    /// scoped parent without a cycle; the filters of its `interest` also as a peer's text (one
    /// expression over its own row, no parameter, only `SyncScope.interestFunctions`). Throws
    /// `ScopeError`, naming the table and the reason.
    public func validate(_ scope: SyncScope) throws {
        guard let engine = syncEngine else { throw SyncError.notSynced("(the database is open read-only)") }
        try write { conn in _ = try engine.compile(scope, conn) }
    }

    /// The backfill a scoped `peer` needs after its scope changed or rows moved with a parent
    /// (see the steps above): apply it with `apply(_:backfill: true)`, batch after batch until
    /// `isLast`. `cursor` is the peer's cursor on this database (after its batches of changes).
    /// A scope holding a peer's interest is evaluated within `interestBudget` (see
    /// ``InterestBudget``; a fresh one if nil).
    public func extractScopeBackfill(
        for peer: InstanceKey, after cursor: Int64, scope: SyncScope,
        limits: BatchLimits = BatchLimits(), interestBudget: InterestBudget? = nil
    ) throws -> ChangeBatch {
        guard let engine = syncEngine else { throw SyncError.notSynced("(the database is open read-only)") }
        return try write { conn in
            try conn.evaluatingInterest(of: scope, within: interestBudget) {
                try engine.extractScopeBackfill(
                    for: peer, after: cursor, scope: try engine.compile(scope, conn), limits: limits,
                    connection: conn)
            }
        }
    }
}

extension Database {
    /// Records that `peer` refused `refusals` (its `ApplyReport.refused`: changes of this database
    /// outside this database's scope there). They are listed by `refusedChanges()` and never sent
    /// again: this database's version of each row is dropped (without tombstone or capture;
    /// observers hear `evict`), and `peer` sends its own at the next pull when the row is inside
    /// this database's scope.
    public func recordRefusals(_ refusals: [RefusedChange], by peer: InstanceKey) throws {
        guard let engine = syncEngine else { throw SyncError.notSynced("(the database is open read-only)") }
        try write { conn in
            try engine.prepareClock(conn)
            try engine.recordRefusals(refusals, by: peer, conn)
        }
    }

    /// This database's changes that peers refused, oldest first (`RefusedChange.refusedBy` names the peer).
    public func refusedChanges() throws -> [RefusedChange] {
        try read { try RefusalStore.all($0) }
    }
}
