/// What orders a database's commits and can tell its changes again afterwards: the sync
/// engine's changelog (every change to a synced table has a sequence number). Observation
/// reads it to resume a stream and to learn what other processes changed; the core knows
/// nothing more of it.
protocol ChangelogSource: AnyObject {
    /// The sequence numbers the last commit gave its changes, once (nil when it gave none).
    /// Called on the writer, after the commit.
    func takeCommittedSequences() -> ClosedRange<Int64>?
    /// The transaction the last commit's own changes to synced tables belong to (nil when it made
    /// none), once. Called on the writer, after the commit, with `takeCommittedSequences`.
    func takeCommittedTransaction() -> SourceTransaction?
    /// The last sequence number stored.
    func lastStoredSequence(_ connection: Connection) throws -> Int64
    /// The rows changed after `sequence`, in sequence order: each row once, as it is now (a
    /// live row as an update, a deleted one as a delete), with its origin.
    func changes(after sequence: Int64, _ connection: Connection) throws -> [DatabaseEvent]
    /// The tables whose every change it records.
    var recordedTables: Set<String> { get }
    /// Gives what other programs wrote to tables captured by triggers their sequence numbers.
    func foldExternalWrites(_ connection: Connection) throws
}

/// One commit's changes, in the order they were made.
public struct CommittedTransaction: Sendable, Hashable {
    /// The changes, in order. Read back from the changelog (`isReadBack`), each row appears once.
    public let changes: [DatabaseEvent]
    /// The sequence numbers the commit gave its changes to synced tables (nil when it changed none).
    public let sequences: ClosedRange<Int64>?
    /// True for changes read back from the changelog rather than seen as they were made: a
    /// stream's catch-up after `resumingAfter`, or commits of another process. Those are grouped
    /// by when they were read, not by the commit that made them.
    public let isReadBack: Bool

    init(changes: [DatabaseEvent], sequences: ClosedRange<Int64>?, isReadBack: Bool = false) {
        self.changes = changes
        self.sequences = sequences
        self.isReadBack = isReadBack
    }

    /// The tables the commit changed.
    public var tables: Set<String> { Set(changes.map(\.table)) }

    /// The changes by the source transaction each belongs to (`DatabaseEvent.sourceTransaction`),
    /// the transactions in the order they were made (timestamp order), each one's changes in the
    /// commit's order; changes without one (evictions) last. A peer applies what it received in
    /// units of its own (a whole catch-up is one commit): this tells the source's transactions apart.
    public var bySourceTransaction: [(transaction: SourceTransaction?, changes: [DatabaseEvent])] {
        var groups: [SourceTransaction?: [DatabaseEvent]] = [:]
        for change in changes { groups[change.sourceTransaction, default: []].append(change) }
        return groups.sorted { left, right in
            switch (left.key, right.key) {
            case let (left?, right?): left < right
            case (.some, nil): true
            case (nil, _): false
            }
        }
        .map { ($0.key, $0.value) }
    }
}
