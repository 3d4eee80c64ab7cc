import NIOCore
import Tether

// MARK: Live (§8.4)

extension SyncSessionStateMachine {
    /// Tells the peer, right after the handshake, how far this database's changes go (one CHANGED,
    /// sent whatever the capabilities, §8.4), so that it can show how much it expects to receive.
    mutating func announceLatest() {
        runDatabase(.readLastSequence)
    }

    mutating func announcedLatest(_ latest: Int64) {
        guard state.isOpen, latest > 0, responder.announced == 0 else { return }
        responder.announced = latest
        send(.changed(latest: latest))
    }

    mutating func receivedChanged(_ latest: Int64, from peer: InstanceKey) {
        guard !peerPolicy.readOnly else { return }
        if latest > requester.peerLatest {
            requester.peerLatest = latest
            if changesExpectedToReceive == nil || !requester.receivedLast {
                estimateReceiving(cursor: requester.outstandingPull ?? 0)
                reportProgress()
            }
        }
        // Without livePush negotiated, CHANGED only informs progress (§8.4).
        guard live else { return }
        if requester.outstandingPull != nil || requester.applying || !requester.receivedLast {
            requester.pendingChanged = max(requester.pendingChanged, latest)
            return
        }
        requester.receivedLast = false
        pull(from: peer)
    }

    /// Without `livePush`, a kept-open session learns of the peer's new changes by pulling again (§8.4).
    mutating func schedulePoll() {
        guard !completed else { return }
        schedule(.poll, in: max(.milliseconds(1), options.pollInterval))
    }

    /// Sends CHANGED if this database has changes beyond what the peer was sent and it is not pulling.
    mutating func checkLocalChanges() {
        guard live, state.isOpen, responder.sentLast, !responder.owesBatch, !responder.checkingChanges else { return }
        responder.checkingChanges = true
        runDatabase(.readLastSequenceIncludingExternalWrites)
    }

    /// This database's changes now go through `latest` (a `LocalChangeMonitor` tells the
    /// sessions): CHANGED if the peer lacks them and is not pulling; otherwise remembered, and
    /// announced once the peer's pull is answered or its batch applied (`announceIfBehind`).
    mutating func localChangesCommitted(through latest: Int64) {
        if case var .handshaking(handshake) = state {
            handshake.localLatest = max(handshake.localLatest, latest)
            state = .handshaking(handshake)
        } else {
            responder.localLatest = max(responder.localLatest, latest)
        }
        announceIfBehind()
        answerParkedPull()
    }

    /// Looks for changes for the peer's parked PULL (§8.4) once told of commits after the last
    /// look; `extracted` answers it if there are. Not while a batch of the peer's is being applied
    /// (as for CHANGED): its commit may hold only the peer's own changes.
    mutating func answerParkedPull() {
        guard var parked = responder.parked, state.isOpen, !responder.owesBatch, !requester.applying,
            responder.localLatest > max(parked.nothingThrough, parked.lookedAt), let peer = peerKey,
            case let .settled(sentScope, _) = scopes
        else { return }
        parked.lookedAt = responder.localLatest
        responder.parked = parked
        var pull = parked.pull
        pull.after = parked.nothingThrough
        pull.history = nil
        extract(pull, for: peer, sentScope: sentScope)
    }

    /// Not while a batch of the peer's is being applied: its commit tells of sequence numbers
    /// that may hold only the peer's own changes, which the peer does not need back; once applied
    /// (`batchApplied` knows), what is left is announced.
    mutating func announceIfBehind() {
        let responder = self.responder
        guard live, state.isOpen, responder.sentLast, !responder.owesBatch, responder.parked == nil,
            !requester.applying, responder.localLatest > responder.sentThrough,
            responder.localLatest > responder.announced
        else { return }
        self.responder.announced = responder.localLatest
        send(.changed(latest: responder.localLatest))
    }
}
