import NIOCore
import Tether
import TetherWire

extension SyncSessionStateMachine {
    /// Pulling the peer's changes (§8.3), and its CHANGED notices (§8.4).
    struct Requester {
        var backfill = BackfillState.unrecorded
        /// The `after` of the PULL awaiting its BATCH.
        var outstandingPull: Int64?
        /// The PULL awaiting its BATCH is a backfill.
        var outstandingPullIsBackfill = false
        /// The PULL awaiting its BATCH is a scope backfill (§8.10).
        var outstandingPullIsScopeBackfill = false
        /// The PULL awaiting its BATCH is parked at the peer (§8.4): caught up, waiting for its next changes.
        var outstandingPullIsParked = false
        /// Follow-on PULLs sent (§8.3) whose batches are still to come, after the one `outstandingPull` awaits.
        var followOnsOutstanding = 0
        /// Batches received and not yet applied (at most two: one applying, the next one pulled meanwhile).
        var batchesBeingApplied = 0
        var batchesApplied = 0
        /// The batches (and their changes) this session staged for the catch-up under way (§8.3
        /// *Whole catch-ups*): applied with its last batch.
        var staged = (batches: 0, changes: 0)
        /// The `through` of a batch received while another was being applied: its PULL goes out once
        /// that other one is applied, so that no more than two batches are ever held.
        var deferredPull: Int64?
        /// Whether this side asks for whole rows: a partial change (§7.2) left out values it did not hold.
        var wantsWholeRows = false
        /// The `maxChanges` of this side's PULLs: the configured one, made smaller while batches do
        /// not fit on the disk, and grown back as they do.
        var pullChangeLimit: Int
        /// Pulling waits for the `pullRetry` timer before it starts again: after a single change did
        /// not fit (`noRoomRetryDelay`), or after deferring the peer's batch (`clockSkewRetryInterval`).
        var pullRetryPending = false
        /// DEFERRED to send once no pull is in progress (§8.3: its `through` covers every batch
        /// discarded meanwhile), and when to pull again.
        var pendingDeferral: (deferral: Deferral, retry: TimeAmount)?
        /// Bumped when the pulls in progress are abandoned to pull again with whole rows: a batch
        /// answering an older pull is not applied.
        var pullGeneration = 0
        var outstandingPullGeneration = 0
        /// Pulling must start again from the cursor once the abandoned pulls and applies are over.
        var restartPending = false
        var receivedLast = false
        /// The highest `latest` of a CHANGED received while pulling (0: none).
        var pendingChanged: Int64 = 0
        /// The highest `latest` the peer announced with CHANGED (0: none).
        var peerLatest: Int64 = 0
        /// The mark of the peer's history kept here, shown to it with the next PULL (once a session, §8.9).
        var markToShow: HistoryMark?
        /// The mark the peer sent (HISTORY) for the BATCH that follows it.
        var markForNextBatch: HistoryMark?
        /// Pulls refused since the peer was found forgotten here (`awaitingResync`): each waits
        /// twice as long as the one before, from 250 ms, so that a peer that never takes its
        /// resync is not asked four times a second.
        var awaitingResyncRetries = 0

        var applying: Bool { batchesBeingApplied > 0 }

        init(_ configuration: Configuration) {
            pullChangeLimit = max(1, configuration.options.batchLimits.maximumChanges)
        }
    }

    /// Where pulling what became shared since the last session stands (§8.3).
    enum BackfillState: Equatable {
        /// The peer's schema is recorded with the first cursor read, which says what to backfill.
        case unrecorded
        /// Nothing to backfill, or done.
        case done
        /// Pulling it: the backfill PULLs go out, from `resumeAfter`, until a batch with `isLast`.
        case running(Backfill, resumeAfter: Int64)
    }
}

// MARK: Requester: pulling the peer's changes (§8.3)

