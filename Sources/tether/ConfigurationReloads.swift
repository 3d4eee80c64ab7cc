import ArgumentParser
import Logging
import ServiceLifecycle
import Tether
import TetherSync

/// A setting of `tether serve` that a running node cannot change: SIGHUP reads it again only to
/// say, when it differs, that it takes effect at the next start.
struct RestartOnlySetting: Sendable, Equatable {
    /// The flag, without dashes (`listen`).
    var flag: String
    /// Its value, as the flags give it.
    var value: String
}

/// `tether serve`'s SIGHUP: reads the command line and the configuration file again, as at the
/// start (`TetherCommand.parse`), and gives the node's next sessions the peer policies (`--allow`,
/// `--read-only-peer`, `--peer-policy`) and interest it finds; the log level changes at once. The
/// sessions open keep theirs to their end. A configuration that does not parse, or that does not
/// fit the database, is refused whole with a logged error: the previous one stays. What cannot
/// change live (`RestartOnlySetting`) is logged as waiting for a restart when it differs.
///
/// Stops on the group's graceful shutdown, never cancelling the signal's source (see `StopRequests`).
struct ConfigurationReloads: Service {
    let signals: SignalWatcher
    /// The process's arguments, read again with the file at each reload.
    let arguments: [String]
    /// The configuration file they name (nil: none, SIGHUP has nothing to read).
    let path: String?
    /// What the node started with and cannot change.
    let startedWith: [RestartOnlySetting]
    let node: SyncNode
    let database: Database
    let logger: Logger

    func run() async throws {
        await cancelWhenGracefulShutdown { [self] in
            while await signals.next() != nil, !Task.isCancelled {
                reload()
            }
        }
    }

    /// Reads the configuration again and applies it, or logs why not.
    func reload() {
        guard let path else {
            logger.warning(
                """
                SIGHUP: tether serve was started without --config, so there is no configuration file to read \
                again: nothing changed
                """)
            return
        }
        let serve: Serve
        let options: SyncOptions
        do {
            guard let parsed = try TetherCommand.parse(arguments: arguments) as? Serve else {
                return refuse("the arguments no longer name tether serve", path: path)
            }
            serve = parsed
            options = try serve.syncOptions()
            try Serve.check(options: options, against: database)
        } catch {
            return refuse(Self.describe(error), path: path)
        }
        for (started, now) in zip(startedWith, serve.restartOnlySettings) where started != now {
            logger.warning(
                """
                configuration \(path): \(now.flag) is now \(now.value), still \(started.value) until tether serve \
                restarts (it cannot change while it runs)
                """)
        }
        var next = node.options
        next.peers = options.peers
        next.interest = options.interest
        node.replaceOptions(next)
        TetherLogging.level = serve.common.logLevel
        let policies = options.peers.rules.count + (options.peers.others == PeerPolicy() ? 0 : 1)
        Output.line(
            "reloaded configuration from \(path): \(policies) peer polic\(policies == 1 ? "y" : "ies"), "
                + "\(options.interest.count) interest rule\(options.interest.count == 1 ? "" : "s"), log level "
                + "\(serve.common.logLevel); "
                + "sessions from now on use them")
    }

    private func refuse(_ reason: String, path: String) {
        logger.error("configuration not reloaded from \(path): \(reason); the previous configuration stays")
    }

    /// One line for whatever reading the configuration threw: the file's error, a flag's, a policy's.
    static func describe(_ error: any Error) -> String {
        if TetherCommand.isParserError(error) { return TetherCommand.usageMessage(for: error) }
        // The line names the file already.
        if let error = error as? ConfigFileError { return error.reason }
        return ErrorReport.classify(error).message
    }
}
