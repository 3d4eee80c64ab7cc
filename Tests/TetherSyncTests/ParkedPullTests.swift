import NIOCore
import Testing
@testable import Tether
@testable import TetherSync
import TetherWire

/// Parked pulls (capability `parkedPulls`, Protocol/README.md §8.4): a caught-up requester leaves
/// its next PULL at the responder, which answers it with its next commit: no CHANGED, no PULL in
/// between, so a commit reaches the peer in half a round trip.
@Suite("Sync sessions: parked pulls")
struct ParkedPullTests {
    typealias Session = SessionStateMachineTests.Session

    /// A row of `t` from `source`, at sequence `sequence`.
    static func change(_ id: Int64, sequence: Int64, from source: InstanceKey) -> RowChange {
        let version = Version(timestamp: HybridTimestamp(milliseconds: 1_000 + UInt64(id), counter: 0), origin: source)
        return RowChange(
            table: 0, key: [.integer(id)], isAlive: true, existence: version, values: [.text("row \(id)")],
            versions: [], sequence: sequence)
    }

    /// The responder side, open, with the peer's first PULL answered (everything sent): the
    /// peer's next PULL, after `after`, is the parked one.
    /// `latest`: the database's last sequence number as the batch was extracted (by default one
    /// more: a commit landed meanwhile, so a PULL parked after the batch is looked at).
    static func responderServed(after: Int64, latest: Int64? = nil, parks: Bool = true) throws -> Session {
        var session = try Session(parksPulls: parks)
        _ = session.pulling(after: 0)
        _ = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        _ = session.handle(
            .databaseCompleted(
                .extracted(session.ownBatch(after: 0, through: after, isLast: true), latest: latest ?? after + 1)))
        _ = session.handle(.received(.ack(through: after)))
        _ = session.handle(.timerFired(.acknowledgement))
        _ = session.handle(.databaseCompleted(.acknowledged))
        return session
    }

    static func parkedPull(after: Int64) -> Pull {
        var pull = Pull(after: after, maxChanges: 10, maxBytes: 1000)
        pull.park = true
        return pull
    }

