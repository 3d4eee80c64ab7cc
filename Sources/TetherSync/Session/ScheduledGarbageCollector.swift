import Dispatch
import Foundation
import Logging
import NIOConcurrencyHelpers
import Tether

/// Runs a server's garbage collection as its ``GarbageCollectionSchedule`` says: every
/// `interval`, and soon after `afterDeletes` tombstones were written since the last run. Every
/// run goes on one serial queue of its own (never on an event loop, never two at once); the
/// writer is free between its steps (`Database.collectGarbage(_:)`).
///
/// The trigger after large deletes costs the writers nothing: the server's change monitor tells
/// how far the sequence went (`sequenceAdvanced(to:)`, a comparison); only once it went
/// `afterDeletes` further are the tombstones since the last run counted (a range of the sequence
/// index), on the queue.
final class ScheduledGarbageCollector: Sendable {
    private struct State {
        var stopped = false
        /// The timer armed last: one armed before it does nothing when it fires.
        var timer = 0
        /// This database's last sequence when the last run (or the collector) started: the
        /// tombstones after it were written since.
        var sequenceAtLastRun: Int64 = 0
        /// The sequence when the tombstones were last counted: counted again once it went `afterDeletes` further.
        var sequenceAtLastCount: Int64 = 0
        var countQueued = false
        /// When each peer close to the horizon was last logged as such (at most once a day each).
        var closeToHorizonLogged: [InstanceKey: Date] = [:]
    }

    private let database: Database
    private let schedule: GarbageCollectionSchedule
    private let queue = DispatchQueue(label: "tether.sync.server.garbage-collection", qos: .utility)
    private let metrics: GarbageCollectionMetrics
    private let logger: Logger
    private let state = NIOLockedValueBox(State())

    init(database: Database, schedule: GarbageCollectionSchedule, metrics: GarbageCollectionMetrics, logger: Logger) {
        self.database = database
        self.schedule = schedule
        self.metrics = metrics
        self.logger = logger
    }

    /// Notes where the sequence stands and how many tombstones are kept, then arms the first run
    /// an interval from now.
    func start() {
        guard schedule.isEnabled else { return }
        queue.async { [self] in
            do {
                noteRun(startedAt: try database.lastSequence())
                metrics.keptTombstones(try database.tombstoneCount())
            } catch {
                logger.warning("garbage collection: could not read the database as the server started: \(error)")
            }
        }
        if let interval = schedule.interval { run(.schedule, after: interval) }
    }

    /// No run starts after this; returns once the one under way, if any, is over (the database
    /// can close then).
    func stop() async {
        state.withLockedValue { $0.stopped = true }
        await withCheckedContinuation { (drained: CheckedContinuation<Void, Never>) in queue.async { drained.resume() }
        }
    }

    /// This database's changes go through `latest` (called on the event loop by the change
    /// monitor): once that is `afterDeletes` past the last count, the tombstones written since the
    /// last run are counted, on the queue, and a run follows `catchUpDelay` later if there are that
    /// many (time for the peers online to acknowledge them).
    func sequenceAdvanced(to latest: Int64) {
        guard let threshold = schedule.afterDeletes else { return }
        let count = state.withLockedValue { state -> Bool in
            guard !state.stopped, !state.countQueued, latest - state.sequenceAtLastCount >= Int64(threshold) else {
                return false
            }
            state.countQueued = true
            return true
        }
        guard count else { return }
        queue.async { [self] in
            let since = state.withLockedValue { $0.sequenceAtLastRun }
            let written: Int
            do {
                written = try database.tombstoneCount(after: since)
            } catch {
                logger.warning(
                    "garbage collection: could not count the tombstones written since the last run: \(error)")
                written = 0
            }
            state.withLockedValue {
                $0.countQueued = false
                $0.sequenceAtLastCount = max($0.sequenceAtLastCount, latest)
            }
            if written >= threshold { run(.deletes(delay: schedule.catchUpDelay), after: schedule.catchUpDelay) }
        }
    }

    /// Why a run starts.
    private enum Trigger: CustomStringConvertible {
        case schedule
        /// Large deletes, `delay` after them (or after the run before, which left them kept).
        case deletes(delay: Duration)
        /// The run before stopped at its time limit.
        case catchUp

        var description: String {
            switch self {
            case .schedule: "scheduled"
            case .deletes: "after large deletes"
            case .catchUp: "going on after the time limit"
            }
        }
    }

