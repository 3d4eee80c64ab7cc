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
    /// It answers a backfill PULL (§8.3): applied whatever the cursor, which it leaves as it is.
    var backfill = false
    /// The mark of the peer's history that came with it (HISTORY, §8.9), kept once it is applied.
    var mark: HistoryMark?
    /// It answers a scope backfill PULL (§8.10): applied like a backfill.
    var scopeBackfill = false
    /// What the peer may write here (nil: every row); changes outside are refused.
    var writeScope: SyncScope?
    /// Staged with the catch-up's other batches and applied with its last (`SyncOptions.wholeCatchUps`).
    var whole = false
}

/// What this side records of the peer's schema at the handshake (§8.2): what both sync, in this
/// side's names, and how the schemas differ (for `tether status`).
struct PeerSchemaRecord: Sendable, Equatable {
    var shared: [String: [String]]
    var differences: [String]
}

/// How this side's batches are cut for the peer: the tables its policy allows it (nil: all),
/// what both sync, and whether rows sent are marked in flight (not when tables are left out:
/// the peer's ACK must not mark rows it was not sent as synced).
struct ExtractRestriction: Sendable {
    var allowedTables: Set<String>?
    var shared: SharedSchema
    var marksInFlight: Bool
    /// Whether the batch goes with a mark of this database's history (HISTORY, §8.9).
    var marksHistory = false
    /// The rows the peer holds (partial replication, §8.10); nil: every row.
    var scope: SyncScope?
    /// Whether the session speaks version 3 (the peer can be sent evictions).
    var version3 = false
}

/// This database holds only part of a table a version 2 peer would get whole: it could not be told
/// which rows leave (§8.10), so the session is refused.
struct PartialTableForVersionTwo: Error {
    var table: String
}

/// Database work the state machine asks for; `SyncSessionHandler` runs it on its queue.
enum DatabaseRequest: Sendable {
    /// The peer presenting `peer` with `certificate` may sync under that key (`.peerConfirmed`):
    /// the session's first request, which only reads. If it fails, every later request of the
    /// session fails the same way without running (see `SyncSessionHandler.run`).
    case confirmPeerIdentity(peer: InstanceKey, certificate: PeerIdentity)
    /// Pins a key met for the first time to its certificate, or records the renewed certificate of
    /// a known one (`.peerPinned`), once the reads the session starts with are done: it waits for
    /// the writer, which they need not. Fails like `confirmPeerIdentity` if another certificate
    /// pinned the key meanwhile.
    case pinPeerIdentity(peer: InstanceKey, certificate: PeerIdentity)
    /// This database's last sequence number (`.lastSequence`).
    case readLastSequence
    /// The same, counting other programs' writes (`.lastSequenceIncludingExternalWrites`).
    case readLastSequenceIncludingExternalWrites
    /// This database's cursor on the peer (`.cursor`); `previousAfter` is the `after` of the
    /// last batch, not the last, that the cursor must have passed. With `recording`, the peer's
    /// schema is recorded first, and the result says what became shared since the last session,
    /// and which mark of the peer's history is kept here (§8.9).
    /// `wholeCatchUps`: a catch-up staged before goes on after its staged batches; otherwise
    /// they go (a session applying batch by batch starts from the cursor).
    case readCursor(
        peer: InstanceKey, previousAfter: Int64?, recording: PeerSchemaRecord? = nil, wholeCatchUps: Bool = false)
    /// The batch answering the peer's PULL, cut as `restriction` says (`.extracted`).
    case extract(peer: InstanceKey, pull: Pull, restriction: ExtractRestriction)
    /// The backfill from the peer is done: what both sync is recorded (`.backfillCompleted`).
    case completeBackfill(peer: InstanceKey, shared: [String: [String]])
    case apply(BatchApply)
    case acknowledge(peer: InstanceKey, through: Int64)
    case recordDeferral(peer: InstanceKey, Deferral)
    /// The peer refused these changes of this database (REFUSED, §6.11): recorded (`.refusalsRecorded`).
    case recordRefusals(peer: InstanceKey, [RefusedChange])
    /// The peer sends this database only part of these tables (SCOPE, §8.10): recorded (`.partialTablesRecorded`).
    case recordPartialTables(peer: InstanceKey, Set<String>)