    @Test("a caught-up requester acknowledges its last batch and parks its next PULL after it; it is caught up")
    func caughtUpRequesterParks() throws {
        var session = try Session(parksPulls: true)
        _ = session.pulling(after: 0)
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 7, isLast: true))))
        guard case let .apply(apply)? = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        let applied = session.handle(
            .databaseCompleted(.applied(.applied(SessionStateMachineTests.report(cursor: 7)), apply)))
        #expect(applied.sent == [.ack(through: 7), .pull(Self.parkedPull(after: 7).withLimits(of: applied.pulls))])
        #expect(applied.pulls.map(\.park) == [true])
        #expect(session.machine.requester.outstandingPullIsParked)

        // Its answer comes with the peer's next commit: applied, and parked again.
        let next = session.handle(.received(.batch(session.batch(after: 7, through: 9, isLast: true))))
        guard case let .apply(nextApply)? = next.requests.first else {
            Issue.record("asked for \(next.requests)"); return
        }
        #expect(!session.machine.requester.outstandingPullIsParked)
        let nextApplied = session.handle(
            .databaseCompleted(.applied(.applied(SessionStateMachineTests.report(cursor: 9)), nextApply)))
        #expect(nextApplied.pulls.map { [$0.after: $0.park] } == [[9: true]])
    }

    @Test("without parkedPulls negotiated (an earlier peer), a caught-up requester does not park: CHANGED it is")
    func noParkingWithoutTheCapability() throws {
        var session = try Session(parksPulls: true)
        var hello = session.peerHello
        hello.capabilities.remove(.parkedPulls)
        _ = session.pulling(hello: hello)
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 7, isLast: true))))
        guard case let .apply(apply)? = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        let applied = session.handle(
            .databaseCompleted(.applied(.applied(SessionStateMachineTests.report(cursor: 7)), apply)))
        #expect(applied.sent == [.ack(through: 7)])
    }

    @Test(
        """
        a parked PULL with nothing to send is not answered; the next commit is looked for after it and sent as \
        the answer (after the PULL's cursor), with no CHANGED
        """)
    func responderAnswersParkedPullWithTheNextCommit() throws {
        var session = try Self.responderServed(after: 4)
        let parked = session.handle(.received(.pull(Self.parkedPull(after: 4))))
        guard case let .extract(_, firstLook, _)? = parked.requests.first else {
            Issue.record("asked for \(parked.requests)"); return
        }
        #expect(firstLook.after == 4)
        // Sequence 5 held only the peer's own change: nothing for it, the PULL stays parked.
        let nothing = session.handle(
            .databaseCompleted(.extracted(session.ownBatch(after: 4, through: 5, isLast: true), latest: 5)))
        #expect(nothing.sent.isEmpty)
        #expect(session.machine.responder.parked?.nothingThrough == 5)

        // A commit through 6: looked for after 5, answered after 4.
        let committed = session.handle(.localChangesCommitted(through: 6))
        #expect(committed.sent.isEmpty, "no CHANGED while a PULL is parked")
        guard case let .extract(_, look, _)? = committed.requests.first else {
            Issue.record("asked for \(committed.requests)"); return
        }
        #expect(look.after == 5)
        let row = Self.change(1, sequence: 6, from: session.local)
        let answered = session.handle(
            .databaseCompleted(
                .extracted(session.ownBatch(after: 5, through: 6, isLast: true, changes: [row]), latest: 6)))
        guard case let .batch(batch)? = answered.sent.last else { Issue.record("sent \(answered.sent)"); return }
        #expect(batch.after == 4 && batch.through == 6 && batch.changes.count == 1)
        #expect(session.machine.responder.parked == nil)
        #expect(session.machine.responder.unacknowledged == [6])
        // Told of the same commit again: nothing more (the answer is out, no PULL is parked).
        #expect(session.handle(.localChangesCommitted(through: 6)).sent.isEmpty)
    }

    @Test(
        """
        a PULL parked after all the database held at the last extraction is parked without a look; the ACK \
        that came with it is recorded after the next commit's extraction, not before it
        """)
    func parkedWithoutALookAndAcknowledgedAfterTheNextExtraction() throws {
        var session = try Self.responderServed(after: 4, latest: 4)
        let row = Self.change(1, sequence: 5, from: session.local)
        _ = session.handle(.localChangesCommitted(through: 5))
        _ = session.handle(.received(.pull(Self.parkedPull(after: 4))))
        _ = session.handle(
            .databaseCompleted(
                .extracted(session.ownBatch(after: 4, through: 5, isLast: true, changes: [row]), latest: 5)))
        #expect(session.machine.responder.unacknowledged == [5])

        // The peer applied it: its ACK and its next PULL, parked, come together.
        let ack = session.handle(.received(.ack(through: 5)))
        #expect(ack.requests.isEmpty && ack.scheduled.map(\.timer) == [.acknowledgement])
        let parked = session.handle(.received(.pull(Self.parkedPull(after: 5))))
        #expect(parked.requests.isEmpty, "nothing after 5 to look for")
        #expect(session.machine.responder.parked != nil)
        #expect(!session.machine.responder.owesBatch)

        // The next commit: its extraction first, then the ACK's record.
        let committed = session.handle(.localChangesCommitted(through: 6))
        guard committed.requests.count == 2, case let .extract(_, look, _) = committed.requests[0],
            case let .acknowledge(_, through) = committed.requests[1]
        else { Issue.record("asked for \(committed.requests)"); return }
        #expect(look.after == 5 && through == 5)
        #expect(session.handle(.timerFired(.acknowledgement)).requests.isEmpty, "recorded once")
    }

    @Test("an ACK waiting to be recorded goes before any other database work (here the peer's batch), not after it")
    func acknowledgementGoesBeforeOtherWork() throws {
        var session = try Self.responderServed(after: 4, latest: 4)
        _ = session.handle(.localChangesCommitted(through: 5))
        _ = session.handle(.received(.pull(Pull(after: 4, maxChanges: 10, maxBytes: 1000))))
        let row = Self.change(5, sequence: 5, from: session.local)
        _ = session.handle(
            .databaseCompleted(
                .extracted(session.ownBatch(after: 4, through: 5, isLast: true, changes: [row]), latest: 5)))
        #expect(session.handle(.received(.ack(through: 5))).requests.isEmpty)
        // The answer to this side's own PULL (after 0) arrives: the ACK is recorded first.
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 3, isLast: true))))
        guard received.requests.count == 2, case let .acknowledge(_, through) = received.requests[0],
            case .apply = received.requests[1]
        else { Issue.record("asked for \(received.requests)"); return }
        #expect(through == 5)
        #expect(session.handle(.timerFired(.acknowledgement)).requests.isEmpty, "recorded once")
    }

    @Test("ACKs received while one waits to be recorded are recorded as one, the newest")
    func acknowledgementsCoalesce() throws {
        var session = try Self.responderServed(after: 4, latest: 4)
        var sent: [Int64] = []
        for through in [5, 6] as [Int64] {
            _ = session.handle(.localChangesCommitted(through: through))
            _ = session.handle(.received(.pull(Pull(after: through - 1, maxChanges: 10, maxBytes: 1000))))
            let row = Self.change(through, sequence: through, from: session.local)
            _ = session.handle(
                .databaseCompleted(
                    .extracted(
                        session.ownBatch(after: through - 1, through: through, isLast: true, changes: [row]),
                        latest: through)))
            sent.append(through)
        }
        #expect(session.machine.responder.unacknowledged == sent)
        #expect(session.handle(.received(.ack(through: 5))).requests.isEmpty)
        #expect(session.handle(.received(.ack(through: 6))).requests.isEmpty)
        let recorded = session.handle(.timerFired(.acknowledgement))
        guard case let .acknowledge(_, through)? = recorded.requests.first, recorded.requests.count == 1 else {
            Issue.record("asked for \(recorded.requests)"); return
        }
        #expect(through == 6)
    }

    @Test("a commit told while the parked PULL is being looked at is looked for again; the same one is not")
    func commitDuringTheLookIsLookedForAgain() throws {
        var session = try Self.responderServed(after: 4)
        _ = session.handle(.received(.pull(Self.parkedPull(after: 4))))
        #expect(session.handle(.localChangesCommitted(through: 5)).requests.isEmpty, "one look at a time")
        let again = session.handle(
            .databaseCompleted(.extracted(session.ownBatch(after: 4, through: 4, isLast: true), latest: 4)))
        guard case let .extract(_, look, _)? = again.requests.first else {
            Issue.record("asked for \(again.requests)"); return
        }
        #expect(look.after == 4)
        // The look finds nothing through 5 (a rolled-back number, say): not looked at again until a later commit.
        let parkedAgain = session.handle(
            .databaseCompleted(.extracted(session.ownBatch(after: 4, through: 4, isLast: true), latest: 4)))
        #expect(parkedAgain.requests.isEmpty && parkedAgain.sent.isEmpty)
        #expect(session.handle(.localChangesCommitted(through: 5)).requests.isEmpty)
        #expect(session.handle(.localChangesCommitted(through: 6)).requests.count == 1)
    }

    @Test("the commit of the peer's own batch does not wake its parked PULL")
    func applyOfThePeersBatchDoesNotWakeIt() throws {
        var session = try Self.responderServed(after: 0, parks: true)
        _ = session.handle(.received(.pull(Self.parkedPull(after: 0))))
        _ = session.handle(
            .databaseCompleted(.extracted(session.ownBatch(after: 0, through: 0, isLast: true), latest: 0)))
        // The peer's batch arrives (this side's pull was answered) and is applied: sequences 1...3.
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 5, isLast: true))))
        guard case let .apply(apply)? = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        #expect(session.handle(.localChangesCommitted(through: 3)).requests.isEmpty)
        let applied = session.handle(SameProcessCommitTests.applied(apply, issued: 1...3))
        #expect(!applied.requests.contains { if case .extract = $0 { true } else { false } })
        #expect(session.machine.responder.parked?.nothingThrough == 3)
        // This side's own commit after it is looked for.
        #expect(session.handle(.localChangesCommitted(through: 4)).requests.count == 1)
    }

    @Test("a second PULL while one is parked, and a PULL to park without the capability, end the session")
    func parkingRulesAreEnforced() throws {
        var session = try Self.responderServed(after: 4)
        _ = session.handle(.received(.pull(Self.parkedPull(after: 4))))
        _ = session.handle(
            .databaseCompleted(.extracted(session.ownBatch(after: 4, through: 4, isLast: true), latest: 4)))
        let second = session.handle(.received(.pull(Pull(after: 4, maxChanges: 10, maxBytes: 1000))))
        #expect(second.errorCodes == [.malformedFrame])

        var earlier = try Self.responderServed(after: 4, parks: false)
        let refused = earlier.handle(.received(.pull(Self.parkedPull(after: 4))))
        #expect(refused.errorCodes == [.malformedFrame])
        #expect(refused.requests.isEmpty, "nothing extracted")
    }
}

