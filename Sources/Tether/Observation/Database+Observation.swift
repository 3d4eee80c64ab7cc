import Foundation
import Synchronization

/// Keeps an observation alive: releasing it (or calling `cancel`) stops the observation.
///
/// ```swift
/// var token: ObservationToken? = db.observe(.insert, in: "player") { print($0) }
/// token = nil   // no more calls
/// ```
public final class ObservationToken: Sendable {
    private let cancellation: @Sendable () -> Void
    private let cancelled = Mutex(false)

    init(_ cancellation: @escaping @Sendable () -> Void) {
        self.cancellation = cancellation
    }

    deinit { cancel() }

    /// Stops the observation now; later calls do nothing.
    public func cancel() {
        let first = cancelled.withLock { cancelled -> Bool in
            defer { cancelled = true }
            return !cancelled
        }
        if first { cancellation() }
    }
}

// MARK: - The broker

extension DatabaseAttachment {
    /// Every database keeps an observation broker, first of its services; it observes the writer
    /// only while someone observes.
    func makeServices() -> [any DatabaseService] { [ObservationBroker(changelog: changelog)] }
}

extension Database {
    /// Listeners, change streams and query observations. `makeServices` makes the broker first
    /// for every database, so the downcast cannot fail.
    var observation: ObservationBroker { unsafeDowncast(services[0], to: ObservationBroker.self) }
}

// MARK: - Listeners

extension Database {
    /// Calls `listener` for each committed insert, update or delete of `table` (those in `kinds`;
    /// with `key`, of that row only), and, with `.fetch` in `kinds`, for each row of it the ORM
    /// fetches — SundeedQLite's listeners.
    ///
    /// A listener sees every change committed through this database — the ORM, raw SQL, a batch
    /// from a peer, a sync file — once, after the commit, never a change that was rolled back (a
    /// transaction or a savepoint). It also sees other programs' writes to synced tables, read
    /// back from the changelog while `Configuration.observationPollInterval` is set (a live row
    /// then comes as an update, one of an insert range as an insert). Listeners are called on a
    /// serial queue of the database, in commit order, never on the writing thread.
    ///
    /// ```swift
    /// let token = db.observe(.changes, in: "player") { event in
    ///     print(event.kind, event.key, event.origin)   // insert [1] local
    /// }
    /// ```
    ///
    /// - Returns: the token that keeps the listener: it is removed when the token is released.
    public func observe(
        _ kinds: DatabaseEvent.Kinds = .changes, in table: String, key: PrimaryKey? = nil,
        _ listener: @escaping @Sendable (DatabaseEvent) -> Void
    ) -> ObservationToken {
        let broker = observation
        let id = broker.addListener(ObservationBroker.Listener(table: table, kinds: kinds, key: key, body: listener))
        return ObservationToken { [weak broker] in broker?.unsubscribe(id) }
    }

    /// `observe(_:in:key:_:)` for the table of `M`.
    public func observe<M: Model>(
        _ kinds: DatabaseEvent.Kinds = .changes, of type: M.Type,
        _ listener: @escaping @Sendable (DatabaseEvent) -> Void
    ) -> ObservationToken {
        observe(kinds, in: M.tableName, listener)
    }

    /// `observe(_:in:key:_:)` for one row: `model`'s, by its primary key.
    public func observe<M: Model>(
        _ kinds: DatabaseEvent.Kinds = .changes, of model: M,
        _ listener: @escaping @Sendable (DatabaseEvent) -> Void
    ) throws -> ObservationToken {
        let schema = try ModelSchema<M>.shared()
        let values = try RowEncoder(schema: schema).collect(model)
        return observe(kinds, in: M.tableName, key: PrimaryKey(schema.primaryKey.map { values[$0] }), listener)
    }
}

// MARK: - Committed sequence numbers

extension Database {
    /// Calls `watcher` after each commit through this database that gave sequence numbers to
    /// changes of synced tables, with the last of them: the cheapest way to learn at once that
    /// the changelog moved (a sync server wakes its sessions with it).
    ///
    /// It sees every such commit of this `Database` — the ORM, raw SQL, a batch from a peer, a
    /// sync file — but not other programs' writes: for those, poll `lastSequence()` after
    /// `captureExternalWrites()`. `watcher` is called on the writing thread, right after the
    /// commit and before the write returns, with the writer still held: it must be quick and
    /// must not use the database (hand the number over to another queue).
    ///
    /// Unlike listeners and streams, it records nothing of the changed rows: while only watchers
    /// exist, a commit costs one call per watcher.
    ///
    /// ```swift
    /// let token = db.observeCommittedSequences { last in queue.async { announce(last) } }
    /// ```
    ///
    /// - Returns: the token that keeps the watcher: it is removed when the token is released.
    public func observeCommittedSequences(_ watcher: @escaping @Sendable (Int64) -> Void) -> ObservationToken {
        let broker = observation
        let id = broker.addSequenceWatcher(watcher)
        return ObservationToken { [weak broker] in broker?.unsubscribe(id) }
    }
}

// MARK: - Committed transactions

