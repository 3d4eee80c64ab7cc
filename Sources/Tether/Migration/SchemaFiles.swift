import Foundation

extension Database {
    /// Runs the `.sql` files of `directory` not applied yet, once each, in the order of their
    /// names (sModel's schema files; name them so that new ones sort last: `001-player.sql`,
    /// `002-score.sql`). Each file runs in its own transaction, like a migration (foreign keys
    /// checked before commit), and is recorded in `tether_migrations` with the SHA-256 of its
    /// bytes. Returns the names of the files applied.
    ///
    /// An applied file must never change: if one did, this throws
    /// `MigrationError.changedAfterApplying` naming it, and nothing runs. A file recorded as
    /// applied but gone from the directory throws `MigrationError.appliedSchemaFilesMissing`
    /// (an older copy of the schema directory, or a deleted file) unless `allowingMissingFiles`.
    ///
    /// ```swift
    /// let applied = try db.applySchemaFiles(in: "Schema")   // ["001-player.sql", "002-score.sql"]
    /// ```
    @discardableResult
    public func applySchemaFiles(in directory: String, allowingMissingFiles: Bool = false) throws -> [String] {
        var migrator = try Migrator(schemaFilesIn: directory)
        migrator.allowsUnknownMigrations = allowingMissingFiles
        return try migrator.migrate(self)
    }
}

extension Migrator {
    /// A migrator whose steps are the `.sql` files of `directory`, sorted by the bytes of their
    /// names (what `applySchemaFiles(in:)` runs); for sModel's recovery from a failed upgrade
    /// (`erasesDatabaseOnFailure` with `migrate(databaseAt:configuration:)`).
    ///
    /// ```swift
    /// var schema = try Migrator(schemaFilesIn: "Schema")
    /// schema.erasesDatabaseOnFailure = true
    /// let opened = try schema.migrate(databaseAt: "cache.sqlite")
    /// ```
    public init(schemaFilesIn directory: String) throws {
        self.init(kind: .schemaFile)
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix(".sql") }
        } catch {
            throw MigrationError.unreadableSchemaFile(
                path: directory, reason: "the directory cannot be listed: \(error.localizedDescription)")
        }
        // Byte order of the UTF-8 names: the same on every machine and locale.
        for name in names.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
            let path = (directory as NSString).appendingPathComponent(name)
            guard let data = FileManager.default.contents(atPath: path) else {
                throw MigrationError.unreadableSchemaFile(path: path, reason: "it cannot be read")
            }
            guard let text = String(data: data, encoding: .utf8) else {
                throw MigrationError.unreadableSchemaFile(path: path, reason: "it is not UTF-8 text")
            }
            append(Step(name: name, checksum: SHA256.hex(data), body: { try $0.connection.executeScript(text) }))
        }
    }
}