extension Pull {
    /// This parked pull with the limits of the first of `pulls` (the session's own).
    fileprivate func withLimits(of pulls: [Pull]) -> Pull {
        var pull = self
        if let first = pulls.first {
            pull.maxChanges = first.maxChanges
            pull.maxBytes = first.maxBytes
        }
        return pull
    }
}

/// Live sessions with parked pulls, and with a peer that does not park (an earlier version): every
/// commit reaches the other side both ways, and the session closes well with PULLs parked.
@Suite("Sync sessions: parked pulls, live")
struct ParkedPullSessionTests {
    @Test(
        "commits on either side reach the other, whether both park, or one side does not offer parkedPulls",
        arguments: [true, false])
    func commitsReachTheOtherSide(clientParks: Bool) async throws {
        let server = try makeSyncedDatabase()
        let client = try makeSyncedDatabase()
        var (serverApplied, serverOptions) = appliedBatches()
        serverOptions.changeCheckInterval = SameProcessCommitTests.distantCheck
        var (clientApplied, clientOptions) = appliedBatches()
        clientOptions.changeCheckInterval = SameProcessCommitTests.distantCheck
        clientOptions.testHooks.offersParkedPulls = clientParks
        try await SameProcessCommitTests.withLiveSession(
            server: server, serverOptions: serverOptions, client: client, clientOptions: clientOptions
        ) {
            for round in 0..<5 {
                let serverRow = 100 + round, clientRow = 200 + round
                try server.execute("INSERT INTO t (id, name, n) VALUES (?, 'server', ?)", [serverRow, round])
                #expect(try await waitForRow(client, serverRow, in: clientApplied), "server row \(serverRow)")
                try client.execute("INSERT INTO t (id, name, n) VALUES (?, 'client', ?)", [clientRow, round])
                #expect(try await waitForRow(server, clientRow, in: serverApplied), "client row \(clientRow)")
            }
        }
        #expect(try ColumnarBatchSessionTests.rows(server) == ColumnarBatchSessionTests.rows(client))
        #expect(try ColumnarBatchSessionTests.rows(server).count == 10)
    }
}
