import NIOCore
import Testing
@testable import Tether
@testable import TetherSync
import TetherWire

/// Follow-on PULLs (capability `pullsAhead`, Protocol/README.md §8.3): a requester catching up keeps
/// a second batch coming while the apply keeps up, so that a link with a round trip is not left
/// idle between batches; the responder answers each once the batch before it is sent.
@Suite("Sync sessions: follow-on pulls")
struct FollowOnPullTests {
    typealias Session = SessionStateMachineTests.Session

    static func applied(_ session: inout Session, _ actions: [SyncSessionStateMachine.Action], cursor: Int64)
        -> [SyncSessionStateMachine.Action]
    {
        guard case let .apply(apply)? = actions.requests.first else {
            Issue.record("asked for \(actions.requests)")
            return []
        }
        return session.handle(
            .databaseCompleted(.applied(.applied(SessionStateMachineTests.report(cursor: cursor)), apply)))
    }

    @Test(
        """
        a catch-up's first PULL goes with a follow-on; while the apply keeps up, each batch received asks for \
        one more, and a batch with isLast voids the follow-ons still out
        """)
    func requesterKeepsTwoBatchesComing() throws {
        var session = try Session(pullsAhead: true)
        let start = session.pulling(after: 0)
        #expect(start.pulls.map(\.after) == [0, 0])
        #expect(start.pulls.map(\.followOn) == [false, true])
        // The first PULL's batch: the follow-on's comes next, after 10; one more follow-on goes out.
        let first = session.handle(.received(.batch(session.batch(after: 0, through: 10))))
        #expect(first.pulls.map(\.followOn) == [true])
        #expect(session.machine.requester.outstandingPull == 10)
        _ = Self.applied(&session, first, cursor: 10)

        let second = session.handle(.received(.batch(session.batch(after: 10, through: 20))))
        #expect(second.pulls.map(\.followOn) == [true])
        #expect(session.machine.requester.outstandingPull == 20)
        _ = Self.applied(&session, second, cursor: 20)

        // The last batch answers the first follow-on; the second, still out, is void: nothing more comes,
        // and a batch that did is answering no PULL.
        let last = session.handle(.received(.batch(session.batch(after: 20, through: 25, isLast: true))))
        #expect(last.pulls.isEmpty)
        #expect(session.machine.requester.followOnsOutstanding == 0)
        #expect(session.machine.requester.outstandingPull == nil)
        let afterLast = session.handle(.received(.batch(session.batch(after: 25, through: 25, isLast: true))))
        #expect(afterLast.errorCodes == [.malformedFrame])
    }

    @Test(
        """
        live, with parked pulls: a catch-up that ends with a follow-on still out parks once its last batch is \
        applied; a commit too large for one batch answers the parked PULL, follow-ons start again, and it parks again
        """)
    func followOnsEndInAParkedPull() throws {
        var session = try Session(parksPulls: true, pullsAhead: true)
        _ = session.pulling(after: 0)
        let first = session.handle(.received(.batch(session.batch(after: 0, through: 10))))
        #expect(first.pulls.map(\.followOn) == [true])
        _ = Self.applied(&session, first, cursor: 10)
        // The first follow-on's batch is the last: the second follow-on is void on both sides.
        let last = session.handle(.received(.batch(session.batch(after: 10, through: 15, isLast: true))))
        #expect(session.machine.requester.followOnsOutstanding == 0)
        let caughtUp = Self.applied(&session, last, cursor: 15)
        #expect(caughtUp.pulls.map { [$0.after: $0.park] } == [[15: true]])

        // A commit of more than a batch answers the parked PULL: the next PULL goes with a follow-on.
        let commit = session.handle(.received(.batch(session.batch(after: 15, through: 30))))
        #expect(commit.pulls.map { [$0.after: $0.followOn] } == [[30: false], [0: true]])
        _ = Self.applied(&session, commit, cursor: 30)
        let rest = session.handle(.received(.batch(session.batch(after: 30, through: 35, isLast: true))))
        #expect(session.machine.requester.followOnsOutstanding == 0)
        let parkedAgain = Self.applied(&session, rest, cursor: 35)
        #expect(parkedAgain.pulls.map { [$0.after: $0.park] } == [[35: true]])
        #expect(session.machine.requester.outstandingPullIsParked)
    }

