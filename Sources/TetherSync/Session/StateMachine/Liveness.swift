import NIOCore
import TetherWire

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
        /// When this side's newest PING was sent (nil: none yet).
        var lastPingSent: NIODeadline?
        /// The oldest frame other than PING and PONG this side sent that no answered PING sent
        /// after it covers yet, and the oldest sent after the newest PING (nil: none): what the
        /// accepting side pings for (see `nextPing`).
        var unconfirmedSince: NIODeadline?
        var sentSinceLastPing: NIODeadline?
        /// When the last frame other than PING and PONG was sent or received: a session with none
        /// for `quietAfter` is quiet (`quietHeartbeats`, §8.5).
        var lastActivity: NIODeadline

        init(since now: NIODeadline) {
            lastReceived = now
            lastSent = now
            lastActivity = now
        }
    }

    /// Quiet sessions (capability `quietHeartbeats`, §8.5): after this long with nothing but PING and
    /// PONG either way, both sides use the quiet heartbeat interval and idle timeout.
    static let quietAfter = TimeAmount.seconds(60)
    /// The heartbeat interval of a quiet session (or the configured one, if longer).
    static let quietPingInterval = TimeAmount.seconds(300)
    /// The idle timeout of a quiet session (or the configured one, if longer).
    static let quietIdleTimeout = TimeAmount.seconds(900)
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

    /// Whether the session is quiet now (§8.5): `quietHeartbeats` negotiated, open, and nothing but
    /// PING and PONG sent or received for `quietAfter`.
    var isQuiet: Bool {
        quietHeartbeats && state.isOpen && now - liveness.lastActivity >= Self.quietAfter
    }

    /// The heartbeat interval in effect: the quiet one in a quiet session.
    var heartbeatInterval: TimeAmount {
        isQuiet ? max(Self.quietPingInterval, options.effectivePingInterval) : options.effectivePingInterval
    }

    /// The idle timeout in effect: the quiet one in a quiet session.
    var idleTimeout: TimeAmount {
        isQuiet ? max(Self.quietIdleTimeout, options.idleTimeout) : options.idleTimeout
    }

    /// A frame other than PING and PONG, sent or received: a quiet session is quiet no more, and its
    /// next heartbeat, due far later, is set again by the usual interval and timeout.
    mutating func noteActivity() {
        let wasQuiet = isQuiet
        liveness.lastActivity = now
        guard wasQuiet, !completed else { return }
        actions.append(.cancel(.heartbeat))
        scheduleHeartbeat()
    }

    /// The first deadline of the session: the idle timeout (counted from the last frame received,
    /// or from when reading was paused) and, while open and reading, the PING due once nothing
    /// was sent for the ping interval.
    var nextHeartbeat: NIODeadline {
        if let blockedSince = liveness.blockedSince { return blockedSince + options.idleTimeout }
        let idle =
            min(liveness.lastReceived, liveness.unansweredPingSince ?? liveness.lastReceived) + idleTimeout
        guard state.isOpen else { return idle }
        return min(idle, nextPing)
    }

    /// When this side sends its next PING (§8.5). The connecting side pings once it has sent
    /// nothing but PONGs for the ping interval. The accepting side only answers while the
    /// connecting side's PINGs keep coming (a hub holding thousands of idle peers sends one record
    /// per peer per interval, not two, and reads one): it pings when nothing arrived for half as
    /// long again (at most two thirds of the idle timeout), and once a frame it sent other than
    /// PING and PONG went a ping interval without an answered PING sent after it — a peer that
    /// pings but leaves a BATCH unread is still found out.
    var nextPing: NIODeadline {
        let interval = heartbeatInterval
        guard role == .server else { return liveness.lastSent + interval }
        let sincePing = liveness.lastPingSent ?? .uptimeNanoseconds(0)
        let silence = min(
            interval + .nanoseconds(interval.nanoseconds / 2), .nanoseconds(idleTimeout.nanoseconds * 2 / 3))
        let silent = max(liveness.lastReceived, sincePing) + silence
        guard let unconfirmed = liveness.unconfirmedSince else { return silent }
        return min(silent, max(unconfirmed, sincePing) + interval)
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
            let idleTimeout = self.idleTimeout
            if now - liveness.lastReceived >= idleTimeout {
                return fail(.timeout("nothing received from the \(role.peerName) for \(Self.describe(idleTimeout))"))
            }
            if let since = liveness.unansweredPingSince, now - since >= idleTimeout {
                return fail(
                    .timeout(
                        """
                        the \(role.peerName) answered no PING for \(Self.describe(idleTimeout)): it reads \
                        nothing of what it is sent
                        """))
            }
            if now >= nextPing {
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
        // The newest PING answered: the peer read every frame sent before it.
        if nonce == liveness.lastPingNonce { liveness.unconfirmedSince = liveness.sentSinceLastPing }
    }

    /// Counts `message`, about to be sent, for the heartbeats: a PONG does not count as sent (a
    /// side answering PINGs still sends its own where `nextPing` says so).
    mutating func countSent(_ message: WireMessage) {
        switch message {
        case .pong:
            return
        case .ping:
            liveness.lastPingSent = now
            liveness.sentSinceLastPing = nil
        default:
            noteActivity()
            if liveness.unconfirmedSince == nil { liveness.unconfirmedSince = now }
            if liveness.sentSinceLastPing == nil { liveness.sentSinceLastPing = now }
        }
        liveness.lastSent = now
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
                answerFollowOn()
            }
        } else if liveness.blockedSince == nil, state.isOpen {
            liveness.blockedSince = now
            actions.append(.pauseReading)
        }
    }
}
