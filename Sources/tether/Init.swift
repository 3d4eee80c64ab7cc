import ArgumentParser
import Foundation
import Logging
import Tether

/// `tether init`: create or open a database, apply a schema, turn sync on.
struct Init: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract:
            "Create or open a database, apply a schema file and turn sync on for tables; prints the instance key.",
        discussion: """
            The schema file holds SQL statements. Tables it creates that already exist with the same columns are \
            left as they are; an existing table whose columns differ is a schema mismatch (exit 65) and nothing \
            is changed. --schema may instead name a directory of .sql files: each file not applied yet runs once, \
            in the order of the file names, in its own transaction, and is recorded with its SHA-256; a file \
            changed after it was applied is an error naming it (exit 65), and nothing runs. Tables named by --sync \
            are synced with their writes captured by triggers too, so that \
            writes made by other programs (the sqlite3 shell) reach peers. --counter TABLE.COLUMN makes a column of \
            a table named by --sync (or synced already) merge as a counter: concurrent changes add up on every peer \
            (every peer must name the same counters; tether status lists them). --max TABLE.COLUMN and --min \
            TABLE.COLUMN make a column keep the greatest (smallest) value ever written on any peer; a write that \
            would make it smaller (greater) is refused. --add-wins TABLE: an update made on a peer that had not seen \
            a row's delete brings the row back (by default the delete wins). \
            Prints the instance key; with --json, one object: "database" (the path), "instanceKey", "created" (whether \
            the file was made now), "statementsApplied" (statements of a schema file that ran), "schemaFilesApplied" \
            (files of a schema directory that ran, in order), "syncTurnedOn" (tables whose sync this run turned on) \
            and "syncedTables" (every table it syncs).
            """)
    static let configKeys =
        DatabaseOption<DatabaseCreatedIfMissing>.configKeys + ["schema", "sync", "counter", "max", "min", "add-wins"]
        + OutputFormatOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<DatabaseCreatedIfMissing>

    @Option(
        help: ArgumentHelp(
            "A file of SQL statements to apply, or a directory of .sql files to run once each, in name order.",
            valueName: "file.sql|dir"),
        completion: .file())  // not .sql only: a directory is a schema too
    var schema: String?

    @Option(help: ArgumentHelp("Tables to sync, comma-separated (repeatable).", valueName: "table[,table...]"))
    var sync: [String] = []

    @Option(
        help: ArgumentHelp(
            "A column that merges as a counter: concurrent changes add up (repeatable).",
            valueName: "table.column"))
    var counter: [String] = []

    @Option(
        help: ArgumentHelp(
            "A column that keeps the greatest value ever written on any peer (repeatable).", valueName: "table.column"))
    var max: [String] = []

    @Option(
        help: ArgumentHelp(
            "A column that keeps the smallest value ever written on any peer (repeatable).", valueName: "table.column"))
    var min: [String] = []

    @Option(
        name: .customLong("add-wins"),
        help: ArgumentHelp(
            "A synced table whose rows come back when updated on a peer that had not seen their delete (repeatable).",
            valueName: "table"))
    var addWins: [String] = []

    /// The columns --counter, --max and --min name, with their rules.
    private var namedColumns: [(option: String, named: String, rule: ColumnMergeRule)] {
        counter.map { ("--counter", $0, .counter) } + max.map { ("--max", $0, .maximum) }
            + min.map { ("--min", $0, .minimum) }
    }

    /// The columns --counter, --max and --min name, by table.
    var columnRules: [String: [String: ColumnMergeRule]] {
        var rules: [String: [String: ColumnMergeRule]] = [:]
        for (_, named, rule) in namedColumns {
            guard let dot = named.firstIndex(of: ".") else { continue }
            rules[String(named[..<dot]), default: [:]][String(named[named.index(after: dot)...])] = rule
        }
        return rules
    }

    @OptionGroup var output: OutputFormatOption

    var syncTables: [String] {
        var seen = Set<String>()
        return sync.flatMap { $0.split(separator: ",") }.map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty && seen.insert($0).inserted }
    }

    func validate() throws {
        if sync.contains(where: {
            $0.split(separator: ",").contains { $0.trimmingCharacters(in: .whitespaces).isEmpty }
        }) {
            throw ValidationError("--sync has an empty table name")
        }
        var seen: [String: String] = [:]
        for (option, named, _) in namedColumns {
            let parts = named.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else {
                throw ValidationError("\(option) \(named) is not TABLE.COLUMN")
            }
            if let earlier = seen.updateValue(option, forKey: named), earlier != option {
                throw ValidationError("\(named) is named by both \(earlier) and \(option): a column has one rule")
            }
        }
    }

    /// The directories a new database's path names, made as `mkdir -p` would (a new node's
    /// `--db /var/lib/tether/north.db` works on a fresh machine).
    static func createDirectory(holding path: String) throws {
        let directory = URL(fileURLWithPath: path).deletingLastPathComponent().path
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory) { return }
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw CLIError(
                .cannotCreate,
                "cannot create the directory \(directory) for database \(path): \(error.localizedDescription)")
        }
    }

    func run() throws {
        let logger = common.bootstrapLogging()
        let tables = syncTables
        let created = !FileManager.default.fileExists(atPath: db.path)
        if created { try Self.createDirectory(holding: db.path) }
        var isDirectory: ObjCBool = false
        if let schema, FileManager.default.fileExists(atPath: schema, isDirectory: &isDirectory), isDirectory.boolValue
        {
            let (database, applied) = try applySchemaDirectory(schema, tables: tables, logger: logger)
            let turnedOn = try turnOnSync(tables, in: database, logger: logger)
            report(
                database, created: created, statementsApplied: 0, schemaFilesApplied: applied, syncTurnedOn: turnedOn)
            return
        }
        var statements: [String] = []
        if let schema {
            let data = try AtomicFile.read(schema, what: "schema file")
            guard let text = String(data: data, encoding: .utf8) else {
                throw CLIError(.dataError, "schema file \(schema) is not UTF-8 text")
            }
            statements = SQLScript.split(text)
        }

        // Everything is checked on a scratch copy first: a schema that does not
        // run, or a table that cannot be synced, leaves the database as it was
        // (and a new database is not created).
        let existing = created ? nil : try TetherDatabase.open(path: db.path)
        let existingTables = try existing.map { try Self.tableColumns($0) } ?? [:]
        let scratch = try Database.inMemory()
        for (name, _) in existingTables {
            if let sql = try existing?.read({
                try $0.fetchValue(
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [name], as: String.self)
            }) {
                try scratch.execute(sql)
            }
        }
        let newStatements = try scratch.write { conn -> [String] in
            var kept: [String] = []
            for statement in statements {
                do {
                    try conn.execute(statement)
                    kept.append(statement)
                } catch let error as DatabaseError where error.message.hasSuffix("already exists") {
                    continue  // compared below, for tables
                } catch let error as DatabaseError {
                    throw CLIError(
                        .dataError, "schema \(schema ?? ""): \(error.message) (in: \(Self.oneLine(statement)))")
                }
            }
            return kept
        }
        // Tables the schema declares again must match the database's.
        if let schemaText = schema {
            let declared = try Self.tableColumns(fromStatements: statements)
            for (table, columns) in declared {
                guard let current = existingTables[table] else { continue }
                if current != columns {
                    let currentNames = current.map(\.name), declaredNames = columns.map(\.name)
                    let detail: String
                    if let missing = declaredNames.first(where: { !currentNames.contains($0) }) {
                        detail = "column \(missing) is in the schema but not in the database"
                    } else if let extra = currentNames.first(where: { !declaredNames.contains($0) }) {
                        detail = "column \(extra) is in the database but not in the schema"
                    } else if let differing = zip(current, columns).first(where: { $0 != $1 }) {
                        detail = """
                            column \(differing.0.name) is \(differing.0.summary) in the database but \
                            \(differing.1.summary) in the schema
                            """
                    } else {
                        detail = "the columns differ"
                    }
                    throw CLIError(
                        .dataError,
                        "schema mismatch: table \(table) of \(db.path) does not match \(schemaText): \(detail)")
                }
            }
        }
        for table in tables where !(existing?.syncedTables.contains(table) ?? false) {
            do {
                try scratch.enableSync(
                    table: table, capturingExternalWrites: true, columnRules: columnRules[table] ?? [:],
                    rowRule: addWins.contains(table) ? .addWins : .deleteWins)
            } catch let error as SyncError {
                throw CLIError(.dataError, "cannot sync table \(table): \(Self.reason(error))")
            }
        }

        let database = try existing ?? TetherDatabase.open(path: db.path)
        try database.write { conn in
            for statement in newStatements {
                do {
                    try conn.execute(statement)
                } catch let error as DatabaseError where error.message.hasSuffix("already exists") {
                    continue
                }
            }
        }
        if !newStatements.isEmpty { logger.info("applied \(newStatements.count) schema statement(s) to \(db.path)") }
        let turnedOn = try turnOnSync(tables, in: database, logger: logger)
        report(
            database, created: created, statementsApplied: newStatements.count, schemaFilesApplied: [],
            syncTurnedOn: turnedOn)
    }

    /// Prints the instance key, or with --json what this run did (the keys are listed in the discussion).
    private func report(
        _ database: Database, created: Bool, statementsApplied: Int, schemaFilesApplied: [String],
        syncTurnedOn: [String]
    ) {
        output.print(
            database.instanceKey.hex,
            json: .object([
                "database": .string(db.path), "instanceKey": .string(database.instanceKey.hex),
                "created": .bool(created),
                "statementsApplied": .int(statementsApplied), "schemaFilesApplied": .strings(schemaFilesApplied),
                "syncTurnedOn": .strings(syncTurnedOn), "syncedTables": .strings(database.syncedTables),
            ]))
    }

    /// Runs the schema files of `directory` not applied yet. A new database is made only if
    /// they all run (and its --sync tables can be synced), tried on a scratch database first.
    private func applySchemaDirectory(_ directory: String, tables: [String], logger: Logger) throws -> (
        Database, applied: [String]
    ) {
        func run(_ database: Database) throws -> [String] {
            do {
                return try database.applySchemaFiles(in: directory)
            } catch let error as MigrationError {
                if case let .unreadableSchemaFile(path, reason) = error {
                    throw CLIError(.noInput, "cannot read schema file \(path): \(reason)")
                }
                throw CLIError(.dataError, "schema \(directory): \(error)")
            }
        }
        if !FileManager.default.fileExists(atPath: db.path) {
            let scratch = try Database.inMemory()
            _ = try run(scratch)
            for table in tables {
                do {
                    try scratch.enableSync(
                        table: table, capturingExternalWrites: true, columnRules: columnRules[table] ?? [:],
                        rowRule: addWins.contains(table) ? .addWins : .deleteWins)
                } catch let error as SyncError {
                    throw CLIError(.dataError, "cannot sync table \(table): \(Self.reason(error))")
                }
            }
        }
        let database = try TetherDatabase.open(path: db.path)
        let applied = try run(database)
        logger.info(
            """
            applied \(applied.count) schema file(s) to \
            \(db.path)\(applied.isEmpty ? "" : ": " + applied.joined(separator: ", "))
            """)
        return (database, applied)
    }

    /// Turns sync on for `tables` (with writes by other programs captured); returns those it was not on for.
    private func turnOnSync(_ tables: [String], in database: Database, logger: Logger) throws -> [String] {
        var turnedOn: [String] = []
        let counters = columnRules
        let synced = try database.syncedTableRecords()
        for table in Set(counters.keys).union(addWins).sorted()
        where !tables.contains(table) && !synced.contains(where: { $0.name == table }) {
            throw CLIError(
                .usage,
                "--counter, --max, --min or --add-wins names table \(table), which is neither synced nor named by "
                    + "--sync")
        }
        for table in tables + Set(counters.keys).union(addWins).sorted().filter({ !tables.contains($0) }) {
            // Read again for each table: a table named twice is synced by the first.
            let recorded = try database.syncedTableRecords().first(where: { $0.name == table })
            let rules = (recorded?.columnRules ?? [:]).merging(counters[table] ?? [:]) { _, named in named }
            let rowRule = addWins.contains(table) ? .addWins : recorded?.rowRule ?? .deleteWins
            switch recorded {
            case let record?
            where record.capturesExternalWrites && record.columnRules == rules
                && record.rowRule == rowRule:
                logger.info("table \(table) is already synced")
            case let record? where record.capturesExternalWrites:
                guard let kept = record.conflictPolicy else {
                    throw CLIError(.dataError, "table \(table) is synced with a custom merge: its column rules stay")
                }
                do {
                    try database.enableSync(
                        table: table, policy: kept, capturingExternalWrites: true, columnRules: rules, rowRule: rowRule)
                } catch let error as SyncError {
                    throw CLIError(
                        .dataError, "cannot change the column rules of table \(table): \(Self.reason(error))")
                }
                let named = rules.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }
                logger.info("table \(table): rows \(rowRule), column rules now \(named.joined(separator: ", "))")
            case let record?:
                guard let kept = record.conflictPolicy else {
                    ErrorReport.printWarning(
                        "table \(table) is synced with a custom merge; its writes by other programs are not captured")
                    continue
                }
                try database.enableSync(
                    table: table, policy: kept, capturingExternalWrites: true, columnRules: rules, rowRule: rowRule)
                logger.info("table \(table) now captures writes by other programs")
            case nil:
                do {
                    try database.enableSync(
                        table: table, capturingExternalWrites: true, columnRules: rules, rowRule: rowRule)
                } catch let error as SyncError {
                    throw CLIError(.dataError, "cannot sync table \(table): \(Self.reason(error))")
                }
                logger.info("sync turned on for table \(table)")
                turnedOn.append(table)
            }
        }
        return turnedOn
    }

    private static func reason(_ error: SyncError) -> String {
        switch error {
        case let .invalidTable(reason): return reason
        default: return error.description
        }
    }

    static func oneLine(_ sql: String) -> String {
        let flat = sql.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        return flat.count > 120 ? String(flat.prefix(120)) + "…" : flat
    }

    struct Column: Equatable {
        var name: String
        var type: String
        var notNull: Bool
        var primaryKey: Int
        var summary: String {
            (type.isEmpty ? "untyped" : type) + (notNull ? " NOT NULL" : "") + (primaryKey > 0 ? " PRIMARY KEY" : "")
        }
    }

    /// The user tables of `database` and their columns (Tether's own columns left out).
    static func tableColumns(_ database: Database) throws -> [String: [Column]] {
        try database.read { conn in
            var result: [String: [Column]] = [:]
            let names = try conn.fetchRows(
                """
                SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'tether\\_%' ESCAPE '\\' \
                AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'
                """
            )
            .map { try $0.get(0, as: String.self) }
            for name in names {
                result[name] = try conn.fetchRows(
                    "SELECT name, type, \"notnull\", pk FROM pragma_table_info(?) ORDER BY cid", [name]
                )
                .map {
                    Column(
                        name: try $0.get(0, as: String.self), type: try $0.get(1, as: String.self).uppercased(),
                        notNull: try $0.get(2, as: Int.self) != 0, primaryKey: try $0.get(3, as: Int.self))
                }
                .filter { !$0.name.hasPrefix("tether_") }
            }
            return result
        }
    }

    /// The tables the schema statements create, on their own, and their columns.
    static func tableColumns(fromStatements statements: [String]) throws -> [String: [Column]] {
        let scratch = try Database.inMemory()
        try scratch.write { conn in
            for statement in statements {
                _ = try? conn.execute(statement)
            }
        }
        return try tableColumns(scratch)
    }
}
