import ArgumentParser
import Foundation
import Tether

/// `tether rekey`: gives a copied database (a cloned node, a restored backup) an instance key of
/// its own, or, with `--keep-key`, confirms that it was moved rather than copied.
struct Rekey: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rekey",
        abstract: "Give a copied database an instance key of its own (its writes then reach every peer), or confirm a move with --keep-key.",
        discussion: """
            A database copied while it syncs (cp, sqlite3 .backup) carries the original's instance key: it notices \
            that it is a copy when opened, and refuses to sync until it is rekeyed. Rekeyed, its peers pull \
            everything under the new key: what they hold merges as unchanged, and the copy's own writes reach them. \
            Stop `tether serve` on the database first. Prints the new key. A database moved to another file or \
            machine (the original, not a copy) keeps its key: say so with --keep-key.
            """)
    static let configKeys = ["db", "keep-key"]

    @OptionGroup var common: CommonOptions

    @Option(help: ArgumentHelp("The Tether database.", valueName: "path"))
    var db: String

    @Flag(help: "The database was moved, not copied: keep its instance key, and sync again.")
    var keepKey = false

    func run() throws {
        common.bootstrapLogging()
        let database = try TetherDatabase.openExisting(path: db)
        let old = database.instanceKey
        if keepKey {
            try database.confirmMove()
            Output.line("\(db) keeps instance key \(old.hex)")
        } else {
            let key = try database.resetInstanceKey()
            Output.line("\(db): instance key \(old.hex) replaced by \(key.hex)")
        }
    }
}

/// `tether backup`: a consistent copy of a live database, safe to restore.
struct Backup: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Copy a database consistently while it is in use (tether serve may keep writing); the copy is safe to restore.",
        discussion: """
            Uses SQLite's online backup API. The copy takes a new instance key the first time it is opened to \
            write, so a restored backup never syncs under the original's key: peers pull everything from it under \
            its new key (nothing duplicated), and it receives what they wrote after the backup was taken.
            """)
    static let configKeys = ["db", "to"]

    @OptionGroup var common: CommonOptions

    @Option(help: ArgumentHelp("The Tether database.", valueName: "path"))
    var db: String

    @Option(help: ArgumentHelp("Where to write the copy (must not exist).", valueName: "path"))
    var to: String

    func run() throws {
        common.bootstrapLogging()
        let database = try TetherDatabase.openExisting(path: db)
        do {
            try database.backup(to: to)
        } catch let error as DatabaseError {
            throw CLIError(.cannotCreate, "cannot back up \(db) to \(to): \(error.message)")
        }
        Output.line("backed up \(db) to \(to)")
    }
}
