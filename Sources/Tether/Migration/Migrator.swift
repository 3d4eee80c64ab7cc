import CSQLite
import Foundation

/// Versioned migrations: registered by name, each run once and in the order registered,
/// recorded in the database (`tether_migrations`: name, time applied, and for SQL migrations
/// the SHA-256 of their text).
///
/// Each migration runs in its own transaction with foreign keys off, as SQLite's procedure for
/// schema changes asks; `PRAGMA foreign_key_check` runs before the commit, and a violation rolls
/// the migration back with the violating rows named. A migration that throws is rolled back:
/// schema and data are exactly as before it, the migrations after it do not run, and the next
/// `migrate` starts again from it.
///
/// ```swift
/// var migrator = Migrator()
/// migrator.register("1-player") { migration in
///     try migration.execute("CREATE TABLE player (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
/// }
/// migrator.register("2-player-score", sql: "ALTER TABLE player ADD COLUMN score INTEGER NOT NULL DEFAULT 0")
/// let applied = try migrator.migrate(db)   // ["1-player", "2-player-score"], then [] next time
/// ```
///
/// A database whose records name migrations this migrator does not have was migrated by a
/// newer version of the application: `migrate` throws `MigrationError.unknownMigrations`
/// (the newer schema may not be what this version expects), unless `allowsUnknownMigrations`
/// says this version can live with it. A database is erased only when asked, never by
/// default: see `erasesDatabaseOnFailure` (sModel's bad-upgrade recovery).
public struct Migrator: Sendable {
    struct Step: Sendable {
        let name: String
        /// SHA-256 of an SQL migration's text or a schema file's bytes; nil for a closure.
        let checksum: String?
        let body: @Sendable (Migration) throws -> Void
    }

    /// Which records a migrator reads and writes: registered migrations and schema files are
    /// recorded apart, so that neither looks like the other's unknown names.
    enum Kind: String, Sendable {
        case migration
        case schemaFile = "schema file"
    }

    private(set) var steps: [Step] = []
    private var duplicate: String?
    let kind: Kind

    /// Run even when the database records migrations this migrator does not have (it was
    /// migrated by a newer version of the application). Off by default: the newer schema may
    /// not be what this version expects.
    public var allowsUnknownMigrations = false

    /// sModel's bad-upgrade recovery, for a database that caches what peers hold: when a
    /// migration fails, `migrate(databaseAt:configuration:)` erases the database and runs every
    /// migration again on the empty one — only when it holds no local change that no peer has
    /// acknowledged; otherwise it throws `MigrationError.erasingWouldLoseChanges` with their
    /// count, and the database is as it was before the failing migration. Off by default: a
    /// failed migration leaves the database exactly as it was.
    ///
    /// `migrate(_:)`, handed a database others may hold open, cannot erase it: with this set, it
    /// throws `MigrationError.erasingRefused` before touching anything.
    public var erasesDatabaseOnFailure = false

    /// An empty migrator: register its migrations, then call `migrate(_:)`.
    public init() { kind = .migration }

    init(kind: Kind) { self.kind = kind }

    /// The registered names, in order.
    public var names: [String] { steps.map(\.name) }

    /// Registers a migration run by a closure.
    public mutating func register(_ name: String, _ body: @escaping @Sendable (Migration) throws -> Void) {
        append(Step(name: name, checksum: nil, body: body))
    }

    /// Registers a migration of SQL statements. Its SHA-256 is recorded: once applied, changing
    /// its text is an error (`MigrationError.changedAfterApplying`).
    public mutating func register(_ name: String, sql: String) {
        append(Step(name: name, checksum: SHA256.hex(Array(sql.utf8)), body: { try $0.connection.executeScript(sql) }))
    }

    mutating func append(_ step: Step) {
        if duplicate == nil, steps.contains(where: { $0.name == step.name }) { duplicate = step.name }
        steps.append(step)
    }

    // MARK: Migrating

    /// Runs the migrations not applied yet, in order; returns their names.
    @discardableResult
    public func migrate(_ db: Database) throws -> [String] {
        if erasesDatabaseOnFailure {
            throw MigrationError.erasingRefused(
                """
                erasesDatabaseOnFailure needs migrate(databaseAt:), which opens the database itself: a database \
                handed open may be held by other code, which an erase would pull the rows from under. Nothing ran
                """)
        }
        if let duplicate { throw MigrationError.duplicateName(duplicate) }
        let capture = db.syncEngine?.capture
        return try db.writeWithoutTransaction { conn in
            let recorded = try MigrationLog.records(of: kind, conn)
            let registered = Set(steps.map(\.name))
            let unknown = recorded.keys.filter { !registered.contains($0) }.sorted()
            if !unknown.isEmpty && !allowsUnknownMigrations {
                throw kind == .schemaFile
                    ? MigrationError.appliedSchemaFilesMissing(names: unknown)
                    : MigrationError.unknownMigrations(names: unknown)
            }
            for step in steps {
                if let stored = recorded[step.name], let stored, let current = step.checksum, stored != current {
                    throw MigrationError.changedAfterApplying(name: step.name, recorded: stored, current: current)
                }
            }
            var applied: [String] = []
            for step in steps where recorded[step.name] == nil {
                try MigrationRun.run(named: step.name, conn, capture) { migration in
                    try step.body(migration)
                    try MigrationLog.record(step.name, kind: kind, checksum: step.checksum, conn)
                }
                applied.append(step.name)
            }
            return applied
        }
    }

