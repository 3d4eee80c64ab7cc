import ArgumentParser
import Foundation
import Logging
import Tether
import TetherSync

#if canImport(Glibc)
    import Glibc
#endif

/// `tether sync`: one sync session with a peer, then exit.
struct Sync: AsyncParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync",
        abstract: "Sync once with a peer over mutual TLS: catch up both ways, then exit with a summary.",
        discussion: """
            On a terminal, a progress line on stderr shows the share done, the changes received and sent, \
            the bytes, the rate (rows/s) and the time left; none when stderr is a file or a pipe. \
            The summary goes to stdout; with --json, one object: "peer" (its instance key, or null), "changesSent", \
            "changesReceived", "applied", "unchanged", "conflicts", "keptAside", "refused" (the peer's changes \
            refused here), "refusedByPeer", "bytesSent", "bytesReceived", "deferredFromPeer" and "deferredByPeer" \
            (the reason, or null), "seconds". \
            Exit 69 when the peer cannot be reached or the connection is lost, 77 for certificate, key and TLS \
            failures, \
            65 for a schema mismatch, 74 when the disk is full (not even one change fits), 75 when either side \
            deferred \
            the other's changes because its clock is ahead (they stay pending; sync again later or raise \
            --max-clock-skew; \
            the summary is printed first).
            """)
    static let configKeys =
        DatabaseOption<ExistingDatabase>.configKeys + ["peer"] + TLSOptions.configKeys + ["max-clock-skew"]
        + InterestOption.configKeys + WholeCatchUpsOption.configKeys + OutputFormatOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @Option(help: ArgumentHelp("The peer's address.", valueName: "host:port"))
    var peer: String

    @OptionGroup(title: "TLS options") var tls: TLSOptions

    @OptionGroup var clockSkew: ClockSkewOption

    @OptionGroup var interest: InterestOption

    @OptionGroup var wholeCatchUps: WholeCatchUpsOption

    @OptionGroup var output: OutputFormatOption

    func validate() throws {
        do { _ = try PeerAddress(parsing: peer) } catch let error as CLIError { throw ValidationError(error.message) }
    }

    func run() async throws {
        let logger = common.bootstrapLogging()
        let address = try PeerAddress(parsing: peer)
        let context = try tls.context(role: .client)
        let database = try db.openExisting()
        try clockSkew.apply(to: database)
        var options = SyncOptions()
        options.interest = try interest.rules()
        wholeCatchUps.apply(to: &options)
        try InterestOption.check(options.interest, against: database)
        logger.info("syncing \(db.path) with \(address)")
        let started = ContinuousClock.now
        let summary: SyncSummary
        do {
            let run = try await SyncClient.startSync(
                database: database, host: address.host, port: address.port, tls: context, options: options)
            if ProgressBar.isShown {
                let bar = ProgressBar()
                for await step in run.progress { bar.draw(step) }
                bar.clear()
            }
            summary = try await run.summary()
        } catch {
            throw Self.classify(error, address: address)
        }
        output.print(Self.summaryLine(summary), json: Self.report(summary, seconds: started.duration(to: .now).seconds))
        // Changes left pending by a deferral: not a failure of the session, but not a full sync either.
        if let reason = summary.deferredFromPeer {
            throw CLIError(.temporaryFailure, "the peer's changes were deferred, they stay pending on it: \(reason)")
        }
        if let reason = summary.deferredByPeer {
            throw CLIError(
                .temporaryFailure, "the peer deferred this database's changes, they stay pending here: \(reason)")
        }
    }

    /// The `--json` summary (its keys are listed in the command's discussion).
    static func report(_ summary: SyncSummary, seconds: Double) -> JSONValue {
        .object([
            "peer": .string(orNull: summary.peer?.hex),
            "changesSent": .int(summary.changesSent), "changesReceived": .int(summary.changesReceived),
            "applied": .int(summary.applied), "unchanged": .int(summary.unchanged),
            "conflicts": .int(summary.conflicts),
            "keptAside": .int(summary.keptAside), "refused": .int(summary.refused),
            "refusedByPeer": .int(summary.refusedByPeer),
            "bytesSent": .int(summary.bytesSent), "bytesReceived": .int(summary.bytesReceived),
            "deferredFromPeer": .string(orNull: summary.deferredFromPeer),
            "deferredByPeer": .string(orNull: summary.deferredByPeer),
            "seconds": .real((seconds * 1000).rounded() / 1000),
        ])
    }

    /// A summary line: sent, received, applied, conflicts, kept aside.
    static func summaryLine(_ summary: SyncSummary) -> String {
        "synced with \(summary.peer?.hex ?? "peer"): sent \(summary.changesSent), received \(summary.changesReceived), "
            + "applied \(summary.applied), conflicts \(summary.conflicts), kept aside \(summary.keptAside)"
    }

    /// Errors of the session keep their own mapping; anything else from the
    /// connection (refused, unreachable, reset) is "peer unavailable".
    static func classify(_ error: any Error, address: PeerAddress) -> any Error {
        switch error {
        case is SyncSessionError, is TLSError, is TLSConfigurationError, is DatabaseError, is SyncError, is CLIError:
            switch error as? SyncSessionError {
            case .transport?: return CLIError(.unavailable, "cannot sync with \(address): \(error)")
            case let .tls(tls)?: return CLIError(ErrorReport.status(of: tls), "cannot sync with \(address): \(error)")
            default: return error
            }
        default:
            return CLIError(.unavailable, "cannot reach peer \(address): \(describe(error))")
        }
    }

    private static func describe(_ error: any Error) -> String {
        let text = String(describing: error)
        if text.contains("connection refused") || text.contains("Connection refused") || text.contains("ECONNREFUSED") {
            return "connection refused"
        }
        return text
    }
}