extension SyncSessionStateMachine {
    /// Sends PULL after `after` with this side's limits; it is outstanding until its BATCH arrives.
    /// Called directly for the PULL that follows a batch not yet applied (§8.3 pipelining).
    mutating func sendPull(
        after: Int64, resumingResync: Bool = false, backfill: Backfill? = nil, scopeBackfill: Bool = false,
        park: Bool = false
    ) {
        requester.outstandingPull = after
        requester.outstandingPullIsBackfill = backfill != nil || scopeBackfill
        requester.outstandingPullIsScopeBackfill = scopeBackfill
        requester.outstandingPullIsParked = park
        requester.outstandingPullGeneration = requester.pullGeneration
        var pull = Pull(
            after: after, resumingResync: resumingResync, maxChanges: max(1, requester.pullChangeLimit),
            maxBytes: max(1, pullByteLimit), wholeRows: requester.wantsWholeRows,
            backfill: backfill, history: requester.markToShow)
        pull.scopeBackfill = scopeBackfill
        pull.park = park
        send(.pull(pull))
        requester.markToShow = nil
    }

    /// The `maxBytes` of this side's PULLs: in proportion to `maxChanges` while the batches are made
    /// smaller for lack of room.
    var pullByteLimit: Int {
        let limits = options.batchLimits
        return requester.pullChangeLimit >= limits.maximumChanges
            ? limits.maximumBytes
            : Int(
                clamping: Int64(limits.maximumBytes) * Int64(requester.pullChangeLimit)
                    / Int64(max(1, limits.maximumChanges)))
    }

    /// Sends the next PULL, from this database's cursor on the peer (the first read records the
    /// peer's schema, and says what to backfill).
    mutating func pull(from peer: InstanceKey, previousAfter: Int64? = nil) {
        let recording =
            requester.backfill == .unrecorded
            ? PeerSchemaRecord(shared: shared.sharedColumns(of: schema), differences: shared.differences) : nil
        runDatabase(
            .readCursor(
                peer: peer, previousAfter: previousAfter, recording: recording, wholeCatchUps: options.wholeCatchUps))
    }

    mutating func cursorRead(after: Int64, resyncing: Bool, previousAfter: Int64?, newlyShared: [String: [String]]) {
        if let previousAfter, after <= previousAfter, !resyncing {
            return fail(
                .batchRejected(
                    """
                    the cursor on the \(role.peerName) did not advance past \(previousAfter) although its batch \
                    was not the last
                    """))
        }
        if requester.backfill == .unrecorded {
            // Columns or tables shared since the last session: their rows the peer wrote before this
            // side had them, which the cursor has passed, come first by backfill PULLs (§8.3). A
            // cursor at 0 or a full resync brings every row anyway.
            requester.backfill = .done
            if !newlyShared.isEmpty, let peer = peerKey {
                if after > 0, !resyncing {
                    requester.backfill = .running(shared.backfill(of: newlyShared, through: after), resumeAfter: 0)
                } else {
                    runDatabase(.completeBackfill(peer: peer, shared: shared.sharedColumns(of: schema)))
                }
            }
        }
        if case let .running(request, resumeAfter) = requester.backfill {
            return sendPull(after: resumeAfter, backfill: request)
        }
        if changesExpectedToReceive == nil, requester.peerLatest > 0 {
            estimateReceiving(cursor: after)
            reportProgress()
        }
        sendPull(after: after, resumingResync: resyncing)
        // A catch-up's first PULL: its second batch is asked for at once (not during a resync).
        if !resyncing { pullAhead() }
    }

    /// HISTORY: the mark of the peer's history that the BATCH following it leaves here (§8.9).
    mutating func receivedHistory(_ mark: HistoryMark) {
        guard histories else {
            return fail(.protocolViolation("HISTORY, but the histories capability was not negotiated"))
        }
        guard requester.outstandingPull != nil, requester.markForNextBatch == nil else {
            return fail(.protocolViolation("HISTORY that precedes no BATCH answering a PULL"))
        }
        requester.markForNextBatch = mark
    }

