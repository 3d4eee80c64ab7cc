import Tether
import TetherWire

extension SyncSessionStateMachine {
    /// Serving the peer's pulls (§8.3), and telling it of this database's new changes (§8.4).
    struct Responder {
        var owesBatch = false
        /// The BATCH owed answers a backfill PULL (it is not acknowledged).
        var owedBatchIsBackfill = false
        /// Whether the peer sent at least one PULL.
        var receivedAnyPull = false
        var sentLast = false
        /// The `through` of every BATCH sent and not yet acknowledged, in order.
        var unacknowledged: [Int64] = []
        /// The peer's newest ACK, not yet recorded in the database (`deferAcknowledgement`).
        var unrecordedAck: (peer: InstanceKey, through: Int64)?
        /// The `through` of the newest BATCH sent (nil: none yet), the most an ACK may name (§8.3).
        var newestThrough: Int64?
        /// The highest `through` of the batches sent, and the last `latest` announced.
        var sentThrough: Int64 = 0
        var announced: Int64 = 0
        var checkingChanges = false
        /// The highest last sequence number of this database the session has been told of.
        var localLatest: Int64 = 0
        /// The changes sent that the peer may still refuse.
        var refusable = RefusableChanges()
        /// The peer's PULL parked here until this database has changes for it (§8.4).
        var parked: ParkedPull?
        /// The database's last sequence number when the last batch was extracted (nil: none yet).
        var latestAtExtraction: Int64?
        /// Follow-on PULLs (§8.3) received and not answered yet, in order: each is answered by the
        /// batch after the one sent before it.
        var followOns: [Pull] = []
    }

    /// A PULL with flag `park` (§8.4), held until there is something after its `after` to send.
    struct ParkedPull {
        var pull: Pull
        /// Nothing for the peer lies between the pull's `after` and this sequence number: the next
        /// look starts after it (the answer still goes after the pull's `after`).
        var nothingThrough: Int64
        /// `localLatest` when this side last looked: it looks again once told of later changes.
        var lookedAt: Int64
    }
}

// MARK: Responder: serving the peer's pulls (§8.3)

extension SyncSessionStateMachine {
    mutating func receivedPull(_ pull: Pull, from peer: InstanceKey) {
        if pull.followOn { return receivedFollowOn(pull, from: peer) }
        guard !responder.owesBatch, responder.parked == nil, responder.followOns.isEmpty else {
            return fail(.protocolViolation("a PULL while the answer to the previous one is still owed"))
        }
        guard !pull.park || parksPulls else {
            return fail(
                .protocolViolation(
                    "a PULL to park, but the parkedPulls and livePush capabilities were not both negotiated"))
        }
        guard pull.history == nil || histories else {
            return fail(
                .protocolViolation("a PULL with a history mark, but the histories capability was not negotiated"))
        }
        guard case let .settled(sentScope, _) = scopes else {
            return fail(.protocolViolation("a PULL before SCOPE, which version 3 sends first"))
        }
        guard !pull.scopeBackfill || version3 else {
            return fail(.protocolViolation("a PULL for a scope backfill, but protocol version 3 was not negotiated"))
        }
        responder.refusable.pulledAfterBackfill()
        responder.owedBatchIsBackfill = pull.backfill != nil || pull.scopeBackfill
        responder.receivedAnyPull = true
        if pull.park {
            responder.parked = ParkedPull(pull: pull, nothingThrough: pull.after, lookedAt: responder.localLatest)
            // Nothing was committed after the pull's cursor when the last batch was extracted, nor
            // told of since: the next commit's wake looks (`answerParkedPull`), not a look now.
            if nothingToLook(after: pull) { return }
        }
        extract(pull, for: peer, sentScope: sentScope)
    }

