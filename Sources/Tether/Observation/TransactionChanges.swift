/// The changes of one transaction as observation collects them, in order: single events, and
/// each bulk insert's rows as runs of consecutive rowids, one entry per run rather than one
/// event per row (a million-row insert would otherwise build, hand over and free a million
/// events for listeners that look at each once). Indexed like the events it stands for.
struct TransactionChanges: RandomAccessCollection {
    private enum Segment {
        case event(DatabaseEvent)
        /// Rows inserted into `table` (its key is the rowid), `rowids` in order.
        case inserted(table: String, rowids: ClosedRange<Int64>, origin: ChangeOrigin)

        var count: Int {
            switch self {
            case .event: 1
            case let .inserted(_, rowids, _): rowids.count
            }
        }
    }

    private var segments: [Segment] = []
    /// The index of each segment's first change.
    private var starts: [Int] = []
    private(set) var count = 0

    init() {}

    init(_ events: [DatabaseEvent]) {
        segments = events.map(Segment.event)
        starts = Array(events.indices)
        count = events.count
    }

    var startIndex: Int { 0 }
    var endIndex: Int { count }

    subscript(position: Int) -> DatabaseEvent {
        let (segment, offset) = locate(position)
        switch segments[segment] {
        case let .event(event): return event
        case let .inserted(table, rowids, origin):
            return DatabaseEvent(kind: .insert, table: table, rowID: rowids.lowerBound + Int64(offset), keyValues: nil, origin: origin)
        }
    }

    /// The segment holding change `position`, and the change's place in it.
    private func locate(_ position: Int) -> (segment: Int, offset: Int) {
        // The last segment first: the broker reads back the change it has just added.
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
        segments.append(.event(event))
        count += 1
    }

    /// Rows inserted in bulk: joined to the run before when they continue it.
    mutating func appendInserted(into table: String, rowids: ClosedRange<Int64>, origin: ChangeOrigin) {
        if case let .inserted(lastTable, lastRowids, lastOrigin)? = segments.last,
           lastTable == table, lastOrigin == origin, lastRowids.upperBound &+ 1 == rowids.lowerBound {
            segments[segments.count - 1] = .inserted(table: table, rowids: lastRowids.lowerBound...rowids.upperBound, origin: origin)
        } else {
            starts.append(count)
            segments.append(.inserted(table: table, rowids: rowids, origin: origin))
        }
        count += rowids.count
    }

    /// Replaces the single event at `position` (a key read after its statement ran).
    mutating func replaceEvent(at position: Int, with event: DatabaseEvent) {
        let (segment, _) = locate(position)
        guard case .event = segments[segment] else { return }
        segments[segment] = .event(event)
    }

    /// Forgets the changes from `position` on (a failed statement, a savepoint rolled back).
    mutating func removeChanges(from position: Int) {
        guard position < count else { return }
        guard position > 0 else { return removeAll() }
        let (segment, offset) = locate(position)
        if offset == 0 {
            segments.removeSubrange(segment...)
            starts.removeSubrange(segment...)
        } else {
            guard case let .inserted(table, rowids, origin) = segments[segment] else { return }
            segments[segment] = .inserted(table: table, rowids: rowids.lowerBound...(rowids.lowerBound + Int64(offset) - 1), origin: origin)
            segments.removeSubrange((segment + 1)...)
            starts.removeSubrange((segment + 1)...)
        }
        count = position
    }

    mutating func removeAll() {
        segments.removeAll()
        starts.removeAll()
        count = 0
    }

    /// The tables changed.
    var tables: Set<String> {
        var tables = Set<String>()
        for segment in segments {
            switch segment {
            case let .event(event): tables.insert(event.table)
            case let .inserted(table, _, _): tables.insert(table)
            }
        }
        return tables
    }

    /// The changes as collected, in order: single events, and runs of rows inserted in bulk
    /// (for a consumer that handles a run at once rather than row by row).
    enum Run {
        case event(DatabaseEvent)
        case inserted(table: String, rowids: ClosedRange<Int64>, origin: ChangeOrigin)
    }

    var runs: some Sequence<Run> {
        segments.lazy.map { segment in
            switch segment {
            case let .event(event): .event(event)
            case let .inserted(table, rowids, origin): .inserted(table: table, rowids: rowids, origin: origin)
            }
        }
    }
}