    /// What it does, in words for errors ("could not …").
    var operation: String {
        switch self {
        case let .confirmPeerIdentity(peer, certificate):
            return "confirm that instance key \(peer) belongs to \(certificate)"
        case let .pinPeerIdentity(peer, certificate): return "pin instance key \(peer) to \(certificate)"
        case .readLastSequence, .readLastSequenceIncludingExternalWrites: return "read the last sequence number"
        case let .readCursor(peer, _, _, _): return "read the cursor on peer \(peer)"
        case let .extract(peer, pull, _): return "extract changes for peer \(peer) after \(pull.after)"
        case let .completeBackfill(peer, _): return "record the backfill from peer \(peer) as done"
        case let .apply(apply):
            let batch = apply.batch
            return """
                apply a batch of \(batch.changes.count) change(s) from \(apply.peer) (sequences \
                \(batch.after)–\(batch.through))
                """
        case let .acknowledge(peer, through): return "record that peer \(peer) acknowledged changes through \(through)"
        case let .recordDeferral(peer, deferral):
            return "record that peer \(peer) deferred changes after \(deferral.after)"
        case let .recordRefusals(peer, refusals): return "record that peer \(peer) refused \(refusals.count) change(s)"
        case let .recordPartialTables(peer, tables):
            return "record that peer \(peer) sends only part of \(tables.sorted().joined(separator: ", "))"
        }
    }
}

/// What database work returned, one case per request kind.
enum DatabaseResult: Sendable {
    /// `pinned`: the key was pinned to the certificate, and this certificate recorded, already;
    /// else it is new or renewed, and recorded next.
    case peerConfirmed(pinned: Bool)
    case peerPinned
    case lastSequence(Int64)
    case lastSequenceIncludingExternalWrites(Int64)
    /// `newlyShared`: with a schema recorded, per table the columns (none: the whole table)
    /// shared with the peer since the last session, to backfill.
    /// `mark`: read with the first cursor of a session, the mark of the peer's history kept here.
    case cursor(
        after: Int64, resyncing: Bool, previousAfter: Int64?, newlyShared: [String: [String]] = [:],
        mark: HistoryMark? = nil)
    /// The batch to send, this database's last sequence number (for progress), and the mark of
    /// this database's history to send before it (§8.9).
    case extracted(ChangeBatch, latest: Int64, mark: HistoryMark? = nil)
    case applied(BatchOutcome, BatchApply)
    case acknowledged
    case deferralRecorded
    case refusalsRecorded
    case partialTablesRecorded
    case backfillCompleted
}

/// What became of a batch received from the peer.
enum BatchOutcome: Sendable {
    case applied(ApplyReport)
    /// Staged on disk with the catch-up's batches before it, to be applied with its last one.
    case staged(StagedCatchUp)
    /// Its timestamps are further ahead of this clock than `limit` allows: nothing was applied.
    /// `cursor` is this side's cursor on the peer (a staged catch-up went with the batch).
    case tooFarAhead(ahead: Duration, limit: Duration, cursor: Int64)
    /// It holds partial changes this database cannot complete (§7.2): nothing was applied.
    case needsWholeRows
    /// It did not fit on the disk: nothing was applied.
    case noRoom(String)
    /// It was pipelined behind a batch that was not applied: discarded unread, it comes again (§8.3).
    case discarded
    /// The peer was forgotten here and has not taken its full resync yet (`SyncError.awaitingResync`):
    /// nothing was applied; it is pulled again once the peer has.
    case awaitingResync

    /// Whether the batches staged before it stay when it was not applied: for lack of room only.
    var keepsStagedBatches: Bool { if case .noRoom = self { true } else { false } }