    /// The names of the migrations `db` records as applied, in the order they were applied.
    public func appliedMigrations(in db: Database) throws -> [String] {
        try db.read { try MigrationLog.orderedNames(of: kind, $0) }
    }

    /// The registered migrations `db` has not applied yet, in order.
    public func pendingMigrations(in db: Database) throws -> [String] {
        let applied = Set(try appliedMigrations(in: db))
        return names.filter { !applied.contains($0) }
    }
}

/// `tether_migrations`: what migrations and schema files a database has applied.
enum MigrationLog {
    static let table = "tether_migrations"
    static let create = """
        CREATE TABLE IF NOT EXISTS tether_migrations (kind TEXT NOT NULL, name TEXT NOT NULL, checksum TEXT, \
        applied_at REAL NOT NULL,
          PRIMARY KEY (kind, name)) STRICT
        """

    static func exists(_ connection: Connection) throws -> Bool {
        try connection.tableExists(table)
    }

    /// Name → checksum (nil for a closure migration).
    static func records(of kind: Migrator.Kind, _ connection: Connection) throws -> [String: String?] {
        guard try exists(connection) else { return [:] }
        var records: [String: String?] = [:]
        for row in try connection.fetchRows(
            "SELECT name, checksum FROM tether_migrations WHERE kind = ?", [kind.rawValue])
        {
            records[try row.get(0, as: String.self)] = String.fromDatabaseValue(row[1])
        }
        return records
    }

    static func orderedNames(of kind: Migrator.Kind, _ connection: Connection) throws -> [String] {
        guard try exists(connection) else { return [] }
        return try connection.fetchRows(
            "SELECT name FROM tether_migrations WHERE kind = ? ORDER BY applied_at, rowid", [kind.rawValue]
        )
        .map { try $0.get(0, as: String.self) }
    }

    static func record(_ name: String, kind: Migrator.Kind, checksum: String?, _ connection: Connection) throws {
        try connection.execute(create)
        try connection.execute(
            "INSERT INTO tether_migrations (kind, name, checksum, applied_at) VALUES (?, ?, ?, ?)",
            [kind.rawValue, name, checksum, Date().timeIntervalSince1970])
    }
}

/// One schema change in its own transaction, by SQLite's procedure: foreign keys off, the
/// change, `PRAGMA foreign_key_check`, commit, foreign keys back on. On failure the transaction
/// is rolled back and the sync engine reloads the synced tables as committed.
enum MigrationRun {
    @discardableResult
    static func run<T>(
        named name: String, _ conn: Connection, _ capture: ChangeCapture?, _ body: (Migration) throws -> T
    ) throws -> T {
        let foreignKeys = try conn.fetchValue("PRAGMA foreign_keys", as: Bool.self) ?? false
        // Unobserved: in an implicit savepoint (what an observed write in autocommit mode gets)
        // this PRAGMA would do nothing.
        if foreignKeys { try conn.withoutCapture { try conn.execute("PRAGMA foreign_keys = OFF") } }
        defer { if foreignKeys { try? conn.withoutCapture { try conn.execute("PRAGMA foreign_keys = ON") } } }
        do {
            return try conn.transaction(.immediate) {
                try capture?.migrationWillBegin(conn)
                let result = try body(Migration(name: name, connection: conn, capture: capture))
                // Columns added by raw SQL to synced tables become synced; synced columns gone
                // without a helper are refused.
                try capture?.migrationWillCommit(conn)
                let violations = try conn.fetchRows("SELECT \"table\", rowid, parent FROM pragma_foreign_key_check").map
                {
                    ForeignKeyViolation(
                        table: try $0.get(0, as: String.self), rowid: Int64.fromDatabaseValue($0[1]),
                        parent: try $0.get(2, as: String.self))
                }
                if !violations.isEmpty {
                    throw MigrationError.foreignKeyViolations(migration: name, violations: violations)
                }
                return result
            }
        } catch {
            // The engine loaded the tables as the rolled-back transaction left them.
            try? capture?.migrationDidRollBack(conn)
            if let error = error as? MigrationError, case .foreignKeyViolations = error { throw error }
            throw MigrationError.failed(migration: name, underlying: error)
        }
    }
}
