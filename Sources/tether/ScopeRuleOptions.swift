import ArgumentParser
import Foundation
import Tether
import TetherSync

/// Scope rules (partial replication) as the flags and the configuration file write them — the
/// `"scopes"` of `--peer-policy` and the rules of `--interest`. A rule is a filter (a string: an
/// SQL condition over the table's columns, `site = :peer_name`) or a reference, an object
/// `{"reference": "order_id", "parent": "orders", "parent-column": "id"}` (`parent-column`
/// optional: the parent's single key column).
enum ScopeRuleText {
    /// The keys of a reference, and what each names.
    private static let referenceKeys = [
        ("reference", "a column name"), ("parent", "a table name"), ("parent-column", "a column name"),
    ]

    /// The rule a decoded JSON value holds; `context` begins each error (`--peer-policy north: scope of orders`).
    static func rule(fromJSON value: Any, context: String) throws -> SyncScope.Rule {
        if let filter = value as? String {
            return try self.filter(filter, context: context)
        }
        guard let object = value as? [String: Any] else {
            throw ValidationError(
                "\(context): a rule is a filter (a string) or a reference (an object with \"reference\" and \"parent\")"
            )
        }
        var strings: [String: String] = [:]
        for (key, field) in object.sorted(by: { $0.key < $1.key }) {
            guard let named = referenceKeys.first(where: { $0.0 == key })?.1 else {
                throw ValidationError(
                    """
                    \(context): unknown key \"\(key)\" (known: \
                    \(referenceKeys.map { "\"\($0.0)\"" }.joined(separator: ", ")))
                    """)
            }
            guard let text = field as? String, !text.isEmpty else {
                throw ValidationError("\(context): \"\(key)\" must be \(named), a non-empty string")
            }
            strings[key] = text
        }
        guard let column = strings["reference"], let parent = strings["parent"] else {
            throw ValidationError(
                "\(context): a reference needs \"reference\" (the column) and \"parent\" (the table it references)")
        }
        return .reference(column: column, parent: parent, parentColumn: strings["parent-column"])
    }

    /// The rule of a `TABLE=RULE` flag: a JSON object (a reference) when it starts with `{`,
    /// otherwise a filter as it is.
    static func rule(fromFlag text: String, context: String) throws -> SyncScope.Rule {
        guard text.trimmingCharacters(in: .whitespaces).hasPrefix("{") else {
            return try filter(text, context: context)
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) else {
            throw ValidationError(
                """
                \(context): \(text) is not a JSON object (a reference is {\"reference\": \"column\", \"parent\": \
                \"table\"})
                """)
        }
        return try rule(fromJSON: object, context: context)
    }

    private static func filter(_ expression: String, context: String) throws -> SyncScope.Rule {
        guard !expression.allSatisfy(\.isWhitespace) else { throw ValidationError("\(context): the filter is empty") }
        return .filter(expression)
    }
}

/// `--interest TABLE=RULE`, for the commands that sync (`sync`, `serve`): the rows this side asks
/// its peers for (`SyncOptions.interest`); a peer sends the rows both this and its own policy hold.
struct InterestOption: ParsableArguments {
    static let configKeys = ["interest"]

    @Option(
        help: ArgumentHelp(
            #"""
            Ask peers only for these rows of TABLE (repeatable, one per table): RULE a filter over the table's \#
            columns ("site = 'north'"), or a reference {"reference": "order_id", "parent": "orders"} to a table \#
            given too. In the configuration file: "interest": {"orders": "site = 'north'"}.
            """#,
            valueName: "table=rule"))
    var interest: [String] = []

    func validate() throws {
        _ = try rules()
    }

    /// The interest the flags give, or a `ValidationError` naming the flag and the table.
    func rules() throws -> [String: SyncScope.Rule] {
        var rules: [String: SyncScope.Rule] = [:]
        for entry in interest {
            guard let separator = entry.firstIndex(of: "="), separator != entry.startIndex else {
                throw ValidationError("--interest \(entry): expected TABLE=RULE, e.g. orders=\"site = 'north'\"")
            }
            let table = String(entry[..<separator]).trimmingCharacters(in: .whitespaces)
            guard rules[table] == nil else {
                throw ValidationError("--interest \(table): given twice (one rule per table)")
            }
            rules[table] = try ScopeRuleText.rule(
                fromFlag: String(entry[entry.index(after: separator)...]), context: "--interest \(table)")
        }
        return rules
    }

    /// Checks the interest against `database` as a peer would (tables synced, columns, conditions,
    /// and a peer's text: one expression, no parameter, no subquery, allowed functions only): a
    /// usage error naming the table otherwise.
    static func check(_ interest: [String: SyncScope.Rule], against database: Database) throws {
        guard !interest.isEmpty else { return }
        do {
            try database.validate(SyncScope(interest: interest))
        } catch let error as ScopeError {
            throw CLIError(.usage, "--interest: \(error)")
        }
    }
}
