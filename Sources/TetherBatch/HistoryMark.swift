/// What a database was when it sent a peer its changes through a sequence number: every version
/// of its rows at or before `through` is at or before `clock` (its hybrid clock then). The peer
/// keeps the mark, and shows it back at its next pull (Protocol/README.md §8.9): a database that
/// now holds, at or before `through`, a change written after `clock` was restored to an earlier
/// state and wrote other changes under sequence numbers the peer already holds — two histories
/// under one instance key.
public struct HistoryMark: Sendable, Hashable, CustomStringConvertible {
    /// A sequence number of the database the mark describes.
    public var through: Int64
    /// Its hybrid clock (a raw `HybridTimestamp`) when the mark was made.
    public var clock: UInt64

    public init(through: Int64, clock: UInt64) {
        self.through = through
        self.clock = clock
    }

    public var description: String { "through sequence \(through) at clock \(HybridTimestamp(rawValue: clock))" }
}
