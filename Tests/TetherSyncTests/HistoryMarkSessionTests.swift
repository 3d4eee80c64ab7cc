import NIOCore
import Testing
@testable import Tether
@testable import TetherSync
import TetherWire

/// The session's part of `histories` (Protocol/README.md §8.9), event by event: the mark kept of
/// the peer goes out with the first PULL, each BATCH follows its HISTORY, and neither is allowed
/// without the capability.
@Suite("Sync sessions: history marks")
struct HistoryMarkSessionTests {
    typealias Session = SessionStateMachineTests.Session

    static let kept = HistoryMark(through: 40, clock: 0x0191_f0a7_c100_0003)

    /// Open with `capabilities` in the peer's HELLO, the cursor read as 40 with the mark `kept`:
    /// returns the actions of the cursor result.
    static func pulling(_ session: inout Session, capabilities: Capabilities = .supported) -> [SyncSessionStateMachine
        .Action]
    {
        var hello = session.peerHello
        hello.capabilities = capabilities
        _ = session.open(hello: hello)
        _ = session.handle(.databaseCompleted(.lastSequence(0)))
        return session.handle(.databaseCompleted(.cursor(after: 40, resyncing: false, previousAfter: nil, mark: kept)))
    }

    @Test(
        """
        the first PULL shows the mark kept of the peer; the peer's HISTORY goes with the BATCH after it to its \
        apply, and later PULLs show nothing
        """)
    func marksTravelWithPullsAndBatches() throws {
        var session = try Session()
        let first = Self.pulling(&session)
        guard case let .pull(pull)? = first.sent.first else { Issue.record("sent \(first.sent)"); return }
        #expect(pull.after == 40 && pull.history == Self.kept)

        let sent = HistoryMark(through: 50, clock: 0x0191_f0a7_c100_0009)
        #expect(session.handle(.received(.history(sent))).sent.isEmpty)
        let received = session.handle(.received(.batch(session.batch(after: 40, through: 50))))
        guard case let .pull(pipelined)? = received.sent.first else { Issue.record("sent \(received.sent)"); return }
        #expect(pipelined.after == 50 && pipelined.history == nil)
        guard case let .apply(apply)? = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        #expect(apply.mark == sent)
        // A BATCH without HISTORY before it leaves no mark.
        _ = session.handle(.databaseCompleted(.applied(.applied(SessionStateMachineTests.report(cursor: 50)), apply)))
        let next = session.handle(.received(.batch(session.batch(after: 50, through: 60, isLast: true))))
        guard case let .apply(unmarked)? = next.requests.first else {
            Issue.record("asked for \(next.requests)"); return
        }
        #expect(unmarked.mark == nil)
    }

    @Test("serving a PULL: the extraction reads a mark, which goes out as HISTORY right before the BATCH")
    func historyPrecedesTheBatch() throws {
        var session = try Session()
        _ = Self.pulling(&session)
        let asked = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000, history: Self.kept))))
        guard case let .extract(_, pull, restriction)? = asked.requests.first else {
            Issue.record("asked for \(asked.requests)"); return
        }
        #expect(pull.history == Self.kept && restriction.marksHistory)
        let batch = ChangeBatch(
            source: session.local, after: 0, through: 7, isLast: true, tables: session.schema.tables, changes: [])
        let mark = HistoryMark(through: 7, clock: 12)
        let sent = session.handle(.databaseCompleted(.extracted(batch, latest: 7, mark: mark))).sent
        #expect(sent.prefix(2) == [.history(mark), .batch(batch)])
    }

    @Test("without histories negotiated no mark is shown, and a HISTORY or a PULL showing a mark is ERROR 6")
    func withoutTheCapabilityMarksAreRefused() throws {
        var withoutHistories = Capabilities.supported
        withoutHistories.remove(.histories)
        var session = try Session()
        let first = Self.pulling(&session, capabilities: withoutHistories)
        guard case let .pull(pull)? = first.sent.first else { Issue.record("sent \(first.sent)"); return }
        #expect(pull.history == nil)
        let refused = session.handle(.received(.history(Self.kept)))
        #expect(refused.errorCodes == [.malformedFrame] && refused.closes)

        var server = try Session()
        _ = Self.pulling(&server, capabilities: withoutHistories)
        let asked = server.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000, history: Self.kept))))
        #expect(asked.errorCodes == [.malformedFrame] && asked.requests.isEmpty)
        var other = try Session()
        _ = Self.pulling(&other, capabilities: withoutHistories)
        let served = other.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        guard case let .extract(_, _, restriction)? = served.requests.first else {
            Issue.record("asked for \(served.requests)"); return
        }
        #expect(!restriction.marksHistory)
    }

    @Test("a HISTORY while no PULL is outstanding, or two in a row, is ERROR 6")
    func strayHistoryIsRefused() throws {
        var session = try Session()
        _ = session.open()
        let stray = session.handle(.received(.history(Self.kept)))
        #expect(stray.errorCodes == [.malformedFrame])

        var twice = try Session()
        _ = Self.pulling(&twice)
        _ = twice.handle(.received(.history(Self.kept)))
        let second = twice.handle(.received(.history(Self.kept)))
        #expect(second.errorCodes == [.malformedFrame])
    }
}