    /// Arms the timer of the next run (a timer armed before does nothing then). It holds the
    /// collector weakly: a server gone does not wait for it.
    private func run(_ trigger: Trigger, after delay: Duration) {
        let timer = state.withLockedValue { state -> Int? in
            guard !state.stopped else { return nil }
            state.timer += 1
            return state.timer
        }
        guard let timer else { return }
        queue.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: delay.wholeNanoseconds))) { [weak self] in
            guard let self, state.withLockedValue({ !$0.stopped && $0.timer == timer }) else { return }
            runNow(trigger)
        }
    }

    /// One run, on the queue; then the next is armed (`next(after:)`).
    private func runNow(_ trigger: Trigger) {
        dispatchPrecondition(condition: .onQueue(queue))
        guard !state.withLockedValue({ $0.stopped }) else { return }
        let report: Database.GarbageCollectionReport
        do {
            let sequence = try database.lastSequence()
            report = try database.collectGarbage(schedule.runOptions)
            noteRun(startedAt: sequence)
        } catch {
            metrics.failed()
            logger.error(
                "garbage collection failed (the next run is at the next interval): \(error)",
                metadata: ["tether.gc.trigger": "\(trigger)"])
            if let interval = schedule.interval { run(.schedule, after: interval) }
            return
        }
        metrics.record(report)
        log(report, trigger: trigger)
        next(after: report, trigger: trigger)
    }

    /// A run that stopped at its time limit goes on soon; after large deletes that stay kept,
    /// runs follow at twice the delay each time, up to 64 times `catchUpDelay`; otherwise the
    /// next is an interval from now.
    private func next(after report: Database.GarbageCollectionReport, trigger: Trigger) {
        if !report.isComplete {
            // After large deletes, the runs that follow them go on once this one is caught up.
            if case .deletes = trigger {
                run(trigger, after: schedule.catchUpDelay)
            } else {
                run(.catchUp, after: schedule.catchUpDelay)
            }
        } else if case let .deletes(delay) = trigger, let threshold = schedule.afterDeletes,
            report.tombstonesKept >= threshold,
            delay * 2 <= schedule.catchUpDelay * 64
        {
            run(.deletes(delay: delay * 2), after: delay * 2)
        } else if let interval = schedule.interval {
            run(.schedule, after: interval)
        }
    }

    /// A run (or the collector) started at this database's `sequence`: the deletes after it are counted for the next.
    private func noteRun(startedAt sequence: Int64) {
        state.withLockedValue {
            $0.sequenceAtLastRun = sequence
            $0.sequenceAtLastCount = max($0.sequenceAtLastCount, sequence)
        }
    }

    /// A run that removed something or forgot a peer at `info`, each peer forgotten at `notice`
    /// (named by its certificate where one is known); a run that found nothing at `debug`.
    private func log(_ report: Database.GarbageCollectionReport, trigger: Trigger) {
        let metadata: Logger.Metadata = [
            "tether.gc.trigger": "\(trigger)", "tether.gc.tombstones_removed": "\(report.tombstonesRemoved)",
            "tether.gc.evictions_removed": "\(report.evictionsRemoved)",
            "tether.gc.tombstones_kept": "\(report.tombstonesKept)",
            "tether.gc.horizon": "\(report.horizon)", "tether.gc.seconds": "\(report.duration.seconds)",
        ]
        let removedSomething =
            report.tombstonesRemoved > 0 || report.evictionsRemoved > 0 || !report.peersForgotten.isEmpty
        let summary =
            "garbage collection removed \(report.tombstonesRemoved) tombstone(s) and \(report.evictionsRemoved) "
            + "eviction record(s), "
            + "kept \(report.tombstonesKept) tombstone(s)"
            + (report.isComplete ? "" : "; stopped at its time limit, goes on shortly")
        logger.log(level: removedSomething ? .info : .debug, "\(summary)", metadata: metadata)
        let peers = (try? database.peers()) ?? []
        logPeersCloseToTheHorizon(peers)
        guard !report.peersForgotten.isEmpty else { return }
        let known = Dictionary(peers.map { ($0.instanceKey, $0) }, uniquingKeysWith: { first, _ in first })
        let horizon = schedule.forgetPeersAfter.map { "\($0.seconds) s" } ?? "none"
        for key in report.peersForgotten {
            let peer = known[key]
            var peerMetadata: Logger.Metadata = ["tether.peer": "\(key)", "tether.gc.forget_after": "\(horizon)"]
            if let certificate = peer?.certificate {
                peerMetadata["tether.peer_name"] = "\(certificate.name ?? "(no common name)")"
                peerMetadata["tether.peer_fingerprint"] = "\(certificate.fingerprint)"
            }
            let lastSeen = peer?.lastSeen.map { ISO8601DateFormatter().string(from: $0) } ?? "never"
            logger.notice(
                """
                forgot peer \(key) (last seen \(lastSeen)): not seen within the horizon, it no longer holds \
                tombstones back, \
                and gets a full resync if it returns
                """, metadata: peerMetadata)
        }
    }

    /// A remembered peer unseen for more than three quarters of the horizon is logged at `notice`
    /// (once a day at most), so that an operator can bring it back before it is forgotten.
    private func logPeersCloseToTheHorizon(_ peers: [Database.PeerState]) {
        guard let horizon = schedule.forgetPeersAfter?.seconds else { return }
        let now = Date()
        for peer in peers where peer.forgotten == nil {
            guard let lastSeen = peer.lastSeen, now.timeIntervalSince(lastSeen) > horizon * 0.75 else { continue }
            let due = state.withLockedValue { state -> Bool in
                if let logged = state.closeToHorizonLogged[peer.instanceKey], now.timeIntervalSince(logged) < 86_400 {
                    return false
                }
                state.closeToHorizonLogged[peer.instanceKey] = now
                return true
            }
            guard due else { continue }
            let left = max(0, horizon - now.timeIntervalSince(lastSeen))
            logger.notice(
                """
                peer \(peer.instanceKey) (\(peer.certificate?.name ?? "no certificate name")) was last seen \
                \(ISO8601DateFormatter().string(from: lastSeen)): it is forgotten in \(Int(left / 3_600)) h \
                unless it syncs
                """,
                metadata: ["tether.peer": "\(peer.instanceKey)", "tether.gc.seconds_until_forgotten": "\(Int(left))"])
        }
    }
}
