// Handing a committed transaction to listeners, typed listeners, streams and query observations; the ORM's
// fetches to the listeners that want them.

import Foundation

extension ObservationBroker {
    /// Hands a committed transaction to every subscriber that wants it: listeners go through
    /// its changes as collected, typed listeners get the rows in `models` (by change index and
    /// model type); streams get the changes as events, made only when one listens.
    func publish(
        _ changes: TransactionChanges, sequences: ClosedRange<Int64>?, isReadBack: Bool = false,
        models: CommittedModels.ByChange = [:]
    ) {
        let (listeners, modelListeners, streams, queries) = subscriptions.withLock {
            ($0.listeners, $0.modelListeners, $0.streams, $0.queries)
        }
        if !listeners.isEmpty || !modelListeners.isEmpty {
            listenerQueue.async {
                if !listeners.isEmpty { Self.call(listeners, for: changes) }
                if !modelListeners.isEmpty { Self.call(modelListeners, for: changes, models: models) }
            }
        }
        if !streams.isEmpty {
            let transaction = CommittedTransaction(
                changes: Array(changes), sequences: sequences, isReadBack: isReadBack)
            for (id, stream) in streams where !stream.deliver(transaction) { unsubscribe(id) }
        }
        if !queries.isEmpty {
            let tables = changes.tables
            for query in queries.values { query.databaseDidChange(tables: tables) }
        }
    }

    /// Another program committed: what it did to tables outside `recorded` (those the changelog
    /// does not record) cannot be told apart, so every query observation that reads one fetches again.
    func publishUnknownChange(outside recorded: Set<String> = []) {
        let queries = subscriptions.withLock { $0.queries }
        for query in queries.values { query.databaseDidChange(outside: recorded) }
    }

    private static func call(_ listeners: [Int: Listener], for changes: TransactionChanges) {
        // Listeners grouped by table once per call, and looked up once per run of a table's changes.
        var byTable: [String: [Listener]] = [:]
        for listener in listeners.values.sorted(by: { $0.id < $1.id }) {
            byTable[listener.table, default: []].append(listener)
        }
        var lastTable: String?
        var current: [Listener] = []
        for run in changes.runs {
            switch run {
            case let .event(captured):
                let event = changes.completed(captured)
                if event.table != lastTable {
                    lastTable = event.table
                    current = byTable[event.table] ?? []
                }
                let kind = DatabaseEvent.Kinds(event.kind)
                for listener in current where listener.kinds.contains(kind) {
                    if let key = listener.key, key != event.key { continue }
                    listener.body(event)
                }
            case let .inserted(table, rowids, origin, source):
                if table != lastTable {
                    lastTable = table
                    current = byTable[table] ?? []
                }
                let wanting = current.filter { $0.kinds.contains(.insert) }
                if wanting.isEmpty { continue }
                // A bulk insert's rows: one event whose rowid moves along the run (a new one per
                // row would copy and free its table name and origin a million times).
                var event = changes.completed(
                    DatabaseEvent(
                        kind: .insert, table: table, rowID: nil, keyValues: nil, origin: origin,
                        sourceTransaction: source))
                for rowID in rowids {
                    event.rowID = rowID
                    for listener in wanting {
                        if let key = listener.key, key != event.key { continue }
                        listener.body(event)
                    }
                }
            }
        }
    }

    private static func call(
        _ listeners: [Int: ModelListener], for events: TransactionChanges, models: CommittedModels.ByChange
    ) {
        let byTable = Dictionary(grouping: listeners.values.sorted { $0.id < $1.id }, by: \.table)
        for (index, event) in events.enumerated() {
            guard let current = byTable[event.table], let read = models[index] else { continue }
            let kind = DatabaseEvent.Kinds(event.kind)
            for listener in current where listener.kinds.contains(kind) {
                if let key = listener.key, key != event.key { continue }
                switch read[listener.reader.modelType] {
                case let .success(model)?: listener.body(event, model)
                case let .failure(error)?: listener.failure?(event, error)
                case nil: continue
                }
            }
        }
    }

    // MARK: Fetches (any connection)

    /// Rows of `table` the ORM fetched, by primary key.
    func didFetch(_ table: String, keys: [[DatabaseValue]]) {
        let listeners = subscriptions.withLock {
            $0.listeners.filter { $0.value.table == table && $0.value.kinds.contains(.fetch) }
        }
        guard !listeners.isEmpty else { return }
        let events = keys.map { DatabaseEvent(kind: .fetch, table: table, rowID: nil, keyValues: $0, origin: .local) }
        listenerQueue.async { Self.call(listeners, for: TransactionChanges(events)) }
    }
}
