import CSQLite
import Synchronization

/// How long one extraction may spend evaluating a peer's interest, and the switch that stops it
/// early when the session ends.
///
/// A peer's filter is checked before it is used (one expression over its table's own columns,
/// only `SyncScope.interestFunctions`), so its cost grows with the rows it judges and its own
/// length; the budget bounds what is left. While a scope with an interest is extracted, SQLite's
/// progress handler asks the budget every 1,000 virtual machine instructions, and the extraction
/// stops with `ScopeError` (`.evaluationTooLong`, `.evaluationCancelled`) once the time limit has
/// passed or `cancel()` was called; its transaction is rolled back. A sync server gives each
/// session one budget (`SyncOptions.interestTimeLimit`) and cancels it when the connection closes.
///
/// ```swift
/// let budget = InterestBudget(timeLimit: .seconds(2))
/// let batch = try hub.extractChanges(for: peer, after: cursor, scope: scope, interestBudget: budget)
/// ```
public final class InterestBudget: Sendable {
    /// The time limit when none is given: 10 seconds per extraction.
    public static let defaultTimeLimit = Duration.seconds(10)

    /// How long one extraction (one batch) may take, from its start, while it evaluates an interest.
    public let timeLimit: Duration
    private let cancelled = Atomic<Bool>(false)

    /// A budget of `timeLimit` per extraction, not cancelled.
    public init(timeLimit: Duration = InterestBudget.defaultTimeLimit) {
        self.timeLimit = timeLimit
    }

    /// Stops the extraction evaluating an interest under this budget now, and every later one.
    public func cancel() {
        cancelled.store(true, ordering: .relaxed)
    }

    /// Whether `cancel()` was called.
    public var isCancelled: Bool { cancelled.load(ordering: .relaxed) }
}

/// What SQLite's progress handler consults while an interest is evaluated: the deadline, the
/// budget's switch, and why it stopped the statement (read once the statement fails).
private final class InterestProgressWatch {
    let budget: InterestBudget
    let deadline: ContinuousClock.Instant
    var stop: ScopeError.Reason?

    init(budget: InterestBudget) {
        self.budget = budget
        deadline = ContinuousClock.now.advanced(by: budget.timeLimit)
    }
}

/// SQLite's progress handler: nonzero interrupts the running statement (SQLITE_INTERRUPT).
private func interestProgress(_ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let context else { return 0 }
    let watch = Unmanaged<InterestProgressWatch>.fromOpaque(context).takeUnretainedValue()
    if watch.budget.isCancelled {
        watch.stop = .evaluationCancelled
    } else if ContinuousClock.now > watch.deadline {
        watch.stop = .evaluationTooLong(watch.budget.timeLimit)
    }
    return watch.stop == nil ? 0 : 1
}

extension Connection {
    /// Runs `body`, which evaluates `scope`, under `budget` (a fresh one if nil) when the scope
    /// holds a peer's interest: a statement running past the budget's time limit or after its
    /// `cancel()` is interrupted, and the error `body` throws then is the `ScopeError` naming the
    /// interest's tables and why. Without an interest, just `body`. Does not nest.
    func evaluatingInterest<T>(of scope: SyncScope?, within budget: InterestBudget?, _ body: () throws -> T) throws -> T
    {
        guard let scope, !scope.interest.isEmpty else { return try body() }
        let budget = budget ?? InterestBudget()
        let interestTables = scope.interest.keys.sorted().joined(separator: ", ")
        if budget.isCancelled { throw ScopeError(table: interestTables, reason: .evaluationCancelled) }
        let db = try liveHandle()
        let watch = InterestProgressWatch(budget: budget)
        sqlite3_progress_handler(db, 1_000, interestProgress, Unmanaged.passUnretained(watch).toOpaque())
        defer { sqlite3_progress_handler(db, 0, nil, nil) }
        do {
            return try withExtendedLifetime(watch) { try body() }
        } catch {
            guard let stop = watch.stop else { throw error }
            throw ScopeError(table: interestTables, reason: stop)
        }
    }
}