    mutating func receivedBatch(_ batch: ChangeBatch, from peer: InstanceKey) {
        let mark = requester.markForNextBatch
        requester.markForNextBatch = nil
        guard !peerPolicy.readOnly else {
            return fail(
                .readOnly("the \(role.peerName) \(peer) sent a BATCH, but this peer does not accept changes from it"))
        }
        guard let after = requester.outstandingPull else {
            return fail(.protocolViolation("a BATCH that answers no PULL"))
        }
        if requester.outstandingPullIsParked {
            // The peer's next changes: catching up again.
            requester.outstandingPullIsParked = false
            requester.receivedLast = false
        }
        guard batch.source == peer else {
            return fail(.batchRejected("the batch comes from \(batch.source), not from the \(role.peerName) \(peer)"))
        }
        if requester.outstandingPullIsScopeBackfill {
            // A scope backfill holds rows whose last change is at or before the cursor (§8.10).
            guard batch.after == 0, batch.through == after else {
                return fail(
                    .batchRejected(
                        """
                        the scope backfill goes after \(batch.after) through \(batch.through), not after 0 \
                        through the cursor \(after)
                        """))
            }
        } else if batch.after != after && !(batch.isResync && batch.after == 0) {
            // A full resync (the cursor is older than the peer's collected history) starts from nothing.
            return fail(
                .batchRejected(
                    "the batch follows sequence \(batch.after), but the PULL asked for changes after \(after)"))
        }
        if requester.outstandingPullGeneration != requester.pullGeneration {
            // It answers an abandoned pull (to ask for whole rows or smaller batches, or after a
            // deferral): not applied; pulling starts again once the follow-ons sent are answered too.
            requester.outstandingPull = nil
            expectFollowOn(after: batch)
            coverInPendingDeferral(batch.through)
            return restartPullsIfIdle(peer)
        }
        if batch.containsEvictions {
            guard version3 else {
                return fail(.protocolViolation("a batch with evictions, but protocol version 3 was not negotiated"))
            }
            // An eviction means "this row leaves your part": only a peer sending this side part of
            // the table may say so (§8.10), never one that holds part of what this side holds.
            guard case let .settled(_, received) = scopes else {
                return fail(.protocolViolation("a BATCH before SCOPE, which version 3 sends first"))
            }
            let evictable = received.evictable
            if let change = batch.changes.first(where: {
                $0.isEvicted && !evictable.contains(batch.tables[$0.table].name)
            }) {
                return fail(
                    .batchRejected(
                        "the batch evicts a row of table \(batch.tables[change.table].name) (key \(change.key)), "
                            + "but the \(role.peerName) \(peer) "
                                + """
                                does not send this peer part of that table (it sends part of: \
                                \(evictable.isEmpty ? "none" : evictable.sorted().joined(separator: ", "))); nothing \
                                of the batch was applied
                                """))
            }
        }
        let synced = Set(schema.tables.map(\.name))
        if let table = batch.tables.first(where: { !synced.contains($0.name) }) {
            return fail(.tableNotAllowed("the batch names table \(table.name), which this peer does not sync"))
        }
        // An expiry is a change to the row it names: that table must be one this peer syncs too.
        if let change = batch.changes.first(where: { batch.tableConcerned(by: $0).map(synced.contains) == false }),
            let name = batch.tableConcerned(by: change)
        {
            return fail(
                .tableNotAllowed("the batch sets an expiry on a row of table \(name), which this peer does not sync"))
        }
        if let allowed = peerPolicy.allowedTables,
            let change = batch.changes.first(where: { batch.tableConcerned(by: $0).map(allowed.contains) != true })
        {
            let name = batch.tableConcerned(by: change) ?? "#\(change.table)"
            return fail(
                .tableNotAllowed(
                    """
                    the batch from \(peer) changes table \(name), which this peer does not accept from it \
                    (allowed: \(allowed.sorted().joined(separator: ", ")))
                    """))
        }
        requester.outstandingPull = nil
        if !requester.outstandingPullIsBackfill { expectFollowOn(after: batch) }
        requester.batchesBeingApplied += 1
        summary.batchesReceived += 1
        summary.changesReceived += batch.changes.count
        let writeScope = state.session?.negotiated.writeScope
        if requester.outstandingPullIsBackfill {
            // Applied before the next backfill PULL; not acknowledged: the cursor stays where it is.
            return runDatabase(
                .apply(
                    BatchApply(
                        batch: batch, peer: peer, generation: requester.pullGeneration, pipelined: false,
                        backfill: true,
                        scopeBackfill: requester.outstandingPullIsScopeBackfill, writeScope: writeScope)))
        }
        // Pipelining (§8.3): the next PULL goes out while this batch is applied, so that the peer
        // extracts the next batch meanwhile. Its `after` is this batch's `through`, the cursor once
        // it is applied (applies run in order; if one fails, the session fails). Not during a full
        // resync, whose cursor rules are the database's.
        let pipelined = !batch.isLast && !batch.isResync
        if pipelined, requester.outstandingPull == nil {
            if requester.batchesBeingApplied == 1 {
                sendPull(after: batch.through)
            } else {
                requester.deferredPull = batch.through
            }
        }
        if pipelined { pullAhead() }
        runDatabase(
            .apply(
                BatchApply(
                    batch: batch, peer: peer, generation: requester.pullGeneration, pipelined: pipelined, mark: mark,
                    writeScope: writeScope, whole: options.wholeCatchUps)))
    }

