import Dispatch
import NIOCore
import Tether
import TetherWire

/// One sync session on one connection: the state machine of §8 of
/// Protocol/README.md: catching up in both directions, heartbeats and timeouts,
/// and, with `livePush` negotiated, staying live (CHANGED → PULL → BATCH → ACK).
///
/// It sits last in the pipeline (TLSHandler → message decoder → message
/// encoder → session) and lives on its channel's event loop. Database work
/// (extract, apply, acknowledge, cursors) runs on the session's own serial
/// queue, in the order it was asked for, and its results come back to the
/// event loop.
final class SyncSessionHandler: ChannelInboundHandler {
    typealias InboundIn = WireMessage
    typealias OutboundOut = WireMessage

    enum Role: String {
        case client, server
        var peerName: String { self == .client ? "server" : "client" }
    }

    private enum Phase {
        /// Waiting for the TLS handshake, then the peer's HELLO.
        case handshaking
        case open
        /// BYE sent: nothing more is sent; reading until the peer's BYE or the end.
        case byeSent
        /// BYE received (and answered once the database work in progress is done).
        case byeReceived
        /// ERROR sent or received, or the connection failed.
        case failed
    }

    private let role: Role
    private let database: Database
    private let schema: LocalSchema
    private let options: SyncOptions
    private let decoderHandler: WireMessageDecoderHandler
    private let encoderHandler: WireMessageEncoderHandler
    /// Whether to send BYE once caught up both ways (the client of `syncOnce`).
    private let byeWhenCaughtUp: Bool
    /// Whether this side offers `livePush` (it keeps the session open after catch-up).
    private let offersLive: Bool
    /// Whether `livePush` was negotiated.
    private var live = false
    /// Whether `deferrals` was negotiated: a batch too far ahead of this clock is deferred
    /// (DEFERRED), not a reason to end the session.
    private var defers = false
    private var caughtUpReported = false
    /// Requester: the highest `latest` of a CHANGED received while pulling (0: none).
    private var pendingChanged: Int64 = 0
    /// Responder: the highest `through` of the batches sent, and the last `latest` announced.
    private var sentThrough: Int64 = 0
    private var announced: Int64 = 0
    private var checkingChanges = false
    /// The highest last sequence number of this database the session has been told of.
    private var localLatest: Int64 = 0
    /// Whether the session checks for local changes itself (every `changeCheckInterval`); a
    /// server's sessions are told by its `LocalChangeMonitor` instead.
    private let checksLocalChanges: Bool
    private var changeCheckTimer: Scheduled<Void>?
    private var pollTimer: Scheduled<Void>?
    private let queue: DispatchQueue
    private let eventLoop: EventLoop

    /// Succeeds (with the peer's instance key) once both directions received a last batch and everything sent was acknowledged.
    let caughtUp: EventLoopPromise<InstanceKey>
    /// Completes when the connection is closed: the summary after a graceful BYE, otherwise the error.
    let finished: EventLoopPromise<SyncSummary>
    /// Succeeds once the session is over and its database work queue has drained.
    let drained: EventLoopPromise<Void>
    private var completed = false

    private var context: ChannelHandlerContext?
    private var phase = Phase.handshaking
    private var failure: SyncSessionError?
    private var summary = SyncSummary()
    private var peerKey: InstanceKey?
    /// The SHA-256 fingerprint of the peer's certificate, from the TLS handshake.
    private var peerFingerprint: String?
    /// What the peer may do, known once its HELLO is accepted.
    private var peerPolicy = PeerPolicy()
    private var pendingDatabaseWork = 0

    // Progress.
    private let bytes: FrameByteCounter
    private let progress: AsyncStream<SyncSessionProgress>.Continuation?
    private let totals: SyncTotalsRecorder?
    private let metrics: SessionMetrics
    /// The summary as last added to `totals`.
    private var reportedToTotals = SyncSummary()
    private var changesExpectedToSend: Int?
    private var changesExpectedToReceive: Int?
    /// The highest `latest` the peer announced with CHANGED (0: none).
    private var peerLatest: Int64 = 0

    // Timers (on the event loop).
    private var helloTimer: Scheduled<Void>?
    private var heartbeatTimer: Scheduled<Void>?
    private var readOnlyWaitTimer: Scheduled<Void>?
    private var lastReceived = NIODeadline.now()
    private var lastSent = NIODeadline.now()
    private var lastPingNonce: UInt64 = 0
    /// Flow control (§8.5): since when the send buffer has been above its high-water mark, with
    /// reading paused (nil: writable, reading).
    private var blockedSince: NIODeadline?
    /// Whether the peer sent at least one PULL.
    private var receivedAnyPull = false

