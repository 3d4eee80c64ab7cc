import NIOCore
import Testing
@testable import TetherSync
import TetherWire

/// Quiet sessions (capability `quietHeartbeats`, Protocol/README.md §8.5): once nothing but PING and
/// PONG went either way for 60 s, both sides ping every 300 s and allow 900 s of silence, until
/// any other frame. Driven event by event with the state machine's clock.
@Suite("Sync sessions: quiet heartbeats")
struct QuietHeartbeatTests {
    typealias Session = SessionStateMachineTests.Session
    typealias Machine = SyncSessionStateMachine

    /// 10-s pings, 30-s idle timeout.
    static let options = SessionStateMachineTests.timeoutOptions

    /// A client whose PINGs are answered at once, run through `seconds` of an idle session (one
    /// heartbeat every second): the delays of the heartbeats it set, and the PINGs it sent.
    static func idle(_ session: inout Session, seconds: Int) -> (delays: [TimeAmount], pings: Int) {
        var delays: [TimeAmount] = []
        var pings = 0
        for _ in 0..<seconds {
            let fired = session.handle(.timerFired(.heartbeat), later: .seconds(1))
            #expect(fired.errorCodes.isEmpty)
            delays += fired.scheduled.filter { $0.timer == .heartbeat }.map(\.delay)
            for case let .ping(nonce) in fired.sent {
                pings += 1
                _ = session.handle(.received(.pong(nonce)), later: .milliseconds(1))
            }
        }
        return (delays, pings)
    }

    @Test("an idle client pings every 10 s until the session is quiet (60 s), then every 300 s; no timeout meanwhile")
    func quietClientPingsRarely() throws {
        var session = try Session(options: Self.options, quietHeartbeats: true)
        _ = session.pulling()
        // PINGs at 10, 20, …, 50 s; at 60 s the session is quiet (nothing else since its PULL).
        let firstMinute = Self.idle(&session, seconds: 60)
        #expect(firstMinute.pings == 5)
        let quiet = Self.idle(&session, seconds: 600)
        #expect(quiet.pings == 2, "a PING every 300 s once quiet, not every 10 s")
        #expect(session.machine.isQuiet)
        #expect(quiet.delays.contains { $0 >= .seconds(250) }, "the heartbeat is set minutes ahead, not every second")
    }

    @Test("the accepting side of a quiet session allows 900 s of silence, then times the peer out")
    func quietServerTimesOutAfterTheQuietTimeout() throws {
        var session = try Session(options: Self.options, role: .server, quietHeartbeats: true)
        _ = session.pulling()
        // The connecting side's PINGs, answered, for two minutes: quiet from 60 s on.
        for second in stride(from: 10, through: 120, by: 10) {
            _ = session.handle(.received(.ping(UInt64(second))), later: .seconds(10))
            let fired = session.handle(.timerFired(.heartbeat))
            for case let .ping(nonce) in fired.sent {
                _ = session.handle(.received(.pong(nonce)), later: .milliseconds(1))
            }
        }
        #expect(session.machine.isQuiet)
        // Then silence: no timeout at 30 s, nor at 850 s; at 900 s, ERROR 10.
        let early = session.handle(.timerFired(.heartbeat), later: .seconds(850))
        #expect(early.errorCodes.isEmpty)
        let late = session.handle(.timerFired(.heartbeat), later: .seconds(50))
        #expect(late.errorCodes == [.timeout])
        #expect(late.sent.contains { if case let .error(_, text) = $0 { text.contains("900 s") } else { false } })
    }

    @Test("any frame but PING and PONG ends the quiet: the heartbeat is set again by the 10-s interval")
    func aFrameEndsTheQuiet() throws {
        var session = try Session(options: Self.options, quietHeartbeats: true)
        _ = session.pulling()
        _ = Self.idle(&session, seconds: 90)
        #expect(session.machine.isQuiet)
        let changed = session.handle(.received(.changed(latest: 5)), later: .seconds(1))
        #expect(!session.machine.isQuiet)
        #expect(changed.contains { if case .cancel(.heartbeat) = $0 { true } else { false } })
        #expect(changed.scheduled.filter { $0.timer == .heartbeat }.allSatisfy { $0.delay <= .seconds(10) })
        #expect(changed.scheduled.contains { $0.timer == .heartbeat })
        // 30 s of silence now time the peer out again.
        let timedOut = Self.idle(&session, seconds: 0)
        #expect(timedOut.pings == 0)
        let fired = session.handle(.timerFired(.heartbeat), later: .seconds(31))
        #expect(fired.errorCodes == [.timeout])
    }

    @Test("without quietHeartbeats negotiated (a peer of an earlier version), an idle session pings every 10 s")
    func noQuietWithoutTheCapability() throws {
        var session = try Session(options: Self.options, quietHeartbeats: true)
        var hello = session.peerHello
        hello.capabilities.remove(.quietHeartbeats)
        _ = session.open(hello: hello)
        let idle = Self.idle(&session, seconds: 300)
        #expect(idle.pings == 30)
        #expect(!session.machine.isQuiet)
    }
}
