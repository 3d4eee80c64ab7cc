import Dispatch
#if canImport(Glibc)
    import Glibc
#endif
import NIOConcurrencyHelpers
import NIOCore
import Tether
import TetherWire

/// One sync session on one connection: drives a `SyncSessionStateMachine` (the rules of §8 of
/// Protocol/README.md) with what happens on the channel, and carries out what it decides.
///
/// It sits last in the pipeline (TLSHandler → message decoder → message
/// encoder → session) and lives on its channel's event loop. Database work
/// (extract, apply, acknowledge, cursors) runs on the session's own serial
/// queue, in the order it was asked for, and its results come back to the
/// event loop.
final class SyncSessionHandler: ChannelInboundHandler {
    typealias InboundIn = WireMessage
    typealias OutboundOut = WireMessage
    typealias Role = SyncSessionStateMachine.Role
    private typealias Action = SyncSessionStateMachine.Action
    private typealias Event = SyncSessionStateMachine.Event

    private var machine: SyncSessionStateMachine
    private let database: Database
    private let queue: DispatchQueue
    private let eventLoop: EventLoop
    private let decoderHandler: WireMessageDecoderHandler
    private let encoderHandler: WireMessageEncoderHandler
    private var context: ChannelHandlerContext?
    private var timers: [SyncSessionStateMachine.Timer: Scheduled<Void>] = [:]

    // Progress.
    private let bytes: FrameByteCounter
    private let progress: AsyncStream<SyncSessionProgress>.Continuation?
    private let totals: SyncTotalsRecorder?
    private let metrics: SessionMetrics
    private let log: SessionLog
    /// The summary as last added to `totals`.
    private var reportedToTotals = SyncSummary()
    /// Why the peer may not sync under the key it declared, once the session's first request
    /// found it: set and read on the session's queue only, so that no later request runs.
    private let peerRefusal = NIOLockedValueBox<(any Error)?>(nil)
    /// The newest pull generation a batch of which was not applied (deferred, or to be pulled again
    /// whole or smaller): set and read on the session's queue only, so that a batch of it pipelined
    /// behind is discarded, not applied past the gap (§8.3).
    private let abandonedGeneration = NIOLockedValueBox<Int?>(nil)
    /// Bounds the evaluation of the peer's interest in this session's extractions, and stops it
    /// when the connection closes: it runs on the database queue the server's sessions share.
    private let interestBudget: InterestBudget
    /// The read of this database a catch-up to the peer is served from (used on the session's queue).
    private let catchUpSnapshot = CatchUpSnapshot()

    /// Succeeds (with the peer's instance key) once both directions received a last batch and everything
    /// sent was acknowledged.
    let caughtUp: EventLoopPromise<InstanceKey>
    /// Whether `caughtUp` was completed: an action list cut short by the session's end (a send
    /// that failed at once) may drop the `.caughtUp` the machine already counted as reported.
    private var caughtUpSettled = false
    /// Completes when the connection is closed: the summary after a graceful BYE, otherwise the error.
    let finished: EventLoopPromise<SyncSummary>
    /// Succeeds once the session is over and its database work queue has drained.
    let drained: EventLoopPromise<Void>

    init(
        role: Role, database: Database, schema: LocalSchema, options: SyncOptions, decoder: WireMessageDecoderHandler,
        encoder: WireMessageEncoderHandler, bytes: FrameByteCounter, byeWhenCaughtUp: Bool, offersLive: Bool = false,
        progress: AsyncStream<SyncSessionProgress>.Continuation? = nil, totals: SyncTotalsRecorder? = nil,
        metrics: SyncMetrics,
        databaseQueue: DispatchQueue? = nil, eventLoop: EventLoop, remoteAddress: String? = nil
    ) {
        machine = SyncSessionStateMachine(
            .init(
                role: role, schema: schema, options: options, byeWhenCaughtUp: byeWhenCaughtUp,
                offersLive: offersLive), now: .now())
        self.bytes = bytes
        self.progress = progress
        self.totals = totals
        self.metrics = SessionMetrics(metrics)
        log = SessionLog(options.logger, role: role, remoteAddress: remoteAddress)
        self.database = database
        self.decoderHandler = decoder
        self.encoderHandler = encoder
        // A server's sessions share one thread for their database work (`databaseQueue`): most of
        // it takes the writer anyway, and a queue of their own each made a thread per busy session.
        queue = DispatchQueue(label: "tether.sync.session.\(role.rawValue)", target: databaseQueue)
        self.eventLoop = eventLoop
        interestBudget = InterestBudget(timeLimit: .nanoseconds(options.interestTimeLimit.nanoseconds))
        caughtUp = eventLoop.makePromise()
        finished = eventLoop.makePromise()
        drained = eventLoop.makePromise()
    }