    // Requester side: pulling the peer's changes.
    /// The `after` of the PULL awaiting its BATCH.
    private var outstandingPull: Int64?
    /// Batches received and not yet applied (at most two: one applying, the next one pulled meanwhile).
    private var batchesBeingApplied = 0
    private var batchesApplied = 0
    /// The `through` of a batch received while another was being applied: its PULL goes out once
    /// that other one is applied, so that no more than two batches are ever held.
    private var deferredPull: Int64?
    /// Whether this side asks for whole rows: a partial change (§7.2) left out values it did not hold.
    private var wantsWholeRows = false
    /// The `maxChanges` of this side's PULLs: the configured one, made smaller while batches do
    /// not fit on the disk, and grown back as they do.
    private var pullChangeLimit: Int
    /// Pulling waits for this timer before it starts again: after a single change did not fit
    /// (`noRoomRetryDelay`), or after deferring the peer's batch (`clockSkewRetryInterval`).
    private var pullRetryTimer: Scheduled<Void>?
    /// DEFERRED to send once no pull is in progress (§8.3: its `through` covers every batch
    /// discarded meanwhile), and when to pull again.
    private var pendingDeferral: (deferral: Deferral, retry: TimeAmount)?
    /// Bumped when the pulls in progress are abandoned to pull again with whole rows: a batch
    /// answering an older pull is not applied.
    private var pullGeneration = 0
    private var outstandingPullGeneration = 0
    /// Pulling must start again from the cursor once the abandoned pulls and applies are over.
    private var restartPending = false
    private var applying: Bool { batchesBeingApplied > 0 }
    private var receivedLast = false

    // Responder side: the peer pulling ours.
    private var owesBatch = false
    private var sentLast = false
    /// The `through` of every BATCH sent and not yet acknowledged, in order.
    private var unacknowledged: [Int64] = []

    init(role: Role, database: Database, schema: LocalSchema, options: SyncOptions, decoder: WireMessageDecoderHandler,
         encoder: WireMessageEncoderHandler, bytes: FrameByteCounter, byeWhenCaughtUp: Bool, offersLive: Bool = false,
         progress: AsyncStream<SyncSessionProgress>.Continuation? = nil, totals: SyncTotalsRecorder? = nil, metrics: SyncMetrics,
         databaseQueue: DispatchQueue? = nil, checksLocalChanges: Bool = true, eventLoop: EventLoop) {
        self.bytes = bytes
        self.progress = progress
        self.totals = totals
        self.metrics = SessionMetrics(metrics)
        self.role = role
        self.database = database
        self.schema = schema
        self.options = options
        self.decoderHandler = decoder
        self.encoderHandler = encoder
        self.byeWhenCaughtUp = byeWhenCaughtUp
        self.offersLive = offersLive
        // A server's sessions share one thread for their database work (`databaseQueue`): most of
        // it takes the writer anyway, and a queue of their own each made a thread per busy session.
        queue = DispatchQueue(label: "tether.sync.session.\(role.rawValue)", target: databaseQueue)
        self.checksLocalChanges = checksLocalChanges
        pullChangeLimit = max(1, options.batchLimits.maximumChanges)
        self.eventLoop = eventLoop
        caughtUp = eventLoop.makePromise()
        finished = eventLoop.makePromise()
        drained = eventLoop.makePromise()
    }

    /// The pipeline could not be set up: nothing will ever happen on this session.
    func abandon(_ error: any Error) {
        let failure = SyncSessionError.transport("could not set up the connection: \(error)")
        caughtUp.fail(failure)
        finished.fail(failure)
        drained.succeed(())
    }

