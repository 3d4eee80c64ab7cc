import ArgumentParser
import Foundation
import Logging
import Tether

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// The options every `tether` command takes: `--config FILE` and `--log-level LEVEL`.
///
/// Use it in a command as `@OptionGroup var common: CommonOptions`, and call
/// `common.bootstrapLogging()` first thing in `run()`: it returns the logger to use.
/// The configuration file itself is merged into the arguments before parsing
/// (`ConfigFile.mergedArguments(_:root:)`), so by the time a command runs its
/// flags already hold the file's values.
struct CommonOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp(
        "A JSON configuration file: an object whose keys are long flag names without dashes (\"db\", \"peer\"…); flags given on the command line override it.",
        valueName: "file"))
    var config: String?

    @Option(name: .customLong("log-level"), help: ArgumentHelp(
        "Log level on stderr: trace, debug, info, notice, warning, error or critical.", valueName: "level"))
    var logLevel: Logger.Level = .warning

    /// Sets up logging to stderr at `--log-level` (once per process) and returns a logger.
    @discardableResult
    func bootstrapLogging(label: String = "tether") -> Logger {
        TetherLogging.bootstrap(level: logLevel)
        return Logger(label: label)
    }
}

/// `--max-clock-skew SECONDS`, for the commands that sync (`sync`, `serve`).
struct ClockSkewOption: ParsableArguments {
    @Option(name: .customLong("max-clock-skew"), help: ArgumentHelp(
        "Accept peers' changes stamped up to this many seconds ahead of this machine's clock (default 3600); later ones are deferred until this clock catches up.",
        valueName: "seconds"))
    var seconds: Int?

    func validate() throws {
        if let seconds, seconds < 0 { throw ValidationError("--max-clock-skew \(seconds): a number of seconds, 0 or more") }
    }

    func apply(to database: Database) throws {
        if let seconds { try database.setMaximumClockSkew(.seconds(seconds)) }
    }
}

/// swift-log, writing to stderr through `StreamLogHandler`.
enum TetherLogging {
    private final class State: @unchecked Sendable {
        let lock = NSLock()
        var bootstrapped = false
    }
    private static let state = State()

    /// Bootstraps the logging system once per process (later calls do nothing:
    /// swift-log allows one bootstrap).
    static func bootstrap(level: Logger.Level) {
        state.lock.lock()
        defer { state.lock.unlock() }
        guard !state.bootstrapped else { return }
        state.bootstrapped = true
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
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
    /// A value of the file.
    enum Value: Codable {
        case null, bool(Bool), integer(Int64), real(Double), string(String), array([Value]), object([String: Value])

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if container.decodeNil() { self = .null }
            else if let bool = try? container.decode(Bool.self) { self = .bool(bool) }
            else if let integer = try? container.decode(Int64.self) { self = .integer(integer) }
            else if let real = try? container.decode(Double.self) { self = .real(real) }
            else if let string = try? container.decode(String.self) { self = .string(string) }
            else if let array = try? container.decode([Value].self) { self = .array(array) }
            else { self = .object(try container.decode([String: Value].self)) }
        }

        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            switch self {
            case .null: try container.encodeNil()
            case let .bool(bool): try container.encode(bool)
            case let .integer(integer): try container.encode(integer)
            case let .real(real): try container.encode(real)
            case let .string(string): try container.encode(string)
            case let .array(array): try container.encode(array)
            case let .object(object): try container.encode(object)
            }
        }

        /// The value as compact JSON, keys sorted.
        var json: String {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            return (try? encoder.encode(self)).map { String(decoding: $0, as: UTF8.self) } ?? "null"
        }
    }

    /// Reads and checks the file.
    static func load(path: String) throws -> [String: Value] {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw ConfigFileError(path: path, reason: "no such file", isMissing: true)
        }
        guard !isDirectory.boolValue else { throw ConfigFileError(path: path, reason: "is a directory", isMissing: true) }
        let data: Data
        do { data = try Data(contentsOf: URL(fileURLWithPath: path)) } catch {
            throw ConfigFileError(path: path, reason: "cannot be read (\(error.localizedDescription))", isMissing: true)
        }
        guard (try? JSONSerialization.jsonObject(with: data)) is [String: Any] else {
            throw ConfigFileError(path: path, reason: "must hold a JSON object whose keys are flag names without dashes")
        }
        do {
            return try JSONDecoder().decode([String: Value].self, from: data)
        } catch {
            throw ConfigFileError(path: path, reason: "values must be strings, numbers, booleans, null, arrays or objects of those")
        }
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
        let accepted: Set<String>? = (command as? any ConfigurableCommand.Type).map { Set($0.configKeys).union(["log-level"]) }
        let given = Set(options.compactMap { argument -> String? in
            guard argument.hasPrefix("--") else { return nil }
            return String(argument.dropFirst(2).prefix { $0 != "=" })
        })

        var added: [String] = []
        for key in config.keys.sorted() {
            guard key != "config" else { throw ConfigFileError(path: path, reason: "\"config\" cannot name another configuration file") }
            guard allKeys.contains(key) else { throw ConfigFileError(path: path, reason: "unknown key \"\(key)\"") }
            if let accepted, !accepted.contains(key) { continue }
            if given.contains(key) { continue }
            let values: [Value]
            if case let .array(array) = config[key] { values = array } else { values = config[key].map { [$0] } ?? [] }
            for value in values {
                added += try flagArguments(for: key, value: value, path: path)
            }
        }
        var merged = Array(arguments[..<terminator])
        merged += added
        merged += arguments[terminator...]
        return merged
    }

    private static func flagArguments(for key: String, value: Value, path: String) throws -> [String] {
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
        var current = root
        for argument in arguments where !argument.hasPrefix("-") {
            guard let next = current.configuration.subcommands.first(where: { name(of: $0) == argument }) else { break }
            current = next
        }
        return current
    }

    private static func name(of command: any ParsableCommand.Type) -> String {
        command.configuration.commandName ?? String(describing: command).lowercased()
    }

    private static func allConfigKeys(_ command: any ParsableCommand.Type) -> [String] {
        ((command as? any ConfigurableCommand.Type)?.configKeys ?? [])
            + command.configuration.subcommands.flatMap { allConfigKeys($0) }
    }
}