extension Database {
    /// The transactions committed from now on (of `tables` only, when given), in commit order:
    /// each with its changes in the order they were made.
    ///
    /// A slow consumer loses nothing while at most `bufferLimit` transactions wait for it. One
    /// that falls further behind reads what was buffered, then the sequence throws
    /// `CommittedTransactions.FellBehind`, which says where to resume: a new sequence with
    /// `resumingAfter:` first yields the changes to synced tables made since, read back from the
    /// changelog (each row once, as it is now), then goes on live. Changes to tables that are not
    /// synced are not in the changelog: a consumer that fell behind does not get them back.
    ///
    /// ```swift
    /// for try await transaction in db.committedTransactions() {
    ///     for change in transaction.changes { print(change) }
    /// }
    /// ```
    public func committedTransactions(
        tables: Set<String>? = nil, bufferLimit: Int = 1024,
        resumingAfter sequence: Int64? = nil
    ) throws -> CommittedTransactions {
        let (stream, continuation) = AsyncThrowingStream.makeStream(
            of: CommittedTransaction.self, throwing: (any Error).self,
            bufferingPolicy: .bufferingOldest(Swift.max(1, bufferLimit)))
        let subscriber = CommittedTransactions.Subscriber(
            continuation: continuation, tables: tables, lastSequence: sequence)
        let broker = observation
        try writeWithoutTransaction { connection in
            var newID = 0
            broker.subscribe {
                newID = $0.newID(); $0.streams[newID] = subscriber
            }
            let id = newID
            continuation.onTermination = { [weak broker] _ in broker?.unsubscribe(id) }
            broker.updateActivation(connection)
            guard let sequence else { return }
            guard let changelog = broker.changelog else {
                throw DatabaseError(
                    extendedCode: 8, message: "the database is open read-only: it has no changelog to resume from")
            }
            broker.subscriptionReached(.beforeCatchUp)
            // Where the changelog ends and the changes since `sequence`, read in one snapshot: read
            // apart, another connection's commit landing in between came in the catch-up beyond its
            // last sequence number, and came again from the next read-back.
            let (last, events) = try connection.transaction(.deferred) {
                let last = try changelog.lastStoredSequence(connection)
                broker.subscriptionReached(.catchingUp)
                return (last, try changelog.changes(after: sequence, connection))
            }
            if !events.isEmpty || last > sequence {
                _ = subscriber.deliver(
                    CommittedTransaction(
                        changes: events, sequences: sequence < last ? (sequence + 1)...last : nil, isReadBack: true))
            }
            subscriber.caughtUp(through: Swift.max(sequence, last))
        }
        return CommittedTransactions(stream: stream)
    }
}

/// The transactions a database commits, as an asynchronous sequence (see
/// `Database.committedTransactions(tables:bufferLimit:resumingAfter:)`). Iterated once.
public struct CommittedTransactions: AsyncSequence, Sendable {
    public typealias Element = CommittedTransaction
    let stream: AsyncThrowingStream<CommittedTransaction, any Error>

    public func makeAsyncIterator() -> AsyncThrowingStream<CommittedTransaction, any Error>.AsyncIterator {
        stream.makeAsyncIterator()
    }

    /// The consumer fell more than `bufferLimit` transactions behind: the transactions after the
    /// last one it was given were dropped.
    public struct FellBehind: Error, Sendable, CustomStringConvertible {
        /// The last changelog sequence number the consumer was given (nil: none): pass it as
        /// `resumingAfter:` to get the synced tables' changes since.
        public let resumeAfter: Int64?
        public var description: String {
            """
            the consumer of committed transactions fell too far behind; resume after sequence \
            \(resumeAfter.map(String.init) ?? "none")
            """
        }
    }

    final class Subscriber: ObservationBroker.TransactionSubscriber, @unchecked Sendable {
        private let continuation: AsyncThrowingStream<CommittedTransaction, any Error>.Continuation
        private let tables: Set<String>?
        /// The last sequence number of a transaction buffered (used only on the writer).
        private var lastSequence: Int64?
        /// Where a resumed stream's catch-up read the changelog to (used only on the writer). The
        /// broker reads other connections' commits back from where it last looked, which may be
        /// before: a change read back that is not after it was in the catch-up, and is not given again.
        private var caughtUpThrough: Int64?

        init(
            continuation: AsyncThrowingStream<CommittedTransaction, any Error>.Continuation, tables: Set<String>?,
            lastSequence: Int64?
        ) {
            self.continuation = continuation
            self.tables = tables
            self.lastSequence = lastSequence
        }

        func caughtUp(through sequence: Int64) { caughtUpThrough = sequence }

        func deliver(_ transaction: CommittedTransaction) -> Bool {
            var transaction = transaction
            if transaction.isReadBack, let through = caughtUpThrough {
                if let sequences = transaction.sequences, sequences.lowerBound > through {
                    // Read back from past the catch-up: so will every read-back from now on.
                    caughtUpThrough = nil
                } else {
                    let changes = transaction.changes.filter { ($0.sequence ?? .max) > through }
                    if changes.isEmpty { return true }
                    let sequences = transaction.sequences.flatMap { sequences in
                        through < sequences.upperBound
                            ? Swift.max(sequences.lowerBound, through + 1)...sequences.upperBound : nil
                    }
                    transaction = CommittedTransaction(changes: changes, sequences: sequences, isReadBack: true)
                }
            }
            if let tables {
                let changes = transaction.changes.filter { tables.contains($0.table) }
                if changes.isEmpty { return true }
                transaction = CommittedTransaction(
                    changes: changes, sequences: transaction.sequences, isReadBack: transaction.isReadBack)
            }
            switch continuation.yield(transaction) {
            case .enqueued:
                if let upper = transaction.sequences?.upperBound {
                    lastSequence = Swift.max(lastSequence ?? upper, upper)
                }
                return true
            case .dropped:
                continuation.finish(throwing: FellBehind(resumeAfter: lastSequence))
                return false
            case .terminated:
                return false
            @unknown default:
                return false
            }
        }

        func finish() { continuation.finish() }
    }
}
