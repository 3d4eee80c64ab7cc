// Other connections' commits: watching for them while someone observes, reading them back from the changelog,
// and trying a failed read-back again.

import Foundation
import Logging
import Synchronization

extension ObservationBroker {
    /// Where reading the changelog back has reached (writer only).
    struct ReadBackCursor {
        /// Sequence numbers through which the changelog has been reported (own commits or read back).
        fileprivate var knownSequence: Int64 = 0
        /// This process's commits since `knownSequence`, which reading the changelog back must skip.
        fileprivate var ownSequences: [ClosedRange<Int64>] = []
        fileprivate var lastDataVersion: Int64 = 0

        /// Starts from where the changelog ends and the data version that stands for.
        mutating func start(sequence: Int64, dataVersion: Int64) {
            knownSequence = sequence
            lastDataVersion = dataVersion
            ownSequences.removeAll()
        }

        mutating func noteOwn(_ sequences: ClosedRange<Int64>) {
            if let last = ownSequences.last, last.upperBound + 1 >= sequences.lowerBound {
                ownSequences[ownSequences.count - 1] = last.lowerBound...max(last.upperBound, sequences.upperBound)
            } else {
                ownSequences.append(sequences)
            }
        }
    }

    /// The broker's watch of other connections' commits, and the retry of a read-back that failed:
    /// used from any thread, under their locks.
    struct OtherProcessesWatch: ~Copyable {
        /// Other connections' commits, told by `externalCommits` while something observes.
        fileprivate let monitor = Mutex<Int?>(nil)
        /// Failed read-backs in a row, and whether a retry is scheduled (at most one is).
        fileprivate let readBackRetry = Mutex((failures: 0, scheduled: false))
        fileprivate let readBackRetryQueue = DispatchQueue(label: "tether.observation.read-back-retry")
    }

    /// Whether other processes' commits are watched (then this process's commits are remembered,
    /// see `ReadBackCursor.ownSequences`).
    var monitorsOtherProcesses: Bool { otherProcesses.monitor.withLock { $0 != nil } }

    /// Starts or stops watching for other processes' commits as subscriptions come and go.
    func monitorIfNeeded() {
        guard let database, !database.isMemory, let interval = database.configuration.observationPollInterval else {
            return
        }
        let wanted = subscriptions.withLock { !$0.isEmpty }
        otherProcesses.monitor.withLock { monitor in
            if wanted, monitor == nil {
                monitor = externalCommits.subscribe(pollInterval: interval) { [weak self] in
                    self?.checkOtherProcesses()
                }
            } else if !wanted, let id = monitor {
                externalCommits.unsubscribe(id)
                monitor = nil
            }
        }
    }

    /// Stops watching other processes' commits for good: the database closes.
    func stopWatchingOtherProcesses() {
        otherProcesses.monitor.withLock { monitor in
            if let id = monitor { externalCommits.unsubscribe(id) }
            monitor = nil
        }
        externalCommits.stop()
    }

    /// One poll: cheap (`PRAGMA data_version` on the writer) unless another connection committed.
    /// A read-back that fails is logged and tried again (`retryReadBack`): the watch calls again
    /// only for a later commit, which may never come.
    func checkOtherProcesses() {
        guard let database else { return }
        do {
            try database.writeWithoutTransaction { connection in try readOtherProcessesChanges(connection) }
        } catch {
            return readBackFailed(error, logger: database.configuration.logger)
        }
        let failed = otherProcesses.readBackRetry.withLock { retry in
            defer { retry.failures = 0 }
            return retry.failures
        }
        if failed > 0 {
            database.configuration.logger.notice(
                "read back other connections' commits after failed attempts",
                metadata: ["tether.failed-attempts": "\(failed)"])
        }
    }

    /// Milliseconds to wait before trying a failed read-back again, by failures in a row (the last
    /// repeated while it fails): a busy writer is waited for briefly, a failing disk once a second.
    static let readBackRetryDelays: [Int] = [10, 100, 1000]

