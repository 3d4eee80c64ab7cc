import Foundation

/// A database restored in place (a file-system or VM snapshot rolled back, a file copied back
/// over itself) keeps its file, so nothing tells it apart when opened; once it writes past its
/// peers' cursors, the same sequence numbers of its key name other changes than they received,
/// and the changes between are never sent. Its peers can tell: each keeps a `HistoryMark` of
/// what it was sent (through a sequence, at a clock) and shows it back; a database holding, at or
/// before that sequence, a version later than that clock wrote it after the mark was made, so it
/// went back in between. It then refuses that peer — and every peer whose mark shows the same —
/// until rekeyed; the others, whose marks are at or before the restored point, go on syncing.
///
/// Nothing is paid per change: the sender reads its clock once per batch, the receiver keeps
/// one row per peer (written with the batch's apply), the first transaction of each opening
/// records where it resumed the history (`tether_resumed_writes`: rows all written again since
/// sit after the mark), and the check reads a few rows per table once per session.
extension Database {
    /// The mark a peer keeps of this database's history after being sent its changes through
    /// `sequence`: this database's committed clock, read after the extraction (so at or after
    /// every version of the rows through `sequence`).
    public func historyMark(through sequence: Int64) throws -> HistoryMark {
        try read { connection in
            let stored = try HybridClock.storedClock(connection)
            // Never beyond what is committed: a number given by a transaction that rolled back
            // is given again after a restart, by a later write.
            return HistoryMark(through: min(sequence, stored.sequence), clock: stored.timestamp.rawValue)
        }
    }

    /// The mark of `peer`'s history kept here (nil if it sent none; `apply(_:keepingMark:)` keeps
    /// the one a batch came with): shown back to it at the next pull, with
    /// `checkHistory(_:heldBy:)` on its side.
    public func historyMark(of peer: InstanceKey) throws -> HistoryMark? {
        try read { try $0.peerStore.historyMark(of: peer) }
    }

    /// Checks that this database still has the history `peer` was sent, as `mark` describes it.
    /// If not, it was restored to an earlier state and wrote other changes since, or the peer's
    /// mark is made up: `SyncError.historyDiverged` is thrown and, when `recording`, the finding
    /// is recorded for `peer` (``historyFindings()``; ``detectedCopy()`` then has kind
    /// `.restored`): every exchange with `peer` — extract and apply — is refused until
    /// ``resetInstanceKey()``, while other peers go on syncing. A peer already found so is refused
    /// whatever mark it shows. Pass `recording: false` to refuse this call alone.
    public func checkHistory(_ mark: HistoryMark, heldBy peer: InstanceKey, recording: Bool = true) throws {
        guard let engine = syncEngine else { return }
        if let divergence = try write({ try engine.checkHistory(mark, heldBy: peer, recording: recording, $0) }) {
            throw SyncError.historyDiverged(instanceKey: instanceKey, reason: divergence.reason)
        }
    }

    /// The peers whose mark of this database's history showed a change written after the mark, at a
    /// sequence number the mark covers (``checkHistory(_:heldBy:recording:)``), oldest first: each is
    /// refused until ``resetInstanceKey()``, which forgets them.
    public func historyFindings() throws -> [HistoryFinding] {
        try read { try $0.peerStore.historyFindings() }
    }
}

/// A peer's mark of this database's history (Protocol/README.md §8.9) that this database's history
/// no longer matches: it was restored to an earlier state and wrote since, or the mark is made up.
/// Only that peer is refused: a peer at or before the restored point holds a cursor there too and
/// receives the new changes under their reused numbers as new, and every peer that passed it shows
/// a mark that finds the divergence itself.
public struct HistoryFinding: Sendable, Equatable {
    /// The instance key of the peer that showed the mark.
    public let peer: InstanceKey
    /// The mark it showed.
    public let mark: HistoryMark
    /// What the check found, in words: the mark, and the change later than it (sequence, table, timestamp).
    public let reason: String
    /// When it was found.
    public let found: Date
}

