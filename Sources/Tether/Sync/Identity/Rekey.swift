import Foundation

/// A copy of a database (a cloned node, a restored backup) carries the original's instance key;
/// syncing under it, the copy's writes would be taken for the original's and lost (a peer's
/// cursor on that key already covers their sequence numbers). The engine notices a copy when it
/// opens (the file is not the one it was opened as before), refuses to sync it until it has a key
/// of its own, and a rekey gives it one.
extension SyncEngine {
    /// Notices, at open, whether this database is a copy; a backup's copy is rekeyed at once.
    /// What it reads needs no transaction: an open that changes nothing takes no write lock.
    func checkIdentity(_ connection: Connection) throws {
        if try InstanceIdentity.isMarkedForRekeyOnOpen(connection) {
            // A backup being opened (restored): it is a copy by construction, and its past is the
            // original's, so nothing of it moves to the new key.
            return try connection.transaction(.immediate) {
                try InstanceIdentity.clearRekeyOnOpen(connection)
                _ = try resetInstanceKey(connection)
            }
        }
        copyDetection = try InstanceIdentity.copyDetection(connection)
        guard copyDetection == nil, let current = try InstanceIdentity.currentFile(connection) else { return }
        let recorded = try InstanceIdentity.recordedFile(connection)
        guard recorded != current else { return }
        try connection.transaction(.immediate) {
            guard let recorded else { return try InstanceIdentity.recordFile(current, connection) }
            try prepareClock(connection)
            let detection = CopyDetection(
                kind: .copied,
                reason: "the file was \(recorded) when last opened, and is \(current) now: it was copied (or moved)",
                sequence: clock.lastSequence, timestamp: clock.latest)
            try InstanceIdentity.recordCopy(detection, connection)
            copyDetection = detection
            clock.invalidate()  // read again by the next write: another process may write first
        }
    }

    /// Refuses to sync a copy (or a database restored in place and written since) not yet rekeyed.
    func ensureNotACopy() throws {
        guard let copyDetection else { return }
        switch copyDetection.kind {
        case .copied: throw SyncError.copiedDatabase(instanceKey: instanceKey, reason: copyDetection.reason)
        case .restored: throw SyncError.historyDiverged(instanceKey: instanceKey, reason: copyDetection.reason)
        }
    }

    /// Gives this database a new instance key, in the current transaction. The versions it wrote
    /// after a copy was noticed move to the new key (they are the copy's, not the original's);
    /// those written before keep the old key, as peers know them. Peers pull everything under
    /// the new key from its start: what they hold already merges as unchanged, the rest arrives.
    func resetInstanceKey(_ connection: Connection) throws -> InstanceKey {
        try prepareClock(connection)
        let key = InstanceKey.random()
        let oldKey = instanceKey
        let oldSite = sites.local
        let newSite = try sites.switchLocal(to: key, connection)
        try InstanceIdentity.replaceKey(with: key, localSite: newSite, connection)
        if let copyDetection { try moveVersions(from: oldSite, to: newSite, after: copyDetection, connection) }
        // After a restore found by peers' marks: the versions later than the earliest mark's clock.
        // A made-up mark can only make that earlier, which moves more rows than needed (they merge
        // as the same writes, under either key), never fewer.
        let findings = try connection.peerStore.historyFindings()
        let earliest = findings.min(by: { $0.mark.clock < $1.mark.clock })
        if let earliest { try moveVersions(from: oldSite, to: newSite, after: earliest.detection, connection) }
        let splitClock = [copyDetection?.timestamp.rawValue, earliest?.mark.clock].compactMap { $0 }.min()
        try rekeyCounters(from: oldKey, to: key, after: splitClock, connection)
        try connection.peerStore.forgetHistoryFindings()
        try InstanceIdentity.clearCopy(connection)
        if let current = try InstanceIdentity.currentFile(connection) {
            try InstanceIdentity.recordFile(current, connection)
        }
        instanceKey = key
        copyDetection = nil
        identityMayBeStale = true  // read again if this transaction rolls back
        return key
    }