    /// Logs a failed read-back — the first of a run at `error`, the next ones at `debug` — and
    /// schedules a retry unless one is.
    private func readBackFailed(_ error: any Error, logger: Logger) {
        let (failures, schedules) = otherProcesses.readBackRetry.withLock { retry in
            retry.failures += 1
            defer { retry.scheduled = true }
            return (retry.failures, !retry.scheduled)
        }
        let delay = Self.readBackRetryDelays[min(failures, Self.readBackRetryDelays.count) - 1]
        let metadata: Logger.Metadata = [
            "tether.error": "\(error)", "tether.failed-attempts": "\(failures)", "tether.retry-in-ms": "\(delay)",
        ]
        if failures == 1 {
            logger.error("could not read back other connections' commits; trying again", metadata: metadata)
        } else {
            logger.debug("could not read back other connections' commits again", metadata: metadata)
        }
        guard schedules else { return }
        otherProcesses.readBackRetryQueue.asyncAfter(deadline: .now() + .milliseconds(delay)) { [weak self] in
            self?.retryReadBack()
        }
    }

    /// Tries a failed read-back again, while other connections' commits are watched.
    private func retryReadBack() {
        otherProcesses.readBackRetry.withLock { $0.scheduled = false }
        guard monitorsOtherProcesses else {
            otherProcesses.readBackRetry.withLock { $0.failures = 0 }
            return
        }
        checkOtherProcesses()
    }

    /// When another connection committed since the last look: its changes to synced tables are
    /// read back from the changelog (after folding what triggers recorded of other programs'
    /// writes); a commit that left nothing there is reported as an unknown change.
    func readOtherProcessesChanges(_ connection: Connection) throws {
        guard isActive else { return }
        let version = try connection.fetchValue("PRAGMA data_version", as: Int64.self) ?? 0
        guard version != readBackCursor.lastDataVersion else {
            // Nobody else wrote: this process's commits are all there is up to now.
            if let last = readBackCursor.ownSequences.last {
                readBackCursor.knownSequence = max(readBackCursor.knownSequence, last.upperBound)
            }
            readBackCursor.ownSequences.removeAll()
            return
        }
        try injectedReadBackFailure()
        guard let changelog else {
            readBackCursor.lastDataVersion = version
            return publishUnknownChange()
        }
        let own = readBackCursor.ownSequences
        try changelog.foldExternalWrites(connection)
        // The fold's own commit is not one of this process's changes: it stands for other programs'.
        readBackCursor.ownSequences = own
        // The changes, where the changelog ends and the data version they stand for, read in one
        // snapshot: read apart, a commit landing in between had its changes skipped (counted as
        // read) or its data version taken as seen, and was never told.
        let (readBack, last, readVersion) = try connection.transaction(.deferred) {
            let readVersion = try connection.fetchValue("PRAGMA data_version", as: Int64.self) ?? version
            return (
                try changelog.changes(after: readBackCursor.knownSequence, connection),
                try changelog.lastStoredSequence(connection), readVersion
            )
        }
        let events = readBack.compactMap { event -> DatabaseEvent? in
            if let sequence = event.sequence, own.contains(where: { $0.contains(sequence) }) { return nil }
            guard case .local = event.origin else { return event }
            // Made on this database, but not by this process.
            return event.from(.external)
        }
        let first = readBackCursor.knownSequence + 1
        readBackCursor.knownSequence = max(readBackCursor.knownSequence, last)
        readBackCursor.ownSequences.removeAll()
        readBackCursor.lastDataVersion = readVersion
        if !events.isEmpty {
            let models = committedModels.isEmpty ? [:] : committedModels.readModels(of: events, connection)
            let sequences: ClosedRange<Int64>? = first <= last ? first...last : nil
            publish(TransactionChanges(events), sequences: sequences, isReadBack: true, models: models)
        }
        publishUnknownChange(outside: changelog.recordedTables)
    }
}
