/// Bounds of one batch.
public struct BatchLimits: Sendable {
    /// The most changes a batch holds.
    public var maximumChanges: Int
    /// An estimate of the encoded size; a single row larger than this still goes alone.
    public var maximumBytes: Int
    /// Limits of `maximumChanges` changes and about `maximumBytes` bytes per batch (1 at least each).
    public init(maximumChanges: Int = 2_000, maximumBytes: Int = 1 << 20) {
        self.maximumChanges = max(1, maximumChanges)
        self.maximumBytes = max(1, maximumBytes)
    }
}

/// What a backfill sends (§8.3 of Protocol/README.md): the rows, through `through`, of tables or
/// columns newly shared with a peer.
public struct BackfillScope: Sendable, Equatable {
    /// The last sequence number covered (the peer's cursor on this database when it began).
    public var through: Int64
    /// Per table, the value columns whose rows go: those holding a value other than the
    /// column's default. A table with no columns listed goes whole.
    public var columns: [String: [String]]

    /// A backfill of `columns` (a table with none listed: whole), through the sequence `through`.
    public init(through: Int64, columns: [String: [String]]) {
        self.through = through
        self.columns = columns
    }
}
