import ArgumentParser
import Foundation
import Tether

/// `tether export`: the changes a peer lacks, to a sync file.
struct Export: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export",
        abstract: "Write the changes a peer lacks to a sync file (for air-gapped transfer).",
        discussion: """
            The file is written whole or not at all. The summary line gives the sequence to pass as --since next time. \
            With --json, one object: "file", "for" (the instance key it is for), "changes", "batches" and "nextSince".
            """)
    static let configKeys =
        DatabaseOption<ExistingDatabase>.configKeys + ["for", "since", "out"] + OutputFormatOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @Option(
        name: .customLong("for"),
        help: ArgumentHelp("The instance key (32 hex digits) of the database the file is for.", valueName: "key"))
    var target: String

    @Option(help: ArgumentHelp("Export the changes after this sequence (0: everything).", valueName: "n"))
    var since: Int64 = 0

    @Option(help: ArgumentHelp("The sync file to write.", valueName: "file"), completion: .file())
    var out: String

    @OptionGroup var output: OutputFormatOption

    func validate() throws {
        guard InstanceKey(hex: target) != nil else {
            throw ValidationError(
                "--for must be an instance key: 32 hex digits, as printed by tether init or tether status")
        }
        guard since >= 0 else { throw ValidationError("--since must be 0 or more") }
    }

    func run() throws {
        common.bootstrapLogging()
        guard let key = InstanceKey(hex: target) else { throw CLIError.usage("--for must be an instance key") }
        let database = try db.openExisting()
        guard key != database.instanceKey else {
            throw CLIError.usage("--for names this database's own instance key; name the database the file is for")
        }
        var isDirectory: ObjCBool = false
        let directory = URL(fileURLWithPath: out).deletingLastPathComponent().path
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw CLIError(.cannotCreate, "cannot write \(out): directory \(directory) does not exist")
        }
        let summary = try database.exportSyncFile(to: URL(fileURLWithPath: out), for: key, since: since)
        output.print(
            "exported \(summary.changes) change\(summary.changes == 1 ? "" : "s") in \(summary.batches) "
                + "batch\(summary.batches == 1 ? "" : "es") "
                + "for \(summary.target.hex) to \(out); next --since \(summary.nextSequence)",
            json: .object([
                "file": .string(out), "for": .string(summary.target.hex), "changes": .int(summary.changes),
                "batches": .int(summary.batches), "nextSince": .integer(summary.nextSequence),
            ]))
    }
}

/// `tether import`: apply a sync file made for this database.
struct Import: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Apply a sync file made for this database, in one transaction.",
        discussion: """
            A damaged file, or one made for another database, changes nothing (exit 65). \
            With --json, one object: "file", "from" (the instance key of the database that wrote it), "changes", \
            "batches", \
            "throughSequence", "keptAside", "keptForSchema" (changes kept for a later schema) and "tablesNotSynced".
            """)
    static let configKeys = DatabaseOption<ExistingDatabase>.configKeys + OutputFormatOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @Argument(help: ArgumentHelp("The sync file to apply.", valueName: "file"), completion: .file())
    var file: String

    @OptionGroup var output: OutputFormatOption

    func run() throws {
        common.bootstrapLogging()
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: file, isDirectory: &isDirectory), !isDirectory.boolValue else {
            throw CLIError(.noInput, "sync file \(file) does not exist")
        }
        let database = try db.openExisting()
        let before = try database.keptAsideChanges().count
        let summary = try database.importSyncFile(from: URL(fileURLWithPath: file))
        let keptAside = try database.keptAsideChanges().count
        if output.json {
            Output.line(
                JSONValue.object([
                    "file": .string(file), "from": .string(summary.source.hex), "changes": .int(summary.changes),
                    "batches": .int(summary.batches), "throughSequence": .integer(summary.nextSequence),
                    "keptAside": .int(max(0, keptAside - before)), "keptForSchema": .int(summary.keptForSchema),
                    "tablesNotSynced": .strings(summary.tablesNotSynced),
                ]).json)
            return
        }
        Output.line(
            "imported \(summary.changes) change\(summary.changes == 1 ? "" : "s") in \(summary.batches) "
                + "batch\(summary.batches == 1 ? "" : "es") "
                + "from \(summary.source.hex) through sequence \(summary.nextSequence); kept aside "
                + "\(max(0, keptAside - before))")
        if summary.keptForSchema > 0 {
            let tables =
                summary.tablesNotSynced.isEmpty
                ? "" : " (tables not synced here: \(summary.tablesNotSynced.joined(separator: ", ")))"
            Output.line(
                "kept \(summary.keptForSchema) change\(summary.keptForSchema == 1 ? "" : "s") for a later "
                    + "schema\(tables): "
                    + "the migration that syncs the table or adds the column applies them")
        }
    }
}
