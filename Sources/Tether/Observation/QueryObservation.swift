import Foundation
import Synchronization

extension Database {
    /// The result of `fetch` now, then again after each commit that changes a table it reads —
    /// AgileDB's publisher, GRDB's `ValueObservation`. Which tables a fetch reads is asked of
    /// SQLite's authorizer as its statements are prepared (views count as the tables they read),
    /// again at every fetch: a commit to another table never fetches.
    ///
    /// Fetches run on a reader, one at a time per observation, one per relevant commit, in
    /// commit order. A write by another program to a table that does not capture its writes
    /// cannot be told apart: every observation fetches then (`removeDuplicates()` keeps such a
    /// fetch from yielding the same value again).
    ///
    /// ```swift
    /// for try await players in db.observe({ try $0.fetchAll(Player.self) }).removeDuplicates() {
    ///     print(players.count)
    /// }
    /// ```
    public func observe<Value: Sendable>(_ fetch: @escaping @Sendable (Connection) throws -> Value) -> QueryObservation<
        Value
    > {
        QueryObservation(database: self, fetch: fetch, isDuplicate: nil)
    }

    /// The models `query` selects, now and after each commit that changes `M`'s table.
    public func observe<M: Model>(_ query: Query<M>) -> QueryObservation<[M]> {
        observe { try $0.fetchAll(query) }
    }

    /// The rows of a raw SQL query, now and after each commit that changes a table it reads.
    public func observe(sql: String, arguments: StatementArguments = StatementArguments()) -> QueryObservation<[Row]> {
        observe { try $0.fetchRows(sql, arguments) }
    }
}

/// The values of a query over time, as an asynchronous sequence (see `Database.observe(_:)`).
/// Each iteration observes on its own: it fetches first, then after every relevant commit.
/// A consumer slower than the commits gets the newest values: at most `bufferLimit` wait for
/// it, older ones are dropped (a value is the state of the database, a newer one supersedes it).
public struct QueryObservation<Value: Sendable>: AsyncSequence, Sendable {
    public typealias Element = Value
    let database: Database
    let fetch: @Sendable (Connection) throws -> Value
    let isDuplicate: (@Sendable (Value, Value) -> Bool)?
    var bufferLimit = 16

    /// The same observation, yielding a value only when it differs from the last one yielded.
    public func removeDuplicates() -> QueryObservation where Value: Equatable {
        QueryObservation(database: database, fetch: fetch, isDuplicate: { $0 == $1 }, bufferLimit: bufferLimit)
    }

    public func makeAsyncIterator() -> Iterator {
        let (stream, continuation) = AsyncThrowingStream.makeStream(
            of: Value.self, throwing: (any Error).self,
            bufferingPolicy: .bufferingNewest(Swift.max(1, bufferLimit)))
        let observer = Observer(database: database, fetch: fetch, isDuplicate: isDuplicate, continuation: continuation)
        let broker = database.observation
        var newID = 0
        broker.subscribe {
            newID = $0.newID(); $0.queries[newID] = observer
        }
        let id = newID
        let token = ObservationToken { [weak broker] in broker?.unsubscribe(id) }
        continuation.onTermination = { @Sendable _ in token.cancel() }
        observer.start()
        return Iterator(base: stream.makeAsyncIterator(), token: token)
    }

    /// Yields the query's result now, then after each commit that changed what it read; a fetch
    /// that throws ends the iteration with its error. Dropping the iterator ends the observation.
    public struct Iterator: AsyncIteratorProtocol {
        var base: AsyncThrowingStream<Value, any Error>.AsyncIterator
        /// Ends the observation when the iterator goes.
        let token: ObservationToken

        public mutating func next() async throws -> Value? {
            try await base.next()
        }
    }

    /// Fetches on its own serial queue when told of a commit that touches what it read.
    final class Observer: ObservationBroker.ChangeSubscriber, @unchecked Sendable {
        private weak var database: Database?
        private let fetch: @Sendable (Connection) throws -> Value
        private let isDuplicate: (@Sendable (Value, Value) -> Bool)?
        private let continuation: AsyncThrowingStream<Value, any Error>.Continuation
        private let queue = DispatchQueue(label: "tether.observation.query")
        // Used on `queue` only.
        private var region: Set<String> = []
        private var last: Value?
        private var isFinished = false

        init(
            database: Database, fetch: @escaping @Sendable (Connection) throws -> Value,
            isDuplicate: (@Sendable (Value, Value) -> Bool)?,
            continuation: AsyncThrowingStream<Value, any Error>.Continuation
        ) {
            self.database = database
            self.fetch = fetch
            self.isDuplicate = isDuplicate
            self.continuation = continuation
        }

        func start() {
            queue.async { self.fetchAndYield() }
        }

        func databaseDidChange(tables: Set<String>) {
            queue.async {
                if self.region.isDisjoint(with: tables) { return }
                self.fetchAndYield()
            }
        }

        func databaseDidChange(outside known: Set<String>) {
            queue.async {
                if !self.region.isEmpty && self.region.isSubset(of: known) { return }
                self.fetchAndYield()
            }
        }

        func finish() {
            queue.async {
                self.isFinished = true
                self.continuation.finish()
            }
        }

        private func fetchAndYield() {
            guard !isFinished, let database else { return }
            do {
                let fetch = self.fetch
                let (value, tables) = try database.read { connection in
                    try connection.recordingReadTables { try fetch(connection) }
                }
                region = tables
                if let isDuplicate, let last, isDuplicate(last, value) { return }
                last = value
                continuation.yield(value)
            } catch {
                isFinished = true
                continuation.finish(throwing: error)
            }
        }
    }
}
