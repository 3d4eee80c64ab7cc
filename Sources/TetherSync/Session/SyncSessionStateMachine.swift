import NIOCore
import Tether
import TetherWire

/// The rules of one sync session (§8 of Protocol/README.md) as a value: catching up in both
/// directions, heartbeats and timeouts, flow control and, with `livePush` negotiated, staying
/// live (CHANGED → PULL → BATCH → ACK).
///
/// It holds every bit of protocol state and nothing else: it never touches a channel, a
/// database or a clock. `SyncSessionHandler` turns what happens on the connection into
/// ``Event``s (the time comes with each) and carries out the ``Action``s they return, in order:
/// writing frames, running database work on its queue and handing the result back as an event,
/// scheduling timers. That keeps the rules testable without sockets
/// (SessionStateMachineTests).
struct SyncSessionStateMachine {
    enum Role: String {
        case client, server
        var peerName: String { self == .client ? "server" : "client" }
    }

    struct Configuration {
        var role: Role
        var schema: LocalSchema
        var options: SyncOptions
        /// Whether to send BYE once caught up both ways (the client of `syncOnce`).
        var byeWhenCaughtUp: Bool
        /// Whether this side offers `livePush` (it keeps the session open after catch-up).
        var offersLive: Bool
        /// Whether the session checks for local changes itself (every `changeCheckInterval`); a
        /// server's sessions are told by its `LocalChangeMonitor` instead.
        var checksLocalChanges: Bool
    }

    enum Phase {
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

    /// The session's timers; scheduling one that is pending schedules it once more.
    enum Timer: Hashable, CaseIterable {
        /// The peer's HELLO is due (`helloTimeout`).
        case hello
        /// The idle and ping deadlines are checked (`heartbeatTick`).
        case heartbeat
        /// A one-shot side that never pulls waits this long for the peer's first PULL.
        case readOnlyWait
        /// The session checks for local changes itself (`changeCheckInterval`).
        case changeCheck
        /// A kept-open session without `livePush` pulls again (`pollInterval`).
        case poll
        /// Pulling starts again after a change did not fit, or after a deferral.
        case pullRetry
    }

    /// What the database work queued so far is awaited for.
    enum DrainReason: Equatable {
        /// The peer's BYE is answered once the work in progress is done.
        case answerBye
        /// The session is over: its outcome is reported once everything it committed is counted.
        case finish
    }

    enum Event {
        /// The handler joined the pipeline: the HELLO timeout starts.
        case started
        case tlsHandshakeCompleted(peerFingerprint: String)
        case received(WireMessage)
        /// The decoder, TLS or the network failed.
        case errorCaught(any Error)
        /// A frame this side wrote could not be sent.
        case sendFailed(MessageType, any Error)
        case writabilityChanged(isWritable: Bool)
        case databaseCompleted(DatabaseResult)
        case databaseFailed(DatabaseRequest, any Error)
        /// The database work asked for before `awaitDatabaseIdle` is done.
        case databaseIdle(DrainReason)
        case timerFired(Timer)
        /// This database's changes now go through `through` (a server's `LocalChangeMonitor`).
        case localChangesCommitted(through: Int64)
        /// The owner says the database may have new changes (`SyncConnection.notifyLocalChanges`).
        case localChangeCheckRequested
        /// The owner stops a live session (BYE).
        case byeRequested
        /// A test hook cut the connection after a batch was applied (`.batchApplied`), as a
        /// network failure would.
        case connectionCut
        /// The channel went inactive or the handler left the pipeline.
        case connectionClosed
    }

    enum Action {
        case send(WireMessage)
        case runDatabase(DatabaseRequest)
        /// Answer `.databaseIdle(reason)` once the database work asked for so far is done.
        case awaitDatabaseIdle(DrainReason)
        case schedule(Timer, in: TimeAmount)
        case cancel(Timer)
        case cancelAllTimers
        /// Flow control (§8.5): stop reading from the connection, or read again.
        case pauseReading
        case resumeReading
        /// `lz4` was negotiated: frames may be compressed both ways.
        case enableCompression
        /// The peer's HELLO was accepted (the totals and metrics count a session).
        case sessionOpened(peer: InstanceKey)
        /// The session failed, with its first error (metrics).
        case sessionFailed(SyncSessionError)
        /// The connection closed (metrics: one session less open).
        case sessionClosed
        /// A progress snapshot; the handler adds the byte counts.
        case reportProgress(SyncSessionProgress)
        /// Both directions are caught up (the `caughtUp` promise).
        case caughtUp(peer: InstanceKey)
        /// A batch from the peer was applied and committed, before its ACK (`onBatchApplied`).
        /// A test hook may cut the connection here: the handler then tells `.connectionCut` and
        /// carries out none of the actions after this one.
        case batchApplied(changes: Int, appliedSoFar: Int)
        case close
        /// The session is over and its database work drained: how it ended (the handler adds
        /// the byte counts to a summary), and why catch-up failed if it was never reported.
        case finish(caughtUpFailure: SyncSessionError?, result: Result<SyncSummary, SyncSessionError>)
    }

