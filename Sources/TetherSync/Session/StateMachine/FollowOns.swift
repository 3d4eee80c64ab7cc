import Tether
import TetherWire

// MARK: Follow-on PULLs (§8.3, capability `pullsAhead`)

extension SyncSessionStateMachine {
    /// The most follow-on PULLs a peer may have waiting here (§8.3): more is a protocol violation.
    static let maxFollowOns = 8

    // MARK: Requester: keeping a second batch coming

    /// A batch of the catch-up arrived: if a follow-on PULL is out (§8.3), the next batch answers it,
    /// after this one; a batch with `isLast` voids the follow-ons still out.
    mutating func expectFollowOn(after batch: ChangeBatch) {
        guard requester.followOnsOutstanding > 0 else { return }
        if batch.isLast {
            requester.followOnsOutstanding = 0
        } else {
            requester.followOnsOutstanding -= 1
            requester.outstandingPull = batch.through
        }
    }

    /// The batches in flight or held that a catch-up may have at once with `pullsAhead` (§8.3):
    /// two coming while one is applied.
    static let pullDepth = 3

    /// With `pullsAhead` negotiated, while the apply keeps up (the batch just received, if any, is the
    /// only one held), one more batch is asked for (a follow-on PULL), up to `pullDepth` held or
    /// coming: on a link with a round trip, batches then keep coming back to back; when the apply is
    /// what holds the catch-up back, no more than the two batches of plain pipelining are held.
    mutating func pullAhead() {
        guard pullsAhead, requester.batchesBeingApplied <= 1, requester.outstandingPull != nil,
            !requester.outstandingPullIsBackfill, !requester.outstandingPullIsParked,
            1 + requester.followOnsOutstanding + requester.batchesBeingApplied < Self.pullDepth
        else { return }
        requester.followOnsOutstanding += 1
        var pull = Pull(
            after: 0, maxChanges: max(1, requester.pullChangeLimit), maxBytes: max(1, pullByteLimit),
            wholeRows: requester.wantsWholeRows)
        pull.followOn = true
        send(.pull(pull))
    }

    // MARK: Responder: answering them in order

    /// A follow-on PULL (§8.3): answered by the batch after the one answering the peer's previous
    /// PULL, once that one is sent; void if that one was the catch-up's last.
    mutating func receivedFollowOn(_ pull: Pull, from peer: InstanceKey) {
        guard pullsAhead else {
            return fail(.protocolViolation("a follow-on PULL, but the pullsAhead capability was not negotiated"))
        }
        guard responder.receivedAnyPull, responder.parked == nil, !responder.owedBatchIsBackfill else {
            return fail(
                .protocolViolation("a follow-on PULL that follows no ordinary PULL (none yet, a park or a backfill)"))
        }
        // The batch before it had `isLast`: the requester counts this one as void too.
        if responder.sentLast, !responder.owesBatch { return }
        guard responder.followOns.count < Self.maxFollowOns else {
            return fail(.protocolViolation("more than \(Self.maxFollowOns) follow-on PULLs waiting"))
        }
        responder.followOns.append(pull)
        answerFollowOn()
    }

    /// Extracts the batch the oldest follow-on PULL asks for, once the previous batch is sent and the
    /// connection takes more (flow control, §8.5): what waits here stays one batch.
    mutating func answerFollowOn() {
        guard let next = responder.followOns.first, !responder.owesBatch, liveness.blockedSince == nil,
            state.isOpen, let peer = peerKey, let after = responder.newestThrough,
            case let .settled(sentScope, _) = scopes
        else { return }
        responder.followOns.removeFirst()
        var pull = next
        pull.followOn = false
        pull.after = after
        extract(pull, for: peer, sentScope: sentScope)
    }
}
