import ArgumentParser
import Foundation
import Tether
import TetherSync

/// `tether gc`: one garbage collection run to completion, by hand — what `tether serve` does on
/// its schedule in bounded runs.
struct GarbageCollect: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "gc",
        abstract: """
            Collect garbage now: forget the peers not seen within the horizon, then remove the tombstones and \
            eviction records every remembered peer acknowledged.
            """,
        discussion: """
            tether serve does this by itself (--gc-interval); this runs it once, to the end, and may run while a node \
            serves \
            the database (it works in short transactions). Prints what it removed and kept, the horizon (this \
            database's \
            changes every remembered peer acknowledged, through that sequence: the tombstones up to it went) and the \
            peers \
            forgotten, by instance key and certificate. A forgotten peer that returns gets a full resync before its \
            changes \
            are taken. \
            With --json, one object: "tombstonesRemoved", "evictionsRemoved", "tombstonesKept", "horizon", "seconds", \
            "forgetPeersAfter" (seconds, or null for never) and "peersForgotten" (each with "instanceKey", \
            "certificateName", \
            "certificateFingerprint" and "lastSeen").
            """)
    static let configKeys =
        DatabaseOption<ExistingDatabase>.configKeys + ForgetPeersOption.configKeys + OutputFormatOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @OptionGroup var forgetPeers: ForgetPeersOption

    @OptionGroup var output: OutputFormatOption

    func run() throws {
        common.bootstrapLogging()
        let horizon = try forgetPeers.horizon()
        let database = try db.openExisting()
        guard !database.syncedTables.isEmpty else {
            throw CLIError(
                .dataError,
                """
                database \(db.path) syncs no table: it keeps no tombstones (turn sync on with: tether init --db \
                \(db.path) --sync TABLE)
                """)
        }
        try database.captureExternalWrites()
        let report = try database.collectGarbage(Database.GarbageCollectionOptions(forgetPeersUnseenFor: horizon))
        let known = Dictionary(
            try database.peers().map { ($0.instanceKey, $0) }, uniquingKeysWith: { first, _ in first })
        let forgotten = report.peersForgotten.map { key in (key: key, peer: known[key]) }
        let formatter = ISO8601DateFormatter()

        output.print(
            {
                var lines = [
                    "removed \(report.tombstonesRemoved) tombstone\(report.tombstonesRemoved == 1 ? "" : "s") and "
                        + "\(report.evictionsRemoved) eviction record\(report.evictionsRemoved == 1 ? "" : "s"), "
                        + "kept \(report.tombstonesKept) (horizon: sequence \(report.horizon), what every "
                        + "remembered peer acknowledged) "
                        + "in \(String(format: "%.3f", report.duration.seconds)) s"
                ]
                if forgotten.isEmpty {
                    lines.append(
                        horizon.map { "forgot no peer (peers not seen for \(DurationFlag.describe($0)) are forgotten)" }
                            ?? "forgot no peer (--forget-peers-after never)")
                } else {
                    lines.append(
                        "forgot \(forgotten.count) peer\(forgotten.count == 1 ? "" : "s") not seen for "
                            + "\(DurationFlag.describe(horizon: horizon)) "
                            + "(each gets a full resync if it returns):")
                    for (key, peer) in forgotten {
                        let certificate = peer?.certificate.map { ", \($0.nameAndFingerprint)" } ?? ""
                        lines.append(
                            """
                              \(key.hex)\(certificate), last seen \
                            \(peer?.lastSeen.map { formatter.string(from: $0) } ?? "never")
                            """)
                    }
                }
                return lines.joined(separator: "\n")
            }(),
            json: .object([
                "tombstonesRemoved": .int(report.tombstonesRemoved), "evictionsRemoved": .int(report.evictionsRemoved),
                "tombstonesKept": .int(report.tombstonesKept), "horizon": .integer(report.horizon),
                "seconds": .real(report.duration.seconds),
                "forgetPeersAfter": horizon.map { .integer($0.components.seconds) } ?? .null,
                "peersForgotten": .array(
                    forgotten.map { key, peer in
                        .object([
                            "instanceKey": .string(key.hex),
                            "certificateName": .string(orNull: peer?.certificate?.name),
                            "certificateFingerprint": .string(orNull: peer?.certificate?.fingerprint),
                            "lastSeen": .string(orNull: peer?.lastSeen.map { formatter.string(from: $0) }),
                        ])
                    }),
            ]))
    }
}