    let configuration: Configuration
    private var options: SyncOptions { configuration.options }
    private var schema: LocalSchema { configuration.schema }
    private var role: Role { configuration.role }

    /// The actions of the event being handled, and its time.
    private var actions: [Action] = []
    private var now: NIODeadline

    private(set) var phase = Phase.handshaking
    /// The connection is closed: no more database work, timers or reports of progress.
    private(set) var completed = false
    private var failure: SyncSessionError?
    private(set) var summary = SyncSummary()
    private var peerKey: InstanceKey?
    /// The SHA-256 fingerprint of the peer's certificate, from the TLS handshake.
    private var peerFingerprint: String?
    /// What the peer may do, known once its HELLO is accepted.
    private var peerPolicy = PeerPolicy()
    /// What both sides sync (§8.2), known once the peer's HELLO is accepted.
    private var shared = SharedSchema.everything

    /// Where pulling what became shared since the last session stands (§8.3).
    enum BackfillState: Equatable {
        /// The peer's schema is recorded with the first cursor read, which says what to backfill.
        case unrecorded
        /// Nothing to backfill, or done.
        case done
        /// Pulling it: the backfill PULLs go out, from `resumeAfter`, until a batch with `isLast`.
        case running(Backfill, resumeAfter: Int64)
    }
    private(set) var backfill = BackfillState.unrecorded
    /// The PULL awaiting its BATCH is a backfill.
    private var outstandingPullIsBackfill = false
    /// Responder: the BATCH owed answers a backfill PULL (it is not acknowledged).
    private var owedBatchIsBackfill = false
    private var pendingDatabaseWork = 0

    // Live.
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

    // Progress.
    private var changesExpectedToSend: Int?
    private var changesExpectedToReceive: Int?
    /// The highest `latest` the peer announced with CHANGED (0: none).
    private var peerLatest: Int64 = 0

    // Deadlines.
    private var lastReceived: NIODeadline
    private var lastSent: NIODeadline
    private var lastPingNonce: UInt64 = 0
    /// Flow control (§8.5): since when the send buffer has been above its high-water mark, with
    /// reading paused (nil: writable, reading).
    private(set) var blockedSince: NIODeadline?
    /// Whether the peer sent at least one PULL.
    private var receivedAnyPull = false

    // Requester side: pulling the peer's changes.
    /// The `after` of the PULL awaiting its BATCH.
    private(set) var outstandingPull: Int64?
    /// Batches received and not yet applied (at most two: one applying, the next one pulled meanwhile).
    private(set) var batchesBeingApplied = 0
    private var batchesApplied = 0
    /// The `through` of a batch received while another was being applied: its PULL goes out once
    /// that other one is applied, so that no more than two batches are ever held.
    private var deferredPull: Int64?
    /// Whether this side asks for whole rows: a partial change (§7.2) left out values it did not hold.
    private var wantsWholeRows = false
    /// The `maxChanges` of this side's PULLs: the configured one, made smaller while batches do
    /// not fit on the disk, and grown back as they do.
    private(set) var pullChangeLimit: Int
    /// Pulling waits for the `pullRetry` timer before it starts again: after a single change did
    /// not fit (`noRoomRetryDelay`), or after deferring the peer's batch (`clockSkewRetryInterval`).
    private var pullRetryPending = false
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
    private(set) var unacknowledged: [Int64] = []

    init(_ configuration: Configuration, now: NIODeadline) {
        self.configuration = configuration
        self.now = now
        lastReceived = now
        lastSent = now
        pullChangeLimit = max(1, configuration.options.batchLimits.maximumChanges)
    }

    /// Whether the session failed or its connection closed: actions decided before that are moot.
    var hasEnded: Bool { phase == .failed || completed }