    /// Whether a parked `pull` (an ordinary one, right after the last batch sent) has nothing to
    /// find now: the database held nothing after its cursor at the last extraction, and no later
    /// commit was told of (each one is, `localChangesCommitted`). Any other cursor is looked at.
    private func nothingToLook(after pull: Pull) -> Bool {
        guard let latest = responder.latestAtExtraction, responder.sentLast, pull.history == nil,
            pull.backfill == nil, !pull.scopeBackfill
        else { return false }
        return pull.after == responder.sentThrough && max(latest, responder.localLatest) <= pull.after
    }

    /// Answers `pull` (the database extracts the batch, `extracted` sends it).
    mutating func extract(_ pull: Pull, for peer: InstanceKey, sentScope: SyncScope?) {
        responder.owesBatch = true
        // A scoped peer's ACK marks synced only rows it was sent: rows are not marked in flight.
        runDatabase(
            .extract(
                peer: peer, pull: pull,
                restriction: ExtractRestriction(
                    allowedTables: peerPolicy.allowedTables, shared: shared,
                    marksInFlight: peerPolicy.allowedTables == nil && !shared.leavesOutTables(of: schema)
                        && sentScope == nil, marksHistory: histories,
                    scope: sentScope, version3: version3)))
        recordAcknowledgement()
    }

    mutating func extracted(_ batch: ChangeBatch, latest: Int64, mark: HistoryMark? = nil) {
        responder.owesBatch = false
        responder.latestAtExtraction = latest
        var batch = batch
        if var parked = responder.parked {
            guard !batch.changes.isEmpty || !batch.isLast else {
                // Nothing for the peer yet: the PULL stays parked, and is answered once there is.
                parked.nothingThrough = max(parked.nothingThrough, batch.through)
                responder.parked = parked
                return answerParkedPull()
            }
            // What lay between the pull's `after` and the look's start held nothing for the peer.
            responder.parked = nil
            batch.after = parked.pull.after
        }
        if case let .settled(_, received) = scopes, !received.claimed.isEmpty {
            responder.refusable.sent(batch, isBackfill: responder.owedBatchIsBackfill)
        }
        if responder.owedBatchIsBackfill {
            // Not acknowledged, and no part of the ordinary catch-up (§8.3).
            responder.owedBatchIsBackfill = false
            summary.batchesSent += 1
            summary.changesSent += batch.changes.count
            send(.batch(batch))
            return reportProgress()
        }
        responder.unacknowledged.append(batch.through)
        responder.newestThrough = batch.through
        responder.sentThrough = max(responder.sentThrough, batch.through)
        responder.sentLast = batch.isLast
        summary.batchesSent += 1
        summary.changesSent += batch.changes.count
        changesExpectedToSend = summary.changesSent + (batch.isLast ? 0 : Self.span(from: batch.through, to: latest))
        if let mark { send(.history(mark)) }
        send(.batch(batch))
        reportProgress()
        if batch.isLast {
            // The follow-ons still waiting are void: the requester knows from `isLast`.
            responder.followOns.removeAll()
        } else {
            answerFollowOn()
        }
        checkCaughtUp()
        announceIfBehind()
    }

    mutating func receivedAck(_ through: Int64, from peer: InstanceKey) {
        // The requester acknowledges its cursor after each batch it applies: the batch's `through`
        // or, when its apply waits for a gap, less; never more than the newest batch sent (§8.3).
        guard let newest = responder.newestThrough, through <= newest else {
            return fail(
                .protocolViolation(
                    """
                    ACK through \(through), beyond the newest batch sent \
                    (\(responder.newestThrough.map(String.init) ?? "none"))
                    """))
        }
        // Two pipelined batches can end at the same sequence (one cut by its limits at this
        // database's last change, then an empty last one): the first ACK covers both, and the
        // second, the same, has nothing left to record.
        let unacknowledged = responder.unacknowledged.count
        responder.unacknowledged.removeAll { $0 <= through }
        responder.refusable.acknowledged(through: through)
        guard responder.unacknowledged.count < unacknowledged else { return }
        deferAcknowledgement(peer: peer, through: through)
    }

