import ArgumentParser
import Foundation
import Logging
import Tether
import TetherSync

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// The options every `tether` command takes: `--config FILE` and `--log-level LEVEL`.
///
/// Use it in a command as `@OptionGroup var common: CommonOptions`, and call
/// `common.bootstrapLogging()` first thing in `run()`: it returns the logger to use.
/// The configuration file itself is merged into the arguments before parsing
/// (`ConfigFile.mergedArguments(_:root:)`), so by the time a command runs its
/// flags already hold the file's values.
struct CommonOptions: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp(
            """
            A JSON configuration file: an object whose keys are long flag names without dashes (\"db\", \
            \"peer\"…); flags given on the command line override it.
            """,
            valueName: "file"))
    var config: String?

    @Option(
        name: .customLong("log-level"),
        help: ArgumentHelp(
            "Log level on stderr: trace, debug, info, notice, warning, error or critical.", valueName: "level"))
    var logLevel: Logger.Level = .warning

    /// Sets up logging to stderr at `--log-level` (once per process) and returns a logger.
    @discardableResult
    func bootstrapLogging(label: String = "tether") -> Logger {
        TetherLogging.bootstrap(level: logLevel)
        return Logger(label: label)
    }
}

/// What `--db` says of the database, in the help of the command that takes it.
protocol DatabaseOptionRole {
    static var help: String { get }
}

/// `--db` of every command but `init`: a database `tether init` made.
enum ExistingDatabase: DatabaseOptionRole {
    static let help = "The Tether database (a file made by tether init)."
}

/// `--db` of `tether init`: the file is created if it does not exist.
enum DatabaseCreatedIfMissing: DatabaseOptionRole {
    static let help = "The database file (created if missing)."
}

/// `--db PATH`, the database a command works on: declared here once for every command that
/// takes it (`@OptionGroup var db: DatabaseOption<ExistingDatabase>`).
struct DatabaseOption<Role: DatabaseOptionRole>: ParsableArguments {
    static var configKeys: [String] { ["db"] }

    @Option(name: .customLong("db"), help: ArgumentHelp(Role.help, valueName: "path"), completion: .file())
    var path: String

    func validate() throws {
        if path.isEmpty { throw ValidationError("--db must name a file") }
    }

    /// Opens the database, which must exist and be Tether's (`TetherDatabase.openExisting(path:)`).
    func openExisting() throws -> Database {
        try TetherDatabase.openExisting(path: path)
    }
}

/// `--cert`, `--key`, `--ca`: the TLS material of the commands that sync (`sync`, `serve`).
struct TLSOptions: ParsableArguments {
    static let configKeys = ["cert", "key", "ca"]

    @Option(
        help: ArgumentHelp(
            """
            This node's certificate (PEM, as tether cert node writes it), shown to peers both when connecting and \
            when accepting.
            """,
            valueName: "file"),
        completion: .file(extensions: ["pem"]))
    var cert: String

    @Option(
        help: ArgumentHelp("This node's private key (PEM).", valueName: "file"), completion: .file(extensions: ["pem"]))
    var key: String

    @Option(
        help: ArgumentHelp(
            """
            The CA certificate (PEM) that peers' certificates must chain to. Given once: to trust several CAs \
            (while rotating one), give a file that holds them all (cat old.pem new.pem > bundle.pem).
            """, valueName: "file"),
        completion: .file(extensions: ["pem"]))
    var ca: String

    /// A TLS context for `role` from the three files (errors map to exit codes 66 and 77).
    func context(role: TLSConfiguration.Role) throws -> TLSContext {
        try TLSFiles.context(role: role, certificate: cert, key: key, ca: ca)
    }
}

/// `--json`: a report for scripts instead of text, for every command that prints one. Each
/// command's help describes its JSON; a report is one object on one line, whose keys are
/// always there (`null` when a value is absent).
struct OutputFormatOption: ParsableArguments {
    static let configKeys = ["json"]

    @Flag(help: "Print JSON for scripts instead of text (as described above).")
    var json = false

