import Testing
import Tether
@testable import TetherSync
import TetherWire

/// The session rules of version 3 (Protocol/README.md §2, §8.10), on the state machine alone.
@Suite("Sessions: the rules of protocol version 3")
struct ScopeStateMachineTests {
    typealias Session = SessionStateMachineTests.Session

    /// A HELLO from a peer speaking only version 2.
    static func versionTwoHello(_ session: Session) -> Hello {
        var hello = session.peerHello
        hello.capabilities.remove(.version3)
        return hello
    }

    @Test("SCOPE goes out right after HELLO; a PULL before the peer's SCOPE, or a second SCOPE, is ERROR 6")
    func scopeComesFirst() throws {
        var session = try Session()
        _ = session.handle(.started)
        _ = session.handle(.tlsHandshakeCompleted(peer: Session.peerCertificate))
        let opened = session.handle(.received(.hello(session.peerHello)))
        #expect(opened.sent.first == .scope(ScopeAnnouncement()))
        let early = session.handle(.received(.pull(Pull(after: 0, maxChanges: 10, maxBytes: 1000))))
        #expect(early.errorCodes == [.malformedFrame])
        #expect(early.requests.isEmpty, "nothing extracted before the peer's interest is known")

        var twice = try Session()
        _ = twice.open()
        let second = twice.handle(.received(.scope(ScopeAnnouncement())))
        #expect(second.errorCodes == [.malformedFrame])
    }

    @Test(
        """
        in a version 2 session, SCOPE, REFUSED, a scope backfill PULL and a batch holding an eviction are ERROR \
        6; nothing version 3 is sent
        """)
    func versionTwoSessionsRefuseVersionThreeMessages() throws {
        let refused = RefusedChange(table: "t", key: [.integer(1)], sequence: 1, reason: "outside")
        var backfill = Pull(after: 0, maxChanges: 10, maxBytes: 1000)
        backfill.scopeBackfill = true
        for message in [WireMessage.scope(ScopeAnnouncement()), .refused([refused]), .pull(backfill)] {
            var session = try Session()
            let opened = session.open(hello: Self.versionTwoHello(session))
            #expect(!opened.sent.contains { $0.type == .scope }, "no SCOPE to a version 2 peer")
            let actions = session.handle(.received(message))
            #expect(actions.errorCodes == [.malformedFrame], "\(message.type)")
        }
        var versionTwo = try Session()
        _ = versionTwo.open(hello: Self.versionTwoHello(versionTwo))
        _ = versionTwo.handle(.databaseCompleted(.lastSequence(0)))
        _ = versionTwo.handle(.databaseCompleted(.cursor(after: 0, resyncing: false, previousAfter: nil)))
        let eviction = RowChange.eviction(
            table: 0, key: [.integer(1)],
            existence: Version(timestamp: HybridTimestamp(rawValue: 1), origin: versionTwo.peer),
            sequence: 1)
        let batch = ChangeBatch(
            source: versionTwo.peer, after: 0, through: 1, isLast: true, tables: versionTwo.schema.tables,
            changes: [eviction])
        let actions = versionTwo.handle(.received(.batch(batch)))
        #expect(actions.errorCodes == [.malformedFrame])
        #expect(actions.requests.isEmpty, "nothing of it applied")
    }

    @Test(
        """
        a version 2 peer is refused with ERROR 1 naming the table when this side's policy scopes it, or when this \
        side asks for part of a table
        """)
    func scopedVersionTwoPeerIsRefused() throws {
        var options = SyncOptions()
        options.peers.others = PeerPolicy(scopes: ["t": .filter("n > 0")])
        var scoped = try Session(options: options)
        let refused = scoped.open(hello: Self.versionTwoHello(scoped))
        #expect(refused.errorCodes == [.protocolVersion])
        #expect(
            refused.sent.contains {
                if case let .error(_, text) = $0 {
                    text.contains("table t") && text.contains("version 3")
                } else {
                    false
                }
            })

        var interested = SyncOptions()
        interested.interest = ["t": .filter("n > 0")]
        var asking = try Session(options: interested)
        #expect(asking.open(hello: Self.versionTwoHello(asking)).errorCodes == [.protocolVersion])
    }

    @Test(
        """
        a requester sent part of a table asks for a scope backfill once caught up, applies it without moving the \
        cursor, then is caught up
        """)
    func scopeBackfillAfterCatchUp() throws {
        var session = try Session(byeWhenCaughtUp: true, offersLive: false)
        _ = session.handle(.started)
        _ = session.handle(.tlsHandshakeCompleted(peer: Session.peerCertificate))
        _ = session.handle(.received(.hello(session.peerHello)))
        _ = session.handle(.databaseCompleted(.peerConfirmed(pinned: true)))
        _ = session.handle(.received(.scope(ScopeAnnouncement(scoped: ["t"]))))
        _ = session.handle(.databaseCompleted(.lastSequence(0)))
        _ = session.handle(.databaseCompleted(.cursor(after: 5, resyncing: false, previousAfter: nil)))
        let last = session.batch(after: 5, through: 9, isLast: true)
        let applying = session.handle(.received(.batch(last)))
        guard case let .apply(apply) = applying.requests.first else {
            Issue.record("asked for \(applying.requests)"); return
        }
        let applied = session.handle(
            .databaseCompleted(.applied(.applied(SessionStateMachineTests.report(cursor: 9)), apply)))
        guard case let .pull(pull) = applied.sent.last, pull.scopeBackfill, pull.after == 9 else {
            Issue.record("sent \(applied.sent)"); return
        }
        #expect(!session.machine.requester.receivedLast)
        let backfill = ChangeBatch(
            source: session.peer, after: 0, through: 9, isLast: true, tables: session.schema.tables, changes: [])
        let backfilling = session.handle(.received(.batch(backfill)))
        guard case let .apply(scopeApply) = backfilling.requests.first else {
            Issue.record("asked for \(backfilling.requests)"); return
        }
        #expect(scopeApply.backfill && scopeApply.scopeBackfill)
        let done = session.handle(
            .databaseCompleted(.applied(.applied(SessionStateMachineTests.report(cursor: 9)), scopeApply)))
        #expect(
            !done.sent.contains { if case .ack = $0 { true } else { false } }, "a scope backfill is not acknowledged")
        #expect(session.machine.requester.receivedLast)
    }

    @Test("the peer's refused changes go back to it with REFUSED, before the ACK of their batch")
    func refusalsAreToldBeforeTheAck() throws {
        var session = try Session()
        _ = session.pulling(after: 0)
        let batch = session.batch(after: 0, through: 4)
        let applying = session.handle(.received(.batch(batch)))
        guard case let .apply(apply) = applying.requests.first else {
            Issue.record("asked for \(applying.requests)"); return
        }
        var report = SessionStateMachineTests.report(cursor: 4)
        report.refused = [
            RefusedChange(table: "t", key: [.integer(3)], sequence: 3, reason: "outside the scope of the writer")
        ]
        let applied = session.handle(.databaseCompleted(.applied(.applied(report), apply)))
        let kinds = applied.sent.map(\.type)
        #expect(
            kinds.firstIndex(of: .refused).map { index in kinds.firstIndex(of: .ack).map { index < $0 } ?? false }
                == true, "\(kinds)")
        #expect(session.machine.summary.refused == 1)
    }
}