    /// The file was moved, not copied: it keeps its key. Not for a database restored in place:
    /// keeping its key would leave two histories under it.
    func confirmMove(_ connection: Connection) throws {
        let restore =
            copyDetection?.kind == .restored
            ? copyDetection : try connection.peerStore.historyFindings().first?.detection
        if let restore {
            throw SyncError.historyDiverged(
                instanceKey: instanceKey,
                reason: restore.reason
                    + "; it was restored, not moved: keeping its key would lose its writes since the restore")
        }
        try InstanceIdentity.clearCopy(connection)
        if let current = try InstanceIdentity.currentFile(connection) {
            try InstanceIdentity.recordFile(current, connection)
        }
        copyDetection = nil
        identityMayBeStale = true
    }

    /// Reads the identity again (after a rollback that may have undone a rekey).
    func reloadIdentityIfStale(_ connection: Connection) throws {
        guard identityMayBeStale else { return }
        identityMayBeStale = false
        if let stored = try InstanceIdentity.storedKey(connection) { instanceKey = stored }
        copyDetection = try InstanceIdentity.copyDetection(connection)
    }

    /// Splits this site's counter contributions at `clock` (nil: nothing was written since a copy
    /// or restore) as the versions were (`CounterState.rekeyed`), and forgets their earlier values:
    /// they were the old key's.
    private func rekeyCounters(
        from old: InstanceKey, to new: InstanceKey, after clock: UInt64?, _ connection: Connection
    ) throws {
        var inexact = 0
        for table in tableList where table.hasCounters {
            let rows = try connection.fetchRows(
                "SELECT row_id, counters FROM \(table.layout.rowsTable) WHERE counters IS NOT NULL")
            for row in rows {
                guard case let .blob(stored) = row[1], var counters = RowCounters(encoded: stored) else {
                    throw SyncError.corruptMetadata(
                        "a row of \(table.name) has damaged counter states in its sync metadata")
                }
                let before = counters
                if let clock {
                    for (name, state) in counters.states {
                        let (rekeyed, exact) = state.rekeyed(
                            from: old, to: new, after: clock, stored: counters.own[name],
                            keptSince: counterHistoryKeptSince)
                        counters.states[name] = rekeyed
                        if !exact { inexact += 1 }
                    }
                }
                counters.own = [:]
                if counters != before {
                    try writeRowCounters(counters, table, rowid: try row.get(0, as: Int64.self), connection)
                }
            }
        }
        guard inexact > 0 else { return }
        logger?.warning(
            """
            rekey: \(inexact) counter contributions changed both before and since the restore, and the value \
            they held at the restore is no longer kept: they move whole to the new key (peers holding the \
            original's count that value twice)
            """)
    }

    /// The versions of `oldSite` written after `detection` (the copy's own) become `newSite`'s.
    private func moveVersions(
        from oldSite: Int32, to newSite: Int32, after detection: CopyDetection, _ connection: Connection
    ) throws {
        let later = detection.timestamp.rawValue
        func move(_ version: LocalVersion) -> LocalVersion? {
            version.site == oldSite && version.timestamp > later
                ? LocalVersion(timestamp: version.timestamp, site: newSite) : nil
        }
        for table in tableList {
            let layout = table.layout
            for (select, update) in [
                (layout.selectVersionsAfter, layout.updateVersions),
                (layout.selectDeadVersionsAfter, layout.updateDeadVersions),
            ] {
                for row in try connection.fetchRows(select, [detection.sequence]) {
                    let stored = [UInt8](try row.get(1, as: Data.self))
                    guard let versions = RowVersions(encoded: stored) else {
                        throw SyncError.corruptMetadata(
                            "a row of \(table.name) has damaged versions in its sync metadata")
                    }
                    let moved = versions.mapping(move)
                    if moved != versions { try connection.execute(update, [Data(moved.encoded()), row[0]]) }
                }
            }
            try Self.reassignInsertRanges(
                of: table.name, from: oldSite, to: newSite, after: detection.sequence,
                writtenAfter: detection.timestamp, connection)
            try rewriteRangeVersions(of: table, after: detection.sequence, connection) { $0.mapping(move) }
        }
    }
}