    // MARK: Channel events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        let timeout = options.helloTimeout
        helloTimer = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) { [self] in
            guard phase == .handshaking else { return }
            fail(.timeout("no HELLO from the \(role.peerName) within \(Self.describe(timeout)) of connecting"))
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        complete()
    }

    // MARK: Timers

    static func describe(_ amount: TimeAmount) -> String {
        let milliseconds = amount.nanoseconds / 1_000_000
        return milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
    }

    /// Checks the idle timeout and sends PING when due, then checks again a tick later.
    private func scheduleHeartbeat() {
        guard let context, !completed else { return }
        heartbeatTimer = context.eventLoop.assumeIsolated().scheduleTask(in: options.heartbeatTick) { [self] in
            heartbeat()
        }
    }

    private func heartbeat() {
        guard !completed else { return }
        let now = NIODeadline.now()
        switch phase {
        case .open:
            if let blockedSince {
                // Reading is paused by choice: only the peer not draining what it was sent counts.
                if now - blockedSince >= options.idleTimeout {
                    return fail(.timeout("the \(role.peerName) read nothing of what it was sent for \(Self.describe(options.idleTimeout))"))
                }
                return scheduleHeartbeat()
            }
            if now - lastReceived >= options.idleTimeout {
                return fail(.timeout("nothing received from the \(role.peerName) for \(Self.describe(options.idleTimeout))"))
            }
            if now - lastSent >= options.effectivePingInterval {
                lastPingNonce &+= 1
                send(.ping(lastPingNonce))
            }
        case .byeSent:
            // BYE sent and the peer's not coming: nothing more may be sent (§8.6), just close.
            if now - lastReceived >= options.idleTimeout { return close() }
        case .handshaking, .byeReceived, .failed:
            break
        }
        scheduleHeartbeat()
    }

    // MARK: Live (§8.4)

    private func receivedChanged(_ latest: Int64, from peer: InstanceKey) {
        guard !peerPolicy.readOnly else { return }
        if latest > peerLatest {
            peerLatest = latest
            if changesExpectedToReceive == nil || !receivedLast {
                estimateReceiving(cursor: outstandingPull ?? 0)
                reportProgress()
            }
        }
        // Without livePush negotiated, CHANGED only informs progress (§8.4).
        guard live else { return }
        if outstandingPull != nil || applying || !receivedLast {
            pendingChanged = max(pendingChanged, latest)
            return
        }
        receivedLast = false
        pull(from: peer)
    }

    private func scheduleChangeCheck() {
        guard checksLocalChanges, let context, !completed, let interval = options.changeCheckInterval else { return }
        changeCheckTimer = context.eventLoop.assumeIsolated().scheduleTask(in: max(.milliseconds(1), interval)) { [self] in
            checkLocalChanges()
            scheduleChangeCheck()
        }
    }

    /// Whether this session stays open once caught up (it is not a `syncOnce`).
    private var keptOpen: Bool { offersLive && !byeWhenCaughtUp }

    /// Without `livePush`, a kept-open session learns of the peer's new changes by pulling again (§8.4).
    private func schedulePoll(_ peer: InstanceKey) {
        guard let context, !completed else { return }
        pollTimer = context.eventLoop.assumeIsolated().scheduleTask(in: max(.milliseconds(1), options.pollInterval)) { [self] in
            // Not while the peer is still catching up from this side: its changes then are ours echoed.
            guard caughtUpReported else { return schedulePoll(peer) }
            guard phase == .open, outstandingPull == nil, !applying, receivedLast else { return }
            receivedLast = false
            pull(from: peer)
        }
    }

    /// Sends CHANGED if this database has changes beyond what the peer was sent and it is not pulling.
    func checkLocalChanges() {
        guard live, phase == .open, sentLast, !owesBatch, !checkingChanges else { return }
        checkingChanges = true
        runDatabase("read the last sequence number", { try $0.lastSequenceIncludingExternalWrites() }) { [self] latest in
            checkingChanges = false
            localChangesCommitted(through: latest)
        }
    }

    /// This database's changes now go through `latest` (a server's `LocalChangeMonitor` tells its
    /// sessions): CHANGED if the peer lacks them and is not pulling; otherwise remembered, and
    /// announced once the peer's pull is answered (`announceIfBehind`).
    func localChangesCommitted(through latest: Int64) {
        localLatest = max(localLatest, latest)
        announceIfBehind()
    }

    private func announceIfBehind() {
        guard live, phase == .open, sentLast, !owesBatch, localLatest > sentThrough, localLatest > announced else { return }
        announced = localLatest
        send(.changed(latest: localLatest))
    }

    /// Sends BYE (a graceful close): the owner of a live session stops it.
    func sayBye() {
        switch phase {
        case .open:
            phase = .byeSent
            lastReceived = .now()
            context?.writeAndFlush(wrapOutboundOut(.bye(reason: "stopped")), promise: nil)
        case .handshaking:
            phase = .failed
            record(.connectionClosed(during: "the handshake"))
            close()
        case .byeSent, .byeReceived, .failed:
            return
        }
    }

    private func cancelTimers() {
        changeCheckTimer?.cancel()
        changeCheckTimer = nil
        pollTimer?.cancel()
        pollTimer = nil
        helloTimer?.cancel()
        heartbeatTimer?.cancel()
        readOnlyWaitTimer?.cancel()
        pullRetryTimer?.cancel()
        pullRetryTimer = nil
        helloTimer = nil
        heartbeatTimer = nil
        readOnlyWaitTimer = nil
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let handshake = event as? TLSHandshakeCompleted, phase == .handshaking {
            peerFingerprint = handshake.peerFingerprint
            let hello = Hello(instanceKey: schema.instanceKey, schemaFingerprint: schema.fingerprint, capabilities: offeredCapabilities,
                              tables: schema.tables)
            send(.hello(hello))
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        guard phase == .handshaking || phase == .open else {
            // After BYE (sent or received) the catch-up is complete: a failing close changes nothing.
            context.close(promise: nil)
            return
        }
        switch error {
        case let wire as WireError:
            // The decoder already sent ERROR and is closing.
            if case let .unsupportedProtocolVersion(version) = wire {
                record(.protocolVersion(peerVersion: version))
            } else {
                record(.malformedFrame(wire))
            }
        case let tls as TLSError:
            record(.transport("\(tls)"))
        default:
            record(.transport("\(error)"))
        }
        phase = .failed
        context.close(promise: nil)
    }

    /// Flow control (§8.5): while the send buffer is above its high-water mark, this side reads
    /// nothing more, so that no request of the peer's can make it buffer more; a peer that does not
    /// drain the buffer within the idle timeout is timed out (see `heartbeat`).
    func channelWritabilityChanged(context: ChannelHandlerContext) {
        let writable = context.channel.isWritable
        if writable {
            if blockedSince != nil {
                blockedSince = nil
                lastReceived = .now()
                try? context.channel.syncOptions?.setOption(ChannelOptions.autoRead, value: true)
                context.read()
            }
        } else if blockedSince == nil, phase == .open {
            blockedSince = .now()
            try? context.channel.syncOptions?.setOption(ChannelOptions.autoRead, value: false)
        }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        complete()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let message = unwrapInboundIn(data)
        lastReceived = .now()
        switch phase {
        case .failed, .byeReceived:
            return
        case .byeSent:
            // Only the peer's BYE (or ERROR) matters now.
            switch message {
            case .bye: close()
            case let .error(code, text): receivedError(code: code, message: text)
            default: return
            }
            return
        case .handshaking, .open:
            break
        }
        switch message {
        case let .error(code, text):
            receivedError(code: code, message: text)
        case .bye:
            receivedBye()
        case let .hello(hello):
            guard phase == .handshaking else { return fail(.protocolViolation("a second HELLO")) }
            receivedHello(hello)
        default:
            guard phase == .open, let peer = peerKey else {
                return fail(.protocolViolation("\(message.type) before HELLO"))
            }
            switch message {
            case let .pull(pull): receivedPull(pull, from: peer)
            case let .batch(batch): receivedBatch(batch, from: peer)
            case let .ack(through): receivedAck(through, from: peer)
            case let .ping(nonce): send(.pong(nonce))
            case let .changed(latest): receivedChanged(latest, from: peer)
            case let .deferred(deferral): receivedDeferral(deferral, from: peer)
            case .pong:
                // A PONG only shows the peer is alive (its arrival reset the idle deadline).
                return
            case .hello, .error, .bye:
                return
            }
        }
    }

    // MARK: Messages

    private func receivedHello(_ hello: Hello) {
        guard hello.protocolVersion == WireProtocol.version else {
            return fail(.protocolVersion(peerVersion: hello.protocolVersion),
                        message: "this peer speaks version \(WireProtocol.version)")
        }
        if let refusal = options.refusal(of: hello.instanceKey, fingerprint: peerFingerprint) {
            return fail(.unauthorized("the \(role.peerName) was refused: \(refusal)"))
        }
        guard hello.instanceKey != schema.instanceKey else {
            return fail(.protocolViolation("the \(role.peerName) has this database's own instance key \(hello.instanceKey)"))
        }
        if let difference = schema.firstDifference(from: hello.tables, peerRole: role.peerName) {
            return fail(.schemaMismatch(table: difference.table, column: difference.column, message: difference.message))
        }
        guard hello.schemaFingerprint == schema.fingerprint else {
            return fail(.schemaMismatch(table: "", column: nil, message:
                "the schema fingerprints differ (\(hello.schemaFingerprint) from the \(role.peerName), \(schema.fingerprint) here) though the table lists match"))
        }
        phase = .open
        helloTimer?.cancel()
        helloTimer = nil
        scheduleHeartbeat()
        peerKey = hello.instanceKey
        totals?.sessionStarted()
        metrics.sessionOpened(peer: hello.instanceKey)
        peerPolicy = options.policy(for: hello.instanceKey)
        summary.peer = hello.instanceKey
        let negotiated = offeredCapabilities.negotiated(with: hello.capabilities)
        if negotiated.contains(.livePush) {
            live = true
            scheduleChangeCheck()
        }
        defers = negotiated.contains(.deferrals)
        if negotiated.contains(.lz4) {
            decoderHandler.acceptCompressedFrames()
            encoderHandler.enableCompression()
        }
        announceLatest()
        if peerPolicy.readOnly {
            // This side does not accept the peer's changes: it never pulls from it (§8.3).
            receivedLast = true
            if byeWhenCaughtUp, let context {
                // If the peer does not accept ours either, it never pulls: without its first PULL
                // within the idle timeout, there is nothing to do both ways (see `idleTimeout`).
                readOnlyWaitTimer = context.eventLoop.assumeIsolated().scheduleTask(in: options.idleTimeout) { [self] in
                    guard phase == .open, !receivedAnyPull else { return }
                    sentLast = true
                    checkCaughtUp()
                }
            }
        } else {
            pull(from: hello.instanceKey)
        }
    }

    /// Tells the peer, right after the handshake, how far this database's changes go (one CHANGED,
    /// sent whatever the capabilities, §8.4), so that it can show how much it expects to receive.
    private func announceLatest() {
        runDatabase("read the last sequence number", { try $0.lastSequence() }) { [self] latest in
            guard phase == .open, latest > 0, announced == 0 else { return }
            announced = latest
            send(.changed(latest: latest))
        }
    }

    private var offeredCapabilities: Capabilities {
        var offered: Capabilities = [.lz4, .deferrals, .livePush]
        if !offersLive || !options.testHooks.offersLivePush { offered.remove(.livePush) }
        if !options.testHooks.offersDeferrals { offered.remove(.deferrals) }
        return offered
    }

    /// Sends PULL after `after` with this side's limits; it is outstanding until its BATCH arrives.
    /// Called directly for the PULL that follows a batch not yet applied (§8.3 pipelining).
    private func sendPull(after: Int64, resumingResync: Bool = false) {
        outstandingPull = after
        outstandingPullGeneration = pullGeneration
        let limits = options.batchLimits
        // Bytes in proportion to changes while the batches are made smaller for lack of room.
        let maxBytes = pullChangeLimit >= limits.maximumChanges ? limits.maximumBytes
            : Int(clamping: Int64(limits.maximumBytes) * Int64(pullChangeLimit) / Int64(max(1, limits.maximumChanges)))
        send(.pull(Pull(after: after, resumingResync: resumingResync, maxChanges: max(1, pullChangeLimit),
                        maxBytes: max(1, maxBytes), wholeRows: wantsWholeRows)))
    }

    /// A batch did not fit on the disk: the next ones are made smaller (an eighth), so that what
    /// room there is gets used and sync goes on as soon as some is freed. When a single change does
    /// not fit, a session kept open tries again after `noRoomRetryDelay`; a `syncOnce` session
    /// gives up (the returned error).
    private func shrinkPullsForLackOfRoom(_ reason: String) -> SyncSessionError? {
        guard pullChangeLimit == 1 else {
            pullChangeLimit = max(1, pullChangeLimit / 8)
            return nil
        }
        guard keptOpen, context != nil else {
            return .storage(operation: "apply the \(role.peerName)'s changes", reason: "not even one change fits on the disk: \(reason)")
        }
        schedulePullRetry(in: options.noRoomRetryDelay)
        return nil
    }

    private func schedulePullRetry(in delay: TimeAmount) {
        guard let context, !completed else { return }
        pullRetryTimer = context.eventLoop.assumeIsolated().scheduleTask(in: delay) { [self] in
            pullRetryTimer = nil
            if let peer = peerKey { restartPullsIfIdle(peer) }
        }
    }

    /// The peer's batch (after `after` through `through`) carries a timestamp further ahead of
    /// this clock than it accepts: nothing of it was applied. With `deferrals` negotiated only
    /// this direction pauses (§8.3): DEFERRED goes out once no pull is in progress, and pulling
    /// starts again from the cursor when this clock may have caught up (or the limit was
    /// raised); a `syncOnce` session leaves the rest for a later session. The other direction
    /// goes on either way.
    private func deferPeerBatch(after: Int64, through: Int64, ahead: Duration, limit: Duration) {
        let reason = SyncError.clockSkew(ahead: ahead, limit: limit).description
        let catchUp = ahead - limit
        let retry = min(options.clockSkewRetryInterval, max(.milliseconds(100), .nanoseconds(Int64(clamping: catchUp.components.seconds * 1_000_000_000
            + catchUp.components.attoseconds / 1_000_000_000))))
        pendingDeferral = (Deferral(after: after, through: through, reason: .clockSkew,
                                    retryAfterMilliseconds: UInt64(max(0, retry.nanoseconds / 1_000_000)),
                                    message: Self.truncated(reason, maxBytes: options.wireLimits.maxStringLength)), retry)
        summary.deferredFromPeer = reason
    }

    /// A batch answering an abandoned pull was discarded: a DEFERRED not yet sent covers it too.
    private func coverInPendingDeferral(_ through: Int64) {
        guard let pending = pendingDeferral, through > pending.deferral.through else { return }
        pendingDeferral?.deferral.through = through
    }

    /// Pulls again from the cursor, once nothing of the abandoned pulls is in progress; a
    /// deferral waiting for that moment is sent first.
    private func restartPullsIfIdle(_ peer: InstanceKey) {
        guard restartPending, outstandingPull == nil, batchesBeingApplied == 0, phase == .open else { return }
        if let (deferral, retry) = pendingDeferral {
            pendingDeferral = nil
            send(.deferred(deferral))
            guard keptOpen else {
                // This session will not pull the deferred changes again: this direction is over.
                restartPending = false
                receivedLast = true
                return checkCaughtUp()
            }
            schedulePullRetry(in: retry)
        }
        guard pullRetryTimer == nil else { return }
        restartPending = false
        receivedLast = false
        pull(from: peer)
    }

    /// Sends the next PULL, from this database's cursor on the peer.
    private func pull(from peer: InstanceKey, previousAfter: Int64? = nil) {
        runDatabase("read the cursor on peer \(peer)", { try $0.cursor(for: peer) }) { [self] cursor in
            if let previousAfter, cursor.after <= previousAfter, !cursor.resyncing {
                return fail(.batchRejected("the cursor on the \(role.peerName) did not advance past \(previousAfter) although its batch was not the last"))
            }
            if changesExpectedToReceive == nil, peerLatest > 0 {
                estimateReceiving(cursor: cursor.after)
                reportProgress()
            }
            sendPull(after: cursor.after, resumingResync: cursor.resyncing)
        }
    }

    private func receivedPull(_ pull: Pull, from peer: InstanceKey) {
        guard !owesBatch else { return fail(.protocolViolation("a PULL while the answer to the previous one is still owed")) }
        owesBatch = true
        receivedAnyPull = true
        let limits = BatchLimits(maximumChanges: pull.maxChanges, maximumBytes: pull.maxBytes)
        let allowed = peerPolicy.allowedTables
        runDatabase("extract changes for peer \(peer) after \(pull.after)", {
            // With a table restriction, rows are not marked in flight: the peer's ACK must not mark
            // rows of tables it was not sent as synced. They stay pending for the other peers.
            let batch = try $0.extractChanges(for: peer, after: pull.after, resuming: pull.resumingResync, limits: limits,
                                              markInFlight: allowed == nil, allowingPartialRows: !pull.wholeRows)
            let latest = batch.isLast ? batch.through : try $0.lastSequence()
            return (allowed.map { Self.restrict(batch, to: $0) } ?? batch, latest)
        }) { [self] (batch: ChangeBatch, latest: Int64) in
            owesBatch = false
            unacknowledged.append(batch.through)
            sentThrough = max(sentThrough, batch.through)
            sentLast = batch.isLast
            summary.batchesSent += 1
            summary.changesSent += batch.changes.count
            changesExpectedToSend = summary.changesSent + (batch.isLast ? 0 : Self.span(from: batch.through, to: latest))
            send(.batch(batch))
            reportProgress()
            checkCaughtUp()
            announceIfBehind()
        }
    }

    private func receivedBatch(_ batch: ChangeBatch, from peer: InstanceKey) {
        guard !peerPolicy.readOnly else {
            return fail(.readOnly("the \(role.peerName) \(peer) sent a BATCH, but this peer does not accept changes from it"))
        }
        guard let after = outstandingPull else {
            return fail(.protocolViolation("a BATCH that answers no PULL"))
        }
        guard batch.source == peer else {
            return fail(.batchRejected("the batch comes from \(batch.source), not from the \(role.peerName) \(peer)"))
        }
        guard batch.after == after else {
            return fail(.batchRejected("the batch follows sequence \(batch.after), but the PULL asked for changes after \(after)"))
        }
        if outstandingPullGeneration != pullGeneration {
            // It answers an abandoned pull (to ask for whole rows or smaller batches, or after a
            // deferral): not applied; pulling starts again.
            outstandingPull = nil
            coverInPendingDeferral(batch.through)
            return restartPullsIfIdle(peer)
        }
        let generation = pullGeneration
        let synced = Set(schema.tables.map(\.name))
        if let table = batch.tables.first(where: { !synced.contains($0.name) }) {
            return fail(.tableNotAllowed("the batch names table \(table.name), which this peer does not sync"))
        }
        if let allowed = peerPolicy.allowedTables,
           let change = batch.changes.first(where: { !batch.tables.indices.contains($0.table) || !allowed.contains(batch.tables[$0.table].name) }) {
            let name = batch.tables.indices.contains(change.table) ? batch.tables[change.table].name : "#\(change.table)"
            return fail(.tableNotAllowed("the batch from \(peer) changes table \(name), which this peer does not accept from it (allowed: \(allowed.sorted().joined(separator: ", ")))"))
        }
        outstandingPull = nil
        batchesBeingApplied += 1
        summary.batchesReceived += 1
        summary.changesReceived += batch.changes.count
        // Pipelining (§8.3): the next PULL goes out while this batch is applied, so that the peer
        // extracts the next batch meanwhile. Its `after` is this batch's `through`, the cursor once
        // it is applied (applies run in order; if one fails, the session fails). Not during a full
        // resync, whose cursor rules are the database's.
        let pipelined = !batch.isLast && !batch.isResync
        if pipelined {
            if batchesBeingApplied == 1 {
                sendPull(after: batch.through)
            } else {
                deferredPull = batch.through
            }
        }
        runDatabase("apply a batch of \(batch.changes.count) change(s) from \(peer) (sequences \(batch.after)–\(batch.through))",
                    { [metrics = metrics.shared] database -> BatchOutcome in
                        do {
                            return .applied(try metrics.measuringApply { try database.apply(batch) })
                        } catch let error as SyncError {
                            if case .needsWholeRows = error { return .needsWholeRows }
                            if case let .clockSkew(ahead, limit) = error { return .tooFarAhead(ahead: ahead, limit: limit) }
                            throw error
                        } catch let error as DatabaseError where error.isStorageFailure {
                            return .noRoom("\(error)")
                        }
                    }, failure: { .batchRejected($0) }, committed: { [self] (outcome: BatchOutcome) in
            // Counted whatever became of the session since: the apply is committed.
            guard case let .applied(report) = outcome else { return }
            summary.applied += report.applied
            summary.unchanged += report.unchanged
            summary.keptAside += report.keptAside
            summary.conflicts += report.conflicts.count
        }) { [self] (outcome: BatchOutcome) in
            batchesBeingApplied -= 1
            guard generation == pullGeneration, case let .applied(report) = outcome else {
                // Nothing of the batch was applied: partial changes this database cannot complete,
                // or no room on the disk for the whole batch; or it followed such a one (applied
                // after the gap, but the cursor waits). The pulls start again from the cursor,
                // asking for whole rows, or for smaller batches. The batch is not counted as
                // received: its changes come again.
                if generation == pullGeneration {
                    switch outcome {
                    case .needsWholeRows: wantsWholeRows = true
                    case let .noRoom(reason):
                        if let failure = shrinkPullsForLackOfRoom(reason) { return fail(failure) }
                    case let .tooFarAhead(ahead, limit):
                        guard defers else {
                            return fail(.batchRejected("could not apply a batch of \(batch.changes.count) change(s) from \(peer): \(SyncError.clockSkew(ahead: ahead, limit: limit))"))
                        }
                        deferPeerBatch(after: batch.after, through: batch.through, ahead: ahead, limit: limit)
                    case .applied: break
                    }
                    pullGeneration += 1
                    deferredPull = nil
                    restartPending = true
                } else {
                    coverInPendingDeferral(batch.through)
                }
                summary.batchesReceived -= 1
                summary.changesReceived -= batch.changes.count
                return restartPullsIfIdle(peer)
            }
            // Room again: back towards the configured batch size.
            pullChangeLimit = min(options.batchLimits.maximumChanges, pullChangeLimit * 2)
            batchesApplied += 1
            // The sequence numbers this apply issued hold only the peer's own changes, which it
            // does not need back: not a reason for CHANGED (unless the apply also resolved kept-aside
            // changes or evicted local rows, which the peer lacks).
            if report.resolvedFromKeptAside == 0, report.conflicts.isEmpty, report.sequenceBefore <= max(sentThrough, announced) {
                announced = max(announced, report.sequenceAfter)
            }
            if batch.isLast {
                changesExpectedToReceive = summary.changesReceived
            } else {
                estimateReceiving(cursor: report.cursor)
            }
            reportProgress()
            options.onBatchApplied?(batch.changes.count)
            if let hook = options.testHooks.batchAppliedHook, !hook(batchesApplied) {
                phase = .failed
                record(.connectionClosed(during: "catch-up"))
                return close()
            }
            send(.ack(through: report.cursor))
            if let after = deferredPull, batchesBeingApplied == 1 {
                deferredPull = nil
                sendPull(after: after)
            }
            if batch.isLast, pendingChanged > report.cursor, live {
                // A CHANGED arrived meanwhile announcing more than this batch brought (§8.4).
                pendingChanged = 0
                pull(from: peer)
            } else if batch.isLast {
                pendingChanged = 0
                receivedLast = true
                checkCaughtUp()
                if !live, keptOpen { schedulePoll(peer) }
            } else if !pipelined {
                pull(from: peer, previousAfter: batch.after)
            }
        }
    }

    private func receivedAck(_ through: Int64, from peer: InstanceKey) {
        // The requester acknowledges its cursor, which is a sent batch's `through` or, when its
        // apply waits for a gap, less: never more than the last batch sent.
        guard let last = unacknowledged.last, through <= last else {
            return fail(.protocolViolation("ACK through \(through), beyond every batch sent and not yet acknowledged"))
        }
        unacknowledged.removeAll { $0 <= through }
        runDatabase("record that peer \(peer) acknowledged changes through \(through)", {
            do {
                try $0.acknowledge(peer: peer, through: through)
            } catch let error as DatabaseError where error.isStorageFailure {
                // No room to record it: the rows stay pending, and are sent again (harmlessly) later.
            }
        }) { [self] _ in
            reportProgress()
            checkCaughtUp()
        }
    }

    /// The peer did not apply this side's newest batches (§8.3): their rows stay pending, the
    /// reason is recorded for `tether status`, and the peer pulls them again when it can. A
    /// `syncOnce` session counts this direction as over (the summary says why).
    private func receivedDeferral(_ deferral: Deferral, from peer: InstanceKey) {
        guard defers else { return fail(.protocolViolation("DEFERRED, but the deferrals capability was not negotiated")) }
        guard !owesBatch, let newest = unacknowledged.last, deferral.through == newest, deferral.after < newest else {
            return fail(.protocolViolation("DEFERRED after \(deferral.after) through \(deferral.through), which is not the newest batch sent and not yet acknowledged (\(unacknowledged.last.map(String.init) ?? "none"))"))
        }
        unacknowledged.removeAll()
        summary.deferredByPeer = deferral.message
        runDatabase("record that peer \(peer) deferred changes after \(deferral.after)", {
            do {
                try $0.recordDeferral(by: peer, after: deferral.after, through: deferral.through, reason: deferral.message)
            } catch let error as DatabaseError where error.isStorageFailure {
                // No room to record why: the rows stay pending all the same.
            }
        }) { [self] _ in
            if !keptOpen { sentLast = true }
            reportProgress()
            checkCaughtUp()
        }
    }

    private func receivedError(code: WireErrorCode, message: String) {
        record(.peerError(code: code, message: message))
        phase = .failed
        close()
    }

    private func receivedBye() {
        phase = .byeReceived
        // Answer once the database work in progress (an acknowledgement, an apply) is done.
        afterDatabaseWork { [self] in
            context?.writeAndFlush(wrapOutboundOut(.bye(reason: "")), promise: nil)
            close()
        }
    }

    // MARK: Progress

    /// The number of sequence numbers after `cursor` through `latest` (0 if none), as an Int.
    private static func span(from cursor: Int64, to latest: Int64) -> Int {
        latest > cursor ? Int(clamping: latest.subtractingReportingOverflow(cursor).partialValue) : 0
    }

    /// Expects what was received so far plus the peer's announced sequences after `cursor`.
    private func estimateReceiving(cursor: Int64) {
        guard peerLatest > 0 else { return }
        changesExpectedToReceive = summary.changesReceived + Self.span(from: cursor, to: peerLatest)
    }

    /// Brings the byte counts up to date, adds what changed to the totals and sends a progress snapshot.
    private func reportProgress() {
        summary.bytesSent = bytes.sent
        summary.bytesReceived = bytes.received
        totals?.add(from: reportedToTotals, to: summary)
        reportedToTotals = summary
        metrics.progressed(to: summary)
        progress?.yield(SyncSessionProgress(done: summary, changesExpectedToSend: changesExpectedToSend,
                                            changesExpectedToReceive: changesExpectedToReceive, caughtUp: caughtUpReported))
    }

    private func checkCaughtUp() {
        guard phase == .open || phase == .byeReceived, receivedLast, !applying, !restartPending, outstandingPull == nil, sentLast, !owesBatch,
              unacknowledged.isEmpty,
              pendingDatabaseWork == 0 else { return }
        if !caughtUpReported {
            caughtUpReported = true
            reportProgress()
            caughtUp.succeed(peerKey ?? schema.instanceKey)
        }
        // A side that never pulls from its peer (a read-only peer) has nothing left to do either,
        // unless the session stays open (live).
        if byeWhenCaughtUp || (peerPolicy.readOnly && !live), phase == .open {
            phase = .byeSent
            context?.writeAndFlush(wrapOutboundOut(.bye(reason: "caught up")), promise: nil)
        }
    }

    private func complete() {
        guard !completed else { return }
        completed = true
        cancelTimers()
        metrics.sessionClosed()
        // Database work still queued (a batch being applied) finishes first: the summary then
        // counts everything that was committed.
        let done = eventLoop.makePromise(of: Void.self)
        queue.async { done.succeed(()) }
        done.futureResult.assumeIsolated().whenComplete { [self] _ in report() }
    }

    /// Resolves the session's promises with its final summary or error.
    private func report() {
        reportProgress()
        progress?.finish()
        drained.succeed(())
        if let failure {
            if !caughtUpReported { caughtUp.fail(failure) }
            finished.fail(failure)
            return
        }
        switch phase {
        case .byeSent, .byeReceived:
            if !caughtUpReported { caughtUp.fail(SyncSessionError.connectionClosed(during: "catch-up")) }
            finished.succeed(summary)
        case .handshaking, .open, .failed:
            let error = SyncSessionError.connectionClosed(during: phase == .handshaking ? "the handshake"
                                                                   : caughtUpReported ? "the live session" : "catch-up")
            if !caughtUpReported { caughtUp.fail(error) }
            finished.fail(error)
        }
    }

    /// `batch` without the changes (and table descriptors) of tables outside `allowed`.
    static func restrict(_ batch: ChangeBatch, to allowed: Set<String>) -> ChangeBatch {
        var newIndex: [Int: Int] = [:]
        var tables: [TableDescriptor] = []
        for (index, table) in batch.tables.enumerated() where allowed.contains(table.name) {
            newIndex[index] = tables.count
            tables.append(table)
        }
        var changes: [RowChange] = []
        for var change in batch.changes {
            guard let index = newIndex[change.table] else { continue }
            change.table = index
            changes.append(change)
        }
        return ChangeBatch(source: batch.source, after: batch.after, through: batch.through, isLast: batch.isLast,
                           isResync: batch.isResync, tables: tables, changes: changes)
    }

    // MARK: Sending and closing

    private func send(_ message: WireMessage) {
        guard let context, phase != .failed else { return }
        let promise = context.eventLoop.makePromise(of: Void.self)
        promise.futureResult.assumeIsolated().whenFailure { [self] error in
            guard phase == .handshaking || phase == .open else { return }
            if let wire = error as? WireError {
                fail(.cannotSend(message: "\(message.type)", wire))
            } else {
                record(.transport("could not send \(message.type): \(error)"))
                phase = .failed
                close()
            }
        }
        lastSent = .now()
        context.writeAndFlush(wrapOutboundOut(message), promise: promise)
    }

    /// Fails the session: sends ERROR with the error's code and description (`message` if given), then closes.
    private func fail(_ error: SyncSessionError, message: String? = nil) {
        guard phase != .failed else { return }
        record(error)
        phase = .failed
        let text = Self.truncated(message ?? error.description, maxBytes: options.wireLimits.maxStringLength)
        context?.writeAndFlush(wrapOutboundOut(.error(code: error.code, message: text)), promise: nil)
        close()
    }

    /// `text` cut at a character boundary to at most `maxBytes` UTF-8 bytes.
    static func truncated(_ text: String, maxBytes: Int) -> String {
        guard text.utf8.count > maxBytes else { return text }
        var result = ""
        var used = 0
        for character in text {
            used += character.utf8.count
            if used > maxBytes { break }
            result.append(character)
        }
        return result
    }

    private func record(_ error: SyncSessionError) {
        guard failure == nil else { return }
        failure = error
        metrics.sessionFailed(error)
    }

    private func close() {
        context?.close(promise: nil)
    }

    // MARK: Database work

    /// Runs `work` on the session's serial queue, then `then` on the event loop (unless the session failed meanwhile).
    /// `committed` runs on the event loop on success even if the session ended meanwhile (the
    /// work's effect is in the database): for what the summary counts.
    private func runDatabase<T: Sendable>(_ operation: String, _ work: @escaping @Sendable (Database) throws -> T,
                                          failure makeError: ((String) -> SyncSessionError)? = nil,
                                          committed: ((T) -> Void)? = nil,
                                          then: @escaping (T) -> Void) {
        guard let context, !completed else { return }
        let promise = context.eventLoop.makePromise(of: T.self)
        let database = self.database
        pendingDatabaseWork += 1
        queue.async {
            do { promise.succeed(try work(database)) } catch { promise.fail(error) }
        }
        promise.futureResult.assumeIsolated().whenComplete { [self] result in
            pendingDatabaseWork -= 1
            switch result {
            case let .success(value):
                committed?(value)
                guard !completed, phase == .open || phase == .byeReceived else { return }
                then(value)
                // Whatever work ends last (an apply, an ACK, a change check) may be what the
                // catch-up was waiting for.
                if !caughtUpReported { checkCaughtUp() }
            case let .failure(error):
                if let storage = error as? DatabaseError, storage.isStorageFailure {
                    fail(.storage(operation: operation, reason: "\(storage)"))
                } else if let makeError {
                    fail(makeError("could not \(operation): \(error)"))
                } else {
                    fail(.database(operation: operation, reason: "\(error)"))
                }
            }
        }
    }

    /// Runs `body` on the event loop once the database work asked for so far is done.
    private func afterDatabaseWork(_ body: @escaping () -> Void) {
        guard let context else { return }
        let promise = context.eventLoop.makePromise(of: Void.self)
        queue.async { promise.succeed(()) }
        promise.futureResult.assumeIsolated().whenComplete { _ in body() }
    }
}

/// What became of a batch received from the peer.
private enum BatchOutcome: Sendable {
    case applied(ApplyReport)
    /// Its timestamps are further ahead of this clock than `limit` allows: nothing was applied.
    case tooFarAhead(ahead: Duration, limit: Duration)
    /// It holds partial changes this database cannot complete (§7.2): nothing was applied.
    case needsWholeRows
    /// It did not fit on the disk: nothing was applied.
    case noRoom(String)
}
