// A whole catch-up applied as its batches arrive: the source extracts the next batch while this
// side applies the one before, as a catch-up applied batch by batch does, and readers still see
// nothing of it until its last batch commits.

import Foundation

/// The catch-ups of one database applied as their batches arrive, at most one per source
/// (`Database.receive` hands them their batches).
///
/// An applier holds the writer from its catch-up's first batch to its last, in one transaction,
/// and gives it up — rolling back, the batches staged on disk all the same — whenever anyone else
/// waits for the writer (a local write, another session's), when no batch came for
/// an idle limit (2 s), or when a batch does not follow the one before. The catch-up is then
/// applied at its end from the staging file, as without an applier; a later batch may start an
/// applier again (at most `maximumStarts` per catch-up: each start applies again what was staged).
final class CatchUpAppliers: @unchecked Sendable {
    /// Starts of an applier for one catch-up (appliers that gave up included).
    static let maximumStarts = 3

    private let lock = NSLock()
    /// How long an applier waits for the next batch before it gives the writer up.
    private var idleLimit: TimeInterval = 2  // guarded by lock
    /// How long a starting applier tries to take a free writer before the catch-up is left to
    /// its end (a short write, a look at the file, may hold it as the catch-up starts).
    private var startWindow: TimeInterval = 0.05  // guarded by lock
    private var bySource: [InstanceKey: CatchUpApplier] = [:]  // guarded by lock
    /// Per source, the catch-up (by the cursor it starts at) last started, and how often.
    private var starts: [InstanceKey: (after: Int64, count: Int)] = [:]  // guarded by lock

    /// `batch`, just staged as the newest of `chain` (not the last of its catch-up): handed to the
    /// applier of its catch-up, or starting one. Waits while the applier is two batches behind, so
    /// that memory stays bounded and the session pulls no faster than this side applies.
    func offer(
        _ batch: ChangeBatch, newestOf chain: StagedCatchUp, _ database: Database, _ engine: SyncEngine,
        staging: StagingFile
    ) {
        let source = batch.source
        lock.lock()
        if let running = bySource[source], running.isRunning {
            lock.unlock()
            if running.hand(batch) { return }
            lock.lock()
        }
        bySource[source]?.giveUp()
        bySource[source] = nil
        var started = starts[source].flatMap { $0.after == chain.after ? $0 : nil } ?? (after: chain.after, count: 0)
        guard started.count < Self.maximumStarts else {
            lock.unlock()
            return
        }
        started.count += 1
        starts[source] = started
        let applier = CatchUpApplier(
            source: source, chainAfter: chain.after, through: batch.through, idleLimit: idleLimit,
            startWindow: startWindow)
        bySource[source] = applier
        lock.unlock()
        // The first batch is at hand; later starts read what was staged back from the file.
        applier.start(database, engine, staging: staging, first: chain.batches == 1 ? batch : nil)
    }

    /// The last batch of a catch-up: applied by the catch-up's applier, after every batch before it,
    /// and committed with them (with `mark`, or the newest staged one, recorded). Nil when no
    /// applier holds them all (none started, it gave up, or an apply failed): the caller applies
    /// the catch-up from the staging file.
    func finish(_ batch: ChangeBatch, mark: HistoryMark?) -> ApplyReport? {
        let source = batch.source
        lock.lock()
        let applier = bySource.removeValue(forKey: source)
        starts[source] = nil
        lock.unlock()
        return applier?.finish(batch, mark: mark)
    }

    /// Sets, for appliers started from now on, how long they wait for a batch before they give
    /// the writer up (`idle`) and how long they try to take a free writer as they start (`start`).
    func setLimits(idle: TimeInterval, start: TimeInterval) {
        lock.lock()
        idleLimit = idle
        startWindow = start
        lock.unlock()
    }

    /// Whether an applier is started and neither done nor giving up: from its first batch's
    /// staging, before its thread has taken the writer (or registered as holding it).
    var anyRunning: Bool {
        lock.lock()
        let appliers = Array(bySource.values)
        lock.unlock()
        return appliers.contains { $0.isRunning }
    }

