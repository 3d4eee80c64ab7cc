import NIOCore

extension SyncSessionStateMachine {
    /// What heartbeats, the idle timeout and flow control go by (§8.5).
    struct Liveness {
        var lastReceived: NIODeadline
        var lastSent: NIODeadline
        var lastPingNonce: UInt64 = 0
        /// Since when this side's oldest PING not yet answered was sent (nil: every PING answered),
        /// and its nonce. A peer that sends frames but answers no PING is not reading what it is
        /// sent (the socket buffers hide that from flow control): it is timed out all the same.
        var unansweredPingSince: NIODeadline?
        var unansweredPingNonce: UInt64 = 0
        /// Flow control (§8.5): since when the send buffer has been above its high-water mark,
        /// with reading paused (nil: writable, reading).
        var blockedSince: NIODeadline?

        init(since now: NIODeadline) {
            lastReceived = now
            lastSent = now
        }
    }
}

// MARK: Heartbeats, timeouts and flow control (§8.5)

extension SyncSessionStateMachine {
    /// Wakes the session when the first of its deadlines comes (`nextHeartbeat`), not on a tick:
    /// an idle session wakes once per ping interval. A deadline that moved since (a frame sent or
    /// received) finds nothing due, and the timer is set again for the new one.
    mutating func scheduleHeartbeat() {
        guard !completed else { return }
        schedule(.heartbeat, in: max(.milliseconds(1), nextHeartbeat - now))
    }

    /// The first deadline of the session: the idle timeout (counted from the last frame received,
    /// or from when reading was paused) and, while open and reading, the PING due once nothing
    /// was sent for the ping interval.
    var nextHeartbeat: NIODeadline {
        if let blockedSince = liveness.blockedSince { return blockedSince + options.idleTimeout }
        let idle =
            min(liveness.lastReceived, liveness.unansweredPingSince ?? liveness.lastReceived) + options.idleTimeout
        guard state.isOpen else { return idle }
        return min(idle, liveness.lastSent + options.effectivePingInterval)
    }

    mutating func heartbeat() {
        guard !completed else { return }
        switch state {
        case .open:
            if let blockedSince = liveness.blockedSince {
                // Reading is paused by choice: only the peer not draining what it was sent counts.
                if now - blockedSince >= options.idleTimeout {
                    return fail(
                        .timeout(
                            """
                            the \(role.peerName) read nothing of what it was sent for \
                            \(Self.describe(options.idleTimeout))
                            """))
                }
                return scheduleHeartbeat()
            }
            if now - liveness.lastReceived >= options.idleTimeout {
                return fail(
                    .timeout("nothing received from the \(role.peerName) for \(Self.describe(options.idleTimeout))"))
            }
            if let since = liveness.unansweredPingSince, now - since >= options.idleTimeout {
                return fail(
                    .timeout(
                        """
                        the \(role.peerName) answered no PING for \(Self.describe(options.idleTimeout)): it reads \
                        nothing of what it is sent
                        """))
            }
            if now - liveness.lastSent >= options.effectivePingInterval {
                liveness.lastPingNonce &+= 1
                send(.ping(liveness.lastPingNonce))
                if liveness.unansweredPingSince == nil {
                    liveness.unansweredPingSince = now
                    liveness.unansweredPingNonce = liveness.lastPingNonce
                }
            }
        case .closing(.byeSent, _):
            // BYE sent and the peer's not coming: nothing more may be sent (§8.6), just close.
            if now - liveness.lastReceived >= options.idleTimeout { return close() }
        case .handshaking, .closing(.byeReceived, _), .failed:
            break
        }
        scheduleHeartbeat()
    }

    /// A PONG: the PING it answers, and every earlier one, are answered.
    mutating func receivedPong(_ nonce: UInt64) {
        if liveness.unansweredPingSince != nil, nonce >= liveness.unansweredPingNonce, nonce <= liveness.lastPingNonce {
            liveness.unansweredPingSince = nil
        }
    }

    /// Flow control (§8.5): while the send buffer is above its high-water mark, this side reads
    /// nothing more, so that no request of the peer's can make it buffer more; a peer that does not
    /// drain the buffer within the idle timeout is timed out (see `heartbeat`).
    mutating func writabilityChanged(_ writable: Bool) {
        if writable {
            if liveness.blockedSince != nil {
                liveness.blockedSince = nil
                liveness.lastReceived = now
                // The PONG could not be read meanwhile: the wait for it starts again.
                if liveness.unansweredPingSince != nil { liveness.unansweredPingSince = now }
                actions.append(.resumeReading)
            }
        } else if liveness.blockedSince == nil, state.isOpen {
            liveness.blockedSince = now
            actions.append(.pauseReading)
        }
    }
}
