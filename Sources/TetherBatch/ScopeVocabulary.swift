// The vocabulary of partial replication that the engine and the wire share: the rule that says
// which rows of a table a peer holds, and a change a receiver refused.

/// Which rows of one table a peer holds (see `SyncScope` in Tether), as the engine compiles it and
/// as SCOPE carries a peer's interest (Protocol/README.md §6.12).
public indirect enum ScopeRule: Sendable, Hashable {
    /// The rows for which `condition` holds: an SQL boolean expression over the table's own
    /// columns, with named parameters (`:peer_name`) taken from the scope's parameters. It may
    /// read other synced tables in subqueries; a NULL result leaves the row out.
    case filter(String)
    /// The rows whose `column` holds the `parentColumn` (by default the parent's single key
    /// column) of a row of `parent` inside the scope: `parent` must be scoped too.
    case reference(column: String, parent: String, parentColumn: String? = nil)
    /// The rows both rules hold: how a peer's interest narrows what its policy entitles it to.
    case both(ScopeRule, ScopeRule)

    /// How deep `.both` nests (1 for a filter or a reference).
    public var depth: Int {
        if case let .both(first, second) = self { return 1 + max(first.depth, second.depth) }
        return 1
    }
}

/// A change a receiver refused because it reached outside the writer's scope: nothing of it was
/// written there. The writer records it (`Database.recordRefusals`), drops its own version of the
/// row, and gets the receiver's at its next pull.
public struct RefusedChange: Sendable, Hashable, CustomStringConvertible {
    public var table: String
    public var key: [DatabaseValue]
    /// The writer's sequence number of the change.
    public var sequence: Int64
    public var reason: String
    /// On the writer, the peer that refused the change (`refusedChanges()`); nil in an apply report.
    public var refusedBy: InstanceKey?
    /// The source transaction of the change refused, where the receiver judged it (its apply
    /// report); the writer learns it from the reason, which names it.
    public var sourceTransaction: SourceTransaction?

    public init(
        table: String, key: [DatabaseValue], sequence: Int64, reason: String, refusedBy: InstanceKey? = nil,
        sourceTransaction: SourceTransaction? = nil
    ) {
        self.refusedBy = refusedBy
        self.sourceTransaction = sourceTransaction
        self.table = table
        self.key = key
        self.sequence = sequence
        self.reason = reason
    }

    public var description: String {
        "change \(sequence) to \(table) [\(key.map(\.description).joined(separator: ", "))] refused: \(reason)"
    }
}