    /// Whether the batch was applied, or staged to be.
    var wasAccepted: Bool {
        switch self {
        case .applied, .staged: true
        default: false
        }
    }
}

extension DatabaseRequest {
    /// Does the work on the session's queue (never on the event loop); the peer's interest is
    /// evaluated within `interestBudget`; a catch-up to the peer is served from `snapshot`.
    func perform(
        on database: Database, metrics: SyncMetrics, interestBudget: InterestBudget? = nil,
        snapshot: CatchUpSnapshot? = nil
    ) throws -> DatabaseResult {
        switch self {
        case let .confirmPeerIdentity(peer, certificate):
            return .peerConfirmed(pinned: try database.checkPeer(peer, certificate: certificate))
        case let .pinPeerIdentity(peer, certificate):
            try database.pinPeer(peer, to: certificate)
            return .peerPinned
        case .readLastSequence:
            return .lastSequence(try database.lastSequence())
        case .readLastSequenceIncludingExternalWrites:
            return .lastSequenceIncludingExternalWrites(try database.lastSequenceIncludingExternalWrites())
        case let .readCursor(peer, previousAfter, recording, wholeCatchUps):
            let newlyShared =
                try recording.map {
                    try database.recordPeerSchema(peer, shared: $0.shared, differences: $0.differences)
                } ?? [:]
            let cursor = try database.cursor(for: peer)
            // Once a session: the first cursor read is the one that records the peer's schema.
            let mark = recording == nil ? nil : try database.historyMark(of: peer)
            // A catch-up cut short (a crash, a lost link) goes on after what it staged, unless it
            // no longer starts at the cursor, or what both share changed (the backfill starts from
            // the cursor): then it starts again (the staged batches go with its first batch).
            var after = cursor.after
            if let staged = try database.stagedCatchUp(from: peer) {
                if wholeCatchUps, staged.after == cursor.after, !cursor.resyncing, newlyShared.isEmpty {
                    after = staged.through
                } else if !wholeCatchUps {
                    try database.discardStagedCatchUp(from: peer)
                }
            }
            return .cursor(
                after: after, resyncing: cursor.resyncing, previousAfter: previousAfter,
                newlyShared: newlyShared, mark: mark)
        case let .extract(peer, pull, restriction):
            // The peer shows the mark of this database's history it keeps: if this database no
            // longer has that history (restored in place, or the mark is made up), nothing is sent
            // to this peer until a rekey; other peers are served (§8.9).
            if let mark = pull.history { try database.checkHistory(mark, heldBy: peer) }
            // With a table restriction, rows are not marked in flight: the peer's ACK must not mark
            // rows of tables it was not sent as synced. They stay pending for the other peers.
            let limits = BatchLimits(maximumChanges: pull.maxChanges, maximumBytes: pull.maxBytes)
            // A backfill reaches at most the requester's cursor on this database (§8.3): beyond this
            // database's last sequence number, the peer holds numbers of this key it never gave, as
            // for an `after` beyond it (which the extract refuses).
            if let backfill = pull.backfill, case let latest = try database.lastSequence(), backfill.through > latest {
                throw SyncError.instanceKeyReused(
                    "peer \(peer) asks for a backfill through sequence \(backfill.through) of instance key "
                        + "\(database.instanceKey), which has given only \(latest)")
            }
            let scope = try Self.scope(for: peer, restriction, database)
            let batch: ChangeBatch
            if pull.scopeBackfill {
                // What brings the peer's rows back to its scope (§8.10): rows whose last change is at
                // or before the cursor, so the batch goes after 0 through the cursor, and moves none.
                batch = try database.extractScopeBackfill(
                    for: peer, after: pull.after, scope: scope ?? .whole, limits: limits,
                    interestBudget: interestBudget)
            } else if pull.backfill == nil, !pull.resumingResync, scope == nil,
                let nothing = try database.batchWithNothingToSend(for: peer, after: pull.after)
            {
                batch = nothing
            } else {
                batch = try database.extractChanges(
                    for: peer, after: pull.after, resuming: pull.resumingResync, limits: limits,
                    markInFlight: restriction.marksInFlight, allowingPartialRows: !pull.wholeRows,
                    backfill: pull.backfill.map { restriction.shared.scope(of: $0) }, scope: scope,
                    interestBudget: interestBudget, servedFrom: snapshot)
            }
            let latest = batch.isLast ? batch.through : try database.lastSequence()
            let allowed = restriction.allowedTables.map { Self.restrict(batch, to: $0) } ?? batch
            // Read after the extraction: a backfill is not acknowledged and moves no cursor.
            let mark =
                restriction.marksHistory && pull.backfill == nil && !pull.scopeBackfill
                ? try database.historyMark(through: batch.through) : nil
            return .extracted(restriction.shared.restrict(allowed), latest: latest, mark: mark)
        case let .completeBackfill(peer, shared):
            try database.completeBackfill(from: peer, shared: shared)
            return .backfillCompleted
        case let .apply(apply):
            do {
                let step = try metrics.measuringApply { () throws -> CatchUpStep in
                    // A backfill's rows are applied as they come; a whole catch-up's batches are
                    // staged and applied together with its last one.
                    guard apply.whole, !apply.backfill else {
                        return .applied(
                            try database.apply(
                                apply.batch, backfill: apply.backfill, keepingMark: apply.mark,
                                scope: apply.writeScope))
                    }
                    return try database.receive(apply.batch, keepingMark: apply.mark, scope: apply.writeScope)
                }
                switch step {
                case let .applied(report): return .applied(.applied(report), apply)
                case let .staged(catchUp): return .applied(.staged(catchUp), apply)
                }
            } catch let error as SyncError {
                if case .needsWholeRows = error { return .applied(.needsWholeRows, apply) }
                if case let .clockSkew(ahead, limit) = error {
                    let cursor = try database.cursor(for: apply.peer).after
                    return .applied(.tooFarAhead(ahead: ahead, limit: limit, cursor: cursor), apply)
                }
                if case .awaitingResync = error { return .applied(.awaitingResync, apply) }
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
                try database.recordDeferral(
                    by: peer, after: deferral.after, through: deferral.through, reason: deferral.message)
            } catch let error as DatabaseError where error.isStorageFailure {
                // No room to record why: the rows stay pending all the same.
            }
            return .deferralRecorded
        case let .recordRefusals(peer, refusals):
            try database.recordRefusals(refusals, by: peer)
            return .refusalsRecorded
        case let .recordPartialTables(peer, tables):
            try database.recordPartialTables(tables, from: peer)
            return .partialTablesRecorded
        }
    }