    mutating func batchApplied(_ outcome: BatchOutcome, _ apply: BatchApply) {
        let batch = apply.batch, peer = apply.peer
        requester.batchesBeingApplied -= 1
        if apply.generation == requester.pullGeneration, case .staged = outcome {
            return batchStaged(apply)
        }
        guard apply.generation == requester.pullGeneration, case let .applied(report) = outcome else {
            // Nothing of the batch was applied: partial changes this database cannot complete,
            // or no room on the disk for the whole batch; or it followed such a one (applied
            // after the gap, but the cursor waits). The pulls start again from the cursor,
            // asking for whole rows, or for smaller batches. The batch is not counted as
            // received: its changes come again.
            if apply.generation == requester.pullGeneration {
                switch outcome {
                case .needsWholeRows: requester.wantsWholeRows = true
                case let .noRoom(reason):
                    if let failure = shrinkPullsForLackOfRoom(reason) { return fail(failure) }
                case let .tooFarAhead(ahead, limit, _) where apply.backfill:
                    pauseBackfill(ahead: ahead, limit: limit)
                case let .tooFarAhead(ahead, limit, cursor):
                    guard defers else {
                        return fail(
                            .batchRejected(
                                """
                                could not apply a batch of \(batch.changes.count) change(s) from \(peer): \
                                \(SyncError.clockSkew(ahead: ahead, limit: limit))
                                """))
                    }
                    deferPeerBatch(after: cursor, through: batch.through, ahead: ahead, limit: limit)
                case .awaitingResync:
                    // The peer's ACK of the resync this side sends it lifts this: soon, in this session.
                    summary.deferredFromPeer = "\(SyncError.awaitingResync(peer: peer))"
                    let delay = TimeAmount.milliseconds(250 << min(requester.awaitingResyncRetries, 7))
                    requester.awaitingResyncRetries += 1
                    schedulePullRetry(in: min(options.clockSkewRetryInterval, delay))
                case .applied, .staged, .discarded: break
                }
                if batch.isLast, !outcome.keepsStagedBatches {
                    // The catch-up it ended was not applied: what this session staged for it went too.
                    summary.batchesReceived -= requester.staged.batches
                    summary.changesReceived -= requester.staged.changes
                    requester.staged = (0, 0)
                }
                requester.pullGeneration += 1
                requester.deferredPull = nil
                requester.restartPending = true
            } else {
                coverInPendingDeferral(batch.through)
            }
            summary.batchesReceived -= 1
            summary.changesReceived -= batch.changes.count
            return restartPullsIfIdle(peer)
        }
        // Room again: back towards the configured batch size.
        requester.pullChangeLimit = min(options.batchLimits.maximumChanges, requester.pullChangeLimit * 2)
        requester.batchesApplied += 1
        // The peer's changes outside its scope here were not written: it is told which, and why.
        for refusals in Self.refusedMessages(report.refused) { send(.refused(refusals)) }
        if apply.scopeBackfill { return scopeBackfillApplied(batch, report, from: peer) }
        if apply.backfill { return backfillApplied(batch, report, from: peer) }
        // The sequence numbers this apply issued hold only the peer's own changes, which it
        // does not need back: not a reason for CHANGED (unless the apply also resolved kept-aside
        // changes or evicted local rows, which the peer lacks).
        if report.resolvedFromKeptAside == 0, report.conflicts.isEmpty {
            if report.sequenceBefore <= max(responder.sentThrough, responder.announced) {
                responder.announced = max(responder.announced, report.sequenceAfter)
            }
            if var parked = responder.parked, report.sequenceBefore <= parked.nothingThrough {
                parked.nothingThrough = max(parked.nothingThrough, report.sequenceAfter)
                responder.parked = parked
            }
        }
        if batch.isLast {
            changesExpectedToReceive = summary.changesReceived
        } else {
            estimateReceiving(cursor: report.cursor)
        }
        reportProgress()
        actions.append(
            .batchApplied(
                batch, changes: batch.changes.count + requester.staged.changes, appliedSoFar: requester.batchesApplied))
        requester.staged = (0, 0)
        // The cursor, but never beyond this batch (§8.3): another session on this database may
        // have moved it further meanwhile, and this peer was not sent what lies beyond.
        send(.ack(through: min(report.cursor, batch.through)))
        if let after = requester.deferredPull, requester.batchesBeingApplied == 1 {
            requester.deferredPull = nil
            sendPull(after: after)
        }
        if options.wholeCatchUps, batch.isLast, report.cursor < batch.through, !report.wasDuplicate {
            // The cursor stopped short of the batch (what came before it, staged by this session,
            // was dropped meanwhile: another session on this database moved the cursor): what lies
            // in between comes by pulling again from the cursor.
            pull(from: peer)
        } else if batch.isLast, requester.pendingChanged > report.cursor, live {
            // A CHANGED arrived meanwhile announcing more than this batch brought (§8.4).
            requester.pendingChanged = 0
            pull(from: peer)
        } else if batch.isLast, case let .settled(_, received) = scopes, !received.isEmpty {
            // Caught up with the changes: then what brings this side's rows back to its scope (§8.10).
            sendPull(after: min(report.cursor, batch.through), scopeBackfill: true)
        } else if batch.isLast {
            caughtUpWithPeer(cursor: min(report.cursor, batch.through))
        } else if !apply.pipelined {
            pull(from: peer, previousAfter: batch.after)
        }
    }