    /// The pipeline could not be set up: nothing will ever happen on this session.
    func abandon(_ error: any Error) {
        let failure = SyncSessionError.transport("could not set up the connection: \(error)")
        caughtUpSettled = true
        caughtUp.fail(failure)
        finished.fail(failure)
        drained.succeed(())
    }

    // MARK: Channel events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        Self.enableKeepalive(on: context.channel)
        handle(.started)
    }

    /// TCP keepalive: a peer whose host vanished or whose network was cut is noticed by the kernel
    /// (probes after 60 s of silence, every 10 s, six of them: about two minutes), without waking the
    /// session, whose heartbeats are minutes apart once it is quiet (§8.5). Best effort.
    private static func enableKeepalive(on channel: any Channel) {
        guard let options = channel.syncOptions else { return }
        try? options.setOption(ChannelOptions.socketOption(.so_keepalive), value: 1)
        #if canImport(Glibc)
            for (name, value) in [(TCP_KEEPIDLE, 60), (TCP_KEEPINTVL, 10), (TCP_KEEPCNT, 6)] {
                try? options.setOption(ChannelOptions.tcpOption(NIOBSDSocket.Option(rawValue: name)), value: value)
            }
        #endif
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        interestBudget.cancel()
        handle(.connectionClosed)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let handshake = event as? TLSHandshakeCompleted {
            log.handshakeCompleted(peer: handshake.peer)
            handle(.tlsHandshakeCompleted(peer: handshake.peer))
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        handle(.errorCaught(error))
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        handle(.writabilityChanged(isWritable: context.channel.isWritable))
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        interestBudget.cancel()
        handle(.connectionClosed)
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        handle(.received(unwrapInboundIn(data)))
    }

    // MARK: The owner's requests (on the event loop)

    /// Sends CHANGED if this database has changes beyond what the peer was sent and it is not pulling.
    func checkLocalChanges() {
        handle(.localChangeCheckRequested)
    }

    /// This database's changes now go through `latest` (a `LocalChangeMonitor` tells the
    /// sessions): CHANGED if the peer lacks them and is not pulling; otherwise remembered, and
    /// announced once the peer's pull is answered.
    func localChangesCommitted(through latest: Int64) {
        handle(.localChangesCommitted(through: latest))
    }

    /// Sends BYE (a graceful close): the owner of a live session stops it.
    func sayBye() {
        handle(.byeRequested)
    }

    // MARK: Driving the state machine

    private func handle(_ event: Event) {
        let actions = machine.handle(event, now: .now())
        let endedBefore = machine.hasEnded
        for action in actions {
            // An event handled while carrying these out (a write that failed at once, the test
            // hook cutting the connection) ended the session: the rest was decided before that.
            guard endedBefore || !machine.hasEnded else { return }
            execute(action)
        }
    }

    private func execute(_ action: Action) {
        switch action {
        case let .send(message):
            send(message)
        case let .runDatabase(request):
            run(request)
        case let .awaitDatabaseIdle(reason):
            let idle = eventLoop.makePromise(of: Void.self)
            queue.async { idle.succeed(()) }
            idle.futureResult.assumeIsolated().whenComplete { [self] _ in handle(.databaseIdle(reason)) }
        case let .schedule(timer, delay):
            timers[timer] = eventLoop.assumeIsolated().scheduleTask(in: delay) { [self] in handle(.timerFired(timer)) }
        case let .cancel(timer):
            timers.removeValue(forKey: timer)?.cancel()
        case .cancelAllTimers:
            for timer in timers.values { timer.cancel() }
            timers.removeAll()
        case .sessionClosed:
            metrics.sessionClosed()
        case .pauseReading:
            try? context?.channel.syncOptions?.setOption(ChannelOptions.autoRead, value: false)
        case .resumeReading:
            try? context?.channel.syncOptions?.setOption(ChannelOptions.autoRead, value: true)
            context?.read()
        case .enableCompression:
            decoderHandler.acceptCompressedFrames()
            encoderHandler.enableCompression()
        case let .enableColumnarBatches(compact):
            decoderHandler.acceptColumnarBatches(compact: compact)
            encoderHandler.enableColumnarBatches(compact: compact)
        case let .sessionOpened(peer):
            totals?.sessionStarted()
            metrics.sessionOpened(peer: peer)
            log.sessionOpened(peer: peer)
        case let .sessionFailed(error):
            metrics.sessionFailed(error)
            log.sessionFailed(error)
        case let .reportProgress(snapshot):
            reportProgress(snapshot)
        case let .caughtUp(peer):
            caughtUpSettled = true
            caughtUp.succeed(peer)
        case let .batchApplied(batch, changes, appliedSoFar):
            log.batchApplied(batch)
            let options = machine.configuration.options
            options.onBatchApplied?(changes)
            if let hook = options.testHooks.batchAppliedHook, !hook(appliedSoFar) {
                handle(.connectionCut)
            }
        case let .batchStaged(batch, stagedSoFar):
            log.batchStaged(batch)
            if let hook = machine.configuration.options.testHooks.batchStagedHook, !hook(stagedSoFar) {
                handle(.connectionCut)
            }
        case .close:
            context?.close(promise: nil)
        case let .finish(caughtUpFailure, result):
            // Logged first: whoever awaits the end may read the log at once.
            log.finished(result)
            progress?.finish()
            // After the work queued before it: the snapshot is used on the queue only.
            let snapshot = catchUpSnapshot
            queue.async { snapshot.close() }
            drained.succeed(())
            if !caughtUpSettled {
                caughtUpSettled = true
                let failure: any Error
                switch result {
                case let .failure(error): failure = caughtUpFailure ?? error
                case .success: failure = caughtUpFailure ?? SyncSessionError.connectionClosed(during: "catch-up")
                }
                caughtUp.fail(failure)
            }
            switch result {
            case let .success(summary): finished.succeed(withByteCounts(summary))
            case let .failure(error): finished.fail(error)
            }
        }
    }

    private func send(_ message: WireMessage) {
        guard let context else { return }
        if case let .batch(batch) = message { log.batchSent(batch) }
        let promise = eventLoop.makePromise(of: Void.self)
        promise.futureResult.assumeIsolated().whenFailure { [self] error in
            handle(.sendFailed(message.type, error))
        }
        context.writeAndFlush(wrapOutboundOut(message), promise: promise)
    }

    /// `summary` with the frame bytes counted so far.
    private func withByteCounts(_ summary: SyncSummary) -> SyncSummary {
        var summary = summary
        summary.bytesSent = bytes.sent
        summary.bytesReceived = bytes.received
        return summary
    }

    /// Adds what changed to the totals and sends the progress snapshot, with the byte counts.
    private func reportProgress(_ snapshot: SyncSessionProgress) {
        var snapshot = snapshot
        snapshot.done = withByteCounts(snapshot.done)
        totals?.add(from: reportedToTotals, to: snapshot.done)
        reportedToTotals = snapshot.done
        metrics.progressed(to: snapshot.done)
        progress?.yield(snapshot)
    }

    // MARK: Database work

    /// Runs `request` on the session's serial queue; its result goes to the state machine on the event loop.
    private func run(_ request: DatabaseRequest) {
        let promise = eventLoop.makePromise(of: DatabaseResult.self)
        let database = self.database
        let metrics = self.metrics.shared
        let peerRefusal = self.peerRefusal
        let abandonedGeneration = self.abandonedGeneration
        let interestBudget = self.interestBudget
        let snapshot = catchUpSnapshot
        queue.async {
            if let refusal = peerRefusal.withLockedValue({ $0 }) { return promise.fail(refusal) }
            if case let .apply(apply) = request, let abandoned = abandonedGeneration.withLockedValue({ $0 }),
                apply.generation <= abandoned
            {
                return promise.succeed(.applied(.discarded, apply))
            }
            do {
                let result = try request.perform(
                    on: database, metrics: metrics, interestBudget: interestBudget, snapshot: snapshot)
                if case let .applied(outcome, apply) = result, !outcome.wasAccepted {
                    abandonedGeneration.withLockedValue { $0 = apply.generation }
                }
                promise.succeed(result)
            } catch {
                switch request {
                case .confirmPeerIdentity, .pinPeerIdentity: peerRefusal.withLockedValue { $0 = error }
                default: break
                }
                promise.fail(error)
            }
        }
        promise.futureResult.assumeIsolated().whenComplete { [self] result in
            switch result {
            case let .success(value): handle(.databaseCompleted(value))
            case let .failure(error): handle(.databaseFailed(request, error))
            }
        }
    }
}
