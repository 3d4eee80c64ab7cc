import Tether

// MARK: Database work

/// The session's database work: asked for as actions, run by the handler on the session's
/// serial queue, its results handed back as events.
extension SyncSessionStateMachine {
    /// Asks for `request` to run on the session's serial queue; its result comes back as an event.
    mutating func runDatabase(_ request: DatabaseRequest) {
        guard !completed else { return }
        switch request {
        case .extract, .acknowledge: break
        // Only an extraction goes before an ACK waiting to be recorded (`deferAcknowledgement`).
        default: recordAcknowledgement()
        }
        pendingDatabaseWork += 1
        actions.append(.runDatabase(request))
    }

    mutating func databaseCompleted(_ result: DatabaseResult) {
        pendingDatabaseWork -= 1
        // Counted even if the session ended meanwhile: the apply's effect is in the database.
        if case let .applied(.applied(report), _) = result { count(report) }
        guard !completed, state.acceptsDatabaseResults else { return }
        switch result {
        case let .peerConfirmed(pinned):
            if !pinned, let session = state.session, let identity = session.negotiated.peerIdentity {
                runDatabase(.pinPeerIdentity(peer: session.negotiated.peer, certificate: identity))
            }
        case .peerPinned:
            break
        case let .lastSequence(latest):
            announcedLatest(latest)
        case let .lastSequenceIncludingExternalWrites(latest):
            responder.checkingChanges = false
            localChangesCommitted(through: latest)
        case let .cursor(after, resyncing, previousAfter, newlyShared, mark):
            if histories, let mark { requester.markToShow = mark }
            cursorRead(after: after, resyncing: resyncing, previousAfter: previousAfter, newlyShared: newlyShared)
        case .backfillCompleted:
            break
        case let .extracted(batch, latest, mark):
            extracted(batch, latest: latest, mark: mark)
        case let .applied(outcome, apply):
            batchApplied(outcome, apply)
            // This database's commits told of while the batch was applied (§8.4).
            announceIfBehind()
            answerParkedPull()
        case .acknowledged:
            reportProgress()
            checkCaughtUp()
        case .refusalsRecorded, .partialTablesRecorded:
            break
        case .deferralRecorded:
            if !keptOpen { responder.sentLast = true }
            reportProgress()
            checkCaughtUp()
        }
        // Whatever work ends last (an apply, an ACK, a change check) may be what the
        // catch-up was waiting for.
        if !caughtUpReported { checkCaughtUp() }
    }

    mutating func databaseFailed(_ request: DatabaseRequest, _ error: any Error) {
        pendingDatabaseWork -= 1
        let operation = request.operation
        if case let .instanceKeyPinned(key, pinnedTo, presentedBy) = error as? SyncError {
            let pinned = SyncError.instanceKeyPinned(instanceKey: key, pinnedTo: pinnedTo, presentedBy: presentedBy)
            fail(
                .unauthorized(
                    "the \(role.peerName)'s instance key \(key) is pinned to the certificate \(pinnedTo); "
                        + "it was presented with the certificate \(presentedBy). \(pinned)"))
        } else if let partial = error as? PartialTableForVersionTwo {
            refuseVersionTwo(
                "this peer holds only part of table \(partial.table) (a peer sends it in part)", remedy: "upgrade it")
        } else if let scope = error as? ScopeError {
            // The policy's scopes were checked when they were loaded: what fails is the peer's interest.
            fail(
                .schemaMismatch(
                    table: scope.table, column: nil,
                    message: "the \(role.peerName)'s interest cannot be used here: \(scope)"))
        } else if let storage = error as? DatabaseError, storage.isStorageFailure {
            fail(.storage(operation: operation, reason: "\(storage)"))
        } else if case .apply = request {
            fail(.batchRejected("could not \(operation): \(error)"))
        } else {
            fail(.database(operation: operation, reason: "\(error)"))
        }
    }

    /// Counted whatever became of the session since: the apply is committed.
    mutating func count(_ report: ApplyReport) {
        summary.applied += report.applied
        summary.unchanged += report.unchanged
        summary.keptAside += report.keptAside
        summary.conflicts += report.conflicts.count
        summary.refused += report.refused.count
    }
}
