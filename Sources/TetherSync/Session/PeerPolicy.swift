import Tether

/// What this side allows one peer (chosen by its instance key) to do.
public struct PeerPolicy: Sendable, Hashable {
    /// The peer may pull this side's changes, but this side never applies the
    /// peer's: it never PULLs from it, and a BATCH from it is ERROR 4 `readOnly`.
    public var readOnly: Bool
    /// The tables the peer may sync with this side (nil: all of the negotiated
    /// schema). A batch from it holding a change to another table is refused
    /// whole with ERROR 5 `tableNotAllowed`; changes to other tables are not
    /// sent to it.
    public var allowedTables: Set<String>?

    public init(readOnly: Bool = false, allowedTables: Set<String>? = nil) {
        self.readOnly = readOnly
        self.allowedTables = allowedTables
    }
}
