/// The rows of a query as their primary keys, each model read when it is
/// accessed (AgileDB's `DBResults`): keys now, objects on access, so that a
/// large result costs the memory of its keys.
///
/// ```swift
/// let players = try db.lazyFetch(Player.where(\.team == .red).orderBy(\.name))
/// print(players.count)                  // keys only
/// for player in players { … }           // each read as it comes (nil: deleted since)
/// let first = try players.model(at: 0)  // throws RowDeletedError if deleted since
/// ```
///
/// Each access is its own read of the database as it is then, not as it was
/// when the keys were fetched: a row changed since reads as changed, and a row
/// deleted since has no model. The element (`subscript`) is then nil;
/// `model(at:)` throws `RowDeletedError`, which names the row's key.
public struct LazyResults<M: Model>: RandomAccessCollection, Sendable {
    /// The primary keys of the query's rows, in its order.
    public let keys: [PrimaryKey]
    private let database: Database

    init(keys: [PrimaryKey], database: Database) {
        self.keys = keys
        self.database = database
    }

    /// The first position: 0.
    public var startIndex: Int { keys.startIndex }
    /// One past the last position: the number of keys.
    public var endIndex: Int { keys.endIndex }

    /// The model at `position`: nil when its row was deleted after the keys were fetched, or
    /// can no longer be read as `M` (`model(at:)` throws which).
    public subscript(position: Int) -> M? {
        try? model(at: position)
    }

    /// The model at `position`, read now.
    ///
    /// - Throws: `RowDeletedError` when the row was deleted after the keys were fetched;
    ///   `ModelError.invalidArgument` for a position outside the results; what reading the row
    ///   throws otherwise.
    public func model(at position: Int) throws -> M {
        guard keys.indices.contains(position) else {
            throw ModelError.invalidArgument("position \(position) is outside the \(keys.count) results")
        }
        guard let model = try database.fetch(M.self, key: keys[position]) else {
            throw RowDeletedError(table: M.tableName, key: keys[position], position: position)
        }
        return model
    }
}

/// A `LazyResults` element whose row was deleted between the fetch of the keys and the read of
/// the element (`LazyResults.model(at:)`).
public struct RowDeletedError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The table the row was in.
    public let table: String
    /// The deleted row's primary key.
    public let key: PrimaryKey
    /// The element's position in the results.
    public let position: Int

    public var description: String {
        "the row of \(table) with key \(key.values.map(\.description).joined(separator: ", ")) (position \(position)) "
            + "was deleted after the keys were fetched"
    }
}

extension Database {
    /// The rows a query selects, as `LazyResults`: their keys are read now, each
    /// model when it is accessed. `M` needs a primary key (`ModelError.invalidArgument`).
    public func lazyFetch<M: Model>(_ query: Query<M>) throws -> LazyResults<M> {
        LazyResults(keys: try fetchKeys(query), database: self)
    }
}
