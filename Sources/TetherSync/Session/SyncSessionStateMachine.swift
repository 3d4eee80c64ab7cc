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
///
/// Its ``State`` carries what each stage of the session knows (swift-nio-ssh's
/// `SSHConnectionStateMachine`): the handshake's, then the open session's — what the handshake
/// negotiated, the requester, the responder, liveness — kept through closing and failing. The
/// rules live in `StateMachine/`, one file per section of §8; this file keeps the events, the
/// actions and their dispatch.
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
        /// Whether this side offers `livePush` (it keeps the session open after catch-up). Its
        /// owner's `LocalChangeMonitor` tells a live session of this database's new changes.
        var offersLive: Bool
    }

    /// Where the session stands, with what it knows there.
    enum State {
        /// Waiting for the TLS handshake, then the peer's HELLO (§8.2).
        case handshaking(HandshakingState)
        /// The peer's HELLO was accepted: catching up both ways (§8.3), then live (§8.4).
        case open(OpenState)
        /// BYE sent or received (§8.6), with what the session knew while open (nil: BYE came
        /// before HELLO).
        case closing(Closing, OpenState?)
        /// ERROR sent or received, or the connection failed: the first error, with what the
        /// session knew while open (nil: it failed before).
        case failed(SyncSessionError, OpenState?)
    }

    /// How a graceful close (§8.6) began.
    enum Closing: Equatable {
        /// BYE sent: nothing more is sent; reading until the peer's BYE or the end.
        case byeSent
        /// BYE received (and answered once the database work in progress is done).
        case byeReceived
    }

    /// The session's timers; scheduling one that is pending schedules it once more.
    enum Timer: Hashable, CaseIterable {
        /// The peer's HELLO is due (`helloTimeout`).
        case hello
        /// The idle or ping deadline, whichever comes first, has come (`nextHeartbeat`).
        case heartbeat
        /// A one-shot side that never pulls waits this long for the peer's first PULL.
        case readOnlyWait
        /// A kept-open session without `livePush` pulls again (`pollInterval`).
        case poll
        /// Pulling starts again after a change did not fit, or after a deferral.
        case pullRetry
        /// The peer's ACK is recorded (`deferAcknowledgement`).
        case acknowledgement
    }

    /// How long an ACK waits for an extraction to follow (`deferAcknowledgement`).
    static let acknowledgementDelay = TimeAmount.milliseconds(2)

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
        case tlsHandshakeCompleted(peer: PeerIdentity)
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
        /// This database's changes now go through `through` (a `LocalChangeMonitor`: a commit in
        /// this process, or another process's commit it noticed).
        case localChangesCommitted(through: Int64)
        /// The owner says the database may have new changes (`SyncConnection.notifyLocalChanges`).
        case localChangeCheckRequested
        /// The owner stops a live session (BYE).
        case byeRequested
        /// A test hook cut the connection after a batch was applied or staged (`.batchApplied`,
        /// `.batchStaged`), as a network failure would.
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
        /// `columnarBatches` was negotiated: BATCH bodies in batch format 3 both ways (§7.5), or 4
        /// when `compactColumns` was too (`compact`, §7.6).
        case enableColumnarBatches(compact: Bool)
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
        /// `changes`: the batch's, and those of the batches staged with it.
        case batchApplied(ChangeBatch, changes: Int, appliedSoFar: Int)
        /// A batch of a catch-up was staged, to be applied with its last one (`batchStagedHook`).
        case batchStaged(ChangeBatch, stagedSoFar: Int)
        case close
        /// The session is over and its database work drained: how it ended (the handler adds
        /// the byte counts to a summary), and why catch-up failed if it was never reported.
        case finish(caughtUpFailure: SyncSessionError?, result: Result<SyncSummary, SyncSessionError>)
    }

    let configuration: Configuration
    var options: SyncOptions { configuration.options }
    var schema: LocalSchema { configuration.schema }
    var role: Role { configuration.role }

    /// The actions of the event being handled, and its time.
    var actions: [Action] = []
    var now: NIODeadline

    var state: State
    /// The connection is closed: no more database work, timers or reports of progress.
    var completed = false
    /// What the session did, reported whatever its state (an apply committed after a failure counts).
    var summary = SyncSummary()
    var caughtUpReported = false
    var changesExpectedToSend: Int?
    var changesExpectedToReceive: Int?
    var pendingDatabaseWork = 0
    /// Heartbeats, the idle timeout and flow control, from the start to the end of the connection:
    /// kept apart from `state`, whose payload each access would copy (it is read on every frame).
    var liveness: Liveness

    init(_ configuration: Configuration, now: NIODeadline) {
        self.configuration = configuration
        self.now = now
        liveness = Liveness(since: now)
        state = .handshaking(HandshakingState())
    }

    /// Whether the session failed or its connection closed: actions decided before that are moot.
    var hasEnded: Bool { state.isFailed || completed }

    /// Applies `event`, which happened at `now`; returns what to do, in order.
    mutating func handle(_ event: Event, now: NIODeadline) -> [Action] {
        self.now = now
        switch event {
        case .started: schedule(.hello, in: options.helloTimeout)
        case let .tlsHandshakeCompleted(peer): handshakeCompleted(peer: peer)
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
            enterFailed(.connectionClosed(during: "catch-up"))
            close()
        case .connectionClosed: complete()
        }
        let result = actions
        actions = []
        return result
    }

    private mutating func received(_ message: WireMessage) {
        liveness.lastReceived = now
        switch message {
        case .ping, .pong: break
        default: noteActivity()
        }
        switch state {
        case .failed, .closing(.byeReceived, _):
            return
        case .closing(.byeSent, _):
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
            guard state.isHandshaking else { return fail(.protocolViolation("a second HELLO")) }
            receivedHello(hello)
        default:
            guard state.isOpen, let peer = peerKey else {
                return fail(.protocolViolation("\(message.type) before HELLO"))
            }
            switch message {
            case let .pull(pull): receivedPull(pull, from: peer)
            case let .batch(batch): receivedBatch(batch, from: peer)
            case let .ack(through): receivedAck(through, from: peer)
            case let .ping(nonce): send(.pong(nonce))
            case let .changed(latest): receivedChanged(latest, from: peer)
            case let .deferred(deferral): receivedDeferral(deferral, from: peer)
            case let .history(mark): receivedHistory(mark)
            case let .scope(announcement): receivedScope(announcement)
            case let .refused(refusals): receivedRefusals(refusals, from: peer)
            case let .pong(nonce):
                // The peer is alive (its arrival reset the idle deadline), and reads what it is sent.
                receivedPong(nonce)
            case .hello, .error, .bye:
                return
            }
        }
    }

    // MARK: Timers

    static func describe(_ amount: TimeAmount) -> String {
        let milliseconds = amount.nanoseconds / 1_000_000
        return milliseconds % 1000 == 0 ? "\(milliseconds / 1000) s" : "\(milliseconds) ms"
    }

    mutating func schedule(_ timer: Timer, in delay: TimeAmount) {
        actions.append(.schedule(timer, in: delay))
    }

    private mutating func timerFired(_ timer: Timer) {
        switch timer {
        case .hello:
            guard state.isHandshaking else { return }
            fail(
                .timeout(
                    "no HELLO from the \(role.peerName) within \(Self.describe(options.helloTimeout)) of connecting"))
        case .heartbeat:
            heartbeat()
        case .readOnlyWait:
            guard state.isOpen, !responder.receivedAnyPull else { return }
            responder.sentLast = true
            checkCaughtUp()
        case .poll:
            guard let peer = peerKey else { return }
            // Not while the peer is still catching up from this side: its changes then are ours echoed.
            guard caughtUpReported else { return schedulePoll() }
            guard state.isOpen, requester.outstandingPull == nil, !requester.applying, requester.receivedLast else {
                return
            }
            requester.receivedLast = false
            pull(from: peer)
        case .pullRetry:
            requester.pullRetryPending = false
            if let peer = peerKey { restartPullsIfIdle(peer) }
        case .acknowledgement:
            recordAcknowledgement()
        }
    }

    // MARK: Progress

    /// The number of sequence numbers after `cursor` through `latest` (0 if none), as an Int.
    static func span(from cursor: Int64, to latest: Int64) -> Int {
        latest > cursor ? Int(clamping: latest.subtractingReportingOverflow(cursor).partialValue) : 0
    }

    /// Expects what was received so far plus the peer's announced sequences after `cursor`.
    mutating func estimateReceiving(cursor: Int64) {
        guard requester.peerLatest > 0 else { return }
        changesExpectedToReceive = summary.changesReceived + Self.span(from: cursor, to: requester.peerLatest)
    }

    mutating func reportProgress() {
        actions.append(
            .reportProgress(
                SyncSessionProgress(
                    done: summary, changesExpectedToSend: changesExpectedToSend,
                    changesExpectedToReceive: changesExpectedToReceive, caughtUp: caughtUpReported)))
    }

    // MARK: Sending

    /// Sends `message` unless the session failed, counted for the heartbeats (`countSent`).
    mutating func send(_ message: WireMessage) {
        guard !state.isFailed else { return }
        countSent(message)
        actions.append(.send(message))
    }

    /// Sends the last word (ERROR, BYE) whatever the state.
    mutating func write(_ message: WireMessage) {
        actions.append(.send(message))
    }

    mutating func close() {
        actions.append(.close)
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
}