    /// Records an ACK after the extraction it would otherwise hold up, or `acknowledgementDelay`
    /// later, with those received meanwhile: a live peer acknowledges a batch about when the next
    /// commit wants extracting, and the session's database work runs one request at a time. What
    /// the peer acknowledged is known at once (`unacknowledged`); only the rows' bookkeeping waits,
    /// and only behind extractions (`runDatabase` records it before any other work). A scoped peer's
    /// ACK also settles its evictions, which the next extraction reads: recorded at once.
    mutating func deferAcknowledgement(peer: InstanceKey, through: Int64) {
        guard case .settled(nil, _) = scopes else { return runDatabase(.acknowledge(peer: peer, through: through)) }
        if let unrecorded = responder.unrecordedAck {
            // One record covers both only going forward (an ACK that goes back revisits everything).
            guard through >= unrecorded.through, unrecorded.peer == peer else {
                recordAcknowledgement()
                return deferAcknowledgement(peer: peer, through: through)
            }
        } else {
            schedule(.acknowledgement, in: Self.acknowledgementDelay)
        }
        responder.unrecordedAck = (peer, through)
    }

    /// Records the ACK `deferAcknowledgement` kept, if any.
    mutating func recordAcknowledgement() {
        guard let unrecorded = responder.unrecordedAck else { return }
        responder.unrecordedAck = nil
        actions.append(.cancel(.acknowledgement))
        runDatabase(.acknowledge(peer: unrecorded.peer, through: unrecorded.through))
    }

    /// REFUSED (§6.11): changes of this database the peer did not write, being outside this
    /// database's scope there. Recorded (`refusedChanges()`, `tether status`), never sent again:
    /// this database's version of each row goes, and the peer's comes back with the next pull.
    /// Each must name a change this side sent it and it has not acknowledged or refused yet, and the
    /// peer must send this side part of some table (its policy scopes this side's writes): otherwise
    /// nothing of the message is recorded, and the session ends.
    mutating func receivedRefusals(_ refusals: [RefusedChange], from peer: InstanceKey) {
        guard version3 else { return fail(.protocolViolation("REFUSED, but protocol version 3 was not negotiated")) }
        var refusable = responder.refusable
        if let unsent = refusals.first(where: { !refusable.take($0) }) {
            return fail(
                .protocolViolation(
                    "REFUSED of a change to \(unsent.table) (key \(unsent.key), sequence \(unsent.sequence)) that "
                        + "this peer did not send "
                        + "the \(role.peerName) in a batch it has not acknowledged (or the \(role.peerName) scopes "
                        + "none of this peer's writes); nothing of it was recorded"))
        }
        responder.refusable = refusable
        summary.refusedByPeer += refusals.count
        runDatabase(.recordRefusals(peer: peer, refusals))
    }

    /// The peer did not apply this side's newest batches (§8.3): their rows stay pending, the
    /// reason is recorded for `tether status`, and the peer pulls them again when it can. A
    /// `syncOnce` session counts this direction as over (the summary says why).
    mutating func receivedDeferral(_ deferral: Deferral, from peer: InstanceKey) {
        guard defers else {
            return fail(.protocolViolation("DEFERRED, but the deferrals capability was not negotiated"))
        }
        guard !responder.owesBatch, let newest = responder.unacknowledged.last, deferral.through == newest,
            deferral.after < newest
        else {
            return fail(
                .protocolViolation(
                    """
                    DEFERRED after \(deferral.after) through \(deferral.through), which is not the newest batch \
                    sent and not yet acknowledged (\(responder.unacknowledged.last.map(String.init) ?? "none"))
                    """))
        }
        responder.unacknowledged.removeAll()
        responder.refusable.deferred()
        summary.deferredByPeer = deferral.message
        runDatabase(.recordDeferral(peer: peer, deferral))
    }
}