    /// Prints `report` as one line of JSON with `--json`, otherwise `text`.
    func print(_ text: @autoclosure () -> String, json report: @autoclosure () -> JSONValue) {
        Output.line(json ? report().json : text())
    }
}

/// `--whole-catch-ups` (the default) or `--no-whole-catch-ups`, for the commands that sync (`sync`, `serve`):
/// see `SyncOptions.wholeCatchUps`.
struct WholeCatchUpsOption: ParsableArguments {
    static let configKeys = ["whole-catch-ups", "no-whole-catch-ups"]

    @Flag(
        inversion: .prefixedNo,
        help: """
            Apply each catch-up from a peer whole (the default): readers see only states the peer held, never \
            part of one of its transactions; its batches are applied as they arrive in one transaction, \
            committed with the last, and kept on disk until then, so that a cut catch-up leaves the state \
            before it and resumes after what arrived. --no-whole-catch-ups commits each batch as it comes.
            """)
    var wholeCatchUps = true

    func apply(to options: inout SyncOptions) { options.wholeCatchUps = wholeCatchUps }
}

/// `--max-clock-skew SECONDS`, for the commands that sync (`sync`, `serve`).
struct ClockSkewOption: ParsableArguments {
    @Option(
        name: .customLong("max-clock-skew"),
        help: ArgumentHelp(
            """
            Accept peers' changes stamped up to this many seconds ahead of this machine's clock (default 3600); \
            later ones are deferred until this clock catches up.
            """,
            valueName: "seconds"))
    var seconds: Int?

    func validate() throws {
        if let seconds, seconds < 0 {
            throw ValidationError("--max-clock-skew \(seconds): a number of seconds, 0 or more")
        }
    }

    func apply(to database: Database) throws {
        if let seconds { try database.setMaximumClockSkew(.seconds(seconds)) }
    }
}

/// swift-log, writing to stderr through `StreamLogHandler`, at one level for the whole process
/// that `tether serve` may change while it runs (SIGHUP, `--log-level` in its configuration file).
enum TetherLogging {
    private final class State: @unchecked Sendable {
        let lock = NSLock()
        var bootstrapped = false
        var level = Logger.Level.warning
    }
    private static let state = State()

    /// Bootstraps the logging system once per process at `level` (later calls do nothing:
    /// swift-log allows one bootstrap; setting `level` changes it).
    static func bootstrap(level: Logger.Level) {
        state.lock.lock()
        defer { state.lock.unlock() }
        guard !state.bootstrapped else { return }
        state.bootstrapped = true
        state.level = level
        LoggingSystem.bootstrap { label in
            ProcessLevelHandler(stream: StreamLogHandler.standardError(label: label))
        }
    }

    /// The level every logger of the process logs at from now on, those made before included.
    static var level: Logger.Level {
        get { state.lock.withLock { state.level } }
        set { state.lock.withLock { state.level = newValue } }
    }

    /// `StreamLogHandler` at the process's level, unless a logger sets its own.
    private struct ProcessLevelHandler: LogHandler {
        var stream: StreamLogHandler
        var ownLevel: Logger.Level?

        init(stream: StreamLogHandler) {
            self.stream = stream
        }

        var logLevel: Logger.Level {
            get { ownLevel ?? TetherLogging.level }
            set { ownLevel = newValue }
        }

        var metadata: Logger.Metadata {
            get { stream.metadata }
            set { stream.metadata = newValue }
        }

        var metadataProvider: Logger.MetadataProvider? {
            get { stream.metadataProvider }
            set { stream.metadataProvider = newValue }
        }

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { stream[metadataKey: key] }
            set { stream[metadataKey: key] = newValue }
        }

        func log(event: LogEvent) {
            stream.log(event: event)
        }
    }
}

/// A command whose flags may come from a configuration file: it lists the keys
/// it takes (long flag names without dashes). Keys of the file that the
/// command being run does not take are ignored (one file can serve `sync` and
/// `serve`); keys that no command takes are an error.
protocol ConfigurableCommand {
    static var configKeys: [String] { get }
}

