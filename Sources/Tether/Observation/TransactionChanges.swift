/// The changes of one transaction as observation collects them, in order: single events, and
/// each bulk insert's rows as runs of consecutive rowids, one entry per run rather than one
/// event per row (a million-row insert would otherwise build, hand over and free a million
/// events for listeners that look at each once). Indexed like the events it stands for.
struct TransactionChanges: RandomAccessCollection {
    /// One entry: a single event, or rows inserted in bulk into `table` (its key is the rowid),
    /// `rowids` in order.
    enum Run {
        case event(DatabaseEvent)
        case inserted(
            table: String, rowids: ClosedRange<Int64>, origin: ChangeOrigin, sourceTransaction: SourceTransaction?)
    }

    /// The changes as collected, in order (for a consumer that handles a bulk insert's run at
    /// once rather than row by row).
    private(set) var runs: [Run] = []
    /// The index of each run's first change.
    private var starts: [Int] = []
    private(set) var count = 0
    /// The transaction of this database's own changes in the commit (known once it commits):
    /// theirs, where they were captured without one.
    var localTransaction: SourceTransaction?

    init() {}

    init(_ events: [DatabaseEvent]) {
        runs = events.map(Run.event)
        starts = Array(events.indices)
        count = events.count
    }

    var startIndex: Int { 0 }
    var endIndex: Int { count }

    subscript(position: Int) -> DatabaseEvent {
        let (run, offset) = locate(position)
        switch runs[run] {
        case let .event(event): return completed(event)
        case let .inserted(table, rowids, origin, source):
            return completed(
                DatabaseEvent(
                    kind: .insert, table: table, rowID: rowids.lowerBound + Int64(offset), keyValues: nil,
                    origin: origin, sourceTransaction: source))
        }
    }

    /// The event with the commit's own transaction when it is a local change captured without one.
    @inline(__always)
    func completed(_ event: DatabaseEvent) -> DatabaseEvent {
        guard event.sourceTransaction == nil, let localTransaction, case .local = event.origin else { return event }
        var event = event
        event.sourceTransaction = localTransaction
        return event
    }

    /// The run holding change `position`, and the change's place in it.
    private func locate(_ position: Int) -> (run: Int, offset: Int) {
        // The last run first: the broker reads back the change it has just added.
        if let last = starts.last, position >= last { return (starts.count - 1, position - last) }
        var low = 0
        var high = starts.count - 1
        while low < high {
            let middle = (low + high + 1) / 2
            if starts[middle] <= position { low = middle } else { high = middle - 1 }
        }
        return (low, position - starts[low])
    }

    mutating func append(_ event: DatabaseEvent) {
        starts.append(count)
        runs.append(.event(event))
        count += 1
    }

    /// Rows inserted in bulk: joined to the run before when they continue it.
    mutating func appendInserted(
        into table: String, rowids: ClosedRange<Int64>, origin: ChangeOrigin,
        sourceTransaction: SourceTransaction? = nil
    ) {
        if case let .inserted(lastTable, lastRowids, lastOrigin, lastSource)? = runs.last,
            lastTable == table, lastOrigin == origin, lastSource == sourceTransaction,
            lastRowids.upperBound &+ 1 == rowids.lowerBound
        {
            runs[runs.count - 1] = .inserted(
                table: table, rowids: lastRowids.lowerBound...rowids.upperBound, origin: origin,
                sourceTransaction: sourceTransaction)
        } else {
            starts.append(count)
            runs.append(.inserted(table: table, rowids: rowids, origin: origin, sourceTransaction: sourceTransaction))
        }
        count += rowids.count
    }

    /// Replaces the single event at `position` (a key read after its statement ran).
    mutating func replaceEvent(at position: Int, with event: DatabaseEvent) {
        let (run, _) = locate(position)
        guard case .event = runs[run] else { return }
        runs[run] = .event(event)
    }

    /// Forgets the changes from `position` on (a failed statement, a savepoint rolled back).
    mutating func removeChanges(from position: Int) {
        guard position < count else { return }
        guard position > 0 else { return removeAll() }
        let (run, offset) = locate(position)
        if offset == 0 {
            runs.removeSubrange(run...)
            starts.removeSubrange(run...)
        } else {
            guard case let .inserted(table, rowids, origin, source) = runs[run] else { return }
            runs[run] = .inserted(
                table: table, rowids: rowids.lowerBound...(rowids.lowerBound + Int64(offset) - 1), origin: origin,
                sourceTransaction: source)
            runs.removeSubrange((run + 1)...)
            starts.removeSubrange((run + 1)...)
        }
        count = position
    }

    mutating func removeAll() {
        localTransaction = nil
        runs.removeAll()
        starts.removeAll()
        count = 0
    }

    /// The tables changed.
    var tables: Set<String> {
        var tables = Set<String>()
        for run in runs {
            switch run {
            case let .event(event): tables.insert(event.table)
            case let .inserted(table, _, _, _): tables.insert(table)
            }
        }
        return tables
    }
}
