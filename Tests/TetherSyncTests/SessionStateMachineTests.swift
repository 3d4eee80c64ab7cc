import NIOCore
import Testing
@testable import Tether
@testable import TetherSync
import TetherWire

/// The session's rules (Protocol/README.md §8) driven event by event, without sockets, a
/// database or a clock: each test feeds `SyncSessionStateMachine` events and checks its actions.
@Suite("Sync sessions: the state machine")
struct SessionStateMachineTests {
    typealias Machine = SyncSessionStateMachine

    /// One machine, its clock, and this side's and the peer's keys.
    struct Session {
        var machine: Machine
        var now = NIODeadline.uptimeNanoseconds(1_000_000_000)
        let local: InstanceKey
        let peer: InstanceKey
        let schema: LocalSchema

        /// `tables`: what this side syncs (by default `t`); `peerAllowedTables`: the peer's policy's tables.
        /// `parksPulls`: this side offers `parkedPulls` (§8.4); off by default, so that the rules of
        /// CHANGED are what most tests see. `quietHeartbeats` (§8.5) and `pullsAhead` (§8.3) likewise.
        init(
            options: SyncOptions = SyncOptions(), byeWhenCaughtUp: Bool = false, offersLive: Bool = true,
            tables: [TableDescriptor] = [SessionStateMachineTests.tDescriptor], peerAllowedTables: Set<String>? = nil,
            local: InstanceKey = .random(), peer: InstanceKey = .random(), role: Machine.Role = .client,
            parksPulls: Bool = false, quietHeartbeats: Bool = false, pullsAhead: Bool = false
        ) throws {
            self.local = local
            self.peer = peer
            let fingerprint = try #require(
                SchemaFingerprint(bytes: [UInt8](repeating: 7, count: SchemaFingerprint.byteCount)))
            schema = LocalSchema(instanceKey: local, tables: tables, fingerprint: fingerprint)
            var options = options
            options.testHooks.offersParkedPulls = parksPulls
            options.quietHeartbeats = quietHeartbeats
            options.testHooks.offersPullsAhead = pullsAhead
            if let peerAllowedTables {
                options.peers[.name(Self.peerCertificate.name ?? "")] = PeerPolicy(allowedTables: peerAllowedTables)
            }
            machine = Machine(
                .init(
                    role: role, schema: schema, options: options, byeWhenCaughtUp: byeWhenCaughtUp,
                    offersLive: offersLive), now: now)
        }

        /// Handles `event` `later` after the previous one.
        mutating func handle(_ event: Machine.Event, later: TimeAmount = .zero) -> [Machine.Action] {
            now = now + later
            return machine.handle(event, now: now)
        }

        var peerHello: Hello {
            Hello(
                instanceKey: peer, schemaFingerprint: schema.fingerprint, capabilities: .supported,
                tables: schema.tables)
        }

        static let peerCertificate = PeerIdentity(name: "peer", fingerprint: String(repeating: "ab", count: 32))

        /// Through the handshake and the peer's HELLO, its key confirmed as its own: returns the
        /// actions of the HELLO.
        mutating func open(hello: Hello? = nil) -> [Machine.Action] {
            _ = handle(.started)
            _ = handle(.tlsHandshakeCompleted(peer: Self.peerCertificate))
            let actions = handle(.received(.hello(hello ?? peerHello)))
            if actions.contains(where: { if case .runDatabase(.confirmPeerIdentity) = $0 { true } else { false } }) {
                _ = handle(.databaseCompleted(.peerConfirmed(pinned: true)))
            }
            // Version 3: the peer's SCOPE follows its HELLO (every row both ways).
            if machine.version3 { _ = handle(.received(.scope(ScopeAnnouncement()))) }
            return actions
        }

        /// Open (the peer's HELLO `hello`, by default `peerHello`), with the cursor on the peer read as
        /// `after`: returns the actions of the cursor result.
        mutating func pulling(after: Int64 = 0, hello: Hello? = nil) -> [Machine.Action] {
            _ = open(hello: hello)
            _ = handle(.databaseCompleted(.lastSequence(0)))
            return handle(.databaseCompleted(.cursor(after: after, resyncing: false, previousAfter: nil)))
        }

        func batch(after: Int64, through: Int64, isLast: Bool = false) -> ChangeBatch {
            ChangeBatch(
                source: peer, after: after, through: through, isLast: isLast, tables: schema.tables, changes: [])
        }

        /// This side's own batch after `after` through `through`, holding `changes` (as this side's
        /// extraction answers the peer's PULL).
        func ownBatch(after: Int64, through: Int64, isLast: Bool = false, changes: [RowChange] = []) -> ChangeBatch {
            ChangeBatch(
                source: local, after: after, through: through, isLast: isLast, tables: schema.tables,
                changes: changes)
        }

        /// The session at the other end of the connection: the peer, whose peer is this side.
        func otherEnd() throws -> Session {
            try Session(local: peer, peer: local)
        }