/// Why a configuration file was refused.
struct ConfigFileError: Error, CustomStringConvertible {
    var path: String
    var reason: String
    var isMissing = false
    var description: String { "configuration file \(path): \(reason)" }
}

/// The configuration file: a JSON object whose keys are the long flag names
/// without the dashes, e.g.
///
/// ```json
/// { "db": "node.sqlite", "peer": "10.0.0.2:7000", "cert": "certs/cert.pem",
///   "key": "certs/key.pem", "ca": "ca/ca.pem", "sync": ["player", "match"], "log-level": "info" }
/// ```
///
/// Strings and numbers are the flag's value; `true` sets a flag that takes no
/// value (`"json": true`), `false` and `null` leave it unset; an array repeats the
/// flag once per element; an object gives the flag once per entry, as `NAME=VALUE`, a string value
/// as it is and any other as JSON (`"peer-policy": {"north": {"read-only": true}}` is
/// `--peer-policy 'north={"read-only":true}'`, `"interest": {"orders": "site = 'north'"}` is
/// `--interest "orders=site = 'north'"`). Positional arguments (the SQL of `tether sql`, the
/// file of `tether import`) cannot come from the file. A flag given on the
/// command line replaces the file's value (for an array, all of it).
enum ConfigFile {
    /// Reads and checks the file.
    static func load(path: String) throws -> [String: JSONValue] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw ConfigFileError(path: path, reason: "no such file", isMissing: true)
        }
        guard !isDirectory.boolValue else {
            throw ConfigFileError(path: path, reason: "is a directory", isMissing: true)
        }
        let data: Data
        do { data = try Data(contentsOf: URL(fileURLWithPath: path)) } catch {
            throw ConfigFileError(path: path, reason: "cannot be read (\(error.localizedDescription))", isMissing: true)
        }
        let object: Any
        do { object = try JSONSerialization.jsonObject(with: data) } catch {
            throw ConfigFileError(path: path, reason: "is not valid JSON: \(syntaxError(error, in: data))")
        }
        guard object is [String: Any] else {
            throw ConfigFileError(
                path: path, reason: "must hold a JSON object whose keys are flag names without dashes")
        }
        do {
            return try JSONDecoder().decode([String: JSONValue].self, from: data)
        } catch {
            throw ConfigFileError(
                path: path, reason: "values must be strings, numbers, booleans, null, arrays or objects of those")
        }
    }

    /// Where the JSON parser stopped, as line and column with the line's text: Foundation says
    /// only "Invalid value around character 24".
    static func syntaxError(_ error: any Error, in data: Data) -> String {
        let said = ((error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String) ?? "\(error)"
        guard let range = said.range(of: "character "),
            let offset = Int(said[range.upperBound...].prefix { $0.isNumber }), offset <= data.count
        else { return said }
        let before = data.prefix(offset)
        let line = before.filter { $0 == 0x0A }.count + 1
        let lineStart = before.lastIndex(of: 0x0A).map { $0 + 1 } ?? data.startIndex
        let column = offset - (lineStart - data.startIndex) + 1
        let lineEnd = data[lineStart...].firstIndex(of: 0x0A) ?? data.endIndex
        let text = String(decoding: data[lineStart..<lineEnd], as: UTF8.self).trimmingCharacters(in: .whitespaces)
        let what = said.components(separatedBy: " around ").first ?? said
        return "\(what) at line \(line), column \(column): \(text)"
    }

    /// `arguments` (without the program name) with the values of the file
    /// named by `--config` added for every flag not already given. The command
    /// is found by walking `root`'s subcommands; its `ConfigurableCommand`
    /// keys say which of the file's keys it takes.
    static func mergedArguments(_ arguments: [String], root: any ParsableCommand.Type) throws -> [String] {
        let terminator = arguments.firstIndex(of: "--") ?? arguments.endIndex
        let options = arguments[..<terminator]
        var path: String?
        for (index, argument) in options.enumerated() {
            if argument == "--config" {
                guard index + 1 < options.count else { return arguments }  // ArgumentParser reports the missing value
                path = options[options.startIndex + index + 1]
            } else if argument.hasPrefix("--config=") {
                path = String(argument.dropFirst("--config=".count))
            }
        }
        guard let path else { return arguments }
        let config = try load(path: path)

        let command = self.command(for: Array(options), root: root)
        let allKeys = Set(allConfigKeys(root)).union(["log-level"])
        let accepted: Set<String>? = (command as? any ConfigurableCommand.Type).map {
            Set($0.configKeys).union(["log-level"])
        }
        let given = Set(
            options.compactMap { argument -> String? in
                guard argument.hasPrefix("--") else { return nil }
                return String(argument.dropFirst(2).prefix { $0 != "=" })
            })

        let singleValued = SingleValueOptions.options(of: command).single
        var added: [String] = []
        for key in config.keys.sorted() {
            guard key != "config" else {
                throw ConfigFileError(path: path, reason: "\"config\" cannot name another configuration file")
            }
            guard allKeys.contains(key) else { throw ConfigFileError(path: path, reason: "unknown key \"\(key)\"") }
            if let accepted, !accepted.contains(key) { continue }
            if given.contains(key) { continue }
            let values: [JSONValue]
            if case let .array(array) = config[key] { values = array } else { values = config[key].map { [$0] } ?? [] }
            let flags = try values.flatMap { try flagArguments(for: key, value: $0, path: path) }
            // An array (or an object of several entries) repeats the flag: refused for a flag that
            // takes one value, as it is on the command line.
            let flagValues = zip(flags, flags.dropFirst()).filter { $0.0 == "--\(key)" }.map(\.1)
            if singleValued.contains(key), flagValues.count > 1 {
                throw ConfigFileError(
                    path: path,
                    reason: SingleValueOptions.repeatedMessage(key, values: flagValues, inConfigurationFile: true))
            }
            added += flags
        }
        var merged = Array(arguments[..<terminator])
        merged += added
        merged += arguments[terminator...]
        return merged
    }

    private static func flagArguments(for key: String, value: JSONValue, path: String) throws -> [String] {
        switch value {
        case .null: return []
        case let .bool(bool): return bool ? ["--\(key)"] : []
        case let .integer(integer): return ["--\(key)", String(integer)]
        case let .real(real): return ["--\(key)", String(real)]
        case let .string(string): return ["--\(key)", string]
        case let .object(entries):
            return entries.keys.sorted().flatMap { name -> [String] in
                // A string is the value itself (a filter), not its JSON quoting.
                if case let .string(text) = entries[name] { return ["--\(key)", "\(name)=\(text)"] }
                return ["--\(key)", "\(name)=\(entries[name]?.json ?? "null")"]
            }
        case .array:
            throw ConfigFileError(path: path, reason: "the value of \"\(key)\" is an array of arrays")
        }
    }

    /// The (sub)command the arguments name, following subcommand names from `root`.
    static func command(for arguments: [String], root: any ParsableCommand.Type) -> any ParsableCommand.Type {
        commandPath(for: arguments, root: root).last ?? root
    }

    /// The subcommands the arguments name, in order from `root` (`cert`, `node` for `tether cert node …`).
    static func commandPath(for arguments: [String], root: any ParsableCommand.Type) -> [any ParsableCommand.Type] {
        var path: [any ParsableCommand.Type] = []
        var current = root
        for argument in arguments where !argument.hasPrefix("-") {
            guard let next = current.configuration.subcommands.first(where: { name(of: $0) == argument }) else { break }
            path.append(next)
            current = next
        }
        return path
    }

    static func name(of command: any ParsableCommand.Type) -> String {
        command.configuration.commandName ?? String(describing: command).lowercased()
    }

    private static func allConfigKeys(_ command: any ParsableCommand.Type) -> [String] {
        ((command as? any ConfigurableCommand.Type)?.configKeys ?? [])
            + command.configuration.subcommands.flatMap { allConfigKeys($0) }
    }
}