    /// A batch of a catch-up was staged, to be applied with its last batch: nothing to
    /// acknowledge yet (the cursor has not moved); the next PULL goes out as for an applied one.
    mutating func batchStaged(_ apply: BatchApply) {
        // It fitted: back towards the configured batch size, as for an applied batch.
        requester.pullChangeLimit = min(options.batchLimits.maximumChanges, requester.pullChangeLimit * 2)
        requester.staged.batches += 1
        requester.staged.changes += apply.batch.changes.count
        estimateReceiving(cursor: apply.batch.through)
        reportProgress()
        actions.append(.batchStaged(apply.batch, stagedSoFar: requester.staged.batches))
        if let after = requester.deferredPull, requester.batchesBeingApplied == 1 {
            requester.deferredPull = nil
            sendPull(after: after)
        }
        if !apply.pipelined { pull(from: apply.peer, previousAfter: apply.batch.after) }
    }

    /// `refused` cut into REFUSED messages that each fit a frame (§6.11): at most 10,000 refusals
    /// and about 4 MiB of keys and text apiece (a key's values are not bounded by the string limit).
    static func refusedMessages(_ refused: [RefusedChange]) -> [[RefusedChange]] {
        var messages: [[RefusedChange]] = []
        var current: [RefusedChange] = []
        var bytes = 0
        for refusal in refused {
            let size =
                32 + refusal.table.utf8.count + refusal.reason.utf8.count
                + refusal.key.reduce(0) { total, value in
                    switch value {
                    case let .text(text): total + 10 + text.utf8.count
                    case let .blob(blob): total + 10 + blob.count
                    default: total + 10
                    }
                }
            if !current.isEmpty, current.count == 10_000 || bytes + size > 4 << 20 {
                messages.append(current)
                current = []
                bytes = 0
            }
            current.append(refusal)
            bytes += size
        }
        if !current.isEmpty { messages.append(current) }
        return messages
    }

