import ArgumentParser
import Foundation

/// The `tether` command: Tether without writing Swift.
///
/// `main()` merges the configuration file into the arguments
/// (`ConfigFile.mergedArguments`), parses them, runs the command, and turns
/// any error into one line on stderr and an exit code (`ErrorReport`,
/// `ExitStatus`): never a stack trace.
@main
struct TetherCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tether",
        abstract: "An embedded SQLite ORM with a replication engine: tools and demo.",
        discussion: """
            Exit codes: 0 success, 64 usage, 65 bad data (SQL, schema mismatch, not a Tether database, bad sync file), \
            66 cannot open input, 69 peer unavailable, 70 internal error, 73 cannot create output, 74 I/O error, \
            75 database locked, 76 sync protocol error, 77 not permitted (certificates, keys, TLS). \
            Commands that print a report take --json for scripts. \
            Shell completion: tether --generate-completion-script bash|zsh|fish.
            """,
        subcommands: [
            Init.self, Cert.self, Serve.self, Sync.self, SQL.self, Status.self, GarbageCollect.self, Watch.self,
            Export.self, Import.self, Rekey.self, Backup.self, Demo.self,
        ])

    static func main() async {
        let arguments = Array(CommandLine.arguments.dropFirst())
        let code = await run(arguments: arguments)
        Foundation.exit(code)
    }

    /// Parses and runs `arguments`; returns the exit code (errors already reported).
    static func run(arguments: [String]) async -> Int32 {
        var command: any ParsableCommand
        do {
            command = try parse(arguments: arguments)
        } catch let error as ConfigFileError {
            return ErrorReport.report(error)
        } catch {
            return reportParserError(error, arguments: arguments)
        }
        do {
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
            return 0
        } catch let exit as ExitCode {
            return exit.rawValue
        } catch  where isParserError(error) {
            return reportParserError(error, arguments: arguments)
        } catch {
            return ErrorReport.report(error)
        }
    }

    /// The command `arguments` give, with the configuration file's values merged in: how `run`
    /// reads them, and how `tether serve` reads them again on SIGHUP. Throws `ConfigFileError`
    /// for the file, ArgumentParser's errors (a `ValidationError` for an option given twice) for the rest.
    static func parse(arguments: [String]) throws -> any ParsableCommand {
        let merged = try ConfigFile.mergedArguments(arguments, root: TetherCommand.self)
        try SingleValueOptions.checkGivenOnce(merged, root: TetherCommand.self)
        return try parseAsRoot(merged)
    }

    /// Whether `error` is ArgumentParser's (a usage error, or a request for help).
    static func isParserError(_ error: any Error) -> Bool {
        String(reflecting: type(of: error)).hasPrefix("ArgumentParser.")
    }

    /// ArgumentParser's message for `error`, its first line.
    static func usageMessage(for error: any Error) -> String {
        message(for: error).split(whereSeparator: \.isNewline).first.map(String.init) ?? "invalid arguments"
    }

    /// Help goes to stdout (exit 0); a usage error is one line on stderr (exit 64), pointing to
    /// the help of the command given (`see: tether help sync`).
    private static func reportParserError(_ error: any Error, arguments: [String]) -> Int32 {
        let code = exitCode(for: error)
        if code == .success {
            Output.line(fullMessage(for: error))
            return 0
        }
        let message = usageMessage(for: error)
        let command = ConfigFile.commandPath(for: arguments, root: TetherCommand.self).map(ConfigFile.name(of:))
        ErrorReport.printError("\(message) (see: \((["tether", "help"] + command).joined(separator: " ")))")
        return code.rawValue == 1 ? ExitStatus.usage.rawValue : code.rawValue
    }
}