    /// The rows `peer` is sent: its scope, and every table this database holds only part of (because
    /// of another peer) as a scope holding every row here, so that the rows this database evicts
    /// are evicted there too (§8.10, relaying). A version 2 peer cannot be sent evictions: a table
    /// held in part that it would get is refused (`PartialTableForVersionTwo`).
    private static func scope(for peer: InstanceKey, _ restriction: ExtractRestriction, _ database: Database) throws
        -> SyncScope?
    {
        let heldInPart = LocalSchema.tablesHeldInPart(try database.partialTables(), apartFrom: peer).filter { table in
            restriction.allowedTables.map { $0.contains(table) } != false && restriction.shared.sharesTable(table)
        }
        guard let first = heldInPart.min() else { return restriction.scope }
        guard restriction.version3 else { throw PartialTableForVersionTwo(table: first) }
        var scope = restriction.scope ?? SyncScope()
        for table in heldInPart where !scope.scopes(table) { scope.tables[table] = .filter("1") }
        return scope
    }

    /// `batch` without the changes (and table descriptors) of tables outside `allowed`; an expiry
    /// entry goes with the table whose row it names.
    private static func restrict(_ batch: ChangeBatch, to allowed: Set<String>) -> ChangeBatch {
        batch.cut(
            tables: { ChangeBatch.TableCut(descriptor: $0) },
            changes: { batch.tableConcerned(by: $0).map(allowed.contains) == true })
    }
}
