// Who the broker hands changes to: listeners, typed listeners, transaction streams, query observations and
// watchers of sequence numbers (they subscribe in `ObservationBroker.swift`).

import Foundation

extension ObservationBroker {
    /// A callback for some kinds of events of one table (and, with `key`, one row).
    struct Listener: Sendable {
        var id = 0
        let table: String
        let kinds: DatabaseEvent.Kinds
        let key: PrimaryKey?
        let body: @Sendable (DatabaseEvent) -> Void
    }

    /// A typed listener (`ModelEvent`): some kinds of changes of one table (and, with `key`, one
    /// row), with the rows read by `reader`.
    struct ModelListener: Sendable {
        var id = 0
        let table: String
        let kinds: DatabaseEvent.Kinds
        let key: PrimaryKey?
        let reader: any CommittedRowReading
        /// Called with the change and its model (of the reader's type).
        let body: @Sendable (DatabaseEvent, any Sendable) -> Void
        /// Called when the row could not be read as the model.
        let failure: (@Sendable (DatabaseEvent, any Error) -> Void)?
    }

    /// A subscriber that buffers committed transactions (`CommittedTransactions`).
    protocol TransactionSubscriber: Sendable {
        /// False when the subscriber is done (it fell behind, or its consumer went).
        func deliver(_ transaction: CommittedTransaction) -> Bool
        func finish()
    }

    /// A query observation: told which tables a commit changed, or that tables outside some
    /// set may have changed.
    protocol ChangeSubscriber: Sendable {
        func databaseDidChange(tables: Set<String>)
        func databaseDidChange(outside known: Set<String>)
        func finish()
    }

    struct Subscriptions {
        var listeners: [Int: Listener] = [:]
        var modelListeners: [Int: ModelListener] = [:]
        var streams: [Int: any TransactionSubscriber] = [:]
        var queries: [Int: any ChangeSubscriber] = [:]
        /// Told the last sequence number of each commit that gave some (they need no change recorded).
        var sequenceWatchers: [Int: @Sendable (Int64) -> Void] = [:]
        private var nextID = 1

        /// Whether nobody observes the committed changes themselves (sequence watchers aside).
        var isEmpty: Bool { listeners.isEmpty && modelListeners.isEmpty && streams.isEmpty && queries.isEmpty }

        mutating func newID() -> Int {
            defer { nextID += 1 }
            return nextID
        }

        mutating func add(listener: Listener) -> Int {
            var listener = listener
            listener.id = newID()
            listeners[listener.id] = listener
            return listener.id
        }

        mutating func add(modelListener: ModelListener) -> Int {
            var listener = modelListener
            listener.id = newID()
            modelListeners[listener.id] = listener
            return listener.id
        }
    }
}
