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
        discussion: "Exit 69 when the peer cannot be reached or the connection is lost, 77 for certificate, key and TLS failures, 65 for a schema mismatch, 74 when the disk is full (not even one change fits), 75 when either side deferred the other's changes because its clock is ahead (they stay pending; sync again later or raise --max-clock-skew).")
    static let configKeys = ["db", "peer", "cert", "key", "ca", "max-clock-skew"] + InterestOption.configKeys

    @OptionGroup var common: CommonOptions

    @Option(help: ArgumentHelp("The Tether database.", valueName: "path"))
    var db: String

    @Option(help: ArgumentHelp("The peer's address.", valueName: "host:port"))
    var peer: String

    @Option(help: ArgumentHelp("This node's certificate (PEM).", valueName: "file"))
    var cert: String

    @Option(help: ArgumentHelp("This node's private key (PEM).", valueName: "file"))
    var key: String

    @Option(help: ArgumentHelp("The CA certificate the peer's certificate must chain to (PEM).", valueName: "file"))
    var ca: String

    @OptionGroup var clockSkew: ClockSkewOption

    @OptionGroup var interest: InterestOption

    func validate() throws {
        do { _ = try PeerAddress(parsing: peer) } catch let error as CLIError { throw ValidationError(error.message) }
    }

    func run() async throws {
        let logger = common.bootstrapLogging()
        let address = try PeerAddress(parsing: peer)
        let tls = try TLSFiles.context(role: .client, certificate: cert, key: key, ca: ca)
        let database = try TetherDatabase.openExisting(path: db)
        try clockSkew.apply(to: database)
        var options = SyncOptions()
        options.interest = try interest.rules()
        try InterestOption.check(options.interest, against: database)
        logger.info("syncing \(db) with \(address)")
        let summary: SyncSummary
        do {
            let run = try await SyncClient.startSync(database: database, host: address.host, port: address.port, tls: tls, options: options)
            if isatty(STDERR_FILENO) == 1 {
                for await step in run.progress { ProgressBar.draw(step) }
                ProgressBar.clear()
            }
            summary = try await run.summary()
        } catch {
            throw Self.classify(error, address: address)
        }
        Output.line(Self.summaryLine(summary))
        // Changes left pending by a deferral: not a failure of the session, but not a full sync either.
        if let reason = summary.deferredFromPeer {
            throw CLIError(.temporaryFailure, "the peer's changes were deferred, they stay pending on it: \(reason)")
        }
        if let reason = summary.deferredByPeer {
            throw CLIError(.temporaryFailure, "the peer deferred this database's changes, they stay pending here: \(reason)")
        }
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
            if let session = error as? SyncSessionError, case .transport = session {
                return CLIError(.unavailable, "cannot sync with \(address): \(session.description)")
            }
            return error
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

/// The progress line `tether sync` draws on a terminal's stderr.
enum ProgressBar {
    static func draw(_ step: SyncSessionProgress) {
        let done = step.done.changesReceived + step.done.changesSent
        let expected = (step.changesExpectedToReceive ?? step.done.changesReceived) + (step.changesExpectedToSend ?? step.done.changesSent)
        let fraction = expected > 0 ? min(1, Double(done) / Double(expected)) : 0
        let width = 30
        let filled = Int(fraction * Double(width))
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        let line = "\r[\(bar)] \(Int(fraction * 100))%  received \(step.done.changesReceived), sent \(step.done.changesSent), "
            + "\(step.done.bytesReceived + step.done.bytesSent) bytes"
        FileHandle.standardError.write(Data(line.utf8))
    }

    static func clear() {
        FileHandle.standardError.write(Data("\r\u{1B}[K".utf8))
    }
}