    /// Waits until the applier of the catch-up from `source` has applied `count` batches (in its
    /// transaction, not committed), or given up, or `timeout` passed: whether it had.
    func waitUntilApplied(_ count: Int, from source: InstanceKey, timeout: TimeInterval) -> Bool {
        lock.lock()
        let applier = bySource[source]
        lock.unlock()
        return applier?.waitUntilApplied(count, timeout: timeout) ?? false
    }

    /// The catch-up from `source` goes (its staged batches dropped): its applier gives up.
    func stop(from source: InstanceKey) {
        lock.lock()
        let applier = bySource.removeValue(forKey: source)
        starts[source] = nil
        lock.unlock()
        applier?.giveUp()
    }
}

/// Applies one catch-up's batches as they arrive, on a thread of its own that holds the writer in
/// one transaction from the first to the last (see `CatchUpAppliers`).
final class CatchUpApplier: @unchecked Sendable {
    /// Batches handed over and not applied yet, at most.
    static let queueLimit = 2

    let source: InstanceKey
    /// The cursor the catch-up starts at (where its first staged batch starts).
    let chainAfter: Int64
    /// The batches staged through here when it started are read back from the staging file.
    private let startThrough: Int64

    private let condition = NSCondition()
    private var queue: [ChangeBatch] = []  // guarded by condition
    /// The `through` of the newest batch handed over: the next must start there.
    private var expectedAfter: Int64  // guarded by condition
    private var givingUp = false  // guarded by condition
    /// The mark of the source's history that came with the last batch.
    private var lastMark: HistoryMark?  // guarded by condition
    /// Batches applied in the transaction so far.
    private var applied = 0  // guarded by condition
    /// Set when the thread is done: the report of the catch-up committed, or nil (rolled back).
    private var outcome: ApplyReport??  // guarded by condition
    /// The acknowledgements postponed for the writer it held, recorded in its transaction.
    private var recordedAcknowledgements: [PostponedAcknowledgements.Entry] = []  // its thread's only

    /// How long the applier waits for the next batch before it gives the writer up.
    let idleLimit: TimeInterval
    /// How long it tries, a millisecond apart, to take a free writer as it starts.
    let startWindow: TimeInterval

    init(source: InstanceKey, chainAfter: Int64, through: Int64, idleLimit: TimeInterval, startWindow: TimeInterval) {
        self.idleLimit = idleLimit
        self.startWindow = startWindow
        self.source = source
        self.chainAfter = chainAfter
        startThrough = through
        expectedAfter = through
    }

    /// Neither done nor giving up.
    var isRunning: Bool {
        condition.lock()
        defer { condition.unlock() }
        return outcome == nil && !givingUp
    }

