import CSQLite
import Foundation

/// A database opened and migrated by `Migrator.migrate(databaseAt:configuration:)`.
public struct MigratedDatabase: Sendable {
    /// The database, open, its migrations applied.
    public let database: Database
    /// The migrations applied by this call, in order (every one when the database was erased).
    public let applied: [String]
    /// The failure that had the database erased and migrated again from empty; nil when the
    /// migrations ran on it as it was. An erased database has a new instance key: its peers send
    /// it everything they hold, as to a new peer.
    public let erasedAfter: MigrationError?
}

extension Migrator {
    /// Opens the database at `path` and runs the migrations it has not applied yet, as
    /// `migrate(_:)` does. With `erasesDatabaseOnFailure` (sModel's recovery from a failed upgrade,
    /// for a database that caches what peers hold), a migration that fails — it throws, or leaves
    /// foreign keys violated — has the database erased and every migration run on the empty one,
    /// but only when no local change waits for a peer: a database holding changes no peer has
    /// acknowledged throws `MigrationError.erasingWouldLoseChanges` with their count, and is left
    /// as it was before the failing migration (closed). Rows of tables that are not synced are
    /// local by choice: they are erased with the rest.
    ///
    /// The erase empties the file in place (SQLite's `SQLITE_DBCONFIG_RESET_DATABASE`), so that a
    /// connection another program has open on it sees an empty database rather than writing to a
    /// deleted file; one in a transaction makes the erase wait `busyTimeout`, then fail
    /// (`MigrationError.erasingRefused`, nothing erased). Failures of another kind (unknown
    /// migrations, an applied migration changed) never erase.
    ///
    /// ```swift
    /// var migrator = Migrator()
    /// migrator.register("001-thing", sql: "CREATE TABLE thing (tid TEXT PRIMARY KEY, name TEXT)")
    /// migrator.erasesDatabaseOnFailure = true
    /// let opened = try migrator.migrate(databaseAt: "cache.sqlite")
    /// if let failure = opened.erasedAfter { print("started afresh after: \(failure)") }
    /// ```
    public func migrate(databaseAt path: String, configuration: Database.Configuration = Database.Configuration())
        throws -> MigratedDatabase
    {
        var once = self
        once.erasesDatabaseOnFailure = false
        let db = try Database(path: path, configuration: configuration)
        let failure: MigrationError
        do {
            return MigratedDatabase(database: db, applied: try once.migrate(db), erasedAfter: nil)
        } catch let error as MigrationError
            where erasesDatabaseOnFailure && !configuration.readOnly && error.isFailedMigration
        {
            failure = error
        } catch {
            try? db.close()
            throw error
        }
        do {
            try db.captureExternalWrites()
            let waiting = try db.pendingChangeCount()
            guard waiting == 0 else {
                throw MigrationError.erasingWouldLoseChanges(pendingChanges: waiting, failure: failure)
            }
        } catch {
            try? db.close()
            throw error
        }
        try db.close()
        if path != ":memory:" { try Self.erase(path, failure: failure, configuration) }
        configuration.logger.warning(
            """
            the database was erased after a failed migration, no local change waiting for a peer; its migrations \
            run again from empty
            """,
            metadata: ["tether.database": "\(path)", "tether.reason": "\(failure)"])
        let fresh = try Database(path: path, configuration: configuration)
        do {
            return MigratedDatabase(database: fresh, applied: try once.migrate(fresh), erasedAfter: failure)
        } catch {
            try? fresh.close()
            throw error
        }
    }

    /// Empties the database file at `path` in place, as SQLite documents it: reset on, VACUUM, reset off.
    private static func erase(_ path: String, failure: MigrationError, _ configuration: Database.Configuration) throws {
        do {
            let connection = try Connection(path: path, flags: SQLITE_OPEN_READWRITE)
            defer { connection.close() }
            let handle = try connection.liveHandle()
            sqlite3_busy_timeout(handle, Int32(clamping: configuration.busyTimeout.components.seconds * 1000))
            let on = tether_sqlite_reset_database(handle, 1)
            guard on == SQLITE_OK else { throw connection.error(on, sql: nil) }
            defer { _ = tether_sqlite_reset_database(handle, 0) }
            try connection.execute("VACUUM")
        } catch let error as DatabaseError {
            throw MigrationError.erasingRefused(
                """
                after \(failure), \(path) could not be erased (\(error.message)); it is as it was before the \
                failing migration
                """)
        }
    }
}

extension MigrationError {
    /// A migration that ran and failed (what sModel's recovery erases for), not a refusal to run.
    var isFailedMigration: Bool {
        switch self {
        case .failed, .foreignKeyViolations: return true
        default: return false
        }
    }
}