        /// Hands the messages `actions` sent to this side, in order: returns what it did.
        mutating func receive(_ actions: [Machine.Action]) -> [Machine.Action] {
            actions.sent.flatMap { handle(.received($0)) }
        }
    }

    static func report(cursor: Int64, applied: Int = 0) -> ApplyReport {
        var report = ApplyReport()
        report.cursor = cursor
        report.applied = applied
        return report
    }

    static let timeoutOptions = SyncOptions(idleTimeout: .seconds(30), pingInterval: .seconds(10))
    static let tDescriptor = TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["body"])
    static let uDescriptor = TableDescriptor(name: "u", keyColumns: ["id"], valueColumns: ["label"])
    static let expiryStoreDescriptor = TableDescriptor(
        name: "tether_synced_expiry", keyColumns: ["table_name", "row_key"], valueColumns: ["expires_at"])

    @Test(
        "the TLS handshake sends HELLO; the peer's HELLO opens the session and the first PULL goes from the cursor read"
    )
    func helloExchangeThenPullFromTheCursor() throws {
        var session = try Session()
        let started = session.handle(.started)
        #expect(started.scheduled.map { $0.timer } == [.hello])
        let handshake = session.handle(.tlsHandshakeCompleted(peer: Session.peerCertificate))
        let hello = try #require(handshake.sent.first)
        guard case let .hello(sentHello) = hello else { Issue.record("sent \(hello), not HELLO"); return }
        #expect(sentHello.instanceKey == session.local)
        #expect(sentHello.capabilities.contains(.deferrals))

        let opened = session.handle(.received(.hello(session.peerHello)))
        #expect(session.machine.state.isOpen)
        #expect(opened.contains { if case .cancel(.hello) = $0 { true } else { false } })
        #expect(opened.scheduled.map { $0.timer } == [.heartbeat])
        #expect(opened.contains { if case .enableCompression = $0 { true } else { false } })
        let requests = opened.requests
        #expect(requests.count == 3)
        // The peer's key is confirmed as its own first: the session's queue runs nothing for it before.
        guard requests.count == 3, case let .confirmPeerIdentity(confirmed, certificate) = requests[0],
            case .readLastSequence = requests[1], case let .readCursor(peer, previousAfter, _, _) = requests[2]
        else {
            Issue.record("asked for \(requests)"); return
        }
        #expect(confirmed == session.peer && certificate == Session.peerCertificate)
        #expect(peer == session.peer && previousAfter == nil)
        _ = session.handle(.databaseCompleted(.peerConfirmed(pinned: true)))
        // Version 3: SCOPE first (every row, nothing sent in part), before any PULL.
        #expect(opened.sent == [.scope(ScopeAnnouncement())])

        _ = session.handle(.databaseCompleted(.lastSequence(12)))
        let pull = session.handle(.databaseCompleted(.cursor(after: 40, resyncing: false, previousAfter: nil)))
        #expect(
            pull.sent == [
                .pull(
                    Pull(
                        after: 40, maxChanges: SyncOptions.defaultBatchLimits.maximumChanges,
                        maxBytes: SyncOptions.defaultBatchLimits.maximumBytes))
            ])
        #expect(session.machine.requester.outstandingPull == 40)
    }

    @Test("a second HELLO is ERROR 6 and the connection closes")
    func secondHelloIsRefused() throws {
        var session = try Session()
        _ = session.open()
        let actions = session.handle(.received(.hello(session.peerHello)))
        #expect(actions.errorCodes == [.malformedFrame])
        #expect(actions.closes)
        #expect(session.machine.state.isFailed)
    }

    @Test("anything but HELLO first is ERROR 6")
    func messageBeforeHelloIsRefused() throws {
        var session = try Session()
        _ = session.handle(.started)
        let actions = session.handle(.received(.ack(through: 3)))
        #expect(actions.errorCodes == [.malformedFrame])
        #expect(actions.closes)
    }

    @Test("a PULL while the BATCH for the previous one is owed is ERROR 6")
    func pullWhileBatchOwedIsRefused() throws {
        var session = try Session()
        _ = session.pulling()
        let first = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        guard case let .extract(peer, pull, _) = first.requests.first else {
            Issue.record("asked for \(first.requests)"); return
        }
        #expect(peer == session.peer && pull.maxChanges == 10)
        let second = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        #expect(second.errorCodes == [.malformedFrame])
        #expect(second.closes)
        #expect(second.requests.isEmpty)
    }

    @Test("a BATCH that answers no PULL is ERROR 6")
    func batchAnsweringNoPullIsRefused() throws {
        var session = try Session()
        _ = session.open()
        // The cursor is still being read: no PULL is outstanding.
        let actions = session.handle(.received(.batch(session.batch(after: 0, through: 5))))
        #expect(actions.errorCodes == [.malformedFrame])
        #expect(actions.requests.isEmpty)
    }

    @Test("pipelining: the next PULL goes out before a batch is applied, and no more than two batches are held")
    func pipeliningHoldsAtMostTwoBatches() throws {
        var session = try Session()
        _ = session.pulling(after: 0)
        let first = session.handle(.received(.batch(session.batch(after: 0, through: 10))))
        #expect(first.pulls.map(\.after) == [10])
        guard case let .apply(firstApply) = first.requests.first else {
            Issue.record("asked for \(first.requests)"); return
        }
        #expect(firstApply.pipelined)

        // The second batch arrives while the first is still being applied: its PULL waits.
        let second = session.handle(.received(.batch(session.batch(after: 10, through: 20))))
        #expect(second.pulls.isEmpty)
        #expect(session.machine.requester.batchesBeingApplied == 2)
        guard case let .apply(secondApply) = second.requests.first else {
            Issue.record("asked for \(second.requests)"); return
        }

        let firstDone = session.handle(
            .databaseCompleted(.applied(.applied(Self.report(cursor: 10, applied: 3)), firstApply)))
        #expect(firstDone.sent.filter { if case .ack = $0 { true } else { false } } == [.ack(through: 10)])
        #expect(firstDone.pulls.map(\.after) == [20])
        #expect(
            firstDone.contains {
                if case let .batchApplied(batch, _, appliedSoFar: 1) = $0 { batch.changes.isEmpty } else { false }
            })
        #expect(session.machine.summary.applied == 3)

        let secondDone = session.handle(.databaseCompleted(.applied(.applied(Self.report(cursor: 20)), secondApply)))
        #expect(secondDone.sent == [.ack(through: 20)])
        #expect(session.machine.requester.batchesBeingApplied == 0)
    }

    @Test("an ACK beyond every batch sent is ERROR 6; one within is recorded")
    func ackBeyondWhatWasSentIsRefused() throws {
        var session = try Session()
        _ = session.pulling()
        _ = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        let sent = session.handle(
            .databaseCompleted(
                .extracted(
                    ChangeBatch(
                        source: session.local, after: 0, through: 8, isLast: false, tables: session.schema.tables,
                        changes: []), latest: 30)))
        #expect(sent.sent.count == 1)
        #expect(session.machine.responder.unacknowledged == [8])

        let within = session.handle(.received(.ack(through: 8)))
        #expect(within.requests.isEmpty, "recorded a little later (deferAcknowledgement)")
        #expect(within.scheduled.map(\.timer) == [.acknowledgement])
        #expect(session.machine.responder.unacknowledged.isEmpty)
        let recorded = session.handle(.timerFired(.acknowledgement))
        guard case let .acknowledge(peer, through) = recorded.requests.first else {
            Issue.record("asked for \(recorded.requests)"); return
        }
        #expect(peer == session.peer && through == 8)

        let beyond = session.handle(.received(.ack(through: 9)))
        #expect(beyond.errorCodes == [.malformedFrame])
        #expect(beyond.closes)
    }

    @Test(
        """
        issue 22: a batch cut at the responder's last change, then an empty last batch pipelined with the same \
        through: both ACKs are accepted
        """)
    func pipelinedBatchesEndingAtTheSameSequenceAreAcknowledgedTwice() throws {
        var requester = try Session()
        var responder = try requester.otherEnd()
        _ = responder.pulling()
        let firstPull = responder.receive(requester.pulling(after: 0))
        #expect(firstPull.requests.count == 1)
        // The first batch filled its byte budget with the responder's last change (sequence 8): not
        // the last. The pipelined PULL after 8 finds nothing more: an empty last batch, through 8 too.
        let cutAtLastChange = requester.batch(after: 0, through: 8)
        let firstBatch = requester.receive(responder.handle(.databaseCompleted(.extracted(cutAtLastChange, latest: 8))))
        guard case let .apply(firstApply)? = firstBatch.requests.first else {
            Issue.record("asked for \(firstBatch.requests)"); return
        }
        #expect(firstBatch.pulls.map(\.after) == [8])
        _ = responder.receive(firstBatch)
        let emptyLast = requester.batch(after: 8, through: 8, isLast: true)
        let secondBatch = requester.receive(responder.handle(.databaseCompleted(.extracted(emptyLast, latest: 8))))
        guard case let .apply(secondApply)? = secondBatch.requests.first else {
            Issue.record("asked for \(secondBatch.requests)"); return
        }
        #expect(responder.machine.responder.unacknowledged == [8, 8])

        // The requester applies both in order and acknowledges its cursor after each: 8, then 8 again.
        let firstApplied = requester.handle(
            .databaseCompleted(.applied(.applied(Self.report(cursor: 8, applied: 3)), firstApply)))
        #expect(firstApplied.sent == [.ack(through: 8)])
        _ = responder.receive(firstApplied)
        let firstAck = responder.handle(.timerFired(.acknowledgement))
        #expect(firstAck.requests.count == 1)
        _ = responder.handle(.databaseCompleted(.acknowledged))
        let secondApplied = requester.handle(
            .databaseCompleted(.applied(.applied(Self.report(cursor: 8)), secondApply)))
        #expect(secondApplied.sent == [.ack(through: 8)])

        let secondAck = responder.receive(secondApplied)
        #expect(secondAck.errorCodes.isEmpty, "\(secondAck.sent)")
        #expect(!secondAck.closes)
        #expect(secondAck.requests.isEmpty, "nothing new to record as synced")
        #expect(responder.machine.state.isOpen && requester.machine.state.isOpen)
        #expect(responder.machine.responder.unacknowledged.isEmpty)
    }

    @Test(
        """
        the ACK never goes beyond the batch applied, even when the cursor moved further meanwhile (another \
        session on this database)
        """)
    func ackIsAtMostTheBatchApplied() throws {
        var session = try Session()
        _ = session.pulling(after: 0)
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 10, isLast: true))))
        guard case let .apply(apply)? = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        let applied = session.handle(.databaseCompleted(.applied(.applied(Self.report(cursor: 25)), apply)))
        #expect(applied.sent == [.ack(through: 10)])
    }

    @Test("PING once nothing was sent for the ping interval; ERROR 10 once nothing arrived for the idle timeout")
    func idleTimeout() throws {
        var session = try Session(options: Self.timeoutOptions)
        _ = session.pulling()
        let early = session.handle(.timerFired(.heartbeat), later: .seconds(11))
        #expect(early.sent == [.ping(1)])
        #expect(early.scheduled.map { $0.timer } == [.heartbeat])

        let timedOut = session.handle(.timerFired(.heartbeat), later: .seconds(20))
        #expect(timedOut.errorCodes == [.timeout])
        #expect(timedOut.closes)
        #expect(timedOut.scheduled.isEmpty)
    }

    @Test(
        """
        the heartbeat timer is set for the first deadline (PING after 10 s of silence), not a tick; a deadline \
        that moved sets it again
        """)
    func heartbeatAtTheDeadline() throws {
        var session = try Session(options: Self.timeoutOptions)
        let opened = session.open()
        #expect(opened.scheduled.filter { $0.timer == .heartbeat }.map(\.delay) == [.seconds(10)])
        let pinged = session.handle(.timerFired(.heartbeat), later: .seconds(10))
        #expect(pinged.sent == [.ping(1)])
        #expect(pinged.scheduled.map(\.delay) == [.seconds(10)])
        // The peer's PING 4 s later is answered, but a PONG is not this side's PING: its deadline stays.
        let answered = session.handle(.received(.ping(7)), later: .seconds(4))
        #expect(answered.sent == [.pong(7)])
        let early = session.handle(.timerFired(.heartbeat), later: .seconds(2))
        #expect(early.sent.isEmpty)
        #expect(early.scheduled.map(\.delay) == [.seconds(4)])
    }

    @Test(
        """
        a peer that sends frames (its own PINGs) but answers none of this side's PINGs for the idle timeout is \
        timed out: it reads nothing of what it is sent (either side: the accepting one pings for the frames it \
        sent)
        """, arguments: [Machine.Role.client, .server])
    func unansweredPingTimesThePeerOut(role: Machine.Role) throws {
        var session = try Session(options: Self.timeoutOptions, role: role)
        _ = session.pulling()
        let pinged = session.handle(.timerFired(.heartbeat), later: .seconds(10))
        #expect(pinged.sent == [.ping(1)])
        var elapsed = 10
        var last: [Machine.Action] = []
        // Every 5 s the peer's PING arrives, and is answered; this side's PINGs never are.
        while elapsed < 40 {
            _ = session.handle(.received(.ping(UInt64(elapsed))), later: .seconds(5))
            elapsed += 5
            last = session.handle(.timerFired(.heartbeat))
            if !last.errorCodes.isEmpty { break }
        }
        #expect(elapsed == 40, "timed out after \(elapsed) s")
        #expect(last.errorCodes == [.timeout])
        #expect(
            last.sent.contains {
                if case let .error(_, message) = $0 { message.contains("answered no PING") } else { false }
            })
    }

    @Test(
        """
        the accepting side answers the connecting side's PINGs and sends none of its own while they come; it \
        pings once for what it sent until that PING is answered, and a peer that goes silent
        """)
    func theAcceptingSidePingsOnlyWhenItMust() throws {
        var session = try Session(options: Self.timeoutOptions, role: .server)
        _ = session.pulling()
        // HELLO and PULL went out: one PING, 10 s later, covers them once answered.
        let covering = session.handle(.timerFired(.heartbeat), later: .seconds(10))
        #expect(covering.sent == [.ping(1)])
        _ = session.handle(.received(.pong(1)), later: .milliseconds(2))
        // Idle: the connecting side pings every 10 s; this side only answers.
        var sent: [WireMessage] = []
        for round in 1...9 {
            for _ in 0..<3 {
                let fired = session.handle(.timerFired(.heartbeat), later: .seconds(3))
                #expect(fired.errorCodes.isEmpty)
                sent += fired.sent
            }
            sent += session.handle(.received(.ping(UInt64(round))), later: .seconds(1)).sent
        }
        #expect(sent == (1...9).map { .pong(UInt64($0)) })
        // The peer goes silent: a PING half an interval later than the peer's would have come.
        let quiet = session.handle(.timerFired(.heartbeat), later: .seconds(14))
        #expect(quiet.sent.isEmpty)
        let silent = session.handle(.timerFired(.heartbeat), later: .seconds(1))
        #expect(silent.sent == [.ping(2)])
    }

    @Test("a PONG answering this side's PING keeps a session whose peer sends nothing else open")
    func answeredPingsKeepTheSessionOpen() throws {
        var session = try Session(options: Self.timeoutOptions)
        _ = session.pulling()
        for round in 1...6 {
            let pinged = session.handle(.timerFired(.heartbeat), later: .seconds(10))
            #expect(pinged.sent == [.ping(UInt64(round))] && pinged.errorCodes.isEmpty, "round \(round): \(pinged)")
            _ = session.handle(.received(.pong(UInt64(round))), later: .milliseconds(1))
        }
    }

    @Test(
        """
        flow control: an unwritable channel pauses reading; only the peer not draining for the idle timeout times \
        it out
        """)
    func flowControl() throws {
        var session = try Session(options: Self.timeoutOptions)
        _ = session.pulling()
        let blocked = session.handle(.writabilityChanged(isWritable: false), later: .seconds(25))
        #expect(blocked.contains { if case .pauseReading = $0 { true } else { false } })
        // Nothing received for 35 s, but reading was paused by choice for 10 s only: no timeout.
        let stillWaiting = session.handle(.timerFired(.heartbeat), later: .seconds(10))
        #expect(stillWaiting.errorCodes.isEmpty)
        #expect(stillWaiting.sent.isEmpty)
        #expect(stillWaiting.scheduled.map { $0.timer } == [.heartbeat])

        let timedOut = session.handle(.timerFired(.heartbeat), later: .seconds(21))
        #expect(timedOut.errorCodes == [.timeout])
        #expect(
            timedOut.sent.contains {
                if case let .error(_, message) = $0 { message.contains("read nothing") } else { false }
            })
    }

    @Test("writable again: reading resumes and the idle deadline starts over")
    func writableAgainResumesReading() throws {
        var session = try Session(options: Self.timeoutOptions)
        _ = session.pulling()
        _ = session.handle(.writabilityChanged(isWritable: false), later: .seconds(25))
        let resumed = session.handle(.writabilityChanged(isWritable: true), later: .seconds(4))
        #expect(resumed.contains { if case .resumeReading = $0 { true } else { false } })
        #expect(session.machine.liveness.blockedSince == nil)
        let heartbeat = session.handle(.timerFired(.heartbeat), later: .seconds(20))
        #expect(heartbeat.errorCodes.isEmpty)
    }

    @Test(
        """
        a batch too far ahead is deferred: DEFERRED only once the pipelined pull is answered, covering it; then a \
        retry timer
        """)
    func clockSkewDefersOnceNoPullIsOutstanding() throws {
        var options = SyncOptions()
        options.clockSkewRetryInterval = .seconds(5)
        var session = try Session(options: options)
        _ = session.pulling(after: 0)
        let first = session.handle(.received(.batch(session.batch(after: 0, through: 10))))
        guard case let .apply(apply) = first.requests.first else { Issue.record("asked for \(first.requests)"); return }
        #expect(session.machine.requester.outstandingPull == 10)

        let refused = session.handle(
            .databaseCompleted(.applied(.tooFarAhead(ahead: .seconds(600), limit: .seconds(60), cursor: 0), apply)))
        #expect(refused.sent.isEmpty, "the PULL pipelined after the batch is still outstanding")
        #expect(session.machine.summary.deferredFromPeer != nil)
        #expect(session.machine.summary.batchesReceived == 0)

        // The answer to the abandoned pull is discarded, and the deferral covers it.
        let discarded = session.handle(.received(.batch(session.batch(after: 10, through: 20))))
        #expect(discarded.requests.isEmpty)
        #expect(discarded.sent.count == 1)
        guard case let .deferred(deferral) = discarded.sent.first else {
            Issue.record("sent \(discarded.sent)"); return
        }
        #expect(deferral.after == 0 && deferral.through == 20 && deferral.reason == .clockSkew)
        #expect(deferral.retryAfterMilliseconds == 5000)
        #expect(discarded.scheduled.map { $0.timer } == [.pullRetry])
        #expect(discarded.scheduled.map { $0.delay } == [.seconds(5)])

        let retried = session.handle(.timerFired(.pullRetry), later: .seconds(5))
        guard case .readCursor = retried.requests.first else { Issue.record("asked for \(retried.requests)"); return }
    }

    @Test("without deferrals negotiated a batch too far ahead is ERROR 9")
    func clockSkewWithoutDeferralsFails() throws {
        var session = try Session()
        var hello = session.peerHello
        hello.capabilities.remove(.deferrals)
        _ = session.pulling(hello: hello)
        let first = session.handle(.received(.batch(session.batch(after: 0, through: 10, isLast: true))))
        guard case let .apply(apply) = first.requests.first else { Issue.record("asked for \(first.requests)"); return }
        let refused = session.handle(
            .databaseCompleted(.applied(.tooFarAhead(ahead: .seconds(600), limit: .seconds(60), cursor: 0), apply)))
        #expect(refused.errorCodes == [.batchRejected])
    }

    @Test("DEFERRED from the peer: nothing is awaited for those batches any more, and the deferral is recorded")
    func receivedDeferralClearsUnacknowledged() throws {
        var session = try Session()
        _ = session.pulling()
        _ = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        _ = session.handle(
            .databaseCompleted(
                .extracted(
                    ChangeBatch(
                        source: session.local, after: 0, through: 8, isLast: false, tables: session.schema.tables,
                        changes: []), latest: 30)))
        let deferral = Deferral(
            after: 0, through: 8, reason: .clockSkew, retryAfterMilliseconds: 1000, message: "too far ahead")
        let actions = session.handle(.received(.deferred(deferral)))
        #expect(session.machine.responder.unacknowledged.isEmpty)
        #expect(session.machine.summary.deferredByPeer == "too far ahead")
        guard case let .recordDeferral(peer, recorded) = actions.requests.first else {
            Issue.record("asked for \(actions.requests)"); return
        }
        #expect(peer == session.peer && recorded == deferral)
        #expect(actions.errorCodes.isEmpty)
    }

    @Test("DEFERRED for a batch that is not the newest unacknowledged one is ERROR 6")
    func deferralOfAnotherBatchIsRefused() throws {
        var session = try Session()
        _ = session.pulling()
        let deferral = Deferral(
            after: 0, through: 8, reason: .clockSkew, retryAfterMilliseconds: 1000, message: "too far ahead")
        let actions = session.handle(.received(.deferred(deferral)))
        #expect(actions.errorCodes == [.malformedFrame])
        #expect(actions.requests.isEmpty)
    }

    @Test("BYE from the peer is answered once the database work is done; the session ends with its summary")
    func byeReceived() throws {
        var session = try Session()
        _ = session.pulling()
        let bye = session.handle(.received(.bye(reason: "done")))
        #expect(bye.contains { if case .awaitDatabaseIdle(.answerBye) = $0 { true } else { false } })
        #expect(bye.sent.isEmpty)
        let answered = session.handle(.databaseIdle(.answerBye))
        #expect(answered.sent == [.bye(reason: "")])
        #expect(answered.closes)

        let closed = session.handle(.connectionClosed)
        #expect(closed.contains { if case .cancelAllTimers = $0 { true } else { false } })
        let finished = session.handle(.databaseIdle(.finish))
        guard case let .finish(_, result) = finished.last else { Issue.record("ended with \(finished)"); return }
        #expect((try? result.get())?.peer == session.peer)
    }

    @Test("the owner's BYE: nothing more is sent, and the peer's BYE closes")
    func byeRequested() throws {
        var session = try Session()
        _ = session.pulling()
        let bye = session.handle(.byeRequested)
        #expect(bye.sent == [.bye(reason: "stopped")])
        #expect(session.machine.state.isByeSent)
        let ping = session.handle(.received(.ping(3)))
        #expect(ping.sent.isEmpty)
        let answer = session.handle(.received(.bye(reason: "")))
        #expect(answer.closes)
    }

    @Test("an apply committed after the connection closed is still counted in the summary")
    func applyCommittedAfterCloseIsCounted() throws {
        var session = try Session()
        _ = session.pulling()
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 10, isLast: true))))
        guard case let .apply(apply) = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        _ = session.handle(.connectionClosed)
        let late = session.handle(.databaseCompleted(.applied(.applied(Self.report(cursor: 10, applied: 7)), apply)))
        #expect(late.sent.isEmpty, "no ACK on a closed connection")
        let finished = session.handle(.databaseIdle(.finish))
        guard case let .reportProgress(progress) = finished.first else {
            Issue.record("ended with \(finished)"); return
        }
        #expect(progress.done.applied == 7)
        guard case let .finish(_, result) = finished.last, case let .failure(error) = result else {
            Issue.record("ended with \(finished)"); return
        }
        #expect(error == .connectionClosed(during: "catch-up"))
    }

    @Test(
        """
        a batch that does not fit on the disk: the next PULL asks for an eighth as many changes, and bytes in \
        proportion
        """)
    func noRoomShrinksPulls() throws {
        var options = SyncOptions()
        options.batchLimits = BatchLimits(maximumChanges: 800, maximumBytes: 8000)
        var session = try Session(options: options)
        _ = session.pulling()
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 10, isLast: true))))
        guard case let .apply(apply) = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        let refused = session.handle(.databaseCompleted(.applied(.noRoom("disk full"), apply)))
        #expect(session.machine.requester.pullChangeLimit == 100)
        guard case .readCursor = refused.requests.first else { Issue.record("asked for \(refused.requests)"); return }
        let pull = session.handle(.databaseCompleted(.cursor(after: 0, resyncing: false, previousAfter: nil)))
        #expect(pull.pulls == [Pull(after: 0, maxChanges: 100, maxBytes: 1000)])
    }

    @Test("caught up both ways: caughtUp is reported, and a one-shot session says BYE")
    func caughtUpSaysByeWhenOneShot() throws {
        var session = try Session(byeWhenCaughtUp: true, offersLive: false)
        _ = session.pulling()
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 4, isLast: true))))
        guard case let .apply(apply) = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        let applied = session.handle(.databaseCompleted(.applied(.applied(Self.report(cursor: 4)), apply)))
        #expect(!applied.contains { if case .caughtUp = $0 { true } else { false } }, "the peer has not pulled yet")

        _ = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        _ = session.handle(
            .databaseCompleted(
                .extracted(
                    ChangeBatch(
                        source: session.local, after: 0, through: 0, isLast: true, tables: session.schema.tables,
                        changes: []), latest: 0)))
        let acknowledged = session.handle(.received(.ack(through: 0)))
        #expect(!acknowledged.contains { if case .caughtUp = $0 { true } else { false } }, "not recorded yet")
        let recorded = session.handle(.timerFired(.acknowledgement))
        #expect(recorded.requests.count == 1)
        let done = session.handle(.databaseCompleted(.acknowledged))
        #expect(done.contains { if case let .caughtUp(peer) = $0 { peer == session.peer } else { false } })
        #expect(done.sent == [.bye(reason: "caught up")])
        #expect(session.machine.state.isByeSent)
    }

    @Test("no HELLO within the HELLO timeout is ERROR 10")
    func helloTimeout() throws {
        var session = try Session()
        _ = session.handle(.started)
        let actions = session.handle(.timerFired(.hello), later: .seconds(10))
        #expect(actions.errorCodes == [.timeout])
        #expect(actions.closes)
    }

    @Test("an ERROR message is cut to the peer's string limit at a character boundary")
    func errorMessagesAreTruncated() throws {
        #expect(Machine.truncated("abcdef", maxBytes: 4) == "abcd")
        #expect(Machine.truncated("ééé", maxBytes: 5) == "éé")
        #expect(Machine.truncated("short", maxBytes: 100) == "short")
    }

    @Test("a frame that cannot be encoded is ERROR with the encoder's code")
    func sendFailureFailsTheSession() throws {
        var session = try Session()
        _ = session.pulling()
        let actions = session.handle(
            .sendFailed(.batch, WireError.stringTooLong(field: "BATCH.table", length: 9, limit: 4)))
        #expect(actions.errorCodes.count == 1)
        #expect(actions.closes)
        #expect(session.machine.hasEnded)
    }

    // MARK: Schemas that differ (§8.2, §8.3)

    /// The peer's HELLO when it syncs `t` with one more column, `color`.
    static func widerHello(_ session: Session) throws -> Hello {
        let other = try #require(SchemaFingerprint(bytes: [UInt8](repeating: 9, count: SchemaFingerprint.byteCount)))
        return Hello(
            instanceKey: session.peer, schemaFingerprint: other, capabilities: .supported,
            tables: [TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["body", "color"])])
    }

    @Test(
        """
        a peer with another column: the session opens, records the difference, and backfills what became shared \
        before pulling
        """)
    func newlySharedColumnIsBackfilledFirst() throws {
        var session = try Session()
        let opened = session.open(hello: try Self.widerHello(session))
        #expect(session.machine.state.isOpen)
        guard case let .readCursor(_, _, recording, _)? = opened.requests.last else {
            Issue.record("asked for \(opened.requests)"); return
        }
        #expect(
            recording
                == PeerSchemaRecord(
                    shared: ["t": ["body"]], differences: ["table t: column color is synced by the peer, not here"]))

        _ = session.handle(.databaseCompleted(.lastSequence(0)))
        let cursor = session.handle(
            .databaseCompleted(.cursor(after: 40, resyncing: false, previousAfter: nil, newlyShared: ["t": ["body"]])))
        let backfill = Backfill(through: 40, tables: [Backfill.Table(name: "t", columns: ["body"])])
        #expect(cursor.pulls.map(\.backfill) == [backfill])
        #expect(cursor.pulls.map(\.after) == [0])
        #expect(session.machine.requester.backfill == .running(backfill, resumeAfter: 0))

        // The backfill batch is applied as such, and not acknowledged; then the ordinary pulls start.
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 40, isLast: true))))
        guard case let .apply(apply)? = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        #expect(apply.backfill && !apply.pipelined)
        let applied = session.handle(.databaseCompleted(.applied(.applied(Self.report(cursor: 40)), apply)))
        #expect(!applied.sent.contains { if case .ack = $0 { true } else { false } })
        guard case let .completeBackfill(_, shared)? = applied.requests.first,
            case let .readCursor(_, _, again, _)? = applied.requests.last
        else {
            Issue.record("asked for \(applied.requests)"); return
        }
        #expect(shared == ["t": ["body"]] && again == nil)
        #expect(session.machine.requester.backfill == .done)
        let pull = session.handle(.databaseCompleted(.cursor(after: 40, resyncing: false, previousAfter: nil)))
        #expect(pull.pulls.map(\.after) == [40] && pull.pulls.allSatisfy { $0.backfill == nil })
    }

    /// Opened with a peer that has `color` too, the cursor at 40: the backfill's first PULL is out.
    static func backfilling(_ session: inout Session) throws -> Backfill {
        _ = session.open(hello: try Self.widerHello(session))
        _ = session.handle(.databaseCompleted(.lastSequence(0)))
        _ = session.handle(
            .databaseCompleted(.cursor(after: 40, resyncing: false, previousAfter: nil, newlyShared: ["t": ["body"]])))
        return Backfill(through: 40, tables: [Backfill.Table(name: "t", columns: ["body"])])
    }

    @Test(
        """
        a backfill batch too far ahead is pulled again, from where the backfill got to, once the clock may have \
        caught up; nothing goes to the peer
        """)
    func backfillTooFarAheadIsPulledAgainLater() throws {
        var options = SyncOptions()
        options.clockSkewRetryInterval = .seconds(5)
        var session = try Session(options: options)
        let backfill = try Self.backfilling(&session)

        let first = session.handle(.received(.batch(session.batch(after: 0, through: 20))))
        guard case let .apply(firstApply)? = first.requests.first else {
            Issue.record("asked for \(first.requests)"); return
        }
        let next = session.handle(.databaseCompleted(.applied(.applied(Self.report(cursor: 40)), firstApply)))
        #expect(next.pulls.map(\.after) == [20] && next.pulls.map(\.backfill) == [backfill])

        let second = session.handle(.received(.batch(session.batch(after: 20, through: 30))))
        guard case let .apply(secondApply)? = second.requests.first else {
            Issue.record("asked for \(second.requests)"); return
        }
        let refused = session.handle(
            .databaseCompleted(
                .applied(.tooFarAhead(ahead: .seconds(600), limit: .seconds(60), cursor: 0), secondApply)))
        #expect(refused.sent.isEmpty, "a backfill batch is not acknowledged, so not deferred: \(refused.sent)")
        #expect(refused.errorCodes.isEmpty && !refused.closes)
        #expect(
            refused.scheduled.map { $0.timer } == [.pullRetry] && refused.scheduled.map { $0.delay } == [.seconds(5)])
        #expect(session.machine.summary.deferredFromPeer != nil)
        #expect(session.machine.requester.backfill == .running(backfill, resumeAfter: 20))

        let retried = session.handle(.timerFired(.pullRetry), later: .seconds(5))
        guard case .readCursor? = retried.requests.first else { Issue.record("asked for \(retried.requests)"); return }
        let resumed = session.handle(.databaseCompleted(.cursor(after: 40, resyncing: false, previousAfter: nil)))
        #expect(resumed.pulls.map(\.after) == [20] && resumed.pulls.map(\.backfill) == [backfill])
    }

    @Test(
        """
        a sync-once session whose backfill batch is too far ahead goes on with the ordinary pulls and leaves the \
        backfill unrecorded
        """)
    func backfillTooFarAheadInSyncOnceIsLeftForNextSession() throws {
        var session = try Session(byeWhenCaughtUp: true)
        _ = try Self.backfilling(&session)
        let received = session.handle(.received(.batch(session.batch(after: 0, through: 20))))
        guard case let .apply(apply)? = received.requests.first else {
            Issue.record("asked for \(received.requests)"); return
        }
        let refused = session.handle(
            .databaseCompleted(.applied(.tooFarAhead(ahead: .seconds(600), limit: .seconds(60), cursor: 0), apply)))
        #expect(refused.errorCodes.isEmpty && refused.sent.isEmpty)
        #expect(!refused.requests.contains { if case .completeBackfill = $0 { true } else { false } })
        guard case .readCursor? = refused.requests.last else { Issue.record("asked for \(refused.requests)"); return }
        #expect(session.machine.requester.backfill == .done)
        let pull = session.handle(.databaseCompleted(.cursor(after: 40, resyncing: false, previousAfter: nil)))
        #expect(pull.pulls.map(\.after) == [40] && pull.pulls.allSatisfy { $0.backfill == nil })
    }

    /// A batch from the peer with one entry of the synced expiry store, naming a row of `table`.
    static func expiryBatch(_ session: Session, naming table: String) -> ChangeBatch {
        let version = Version(timestamp: HybridTimestamp(milliseconds: 1_000, counter: 0), origin: session.peer)
        let entry = RowChange(
            table: 0, key: [.text(table), .text("[1]")], isAlive: true, existence: version, values: [.real(0)],
            versions: [], sequence: 1)
        return ChangeBatch(
            source: session.peer, after: 0, through: 1, isLast: true, tables: [expiryStoreDescriptor], changes: [entry])
    }

    @Test(
        """
        an expiry naming a table this side does not sync (a user's or Tether's own) is ERROR 5 naming it; nothing \
        is applied
        """)
    func expiryForATableNotSyncedHereIsRefused() throws {
        for table in ["secret", "tether_peers", "tether_meta", "bulk; DROP TABLE item"] {
            var session = try Session(tables: [Self.tDescriptor, Self.expiryStoreDescriptor])
            _ = session.pulling(after: 0)
            let actions = session.handle(.received(.batch(Self.expiryBatch(session, naming: table))))
            guard case let .error(code, message)? = actions.sent.last else {
                Issue.record("sent \(actions.sent)"); continue
            }
            #expect(code == .tableNotAllowed && message.contains("table \(table),"), "\(message)")
            #expect(actions.requests.isEmpty, "asked for \(actions.requests)")
            #expect(actions.closes)
        }
    }

    @Test(
        "an expiry naming a table the peer is not allowed is ERROR 5; one naming an allowed table goes to the database")
    func expiryForATableThePeerIsNotAllowedIsRefused() throws {
        var refused = try Session(
            tables: [Self.tDescriptor, Self.uDescriptor, Self.expiryStoreDescriptor], peerAllowedTables: ["t"])
        _ = refused.pulling(after: 0)
        let actions = refused.handle(.received(.batch(Self.expiryBatch(refused, naming: "u"))))
        #expect(actions.errorCodes == [.tableNotAllowed])
        #expect(actions.requests.isEmpty, "asked for \(actions.requests)")

        var accepted = try Session(tables: [Self.tDescriptor, Self.expiryStoreDescriptor])
        _ = accepted.pulling(after: 0)
        let applied = accepted.handle(.received(.batch(Self.expiryBatch(accepted, naming: "t"))))
        #expect(applied.errorCodes.isEmpty)
        guard case .apply? = applied.requests.first else { Issue.record("asked for \(applied.requests)"); return }
    }

    @Test("a table identified by other key columns on each side is ERROR 2 naming it")
    func keyColumnsThatDifferAreASchemaMismatch() throws {
        var session = try Session()
        let other = try #require(SchemaFingerprint(bytes: [UInt8](repeating: 9, count: SchemaFingerprint.byteCount)))
        let actions = session.open(
            hello: Hello(
                instanceKey: session.peer, schemaFingerprint: other, capabilities: .supported,
                tables: [TableDescriptor(name: "t", keyColumns: ["body"], valueColumns: ["id"])]))
        guard case let .error(code, message)? = actions.sent.last else { Issue.record("sent \(actions.sent)"); return }
        #expect(
            code == .schemaMismatch && message.contains("table t") && message.contains("key columns differ"),
            "\(message)")
        #expect(actions.closes)
    }

}

extension [SyncSessionStateMachine.Action] {
    var sent: [WireMessage] {
        compactMap { if case let .send(message) = $0 { message } else { nil } }
    }

    var pulls: [Pull] {
        sent.compactMap { if case let .pull(pull) = $0 { pull } else { nil } }
    }

    var errorCodes: [WireErrorCode] {
        sent.compactMap { if case let .error(code, _) = $0 { code } else { nil } }
    }

    var requests: [DatabaseRequest] {
        compactMap { if case let .runDatabase(request) = $0 { request } else { nil } }
    }

    var scheduled: [(timer: SyncSessionStateMachine.Timer, delay: TimeAmount)] {
        compactMap { if case let .schedule(timer, delay) = $0 { (timer, delay) } else { nil } }
    }

    var closes: Bool {
        contains { if case .close = $0 { true } else { false } }
    }
}

private extension SyncSessionStateMachine.State {
    var isByeSent: Bool { if case .closing(.byeSent, _) = self { true } else { false } }
}
