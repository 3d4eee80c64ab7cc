// The scope a peer is sent under, recorded rule by rule before each scoped extraction.

extension ScopedExtraction {
    /// The fingerprint of a table that was scoped and goes whole, until its backfill is done.
    static let wholeFingerprint = "whole"

    /// Records, per table, the scope `peer` is sent under; a table whose rule changed must be
    /// reconciled (`ScopeBackfill`), unless the peer has received nothing yet. A table newly
    /// scoped was held whole: every row counts as held, so that those outside are evicted.
    ///
    /// What the peer may hold is judged by what this database sent it, not by the cursor the peer
    /// shows (a claim): a peer that was never sent anything holds nothing, and is told nothing of
    /// the rows outside its scope, whatever cursor it shows.
    static func prepareRules(
        _ scope: CompiledScope, peer: InstanceKey, cursor claimedCursor: Int64, engine: SyncEngine,
        _ connection: Connection
    ) throws {
        let cursor = min(claimedCursor, try connection.peerStore.sentThrough(to: peer) ?? 0)
        let membership = connection.scopeMembership
        let stored = try membership.rules(of: peer)
        for (name, rule) in scope.rules where stored[name]?.fingerprint != rule.fingerprint {
            let wasWhole = stored[name] == nil || stored[name]?.fingerprint == wholeFingerprint
            if wasWhole && cursor > 0 {
                try membership.holdEveryRow(peer, of: rule.table)
                // So may the rows this database evicted after the cursor (it holds part of the
                // table): their evictions, still to be sent, must reach the peer.
                let evicted = try EvictionLog.entries(
                    of: name, after: cursor, through: engine.clock.lastSequence,
                    connection)
                for (_, key) in evicted {
                    try membership.hold(peer, table: name, rowKey: try engine.membershipKey(of: key, connection))
                }
            }
            try membership.saveRule(peer, table: name, fingerprint: rule.fingerprint, needsReconcile: cursor > 0)
        }
        // A table no longer scoped goes whole: what the peer lacks of it is backfilled, then forgotten.
        for (name, record) in stored where scope.rules[name] == nil && record.fingerprint != wholeFingerprint {
            if cursor > 0 {
                try membership.saveRule(peer, table: name, fingerprint: wholeFingerprint, needsReconcile: true)
            } else {
                try membership.forget(peer, table: name)
            }
        }
    }
}
