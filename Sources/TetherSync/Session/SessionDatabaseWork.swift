import Tether
import TetherWire

// What a session asks of its database (the state machine's requests and the results it is
// told), and how `SyncSessionHandler` does it on the session's queue.

/// A batch from the peer to apply, and what its result is read with.
struct BatchApply: Sendable {
    var batch: ChangeBatch
    var peer: InstanceKey
    /// The pull generation it answers: a result for an older one is not acted on.
    var generation: Int
    /// Whether the next PULL went out before this batch was applied.
    var pipelined: Bool
}

/// Database work the state machine asks for; `SyncSessionHandler` runs it on its queue.
enum DatabaseRequest: Sendable {
    /// This database's last sequence number (`.lastSequence`).
    case readLastSequence
    /// The same, counting other programs' writes (`.lastSequenceIncludingExternalWrites`).
    case readLastSequenceIncludingExternalWrites
    /// This database's cursor on the peer (`.cursor`); `previousAfter` is the `after` of the
    /// last batch, not the last, that the cursor must have passed.
    case readCursor(peer: InstanceKey, previousAfter: Int64?)
    /// The batch answering the peer's PULL, without the changes of tables outside `allowedTables`
    /// (`.extracted`).
    case extract(peer: InstanceKey, pull: Pull, allowedTables: Set<String>?)
    case apply(BatchApply)
    case acknowledge(peer: InstanceKey, through: Int64)
    case recordDeferral(peer: InstanceKey, Deferral)

    /// What it does, in words for errors ("could not …").
    var operation: String {
        switch self {
        case .readLastSequence, .readLastSequenceIncludingExternalWrites: return "read the last sequence number"
        case let .readCursor(peer, _): return "read the cursor on peer \(peer)"
        case let .extract(peer, pull, _): return "extract changes for peer \(peer) after \(pull.after)"
        case let .apply(apply):
            let batch = apply.batch
            return "apply a batch of \(batch.changes.count) change(s) from \(apply.peer) (sequences \(batch.after)–\(batch.through))"
        case let .acknowledge(peer, through): return "record that peer \(peer) acknowledged changes through \(through)"
        case let .recordDeferral(peer, deferral): return "record that peer \(peer) deferred changes after \(deferral.after)"
        }
    }
}

/// What database work returned, one case per request kind.
enum DatabaseResult: Sendable {
    case lastSequence(Int64)
    case lastSequenceIncludingExternalWrites(Int64)
    case cursor(after: Int64, resyncing: Bool, previousAfter: Int64?)
    /// The batch to send, and this database's last sequence number (for progress).
    case extracted(ChangeBatch, latest: Int64)
    case applied(BatchOutcome, BatchApply)
    case acknowledged
    case deferralRecorded
}

/// What became of a batch received from the peer.
enum BatchOutcome: Sendable {
    case applied(ApplyReport)
    /// Its timestamps are further ahead of this clock than `limit` allows: nothing was applied.
    case tooFarAhead(ahead: Duration, limit: Duration)
    /// It holds partial changes this database cannot complete (§7.2): nothing was applied.
    case needsWholeRows
    /// It did not fit on the disk: nothing was applied.
    case noRoom(String)
}

extension DatabaseRequest {
    /// Does the work on the session's queue (never on the event loop).
    func perform(on database: Database, metrics: SyncMetrics) throws -> DatabaseResult {
        switch self {
        case .readLastSequence:
            return .lastSequence(try database.lastSequence())
        case .readLastSequenceIncludingExternalWrites:
            return .lastSequenceIncludingExternalWrites(try database.lastSequenceIncludingExternalWrites())
        case let .readCursor(peer, previousAfter):
            let cursor = try database.cursor(for: peer)
            return .cursor(after: cursor.after, resyncing: cursor.resyncing, previousAfter: previousAfter)
        case let .extract(peer, pull, allowed):
            // With a table restriction, rows are not marked in flight: the peer's ACK must not mark
            // rows of tables it was not sent as synced. They stay pending for the other peers.
            let limits = BatchLimits(maximumChanges: pull.maxChanges, maximumBytes: pull.maxBytes)
            let batch = try database.extractChanges(for: peer, after: pull.after, resuming: pull.resumingResync, limits: limits,
                                                    markInFlight: allowed == nil, allowingPartialRows: !pull.wholeRows)
            let latest = batch.isLast ? batch.through : try database.lastSequence()
            return .extracted(allowed.map { Self.restrict(batch, to: $0) } ?? batch, latest: latest)
        case let .apply(apply):
            do {
                return .applied(.applied(try metrics.measuringApply { try database.apply(apply.batch) }), apply)
            } catch let error as SyncError {
                if case .needsWholeRows = error { return .applied(.needsWholeRows, apply) }
                if case let .clockSkew(ahead, limit) = error { return .applied(.tooFarAhead(ahead: ahead, limit: limit), apply) }
                throw error
            } catch let error as DatabaseError where error.isStorageFailure {
                return .applied(.noRoom("\(error)"), apply)
            }
        case let .acknowledge(peer, through):
            do {
                try database.acknowledge(peer: peer, through: through)
            } catch let error as DatabaseError where error.isStorageFailure {
                // No room to record it: the rows stay pending, and are sent again (harmlessly) later.
            }
            return .acknowledged
        case let .recordDeferral(peer, deferral):
            do {
                try database.recordDeferral(by: peer, after: deferral.after, through: deferral.through, reason: deferral.message)
            } catch let error as DatabaseError where error.isStorageFailure {
                // No room to record why: the rows stay pending all the same.
            }
            return .deferralRecorded
        }
    }

    /// `batch` without the changes (and table descriptors) of tables outside `allowed`; an expiry
    /// entry goes with the table whose row it names.
    private static func restrict(_ batch: ChangeBatch, to allowed: Set<String>) -> ChangeBatch {
        let kept = batch.changes.filter { batch.tableConcerned(by: $0).map(allowed.contains) == true }
        var newIndex: [Int: Int] = [:]
        var tables: [TableDescriptor] = []
        for index in Set(kept.map(\.table)).sorted() {
            newIndex[index] = tables.count
            tables.append(batch.tables[index])
        }
        var changes: [RowChange] = []
        for var change in kept {
            guard let index = newIndex[change.table] else { continue }
            change.table = index
            changes.append(change)
        }
        return ChangeBatch(source: batch.source, after: batch.after, through: batch.through, isLast: batch.isLast,
                           isResync: batch.isResync, tables: tables, changes: changes)
    }
}