    @Test("while a batch is still being applied when the next arrives, no follow-on: at most two batches held")
    func applyBoundRequesterDoesNotPullAhead() throws {
        var session = try Session(pullsAhead: true)
        _ = session.pulling(after: 0)
        let first = session.handle(.received(.batch(session.batch(after: 0, through: 10))))
        #expect(first.pulls.map(\.followOn) == [true])
        // The first is not applied yet: the first follow-on's batch arrives, and asks for nothing more.
        let second = session.handle(.received(.batch(session.batch(after: 10, through: 20))))
        #expect(second.pulls.isEmpty)
        #expect(session.machine.requester.batchesBeingApplied == 2)
        // The second follow-on's batch: three held at most; the next PULL waits for an apply.
        let third = session.handle(.received(.batch(session.batch(after: 20, through: 30))))
        #expect(third.pulls.isEmpty)
        #expect(session.machine.requester.batchesBeingApplied == 3)
        #expect(session.machine.requester.deferredPull == 30)
    }

    @Test("without pullsAhead negotiated, a batch received sends only the next PULL (plain pipelining)")
    func noFollowOnWithoutTheCapability() throws {
        var session = try Session(pullsAhead: false)
        #expect(session.pulling(after: 0).pulls.count == 1)
        let first = session.handle(.received(.batch(session.batch(after: 0, through: 10))))
        #expect(first.pulls.map(\.after) == [10])
        #expect(first.pulls.allSatisfy { !$0.followOn })
    }

    static func followOn() -> Pull {
        var pull = Pull(after: 0, maxChanges: 10, maxBytes: 1000)
        pull.followOn = true
        return pull
    }

    @Test(
        """
        the responder answers a follow-on once the batch before it is sent, after that batch's through; one \
        received after a batch with isLast is void
        """)
    func responderAnswersFollowOns() throws {
        var session = try Session(pullsAhead: true)
        _ = session.pulling(after: 0)
        let pulled = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        #expect(pulled.requests.count == 1)
        #expect(session.handle(.received(.pull(Self.followOn()))).requests.isEmpty, "waits for the batch before")
        let sent = session.handle(
            .databaseCompleted(.extracted(session.ownBatch(after: 0, through: 10), latest: 30)))
        #expect(sent.sent.contains { if case .batch = $0 { true } else { false } })
        guard case let .extract(_, next, _)? = sent.requests.first else {
            Issue.record("asked for \(sent.requests)"); return
        }
        #expect(next.after == 10 && !next.followOn)
        // Another follow-on while that is extracted; then the batch is the last: the follow-on is void.
        _ = session.handle(.received(.pull(Self.followOn())))
        let last = session.handle(
            .databaseCompleted(.extracted(session.ownBatch(after: 10, through: 30, isLast: true), latest: 30)))
        #expect(last.requests.filter { if case .extract = $0 { true } else { false } }.isEmpty)
        #expect(session.machine.responder.followOns.isEmpty)
        let stale = session.handle(.received(.pull(Self.followOn())))
        #expect(stale.requests.isEmpty && stale.errorCodes.isEmpty)
    }

    @Test("a follow-on without the capability, or more than eight waiting, ends the session")
    func followOnRulesAreEnforced() throws {
        var earlier = try Session(pullsAhead: false)
        _ = earlier.pulling(after: 0)
        _ = earlier.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        #expect(earlier.handle(.received(.pull(Self.followOn()))).errorCodes == [.malformedFrame])

        var flooding = try Session(pullsAhead: true)
        _ = flooding.pulling(after: 0)
        _ = flooding.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        var codes: [WireErrorCode] = []
        for _ in 0..<9 { codes += flooding.handle(.received(.pull(Self.followOn()))).errorCodes }
        #expect(codes == [.malformedFrame])
    }

    @Test("while the connection takes no more (flow control), the follow-on waits; writable again, it is answered")
    func followOnWaitsForWritability() throws {
        var session = try Session(pullsAhead: true)
        _ = session.pulling(after: 0)
        _ = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        _ = session.handle(.received(.pull(Self.followOn())))
        _ = session.handle(.writabilityChanged(isWritable: false))
        let sent = session.handle(
            .databaseCompleted(.extracted(session.ownBatch(after: 0, through: 10), latest: 30)))
        #expect(sent.requests.isEmpty)
        let writable = session.handle(.writabilityChanged(isWritable: true))
        #expect(writable.requests.count == 1)
    }
}