    /// Applies `event`, which happened at `now`; returns what to do, in order.
    mutating func handle(_ event: Event, now: NIODeadline) -> [Action] {
        self.now = now
        switch event {
        case .started: schedule(.hello, in: options.helloTimeout)
        case let .tlsHandshakeCompleted(fingerprint): handshakeCompleted(peerFingerprint: fingerprint)
        case let .received(message): received(message)
        case let .errorCaught(error): errorCaught(error)
        case let .sendFailed(type, error): sendFailed(type, error)
        case let .writabilityChanged(writable): writabilityChanged(writable)
        case let .databaseCompleted(result): databaseCompleted(result)
        case let .databaseFailed(request, error): databaseFailed(request, error)
        case .databaseIdle(.answerBye):
            write(.bye(reason: ""))
            close()
        case .databaseIdle(.finish): finish()
        case let .timerFired(timer): timerFired(timer)
        case let .localChangesCommitted(latest): localChangesCommitted(through: latest)
        case .localChangeCheckRequested: checkLocalChanges()
        case .byeRequested: sayBye()
        case .connectionCut:
            phase = .failed
            record(.connectionClosed(during: "catch-up"))
            close()
        case .connectionClosed: complete()
        }
        let result = actions
        actions = []
        return result
    }

    // MARK: Timers

    static func describe(_ amount: TimeAmount) -> String {
        let milliseconds = amount.nanoseconds / 1_000_000
        return milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
    }

    private mutating func schedule(_ timer: Timer, in delay: TimeAmount) {
        actions.append(.schedule(timer, in: delay))
    }

    private mutating func timerFired(_ timer: Timer) {
        switch timer {
        case .hello:
            guard phase == .handshaking else { return }
            fail(.timeout("no HELLO from the \(role.peerName) within \(Self.describe(options.helloTimeout)) of connecting"))
        case .heartbeat:
            heartbeat()
        case .readOnlyWait:
            guard phase == .open, !receivedAnyPull else { return }
            sentLast = true
            checkCaughtUp()
        case .changeCheck:
            checkLocalChanges()
            scheduleChangeCheck()
        case .poll:
            guard let peer = peerKey else { return }
            // Not while the peer is still catching up from this side: its changes then are ours echoed.
            guard caughtUpReported else { return schedulePoll() }
            guard phase == .open, outstandingPull == nil, !applying, receivedLast else { return }
            receivedLast = false
            pull(from: peer)
        case .pullRetry:
            pullRetryPending = false
            if let peer = peerKey { restartPullsIfIdle(peer) }
        }
    }

    /// Checks the idle timeout and sends PING when due, then checks again a tick later.
    private mutating func scheduleHeartbeat() {
        guard !completed else { return }
        schedule(.heartbeat, in: options.heartbeatTick)
    }

