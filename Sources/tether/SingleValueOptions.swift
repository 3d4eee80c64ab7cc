import ArgumentParser
import Foundation

/// The options that take one value (`--ca`, `--db`, `--listen`…): given twice, on the command
/// line or as an array in the configuration file, they are refused naming both values. Left to
/// ArgumentParser, the last value would win silently (`--ca old.pem --ca new.pem` trusting only
/// the new CA), so the arguments are checked before it parses them (`TetherCommand.parse`).
enum SingleValueOptions {
    /// The long names of `command`'s options (those that take a value), and of those among them
    /// that take one value, as ArgumentParser describes them (its `--experimental-dump-help`
    /// description: options whose `isRepeating` is false).
    static func options(of command: any ParsableCommand.Type) -> (taking: Set<String>, single: Set<String>) {
        struct Description: Decodable { var command: Command }
        struct Command: Decodable { var arguments: [Argument]? }
        struct Argument: Decodable { var kind: String; var isRepeating: Bool; var names: [Name]? }
        struct Name: Decodable { var kind: String; var name: String }
        guard let description = try? JSONDecoder().decode(Description.self, from: Data(command._dumpHelp().utf8)) else {
            return ([], [])
        }
        let options = (description.command.arguments ?? []).filter { $0.kind == "option" }
        func longNames(_ arguments: [Argument]) -> Set<String> {
            Set(arguments.flatMap { ($0.names ?? []).filter { $0.kind == "long" }.map(\.name) })
        }
        return (longNames(options), longNames(options.filter { !$0.isRepeating }))
    }

    /// "--ca given twice (a.pem, then b.pem): it takes one value; …" for the values given of `name`
    /// on the command line; from a configuration file, "\"ca\" holds 2 values (a.pem, then b.pem): --ca takes one; …".
    static func repeatedMessage(_ name: String, values: [String], inConfigurationFile: Bool = false) -> String {
        let listed = values.joined(separator: ", then ")
        let given =
            inConfigurationFile
            ? "\"\(name)\" holds \(values.count) values (\(listed)): --\(name) takes one"
            : "--\(name) given \(values.count == 2 ? "twice" : "\(values.count) times") (\(listed)): it takes one value"
        return given + (hint(for: name).map { "; \($0)" } ?? "")
    }

    /// What else to say of a repeated option: for `--ca`, that one file may hold several CAs.
    private static func hint(for name: String) -> String? {
        switch name {
        case "ca": "to trust several CAs, give one file that holds them all (cat a.pem b.pem > bundle.pem)"
        default: nil
        }
    }

    /// Throws a `ValidationError` (a usage error, exit 64) when `arguments` give one of the
    /// options of the command they name more than once, naming the values.
    static func checkGivenOnce(_ arguments: [String], root: any ParsableCommand.Type) throws {
        let given = Array(arguments.prefix { $0 != "--" })
        let options = options(of: ConfigFile.command(for: given, root: root))
        var values: [String: [String]] = [:]
        var order: [String] = []
        var index = 0
        while index < given.count {
            let argument = given[index]
            index += 1
            guard argument.hasPrefix("--") else { continue }
            let flag = argument.dropFirst(2)
            let name = String(flag.prefix { $0 != "=" })
            guard options.taking.contains(name) else { continue }
            let value: String
            if let equals = flag.firstIndex(of: "=") {
                value = String(flag[flag.index(after: equals)...])
            } else if index < given.count {
                // The next argument is this option's value, whatever it looks like.
                value = given[index]
                index += 1
            } else {
                continue  // ArgumentParser reports the missing value
            }
            guard options.single.contains(name) else { continue }
            if values[name] == nil { order.append(name) }
            values[name, default: []].append(value)
        }
        if let name = order.first(where: { (values[$0]?.count ?? 0) > 1 }) {
            throw ValidationError(repeatedMessage(name, values: values[name] ?? []))
        }
    }
}