/// The progress line `tether sync` draws on stderr while it runs, when stderr is a terminal:
/// the share done, the changes each way, the bytes, the rate and the time left.
struct ProgressBar {
    /// Drawn only on a terminal: redirected to a file or a pipe, stderr gets no `\r` lines.
    static var isShown: Bool { isatty(STDERR_FILENO) == 1 }

    private let started = ContinuousClock.now

    func draw(_ step: SyncSessionProgress) {
        let line = Self.line(step, elapsed: started.duration(to: .now), columns: Self.terminalColumns())
        // "\u{1B}[K" erases what a longer previous line left after this one.
        FileHandle.standardError.write(Data("\r\(line)\u{1B}[K".utf8))
    }

    func clear() {
        FileHandle.standardError.write(Data("\r\u{1B}[K".utf8))
    }

    /// The width of the terminal on stderr, read at each draw (it may be resized); 80 when unknown.
    static func terminalColumns() -> Int {
        var size = winsize()
        let known =
            withUnsafeMutablePointer(to: &size) { ioctl(STDERR_FILENO, UInt(TIOCGWINSZ), $0) } == 0 && size.ws_col > 0
        return known ? Int(size.ws_col) : 80
    }

    /// The line for `step`, `elapsed` after the session started, in fewer than `columns`
    /// characters (a line that wraps cannot be redrawn in place), e.g.
    /// `[#########.....................] 30%  received 450000/1500000, sent 0, 38.2 MB, 52000 rows/s, 20s left`.
    /// The rate is the average since the start; the time left is the changes still expected at
    /// that rate (left out while no change has arrived, or once nothing more is expected). On a
    /// narrow terminal the bar narrows, down to 10 characters; then the bar, the bytes and the
    /// rate are left out, in that order.
    static func line(_ step: SyncSessionProgress, elapsed: Duration, columns: Int) -> String {
        let done = step.done.changesReceived + step.done.changesSent
        let expected =
            (step.changesExpectedToReceive ?? step.done.changesReceived)
            + (step.changesExpectedToSend ?? step.done.changesSent)
        let fraction = expected > 0 ? min(1, Double(done) / Double(expected)) : 0
        func count(_ done: Int, of expected: Int?) -> String {
            guard let expected, expected > 0 else { return "\(done)" }
            return "\(done)/\(expected)"
        }
        let counts =
            "\(Int(fraction * 100))%  received \(count(step.done.changesReceived, of: step.changesExpectedToReceive)), "
            + "sent \(count(step.done.changesSent, of: step.changesExpectedToSend))"
        let bytes = byteCount(step.done.bytesReceived + step.done.bytesSent)
        var rate: String?, left: String?
        let seconds = elapsed.seconds
        if done > 0, seconds > 0 {
            let rowsPerSecond = Double(done) / seconds
            rate = "\(Int(rowsPerSecond.rounded())) rows/s"
            if expected > done, !step.caughtUp { left = "\(timeLeft(Double(expected - done) / rowsPerSecond)) left" }
        }
        let room = columns - 1  // the last column would wrap on some terminals
        let full = [counts, bytes, rate, left].compactMap { $0 }.joined(separator: ", ")
        let width = min(30, room - full.count - 3)  // "[", "] "
        if width >= 10 {
            let filled = Int(fraction * Double(width))
            return "[" + String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled) + "] "
                + full
        }
        let shorter = [
            full, [counts, rate, left].compactMap { $0 }.joined(separator: ", "),
            [counts, left].compactMap { $0 }.joined(separator: ", "),
        ]
        return shorter.first { $0.count <= room } ?? String(counts.prefix(max(0, room)))
    }

    /// `512 B`, `38.2 kB`, `1.5 MB`, `2.1 GB` (powers of 1000, as `ls -h --si` and network tools count).
    static func byteCount(_ bytes: Int) -> String {
        let units = ["B", "kB", "MB", "GB", "TB"]
        var value = Double(bytes)
        var unit = 0
        while value >= 999.95, unit < units.count - 1 {
            value /= 1000
            unit += 1
        }
        return unit == 0 ? "\(bytes) B" : String(format: "%.1f", value) + " " + units[unit]
    }

    /// `45s`, `3m 05s`, `2h 07m`.
    static func timeLeft(_ seconds: Double) -> String {
        let total = Int(min(seconds, 359_999).rounded(.up))
        let hours = total / 3600, minutes = total % 3600 / 60, secs = total % 60
        if hours > 0 { return String(format: "%dh %02dm", hours, minutes) }
        if minutes > 0 { return String(format: "%dm %02ds", minutes, secs) }
        return "\(secs)s"
    }
}