extension SyncEngine {
    /// Compares `mark` with the latest change of each table at or before `mark.through` (live
    /// rows, tombstones, insert ranges): in one history every version there is at or before the
    /// clock of the mark. One later was written after the mark was made, under a sequence number
    /// the peer already holds. Returns the detection (recorded for `peer` when `recording`); nil
    /// when the history holds. A peer found so before gets its finding again, whatever its mark.
    func checkHistory(_ mark: HistoryMark, heldBy peer: InstanceKey, recording: Bool, _ connection: Connection) throws
        -> CopyDetection?
    {
        guard copyDetection == nil else { return nil }
        if let finding = try connection.peerStore.historyFinding(of: peer) { return finding.detection }
        var latest: (what: String, sequence: Int64, timestamp: UInt64)?
        func consider(_ what: String, _ sequence: Int64, _ timestamp: UInt64) {
            if timestamp > mark.clock, timestamp > latest?.timestamp ?? 0 { latest = (what, sequence, timestamp) }
        }
        for table in tableList {
            let layout = table.layout
            for sql in [
                "SELECT seq, versions FROM \(layout.rowsTable) WHERE seq <= ? ORDER BY seq DESC LIMIT 1",
                """
                SELECT tether_seq, tether_versions FROM \(layout.deadTable) WHERE tether_seq <= ? ORDER \
                BY tether_seq DESC LIMIT 1
                """,
            ] {
                guard let row = try connection.fetchRow(sql, [mark.through]) else { continue }
                guard let versions = RowVersions(encoded: [UInt8](try row.get(1, as: Data.self))) else {
                    throw SyncError.corruptMetadata("a row of \(table.name) has damaged versions in its sync metadata")
                }
                consider("table \(table.name)", try row.get(0, as: Int64.self), versions.latestTimestamp)
            }
            if let range = try latestInsertRange(of: table, startingAtOrBefore: mark.through, connection) {
                consider("table \(table.name)", range.firstSequence, range.rowVersions.latestTimestamp)
            }
        }
        // Rows written again since hold later sequences: the first transaction of each opening tells.
        if let resumed = try HybridClock.resumedWrite(atOrBefore: mark.through, after: mark.clock, connection) {
            consider("the first transaction after an opening", resumed.sequence, resumed.timestamp)
        }
        guard let latest else { return nil }
        let detection = CopyDetection(
            kind: .restored,
            reason: "peer \(peer) was sent its changes through sequence \(mark.through) when its clock was at "
                + "\(Self.describe(mark.clock)), but it now holds at sequence \(latest.sequence) ("
                + "\(latest.what)) a change written at \(Self.describe(latest.timestamp)), after that: it was "
                + "restored to an earlier state (a file-system or VM snapshot, a file copied back) and has written "
                + "other changes under sequence numbers the peer holds",
            sequence: 0, timestamp: HybridTimestamp(rawValue: mark.clock))
        guard recording else { return detection }
        // The peer alone: a made-up mark must cost the peer that shows it, never the others (§8.9).
        try connection.peerStore.recordHistoryFinding(
            HistoryFinding(peer: peer, mark: mark, reason: detection.reason, found: Date()))
        return detection
    }

    /// Refuses to sync with `peer` when its mark showed that this database's history is not the
    /// one it was sent (``Database/checkHistory(_:heldBy:recording:)``), until a rekey.
    func ensureHistoryHolds(for peer: InstanceKey?, _ connection: Connection) throws {
        guard let peer, let finding = try connection.peerStore.historyFinding(of: peer) else { return }
        throw SyncError.historyDiverged(instanceKey: instanceKey, reason: finding.reason)
    }

    /// A hybrid timestamp for people: its date (UTC, to the millisecond), then its raw form.
    private static func describe(_ raw: UInt64) -> String {
        let timestamp = HybridTimestamp(rawValue: raw)
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return """
            \(formatter.string(from: Date(timeIntervalSince1970: Double(timestamp.milliseconds) / 1000))) \
            (\(timestamp))
            """
    }
}

extension HistoryFinding {
    /// The finding as a restore noticed: this database's versions later than the mark's clock are
    /// the ones it wrote since (a rekey moves them to its new key).
    var detection: CopyDetection {
        CopyDetection(kind: .restored, reason: reason, sequence: 0, timestamp: HybridTimestamp(rawValue: mark.clock))
    }
}
