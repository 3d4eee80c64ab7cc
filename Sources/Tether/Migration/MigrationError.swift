/// Why a migration, a schema file or a schema update did not run. Whatever the case, the
/// database is as it was before the failing step: each migration runs in its own transaction.
public enum MigrationError: Error, Sendable, CustomStringConvertible {
    /// A migration threw (`underlying`): it was rolled back, and the migrations after it did not run.
    case failed(migration: String, underlying: any Error)
    /// Foreign keys are violated at the end of a migration: it was rolled back. Each violation
    /// names the table and rowid of the row that refers to a missing parent, and the parent table.
    case foreignKeyViolations(migration: String, violations: [ForeignKeyViolation])
    /// The database records migrations (or schema files) this program does not know: it was
    /// migrated by a newer version of the application. Nothing ran.
    case unknownMigrations(names: [String])
    /// Schema files the database records as applied are not in the directory any more (an
    /// older copy of it, or deleted files; applied files must stay). Nothing ran.
    case appliedSchemaFilesMissing(names: [String])
    /// A schema file or SQL migration already applied has changed since (its SHA-256 differs
    /// from the one recorded). Nothing ran.
    case changedAfterApplying(name: String, recorded: String, current: String)
    /// Two migrations are registered under one name.
    case duplicateName(String)
    /// Asked to erase the database where it cannot (`erasesDatabaseOnFailure` with
    /// `migrate(_:)`, which is handed a database others may hold open; or the file could not be
    /// erased): nothing was erased, and the message says why.
    case erasingRefused(String)
    /// A migration failed (`failure`) and `erasesDatabaseOnFailure` asked to erase the database,
    /// but it holds `pendingChanges` local changes no peer has acknowledged, which erasing would
    /// lose: it was left as it was before the failing migration.
    indirect case erasingWouldLoseChanges(pendingChanges: Int, failure: MigrationError)
    /// A helper was asked for something it cannot do to this table (a column that does not
    /// exist, a synced table's identity column dropped, a rebuild that would lose a value).
    case invalidChange(table: String, reason: String)
    /// A schema file cannot be read.
    case unreadableSchemaFile(path: String, reason: String)

    public var description: String {
        switch self {
        case let .failed(migration, underlying):
            return
                "migration \(migration) failed and was rolled back (the database is as it was before it): \(underlying)"
        case let .foreignKeyViolations(migration, violations):
            return "migration \(migration) leaves foreign keys violated and was rolled back: "
                + violations.map(\.description).joined(separator: "; ")
        case let .unknownMigrations(names):
            return "the database was migrated by a newer version of this application: it records migration(s) "
                + names.joined(separator: ", ")
                + " that this version does not have. Open it with the newer version, or set allowsUnknownMigrations "
                + "if this version can work with its schema"
        case let .appliedSchemaFilesMissing(names):
            return "schema file(s) " + names.joined(separator: ", ")
                + " were applied to this database but are not in the directory: an older copy of it, or deleted "
                + "files (applied files must stay). Nothing ran; allow missing files to run the new ones anyway"
        case let .changedAfterApplying(name, recorded, current):
            return "\(name) was changed after it was applied (SHA-256 \(recorded.prefix(12))… recorded, "
                + "\(current.prefix(12))… now); "
                + "an applied migration must never change: restore it and put the change in a new one. Nothing ran"
        case let .duplicateName(name):
            return "two migrations are registered under the name \(name)"
        case let .erasingRefused(reason):
            return "the database was not erased: \(reason)"
        case let .erasingWouldLoseChanges(pendingChanges, failure):
            return "\(failure); the database was not erased (erasesDatabaseOnFailure): it holds \(pendingChanges) "
                + "local change(s) "
                + "that no peer has acknowledged, which erasing would lose. It is as it was before the failing "
                + "migration: "
                + "sync it with a peer and migrate again, or fix the migration"
        case let .invalidChange(table, reason):
            return "cannot change table \(table): \(reason)"
        case let .unreadableSchemaFile(path, reason):
            return "cannot read schema file \(path): \(reason)"
        }
    }
}

/// A row whose foreign key refers to a row that does not exist (`PRAGMA foreign_key_check`).
public struct ForeignKeyViolation: Sendable, Hashable, CustomStringConvertible {
    /// The table of the referring row.
    public let table: String
    /// The referring row's rowid (nil for a WITHOUT ROWID table).
    public let rowid: Int64?
    /// The table it refers to.
    public let parent: String

    public var description: String {
        "row \(rowid.map(String.init) ?? "(without rowid)") of \(table) refers to a missing row of \(parent)"
    }
}
