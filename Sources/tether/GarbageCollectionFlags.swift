import ArgumentParser
import Foundation
import TetherSync

/// A duration as the flags write it: a whole number and its unit, `90s`, `10m`, `12h`, `30d`
/// (`never` where the flag allows it: nil).
enum DurationFlag {
    private static let units: [(suffix: String, seconds: Int64)] = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)]

    /// The duration `text` gives for `--flag`, or a usage error naming the flag and the forms it takes.
    static func parse(_ text: String, flag: String, allowsNever: Bool) throws -> Duration? {
        if allowsNever, text == "never" { return nil }
        let forms = "a whole number and a unit: 90s, 10m, 12h, 30d" + (allowsNever ? ", or never" : "")
        guard let unit = units.first(where: { text.hasSuffix($0.suffix) }),
            let count = Int64(text.dropLast(unit.suffix.count)), count > 0,
            count <= Int64.max / unit.seconds
        else {
            throw ValidationError("--\(flag) \(text): expected \(forms)")
        }
        return .seconds(count * unit.seconds)
    }

    /// `duration` in the largest unit that writes it whole (`30d`, `90s`), as the flags take it.
    static func describe(_ duration: Duration) -> String {
        let seconds = duration.components.seconds
        let unit = units.first { seconds % $0.seconds == 0 } ?? units[units.count - 1]
        return "\(seconds / unit.seconds)\(unit.suffix)"
    }

    /// A horizon as the flags write it: `30d`, or `never` for none.
    static func describe(horizon: Duration?) -> String {
        horizon.map(describe) ?? "never"
    }

    /// `seconds` roughly, in the largest unit it holds at least one of (`3 days`, `5 h`), for the
    /// ages `tether status` shows.
    static func age(_ seconds: TimeInterval) -> String {
        let whole = Int64(max(0, seconds))
        for (suffix, size) in units where whole >= size {
            let count = whole / size
            switch suffix {
            case "d": return "\(count) day\(count == 1 ? "" : "s")"
            case "h": return "\(count) h"
            case "m": return "\(count) min"
            default: return "\(count) s"
            }
        }
        return "0 s"
    }
}

/// `--forget-peers-after DURATION|never`, for `serve`, `gc` and `status`: the horizon after which
/// a peer not seen is forgotten by garbage collection (default 30 days, as
/// `GarbageCollectionSchedule.defaultForgetPeersAfter`).
struct ForgetPeersOption: ParsableArguments {
    static let configKeys = ["forget-peers-after"]

    @Option(
        name: .customLong("forget-peers-after"),
        help: ArgumentHelp(
            """
            Forget peers not seen for this long (90s, 10m, 12h, 30d; never: keep every peer; default 30d): they \
            stop holding tombstones back, and one that returns gets a full resync before its changes are taken.
            """,
            valueName: "duration"))
    var text: String?

    func validate() throws {
        _ = try horizon()
    }

    /// The horizon the flag gives (nil: never).
    func horizon() throws -> Duration? {
        guard let text else { return GarbageCollectionSchedule.defaultForgetPeersAfter }
        return try DurationFlag.parse(text, flag: "forget-peers-after", allowsNever: true)
    }

    /// The horizon as the flag writes it, for the reports.
    var description: String {
        DurationFlag.describe(horizon: try? horizon())
    }
}