    private mutating func heartbeat() {
        guard !completed else { return }
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

    // MARK: Connection events

    private mutating func handshakeCompleted(peerFingerprint: String) {
        guard phase == .handshaking else { return }
        self.peerFingerprint = peerFingerprint
        send(.hello(Hello(instanceKey: schema.instanceKey, schemaFingerprint: schema.fingerprint, capabilities: offeredCapabilities,
                          tables: schema.tables, renames: schema.renames)))
    }

    private mutating func errorCaught(_ error: any Error) {
        guard phase == .handshaking || phase == .open else {
            // After BYE (sent or received) the catch-up is complete: a failing close changes nothing.
            return close()
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
        close()
    }

    /// Flow control (§8.5): while the send buffer is above its high-water mark, this side reads
    /// nothing more, so that no request of the peer's can make it buffer more; a peer that does not
    /// drain the buffer within the idle timeout is timed out (see `heartbeat`).
    private mutating func writabilityChanged(_ writable: Bool) {
        if writable {
            if blockedSince != nil {
                blockedSince = nil
                lastReceived = now
                actions.append(.resumeReading)
            }
        } else if blockedSince == nil, phase == .open {
            blockedSince = now
            actions.append(.pauseReading)
        }
    }

    private mutating func sendFailed(_ type: MessageType, _ error: any Error) {
        guard phase == .handshaking || phase == .open else { return }
        if let wire = error as? WireError {
            fail(.cannotSend(message: "\(type)", wire))
        } else {
            record(.transport("could not send \(type): \(error)"))
            phase = .failed
            close()
        }
    }

    private mutating func received(_ message: WireMessage) {
        lastReceived = now
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

    // MARK: Handshake (§8.2)

    private mutating func receivedHello(_ hello: Hello) {
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
        switch SharedSchema.negotiate(mine: schema, theirs: hello, peerRole: role.peerName) {
        case let .success(negotiated): shared = negotiated
        case let .failure(mismatch):
            return fail(.schemaMismatch(table: mismatch.table, column: mismatch.column, message: mismatch.message))
        }
        phase = .open
        actions.append(.cancel(.hello))
        scheduleHeartbeat()
        peerKey = hello.instanceKey
        actions.append(.sessionOpened(peer: hello.instanceKey))
        peerPolicy = options.policy(for: hello.instanceKey)
        summary.peer = hello.instanceKey
        let negotiated = offeredCapabilities.negotiated(with: hello.capabilities)
        if negotiated.contains(.livePush) {
            live = true
            scheduleChangeCheck()
        }
        defers = negotiated.contains(.deferrals)
        if negotiated.contains(.lz4) {
            actions.append(.enableCompression)
        }
        announceLatest()
        if peerPolicy.readOnly {
            // This side does not accept the peer's changes: it never pulls from it (§8.3).
            receivedLast = true
            if configuration.byeWhenCaughtUp {
                // If the peer does not accept ours either, it never pulls: without its first PULL
                // within the idle timeout, there is nothing to do both ways (see `idleTimeout`).
                schedule(.readOnlyWait, in: options.idleTimeout)
            }
        } else {
            pull(from: hello.instanceKey)
        }
    }

    /// Tells the peer, right after the handshake, how far this database's changes go (one CHANGED,
    /// sent whatever the capabilities, §8.4), so that it can show how much it expects to receive.
    private mutating func announceLatest() {
        runDatabase(.readLastSequence)
    }

    private mutating func announcedLatest(_ latest: Int64) {
        guard phase == .open, latest > 0, announced == 0 else { return }
        announced = latest
        send(.changed(latest: latest))
    }

    private var offeredCapabilities: Capabilities {
        var offered: Capabilities = [.lz4, .deferrals, .livePush]
        if !configuration.offersLive || !options.testHooks.offersLivePush { offered.remove(.livePush) }
        if !options.testHooks.offersDeferrals { offered.remove(.deferrals) }
        return offered
    }

    // MARK: Live (§8.4)

    private mutating func receivedChanged(_ latest: Int64, from peer: InstanceKey) {
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

    private mutating func scheduleChangeCheck() {
        guard configuration.checksLocalChanges, !completed, let interval = options.changeCheckInterval else { return }
        schedule(.changeCheck, in: max(.milliseconds(1), interval))
    }

    /// Whether this session stays open once caught up (it is not a `syncOnce`).
    private var keptOpen: Bool { configuration.offersLive && !configuration.byeWhenCaughtUp }

    /// Without `livePush`, a kept-open session learns of the peer's new changes by pulling again (§8.4).
    private mutating func schedulePoll() {
        guard !completed else { return }
        schedule(.poll, in: max(.milliseconds(1), options.pollInterval))
    }

    /// Sends CHANGED if this database has changes beyond what the peer was sent and it is not pulling.
    private mutating func checkLocalChanges() {
        guard live, phase == .open, sentLast, !owesBatch, !checkingChanges else { return }
        checkingChanges = true
        runDatabase(.readLastSequenceIncludingExternalWrites)
    }

    /// This database's changes now go through `latest` (a server's `LocalChangeMonitor` tells its
    /// sessions): CHANGED if the peer lacks them and is not pulling; otherwise remembered, and
    /// announced once the peer's pull is answered (`announceIfBehind`).
    private mutating func localChangesCommitted(through latest: Int64) {
        localLatest = max(localLatest, latest)
        announceIfBehind()
    }

    private mutating func announceIfBehind() {
        guard live, phase == .open, sentLast, !owesBatch, localLatest > sentThrough, localLatest > announced else { return }
        announced = localLatest
        send(.changed(latest: localLatest))
    }

    // MARK: Requester: pulling the peer's changes (§8.3)

    /// Sends PULL after `after` with this side's limits; it is outstanding until its BATCH arrives.
    /// Called directly for the PULL that follows a batch not yet applied (§8.3 pipelining).
    private mutating func sendPull(after: Int64, resumingResync: Bool = false, backfill: Backfill? = nil) {
        outstandingPull = after
        outstandingPullIsBackfill = backfill != nil
        outstandingPullGeneration = pullGeneration
        let limits = options.batchLimits
        // Bytes in proportion to changes while the batches are made smaller for lack of room.
        let maxBytes = pullChangeLimit >= limits.maximumChanges ? limits.maximumBytes
            : Int(clamping: Int64(limits.maximumBytes) * Int64(pullChangeLimit) / Int64(max(1, limits.maximumChanges)))
        send(.pull(Pull(after: after, resumingResync: resumingResync, maxChanges: max(1, pullChangeLimit),
                        maxBytes: max(1, maxBytes), wholeRows: wantsWholeRows, backfill: backfill)))
    }

    /// Sends the next PULL, from this database's cursor on the peer (the first read records the
    /// peer's schema, and says what to backfill).
    private mutating func pull(from peer: InstanceKey, previousAfter: Int64? = nil) {
        let recording = backfill == .unrecorded
            ? PeerSchemaRecord(shared: shared.sharedColumns(of: schema), differences: shared.differences) : nil
        runDatabase(.readCursor(peer: peer, previousAfter: previousAfter, recording: recording))
    }

    private mutating func cursorRead(after: Int64, resyncing: Bool, previousAfter: Int64?, newlyShared: [String: [String]]) {
        if let previousAfter, after <= previousAfter, !resyncing {
            return fail(.batchRejected("the cursor on the \(role.peerName) did not advance past \(previousAfter) although its batch was not the last"))
        }
        if backfill == .unrecorded {
            // Columns or tables shared since the last session: their rows the peer wrote before this
            // side had them, which the cursor has passed, come first by backfill PULLs (§8.3). A
            // cursor at 0 or a full resync brings every row anyway.
            backfill = .done
            if !newlyShared.isEmpty, let peer = peerKey {
                if after > 0, !resyncing {
                    backfill = .running(shared.backfill(of: newlyShared, through: after), resumeAfter: 0)
                } else {
                    runDatabase(.completeBackfill(peer: peer, shared: shared.sharedColumns(of: schema)))
                }
            }
        }
        if case let .running(request, resumeAfter) = backfill {
            return sendPull(after: resumeAfter, backfill: request)
        }
        if changesExpectedToReceive == nil, peerLatest > 0 {
            estimateReceiving(cursor: after)
            reportProgress()
        }
        sendPull(after: after, resumingResync: resyncing)
    }

    private mutating func receivedBatch(_ batch: ChangeBatch, from peer: InstanceKey) {
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
        let synced = Set(schema.tables.map(\.name))
        if let table = batch.tables.first(where: { !synced.contains($0.name) }) {
            return fail(.tableNotAllowed("the batch names table \(table.name), which this peer does not sync"))
        }
        if let allowed = peerPolicy.allowedTables,
           let change = batch.changes.first(where: { batch.tableConcerned(by: $0).map(allowed.contains) != true }) {
            let name = batch.tableConcerned(by: change) ?? "#\(change.table)"
            return fail(.tableNotAllowed("the batch from \(peer) changes table \(name), which this peer does not accept from it (allowed: \(allowed.sorted().joined(separator: ", ")))"))
        }
        outstandingPull = nil
        batchesBeingApplied += 1
        summary.batchesReceived += 1
        summary.changesReceived += batch.changes.count
        if outstandingPullIsBackfill {
            // Applied before the next backfill PULL; not acknowledged: the cursor stays where it is.
            return runDatabase(.apply(BatchApply(batch: batch, peer: peer, generation: pullGeneration, pipelined: false, backfill: true)))
        }
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
        runDatabase(.apply(BatchApply(batch: batch, peer: peer, generation: pullGeneration, pipelined: pipelined)))
    }

    /// Counted whatever became of the session since: the apply is committed.
    private mutating func count(_ report: ApplyReport) {
        summary.applied += report.applied
        summary.unchanged += report.unchanged
        summary.keptAside += report.keptAside
        summary.conflicts += report.conflicts.count
    }

    private mutating func batchApplied(_ outcome: BatchOutcome, _ apply: BatchApply) {
        let batch = apply.batch, peer = apply.peer
        batchesBeingApplied -= 1
        guard apply.generation == pullGeneration, case let .applied(report) = outcome else {
            // Nothing of the batch was applied: partial changes this database cannot complete,
            // or no room on the disk for the whole batch; or it followed such a one (applied
            // after the gap, but the cursor waits). The pulls start again from the cursor,
            // asking for whole rows, or for smaller batches. The batch is not counted as
            // received: its changes come again.
            if apply.generation == pullGeneration {
                switch outcome {
                case .needsWholeRows: wantsWholeRows = true
                case let .noRoom(reason):
                    if let failure = shrinkPullsForLackOfRoom(reason) { return fail(failure) }
                case let .tooFarAhead(ahead, limit) where apply.backfill:
                    pauseBackfill(ahead: ahead, limit: limit)
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
        if apply.backfill { return backfillApplied(batch, report, from: peer) }
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
        actions.append(.batchApplied(changes: batch.changes.count, appliedSoFar: batchesApplied))
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
            if !live, keptOpen { schedulePoll() }
        } else if !apply.pipelined {
            pull(from: peer, previousAfter: batch.after)
        }
    }

    /// A backfill batch was applied: the next backfill PULL, or once the last is in, the backfill
    /// is recorded as done and the ordinary pulls start from the cursor.
    private mutating func backfillApplied(_ batch: ChangeBatch, _ report: ApplyReport, from peer: InstanceKey) {
        reportProgress()
        actions.append(.batchApplied(changes: batch.changes.count, appliedSoFar: batchesApplied))
        guard case let .running(request, _) = backfill else { return }
        if batch.isLast {
            backfill = .done
            runDatabase(.completeBackfill(peer: peer, shared: shared.sharedColumns(of: schema)))
            pull(from: peer)
        } else {
            backfill = .running(request, resumeAfter: batch.through)
            sendPull(after: batch.through, backfill: request)
        }
    }

    /// A backfill batch carries a timestamp further ahead of this clock than it accepts. It is
    /// not acknowledged, so there is nothing to tell the peer (§8.3): a session kept open pulls
    /// it again, from where the backfill got to, once this clock may have caught up; a
    /// `syncOnce` session goes on with the ordinary pulls and leaves the backfill, not recorded
    /// as done, to the next session.
    private mutating func pauseBackfill(ahead: Duration, limit: Duration) {
        summary.deferredFromPeer = SyncError.clockSkew(ahead: ahead, limit: limit).description
        guard keptOpen else {
            backfill = .done
            return
        }
        schedulePullRetry(in: clockSkewRetryDelay(ahead: ahead, limit: limit))
    }

    /// A batch did not fit on the disk: the next ones are made smaller (an eighth), so that what
    /// room there is gets used and sync goes on as soon as some is freed. When a single change does
    /// not fit, a session kept open tries again after `noRoomRetryDelay`; a `syncOnce` session
    /// gives up (the returned error).
    private mutating func shrinkPullsForLackOfRoom(_ reason: String) -> SyncSessionError? {
        guard pullChangeLimit == 1 else {
            pullChangeLimit = max(1, pullChangeLimit / 8)
            return nil
        }
        guard keptOpen else {
            return .storage(operation: "apply the \(role.peerName)'s changes", reason: "not even one change fits on the disk: \(reason)")
        }
        schedulePullRetry(in: options.noRoomRetryDelay)
        return nil
    }

    private mutating func schedulePullRetry(in delay: TimeAmount) {
        guard !completed else { return }
        pullRetryPending = true
        schedule(.pullRetry, in: delay)
    }

    /// The peer's batch (after `after` through `through`) carries a timestamp further ahead of
    /// this clock than it accepts: nothing of it was applied. With `deferrals` negotiated only
    /// this direction pauses (§8.3): DEFERRED goes out once no pull is in progress, and pulling
    /// starts again from the cursor when this clock may have caught up (or the limit was
    /// raised); a `syncOnce` session leaves the rest for a later session. The other direction
    /// goes on either way.
    private mutating func deferPeerBatch(after: Int64, through: Int64, ahead: Duration, limit: Duration) {
        let reason = SyncError.clockSkew(ahead: ahead, limit: limit).description
        let retry = clockSkewRetryDelay(ahead: ahead, limit: limit)
        pendingDeferral = (Deferral(after: after, through: through, reason: .clockSkew,
                                    retryAfterMilliseconds: UInt64(max(0, retry.nanoseconds / 1_000_000)),
                                    message: Self.truncated(reason, maxBytes: options.wireLimits.maxStringLength)), retry)
        summary.deferredFromPeer = reason
    }

    /// When this clock may have caught up with a timestamp `ahead` of it (at least 100 ms, at most
    /// `clockSkewRetryInterval`, after which a raised limit is noticed too).
    private func clockSkewRetryDelay(ahead: Duration, limit: Duration) -> TimeAmount {
        let catchUp = ahead - limit
        let nanoseconds = Int64(clamping: catchUp.components.seconds * 1_000_000_000 + catchUp.components.attoseconds / 1_000_000_000)
        return min(options.clockSkewRetryInterval, max(.milliseconds(100), .nanoseconds(nanoseconds)))
    }

    /// A batch answering an abandoned pull was discarded: a DEFERRED not yet sent covers it too.
    private mutating func coverInPendingDeferral(_ through: Int64) {
        guard let pending = pendingDeferral, through > pending.deferral.through else { return }
        pendingDeferral?.deferral.through = through
    }

    /// Pulls again from the cursor, once nothing of the abandoned pulls is in progress; a
    /// deferral waiting for that moment is sent first.
    private mutating func restartPullsIfIdle(_ peer: InstanceKey) {
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
        guard !pullRetryPending else { return }
        restartPending = false
        receivedLast = false
        pull(from: peer)
    }

    // MARK: Responder: serving the peer's pulls (§8.3)

    private mutating func receivedPull(_ pull: Pull, from peer: InstanceKey) {
        guard !owesBatch else { return fail(.protocolViolation("a PULL while the answer to the previous one is still owed")) }
        owesBatch = true
        owedBatchIsBackfill = pull.backfill != nil
        receivedAnyPull = true
        runDatabase(.extract(peer: peer, pull: pull, restriction: ExtractRestriction(
            allowedTables: peerPolicy.allowedTables, shared: shared,
            marksInFlight: peerPolicy.allowedTables == nil && !shared.leavesOutTables(of: schema))))
    }

    private mutating func extracted(_ batch: ChangeBatch, latest: Int64) {
        owesBatch = false
        if owedBatchIsBackfill {
            // Not acknowledged, and no part of the ordinary catch-up (§8.3).
            owedBatchIsBackfill = false
            summary.batchesSent += 1
            summary.changesSent += batch.changes.count
            send(.batch(batch))
            return reportProgress()
        }
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

    private mutating func receivedAck(_ through: Int64, from peer: InstanceKey) {
        // The requester acknowledges its cursor, which is a sent batch's `through` or, when its
        // apply waits for a gap, less: never more than the last batch sent.
        guard let last = unacknowledged.last, through <= last else {
            return fail(.protocolViolation("ACK through \(through), beyond every batch sent and not yet acknowledged"))
        }
        unacknowledged.removeAll { $0 <= through }
        runDatabase(.acknowledge(peer: peer, through: through))
    }

    /// The peer did not apply this side's newest batches (§8.3): their rows stay pending, the
    /// reason is recorded for `tether status`, and the peer pulls them again when it can. A
    /// `syncOnce` session counts this direction as over (the summary says why).
    private mutating func receivedDeferral(_ deferral: Deferral, from peer: InstanceKey) {
        guard defers else { return fail(.protocolViolation("DEFERRED, but the deferrals capability was not negotiated")) }
        guard !owesBatch, let newest = unacknowledged.last, deferral.through == newest, deferral.after < newest else {
            return fail(.protocolViolation("DEFERRED after \(deferral.after) through \(deferral.through), which is not the newest batch sent and not yet acknowledged (\(unacknowledged.last.map(String.init) ?? "none"))"))
        }
        unacknowledged.removeAll()
        summary.deferredByPeer = deferral.message
        runDatabase(.recordDeferral(peer: peer, deferral))
    }

    // MARK: Closing (§8.6)

    private mutating func receivedError(code: WireErrorCode, message: String) {
        record(.peerError(code: code, message: message))
        phase = .failed
        close()
    }

    private mutating func receivedBye() {
        phase = .byeReceived
        // Answer once the database work in progress (an acknowledgement, an apply) is done.
        actions.append(.awaitDatabaseIdle(.answerBye))
    }

    /// Sends BYE (a graceful close): the owner of a live session stops it.
    private mutating func sayBye() {
        switch phase {
        case .open:
            phase = .byeSent
            lastReceived = now
            write(.bye(reason: "stopped"))
        case .handshaking:
            phase = .failed
            record(.connectionClosed(during: "the handshake"))
            close()
        case .byeSent, .byeReceived, .failed:
            return
        }
    }

    private mutating func checkCaughtUp() {
        guard phase == .open || phase == .byeReceived, receivedLast, !applying, !restartPending, outstandingPull == nil, sentLast, !owesBatch,
              unacknowledged.isEmpty,
              pendingDatabaseWork == 0 else { return }
        if !caughtUpReported {
            caughtUpReported = true
            reportProgress()
            actions.append(.caughtUp(peer: peerKey ?? schema.instanceKey))
        }
        // A side that never pulls from its peer (a read-only peer) has nothing left to do either,
        // unless the session stays open (live).
        if configuration.byeWhenCaughtUp || (peerPolicy.readOnly && !live), phase == .open {
            phase = .byeSent
            write(.bye(reason: "caught up"))
        }
    }

    private mutating func complete() {
        guard !completed else { return }
        completed = true
        pullRetryPending = false
        actions.append(.cancelAllTimers)
        actions.append(.sessionClosed)
        // Database work still queued (a batch being applied) finishes first: the summary then
        // counts everything that was committed.
        actions.append(.awaitDatabaseIdle(.finish))
    }

    /// Reports the session's final summary or error.
    private mutating func finish() {
        reportProgress()
        if let failure {
            return actions.append(.finish(caughtUpFailure: caughtUpReported ? nil : failure, result: .failure(failure)))
        }
        switch phase {
        case .byeSent, .byeReceived:
            actions.append(.finish(caughtUpFailure: caughtUpReported ? nil : .connectionClosed(during: "catch-up"), result: .success(summary)))
        case .handshaking, .open, .failed:
            let error = SyncSessionError.connectionClosed(during: phase == .handshaking ? "the handshake"
                                                                   : caughtUpReported ? "the live session" : "catch-up")
            actions.append(.finish(caughtUpFailure: caughtUpReported ? nil : error, result: .failure(error)))
        }
    }

    // MARK: Progress

    /// The number of sequence numbers after `cursor` through `latest` (0 if none), as an Int.
    private static func span(from cursor: Int64, to latest: Int64) -> Int {
        latest > cursor ? Int(clamping: latest.subtractingReportingOverflow(cursor).partialValue) : 0
    }

    /// Expects what was received so far plus the peer's announced sequences after `cursor`.
    private mutating func estimateReceiving(cursor: Int64) {
        guard peerLatest > 0 else { return }
        changesExpectedToReceive = summary.changesReceived + Self.span(from: cursor, to: peerLatest)
    }

    private mutating func reportProgress() {
        actions.append(.reportProgress(SyncSessionProgress(done: summary, changesExpectedToSend: changesExpectedToSend,
                                                           changesExpectedToReceive: changesExpectedToReceive, caughtUp: caughtUpReported)))
    }

    // MARK: Sending and failing

    /// Sends `message` unless the session failed; the idle deadline for PING counts from now.
    private mutating func send(_ message: WireMessage) {
        guard phase != .failed else { return }
        lastSent = now
        actions.append(.send(message))
    }

    /// Sends the last word (ERROR, BYE) whatever the phase.
    private mutating func write(_ message: WireMessage) {
        actions.append(.send(message))
    }

    /// Fails the session: sends ERROR with the error's code and description (`message` if given), then closes.
    private mutating func fail(_ error: SyncSessionError, message: String? = nil) {
        guard phase != .failed else { return }
        record(error)
        phase = .failed
        let text = Self.truncated(message ?? error.description, maxBytes: options.wireLimits.maxStringLength)
        write(.error(code: error.code, message: text))
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

    private mutating func record(_ error: SyncSessionError) {
        guard failure == nil else { return }
        failure = error
        actions.append(.sessionFailed(error))
    }

    private mutating func close() {
        actions.append(.close)
    }

    // MARK: Database work

    /// Asks for `request` to run on the session's serial queue; its result comes back as an event.
    private mutating func runDatabase(_ request: DatabaseRequest) {
        guard !completed else { return }
        pendingDatabaseWork += 1
        actions.append(.runDatabase(request))
    }

    private mutating func databaseCompleted(_ result: DatabaseResult) {
        pendingDatabaseWork -= 1
        // Counted even if the session ended meanwhile: the apply's effect is in the database.
        if case let .applied(.applied(report), _) = result { count(report) }
        guard !completed, phase == .open || phase == .byeReceived else { return }
        switch result {
        case let .lastSequence(latest):
            announcedLatest(latest)
        case let .lastSequenceIncludingExternalWrites(latest):
            checkingChanges = false
            localChangesCommitted(through: latest)
        case let .cursor(after, resyncing, previousAfter, newlyShared):
            cursorRead(after: after, resyncing: resyncing, previousAfter: previousAfter, newlyShared: newlyShared)
        case .backfillCompleted:
            break
        case let .extracted(batch, latest):
            extracted(batch, latest: latest)
        case let .applied(outcome, apply):
            batchApplied(outcome, apply)
        case .acknowledged:
            reportProgress()
            checkCaughtUp()
        case .deferralRecorded:
            if !keptOpen { sentLast = true }
            reportProgress()
            checkCaughtUp()
        }
        // Whatever work ends last (an apply, an ACK, a change check) may be what the
        // catch-up was waiting for.
        if !caughtUpReported { checkCaughtUp() }
    }

    private mutating func databaseFailed(_ request: DatabaseRequest, _ error: any Error) {
        pendingDatabaseWork -= 1
        let operation = request.operation
        if let storage = error as? DatabaseError, storage.isStorageFailure {
            fail(.storage(operation: operation, reason: "\(storage)"))
        } else if case .apply = request {
            fail(.batchRejected("could not \(operation): \(error)"))
        } else {
            fail(.database(operation: operation, reason: "\(error)"))
        }
    }
}
