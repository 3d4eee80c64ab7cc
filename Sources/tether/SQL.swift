import ArgumentParser
import Foundation
import Tether

/// `tether sql`: run SQL through the library (writes to synced tables are captured).
struct SQL: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sql",
        abstract: "Run SQL statements; print the rows of the last query, or how many rows changed.",
        discussion: """
            Several statements may be separated by semicolons; they run in one transaction (all or nothing) \
            unless they contain BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE or VACUUM, in which case each runs \
            as written. The rows of the last statement that returns rows are printed as an aligned table, or \
            with --json as a JSON array of objects (integers and reals as numbers, text as strings, NULL as null, \
            blobs as base64 strings). Without rows, prints "N rows changed" (with --json: {"changes":N}).
            """)
    static let configKeys = DatabaseOption<ExistingDatabase>.configKeys + OutputFormatOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @OptionGroup var output: OutputFormatOption

    @Argument(help: ArgumentHelp("The SQL to run.", valueName: "sql"))
    var sql: String

    struct Result {
        var columns: [String]
        var rows: [[DatabaseValue]]
    }

    func run() throws {
        let logger = common.bootstrapLogging()
        let statements = SQLScript.split(sql)
        guard !statements.isEmpty else { throw CLIError.usage("no SQL statement to run") }
        let database = try db.openExisting()
        let controlsTransactions = statements.contains { statement in
            let first = statement.prefix { $0.isLetter }.uppercased()
            return ["BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "VACUUM"].contains(first)
        }
        let body = { (conn: Connection) throws -> (Result?, Int, Bool) in
            var result: Result?
            var changes = 0
            var wrote = false
            for statement in statements {
                logger.debug("running: \(statement)")
                let prepared = try conn.cachedStatement(statement)
                if prepared.columnCount > 0 {
                    let columns = prepared.columnNames
                    let rows = try conn.fetchRows(statement).map(\.values)
                    result = Result(columns: columns, rows: rows)
                    if !prepared.isReadOnly { wrote = true }
                } else {
                    let isDML = !prepared.isReadOnly && Self.isDataChange(statement)
                    // The rows a write changed are counted through RETURNING: the
                    // connection's change count also sees the sync engine's own writes.
                    let counting = statement + "\nRETURNING 1"
                    if isDML, let returning = try? conn.cachedStatement(counting), returning.columnCount == 1 {
                        changes += try conn.fetchRows(counting).count
                        wrote = true
                    } else {
                        try conn.execute(statement)
                        if isDML {
                            changes += conn.changes
                            wrote = true
                        }
                    }
                }
            }
            return (result, changes, wrote)
        }
        let (result, changes, wrote) =
            controlsTransactions
            ? try database.writeWithoutTransaction(body)
            : try database.write(body)
        if let result {
            Output.line(output.json ? Self.json(result) : Self.table(result))
        } else if output.json {
            Output.line("{\"changes\":\(changes)}")
        } else if wrote {
            Output.line("\(changes) row\(changes == 1 ? "" : "s") changed")
        } else {
            Output.line("OK")
        }
    }

    /// INSERT, UPDATE, DELETE, REPLACE (also after a WITH clause).
    static func isDataChange(_ statement: String) -> Bool {
        let words = statement.uppercased().split { !$0.isLetter && $0 != "_" }
        guard let first = words.first else { return false }
        if ["INSERT", "UPDATE", "DELETE", "REPLACE"].contains(String(first)) { return true }
        return first == "WITH" && words.contains { ["INSERT", "UPDATE", "DELETE", "REPLACE"].contains(String($0)) }
    }

    // MARK: Formatting

    static func text(_ value: DatabaseValue) -> String {
        switch value {
        case .null: return "NULL"
        case let .integer(integer): return String(integer)
        case let .real(real): return String(real)
        case let .text(text):
            return text.replacingOccurrences(of: "\n", with: "\\n").replacingOccurrences(of: "\t", with: "\\t")
        case let .blob(data): return "X'" + data.map { String(format: "%02X", $0) }.joined() + "'"
        }
    }

    /// An aligned table: a header, a rule, the rows (numbers right-aligned), and a count.
    static func table(_ result: Result) -> String {
        let cells = result.rows.map { $0.map(text) }
        var widths = result.columns.map(\.count)
        for row in cells {
            for (index, cell) in row.enumerated() where index < widths.count {
                widths[index] = max(widths[index], cell.count)
            }
        }
        func pad(_ text: String, _ width: Int, right: Bool) -> String {
            let padding = String(repeating: " ", count: max(0, width - text.count))
            return right ? padding + text : text + padding
        }
        func line(_ fields: [String], numeric: [Bool]) -> String {
            fields.enumerated().map { pad($1, widths[$0], right: numeric[$0]) }.joined(separator: "  ")
                .trimmingTrailingSpaces()
        }
        var lines = [
            line(result.columns, numeric: result.columns.map { _ in false }),
            widths.map { String(repeating: "-", count: $0) }.joined(separator: "  "),
        ]
        for (row, values) in zip(cells, result.rows) {
            lines.append(
                line(
                    row,
                    numeric: values.map {
                        switch $0 {
                        case .integer, .real: return true;
                        default: return false
                        }
                    }))
        }
        lines.append("(\(result.rows.count) row\(result.rows.count == 1 ? "" : "s"))")
        return lines.joined(separator: "\n")
    }

    /// A JSON array of objects, one per row, columns in order.
    static func json(_ result: Result) -> String {
        if result.rows.isEmpty { return "[]" }
        let rows = result.rows.map { values in
            "{" + zip(result.columns, values).map { "\(jsonString($0)):\(jsonValue($1))" }.joined(separator: ",") + "}"
        }
        return "[\n" + rows.joined(separator: ",\n") + "\n]"
    }

    static func jsonValue(_ value: DatabaseValue) -> String {
        switch value {
        case .null: return "null"
        case let .integer(integer): return String(integer)
        case let .real(real): return real.isFinite ? String(real) : "null"
        case let .text(text): return jsonString(text)
        case let .blob(data): return jsonString(data.base64EncodedString())
        }
    }

    static func jsonString(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }
}

extension String {
    func trimmingTrailingSpaces() -> String {
        var text = Substring(self)
        while text.last == " " { text = text.dropLast() }
        return String(text)
    }
}
