import ArgumentParser
import Foundation
import Tether

/// `tether rekey`: gives a copied database (a cloned node, a restored backup) an instance key of
/// its own, or, with `--keep-key`, confirms that it was moved rather than copied.
struct Rekey: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rekey",
        abstract: """
            Give a copied database an instance key of its own (its writes then reach every peer), or confirm a \
            move with --keep-key.
            """,
        discussion: """
            A database copied while it syncs (cp, sqlite3 .backup) carries the original's instance key: it notices \
            that it is a copy when opened, and refuses to sync until it is rekeyed. Rekeyed, its peers pull \
            everything under the new key: what they hold merges as unchanged, and the copy's own writes reach them. \
            Stop `tether serve` on the database first. Prints the new key. A database moved to another file or \
            machine (the original, not a copy) keeps its key: say so with --keep-key. \
            With --json, one object: "database" (the path), "previousInstanceKey", "instanceKey" (the key it has \
            now) and "keptKey" (true with --keep-key).
            """)
    static let configKeys = DatabaseOption<ExistingDatabase>.configKeys + ["keep-key"] + OutputFormatOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @Flag(help: "The database was moved, not copied: keep its instance key, and sync again.")
    var keepKey = false

    @OptionGroup var output: OutputFormatOption

    func run() throws {
        common.bootstrapLogging()
        let database = try db.openExisting()
        let old = database.instanceKey
        let new: InstanceKey
        if keepKey {
            try database.confirmMove()
            new = old
        } else {
            new = try database.resetInstanceKey()
        }
        output.print(
            keepKey
                ? "\(db.path) keeps instance key \(old.hex)"
                : "\(db.path): instance key \(old.hex) replaced by \(new.hex)",
            json: .object([
                "database": .string(db.path), "previousInstanceKey": .string(old.hex), "instanceKey": .string(new.hex),
                "keptKey": .bool(keepKey),
            ]))
    }
}

/// `tether backup`: a consistent copy of a live database, safe to restore.
struct Backup: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: """
            Copy a database consistently while it is in use (tether serve may keep writing); the copy is safe to \
            restore.
            """,
        discussion: """
            Uses SQLite's online backup API. The copy takes a new instance key the first time it is opened to \
            write, so a restored backup never syncs under the original's key: peers pull everything from it under \
            its new key (nothing duplicated), and it receives what they wrote after the backup was taken. \
            With --json, one object: "database" (the path), "backup" (the copy's path), "bytes" (its size).
            """)
    static let configKeys = DatabaseOption<ExistingDatabase>.configKeys + ["to"] + OutputFormatOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @Option(help: ArgumentHelp("Where to write the copy (must not exist).", valueName: "path"), completion: .file())
    var to: String

    @OptionGroup var output: OutputFormatOption

    func run() throws {
        common.bootstrapLogging()
        let database = try db.openExisting()
        do {
            try database.backup(to: to)
        } catch let error as DatabaseError {
            throw CLIError(.cannotCreate, "cannot back up \(db.path) to \(to): \(error.message)")
        }
        let size = (try? FileManager.default.attributesOfItem(atPath: to)[.size] as? NSNumber)?.intValue ?? 0
        output.print(
            "backed up \(db.path) to \(to)",
            json: .object(["database": .string(db.path), "backup": .string(to), "bytes": .int(size)]))
    }
}
