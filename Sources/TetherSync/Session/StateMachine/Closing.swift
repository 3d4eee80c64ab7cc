import Tether
import TetherWire

// MARK: Closing (§8.6)

extension SyncSessionStateMachine {
    mutating func receivedError(code: WireErrorCode, message: String) {
        enterFailed(.peerError(code: code, message: message))
        close()
    }

    mutating func receivedBye() {
        state = .closing(.byeReceived, state.session)
        // Answer once the database work in progress (an acknowledgement, an apply) is done.
        recordAcknowledgement()
        actions.append(.awaitDatabaseIdle(.answerBye))
    }

    /// Sends BYE (a graceful close): the owner of a live session stops it.
    mutating func sayBye() {
        switch state {
        case let .open(session):
            state = .closing(.byeSent, session)
            liveness.lastReceived = now
            write(.bye(reason: "stopped"))
        case .handshaking:
            enterFailed(.connectionClosed(during: "the handshake"))
            close()
        case .closing, .failed:
            return
        }
    }

    mutating func checkCaughtUp() {
        let requester = self.requester, responder = self.responder
        guard state.acceptsDatabaseResults, requester.receivedLast, !requester.applying, !requester.restartPending,
            requester.outstandingPull == nil || requester.outstandingPullIsParked, responder.sentLast,
            !responder.owesBatch,
            responder.unacknowledged.isEmpty, responder.unrecordedAck == nil,
            pendingDatabaseWork == 0
        else { return }
        if !caughtUpReported {
            caughtUpReported = true
            reportProgress()
            actions.append(.caughtUp(peer: peerKey ?? schema.instanceKey))
        }
        // A side that never pulls from its peer (a read-only peer) has nothing left to do either,
        // unless the session stays open (live).
        if configuration.byeWhenCaughtUp || (peerPolicy.readOnly && !live), case let .open(session) = state {
            state = .closing(.byeSent, session)
            write(.bye(reason: "caught up"))
        }
    }

    /// The connection closed, in whatever state.
    mutating func complete() {
        guard !completed else { return }
        // What the peer acknowledged is recorded, however the session ends.
        recordAcknowledgement()
        completed = true
        requester.pullRetryPending = false
        actions.append(.cancelAllTimers)
        actions.append(.sessionClosed)
        // Database work still queued (a batch being applied) finishes first: the summary then
        // counts everything that was committed.
        actions.append(.awaitDatabaseIdle(.finish))
    }

    /// Reports the session's final summary or error.
    mutating func finish() {
        reportProgress()
        switch state {
        case let .failed(failure, _):
            actions.append(.finish(caughtUpFailure: caughtUpReported ? nil : failure, result: .failure(failure)))
        case .closing:
            actions.append(
                .finish(
                    caughtUpFailure: caughtUpReported ? nil : .connectionClosed(during: "catch-up"),
                    result: .success(summary)))
        case .handshaking, .open:
            let error = SyncSessionError.connectionClosed(
                during: state.isHandshaking
                    ? "the handshake"
                    : caughtUpReported ? "the live session" : "catch-up")
            actions.append(.finish(caughtUpFailure: caughtUpReported ? nil : error, result: .failure(error)))
        }
    }
}

// MARK: Failures (§8.6, §8.7)

extension SyncSessionStateMachine {
    /// Fails the session: sends ERROR with the error's code and description (`message` if given), then closes.
    mutating func fail(_ error: SyncSessionError, message: String? = nil) {
        guard !state.isFailed else { return }
        enterFailed(error)
        let text = Self.truncated(message ?? error.description, maxBytes: options.wireLimits.maxStringLength)
        write(.error(code: error.code, message: text))
        close()
    }

    /// Moves to `failed` with `error`, reported once (metrics); a session that already failed
    /// keeps its first error.
    mutating func enterFailed(_ error: SyncSessionError) {
        guard !state.isFailed else { return }
        actions.append(.sessionFailed(error))
        state = .failed(error, state.session)
    }

    mutating func errorCaught(_ error: any Error) {
        guard state.isHandshaking || state.isOpen else {
            // After BYE (sent or received) the catch-up is complete: a failing close changes nothing.
            return close()
        }
        switch error {
        case let wire as WireError:
            // The decoder already sent ERROR and is closing.
            if case let .unsupportedProtocolVersion(version) = wire {
                enterFailed(.protocolVersion(peerVersion: version))
            } else {
                enterFailed(.malformedFrame(wire))
            }
        case let tls as TLSError:
            enterFailed(.tls(tls))
        default:
            enterFailed(.transport("\(error)"))
        }
        close()
    }

    mutating func sendFailed(_ type: MessageType, _ error: any Error) {
        guard state.isHandshaking || state.isOpen else { return }
        if let wire = error as? WireError {
            fail(.cannotSend(message: "\(type)", wire))
        } else {
            enterFailed(.transport("could not send \(type): \(error)"))
            close()
        }
    }
}
