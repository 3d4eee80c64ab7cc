/// Which rows are echoes, left out of a peer's batch: nothing goes back to where everything in a
/// row came from, or to the peer the row's state was received from.
struct EchoFilter {
    /// False for a full resync, which sends every row, echoes included: the receiver deletes the
    /// rows it does not hear about.
    let leavesOut: Bool
    let peer: InstanceKey?
    /// The peer's local id, when rows received from it count as echoes (not for a backfill).
    let peerSite: Int32?

    /// Whether a row is one to leave out as an echo: its state was received from the peer (`via`),
    /// or everything in it came from the peer. `byOrigins` false: only the first (a live row with
    /// counters, whose newest versions may be the peer's while it holds contributions the peer lacks).
    func isEcho(via: Int32?, existence: Version, columnVersions: [Version], byOrigins: Bool = true) -> Bool {
        guard leavesOut, let peer else { return false }
        return (via != nil && via == peerSite)
            || (byOrigins && existence.origin == peer && columnVersions.allSatisfy { $0.origin == peer })
    }
}