    /// The peer's changes are all in: this direction is caught up until the peer announces more.
    /// With `parkedPulls`, a session kept open leaves its next PULL, after `cursor`, parked at the
    /// peer, which answers it with its next changes (§8.4).
    mutating func caughtUpWithPeer(cursor: Int64? = nil) {
        requester.pendingChanged = 0
        requester.receivedLast = true
        checkCaughtUp()
        if !live, keptOpen { schedulePoll() }
        if let cursor, parksPulls, keptOpen, state.isOpen { sendPull(after: cursor, park: true) }
    }

    /// A scope backfill batch was applied: the next one, or once the last is in, caught up (or
    /// pulling again, if the peer announced changes meanwhile).
    mutating func scopeBackfillApplied(_ batch: ChangeBatch, _ report: ApplyReport, from peer: InstanceKey) {
        reportProgress()
        actions.append(.batchApplied(batch, changes: batch.changes.count, appliedSoFar: requester.batchesApplied))
        if !batch.isLast {
            sendPull(after: batch.through, scopeBackfill: true)
            return
        }
        if case let .settled(sent, received) = scopes, !received.widened.isEmpty {
            // The tables the peer now sends whole are whole here: no scope backfill for them again.
            var whole = received
            whole.widened = []
            scopes = .settled(sent: sent, received: whole)
            runDatabase(.recordPartialTables(peer: peer, whole.evictable))
        }
        if requester.pendingChanged > batch.through, live {
            requester.pendingChanged = 0
            pull(from: peer)
        } else {
            // A scope backfill goes through the cursor.
            caughtUpWithPeer(cursor: batch.through)
        }
    }

    /// A backfill batch was applied: the next backfill PULL, or once the last is in, the backfill
    /// is recorded as done and the ordinary pulls start from the cursor.
    mutating func backfillApplied(_ batch: ChangeBatch, _ report: ApplyReport, from peer: InstanceKey) {
        reportProgress()
        actions.append(.batchApplied(batch, changes: batch.changes.count, appliedSoFar: requester.batchesApplied))
        guard case let .running(request, _) = requester.backfill else { return }
        if batch.isLast {
            requester.backfill = .done
            runDatabase(.completeBackfill(peer: peer, shared: shared.sharedColumns(of: schema)))
            pull(from: peer)
        } else {
            requester.backfill = .running(request, resumeAfter: batch.through)
            sendPull(after: batch.through, backfill: request)
        }
    }

    /// A backfill batch carries a timestamp further ahead of this clock than it accepts. It is
    /// not acknowledged, so there is nothing to tell the peer (§8.3): a session kept open pulls
    /// it again, from where the backfill got to, once this clock may have caught up; a
    /// `syncOnce` session goes on with the ordinary pulls and leaves the backfill, not recorded
    /// as done, to the next session.
    mutating func pauseBackfill(ahead: Duration, limit: Duration) {
        summary.deferredFromPeer = SyncError.clockSkew(ahead: ahead, limit: limit).description
        guard keptOpen else {
            requester.backfill = .done
            return
        }
        schedulePullRetry(in: clockSkewRetryDelay(ahead: ahead, limit: limit))
    }

