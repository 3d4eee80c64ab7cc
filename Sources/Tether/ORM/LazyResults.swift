/// The rows of a query as their primary keys, each model read when it is
/// accessed (AgileDB's `DBResults`): keys now, objects on access, so that a
/// large result costs the memory of its keys.
///
/// ```swift
/// let players = try db.lazyFetch(Player.where(\.team == .red).orderBy(\.name))
/// print(players.count)                  // keys only
/// for player in players { … }           // each read as it comes (nil: deleted since)
/// let first = try players.model(at: 0)  // with the error, if it cannot be read
/// ```
///
/// Each access is its own read of the database as it is then: a row deleted
/// since the keys were fetched reads as nil, a row changed reads as changed.
public struct LazyResults<M: Model>: RandomAccessCollection, Sendable {
    /// The primary keys of the query's rows, in its order.
    public let keys: [PrimaryKey]
    private let database: Database

    init(keys: [PrimaryKey], database: Database) {
        self.keys = keys
        self.database = database
    }

    public var startIndex: Int { keys.startIndex }
    public var endIndex: Int { keys.endIndex }

    /// The model at `position`, or nil when its row is gone or cannot be read
    /// (`model(at:)` says why).
    public subscript(position: Int) -> M? {
        try? model(at: position)
    }

    /// The model at `position`, nil when its row is gone; throws what reading it throws.
    public func model(at position: Int) throws -> M? {
        guard keys.indices.contains(position) else {
            throw ModelError.invalidArgument("position \(position) is outside the \(keys.count) results")
        }
        return try database.fetch(M.self, key: keys[position])
    }
}

extension Database {
    /// The rows a query selects, as `LazyResults`: their keys are read now, each
    /// model when it is accessed. `M` needs a primary key (`ModelError.invalidArgument`).
    public func lazyFetch<M: Model>(_ query: Query<M>) throws -> LazyResults<M> {
        LazyResults(keys: try fetchKeys(query), database: self)
    }
}