    /// Hands `batch` over, waiting while the applier is `queueLimit` batches behind. False when the
    /// applier stopped or gave up (or `batch` does not follow): the batch is staged all the same.
    func hand(_ batch: ChangeBatch) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        // Only batches handed here move `expectedAfter`: whether this one follows is known before waiting.
        guard expectedAfter == batch.after else { return false }
        while outcome == nil, !givingUp, queue.count >= Self.queueLimit { condition.wait() }
        guard outcome == nil, !givingUp else { return false }
        queue.append(batch)
        expectedAfter = batch.through
        condition.broadcast()
        return true
    }

    /// Hands over the catch-up's last batch and waits for the commit: its report, or nil when the
    /// catch-up was rolled back (or the applier had stopped before).
    func finish(_ batch: ChangeBatch, mark: HistoryMark?) -> ApplyReport? {
        condition.lock()
        defer { condition.unlock() }
        guard outcome == nil, !givingUp, expectedAfter == batch.after else {
            givingUp = true
            condition.broadcast()
            return nil
        }
        queue.append(batch)
        lastMark = mark
        condition.broadcast()
        while outcome == nil { condition.wait() }
        return outcome ?? nil
    }

    func waitUntilApplied(_ count: Int, timeout: TimeInterval) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        let deadline = Date(timeIntervalSinceNow: timeout)
        while applied < count, outcome == nil, !givingUp {
            guard condition.wait(until: deadline) else { break }
        }
        return applied >= count && outcome == nil && !givingUp
    }

    /// Asks the applier to roll back and give the writer up (it does between two batches).
    func giveUp() {
        condition.lock()
        givingUp = true
        condition.broadcast()
        condition.unlock()
    }

    /// Starts the thread; `first`: the catch-up's first batch, when it is the only one staged.
    func start(_ database: Database, _ engine: SyncEngine, staging: StagingFile, first: ChangeBatch?) {
        let thread = Thread { [self] in
            var report: ApplyReport?
            do {
                // Registered before the writer is taken: a write that starts waiting in between is seen.
                report = try database.writerWaits.whileHolding(self, giveUp: { [self] in giveUp() }) {
                    // A short write may hold the writer as the catch-up starts (a look at the file,
                    // an observer's): tried again for `startWindow`, never waited for (a long write
                    // would stall the session behind the applier's full queue).
                    let deadline = Date(timeIntervalSinceNow: startWindow)
                    while true {
                        if let report = try database.writeIfWriterFree({ conn in
                            try applyCatchUp(first: first, database, engine, staging, conn)
                        }) {
                            return report
                        }
                        guard Date() < deadline, isRunning else { return nil }
                        usleep(1_000)
                    }
                }
            } catch {
                // Rolled back: the catch-up is applied at its end, where an error is reported.
                report = nil
            }
            if report != nil { database.sync.postponedAcknowledgements.recorded(recordedAcknowledgements) }
            condition.lock()
            outcome = .some(report)
            condition.broadcast()
            condition.unlock()
        }
        thread.name = "tether.catch-up-applier"
        thread.stackSize = 8 << 20
        thread.start()
    }

    /// The applier gave the writer up: its transaction rolls back.
    private struct GaveUp: Error {}

    private func applyCatchUp(
        first: ChangeBatch?, _ database: Database, _ engine: SyncEngine, _ staging: StagingFile, _ conn: Connection
    ) throws -> ApplyReport {
        // Another session may have moved the cursor since the first batch was staged.
        guard try conn.peerStore.receiveCursor(of: source)?.receivedThrough ?? 0 == chainAfter else { throw GaveUp() }
        var report: ApplyReport?
        if let first {
            report.combine(with: try engine.apply(first, connection: conn))
            countApplied()
        } else {
            let ids = try staging.withStore { try $0.ids(from: source, through: startThrough) }
            var readAhead = StagedBatchReadAhead(staging, ids: ids)
            while let staged = try readAhead.next() {
                try checkGivingUp(database)
                report.combine(with: try engine.apply(staged, connection: conn))
                readAhead.release(consume staged)
                countApplied()
            }
        }
        while true {
            try checkGivingUp(database)
            let (batch, mark) = try nextBatch()
            report.combine(with: try engine.apply(batch, connection: conn))
            guard batch.isLast else {
                countApplied()
                continue
            }
            let stagedMark = try staging.withStore { try $0.chain(from: source)?.mark }
            if let mark = mark ?? stagedMark { try conn.peerStore.recordHistoryMark(mark, of: source) }
            recordedAcknowledgements = try database.recordPostponedAcknowledgements(conn)
            return report ?? ApplyReport()
        }
    }

    private func countApplied() {
        condition.lock()
        applied += 1
        condition.broadcast()
        condition.unlock()
    }

    private func checkGivingUp(_ database: Database) throws {
        condition.lock()
        let giving = givingUp
        condition.unlock()
        if giving || database.writerWaits.someoneIsWaiting { throw GaveUp() }
    }

    /// The next batch handed over (with the mark that came with the last), waiting at most
    /// `idleLimit`; throws when the applier gives up meanwhile.
    private func nextBatch() throws -> (ChangeBatch, HistoryMark?) {
        condition.lock()
        defer { condition.unlock() }
        let deadline = Date(timeIntervalSinceNow: idleLimit)
        while queue.isEmpty, !givingUp {
            guard condition.wait(until: deadline) else { break }
        }
        guard !givingUp, !queue.isEmpty else {
            givingUp = true
            throw GaveUp()
        }
        let batch = queue.removeFirst()
        condition.broadcast()
        return (batch, batch.isLast ? lastMark : nil)
    }
}