    /// A batch did not fit on the disk: the next ones are made smaller (an eighth), so that what
    /// room there is gets used and sync goes on as soon as some is freed. When a single change does
    /// not fit, a session kept open tries again after `noRoomRetryDelay`; a `syncOnce` session
    /// gives up (the returned error).
    mutating func shrinkPullsForLackOfRoom(_ reason: String) -> SyncSessionError? {
        guard requester.pullChangeLimit == 1 else {
            requester.pullChangeLimit = max(1, requester.pullChangeLimit / 8)
            return nil
        }
        guard keptOpen else {
            return .storage(
                operation: "apply the \(role.peerName)'s changes",
                reason: "not even one change fits on the disk: \(reason)")
        }
        schedulePullRetry(in: options.noRoomRetryDelay)
        return nil
    }

    mutating func schedulePullRetry(in delay: TimeAmount) {
        guard !completed else { return }
        requester.pullRetryPending = true
        schedule(.pullRetry, in: delay)
    }

    /// The peer's batch (after `after` through `through`) carries a timestamp further ahead of
    /// this clock than it accepts: nothing of it was applied. With `deferrals` negotiated only
    /// this direction pauses (§8.3): DEFERRED goes out once no pull is in progress, and pulling
    /// starts again from the cursor when this clock may have caught up (or the limit was
    /// raised); a `syncOnce` session leaves the rest for a later session. The other direction
    /// goes on either way.
    mutating func deferPeerBatch(after: Int64, through: Int64, ahead: Duration, limit: Duration) {
        let reason = SyncError.clockSkew(ahead: ahead, limit: limit).description
        let retry = clockSkewRetryDelay(ahead: ahead, limit: limit)
        requester.pendingDeferral = (
            Deferral(
                after: after, through: through, reason: .clockSkew,
                retryAfterMilliseconds: UInt64(max(0, retry.nanoseconds / 1_000_000)),
                message: Self.truncated(reason, maxBytes: options.wireLimits.maxStringLength)), retry
        )
        summary.deferredFromPeer = reason
    }

    /// When this clock may have caught up with a timestamp `ahead` of it (at least 100 ms, at most
    /// `clockSkewRetryInterval`, after which a raised limit is noticed too).
    func clockSkewRetryDelay(ahead: Duration, limit: Duration) -> TimeAmount {
        let catchUp = ahead - limit
        return min(options.clockSkewRetryInterval, max(.milliseconds(100), .nanoseconds(catchUp.wholeNanoseconds)))
    }

    /// A batch answering an abandoned pull was discarded: a DEFERRED not yet sent covers it too.
    mutating func coverInPendingDeferral(_ through: Int64) {
        guard let pending = requester.pendingDeferral, through > pending.deferral.through else { return }
        requester.pendingDeferral?.deferral.through = through
    }

    /// Pulls again from the cursor, once nothing of the abandoned pulls is in progress; a
    /// deferral waiting for that moment is sent first.
    mutating func restartPullsIfIdle(_ peer: InstanceKey) {
        guard requester.restartPending, requester.outstandingPull == nil, requester.batchesBeingApplied == 0,
            state.isOpen
        else { return }
        if let (deferral, retry) = requester.pendingDeferral {
            requester.pendingDeferral = nil
            send(.deferred(deferral))
            guard keptOpen else {
                // This session will not pull the deferred changes again: this direction is over.
                requester.restartPending = false
                requester.receivedLast = true
                return checkCaughtUp()
            }
            schedulePullRetry(in: retry)
        }
        guard !requester.pullRetryPending else { return }
        requester.restartPending = false
        requester.receivedLast = false
        pull(from: peer)
    }
}
