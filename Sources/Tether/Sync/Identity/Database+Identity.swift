import CSQLite
import Foundation

/// A database's identity among its peers: noticing that it is a copy, giving it a key of its
/// own, and taking backups that are safe to restore.
///
/// Three cases (README › Sync › Copies, backups and restores):
/// - **Cloning a node** (a file copied with `cp` or `sqlite3 .backup`): the copy notices it when
///   opened, and refuses to sync until ``resetInstanceKey()``; its writes stay pending meanwhile.
/// - **Restoring a backup** made by ``backup(to:)``: the copy takes a new key when first opened.
/// - **Moving a node** to another file or machine: it keeps its key; ``confirmMove()`` says so.
extension Database {
    /// Set when this database noticed it is a copy of another (whose instance key it carries) and
    /// was not rekeyed since: it does not sync until ``resetInstanceKey()`` or ``confirmMove()``.
    /// Of kind `.restored` when a peer's mark showed its history rewritten (restored in place):
    /// the peers whose marks show it are refused until ``resetInstanceKey()`` (``historyFindings()``
    /// lists them; the reason is the first one's), the others sync.
    public func detectedCopy() throws -> CopyDetection? {
        try read { connection in
            if let copy = try InstanceIdentity.copyDetection(connection) { return copy }
            return try connection.peerStore.historyFindings().first?.detection
        }
    }

    /// Gives this database a new instance key, and returns it. Its peers then pull everything
    /// under the new key from its start: what they already hold merges as unchanged (nothing is
    /// duplicated), and a copy's own writes — those made after the copy was noticed, moved to the
    /// new key — reach them all. Peers keep their cursors for the old key (the original's).
    ///
    /// Close this database's sync sessions first: a session open under the old key ends with an error.
    ///
    /// ```swift
    /// if try db.detectedCopy() != nil {
    ///     let key = try db.resetInstanceKey()
    ///     print("syncing as \(key) from now on")
    /// }
    /// ```
    @discardableResult
    public func resetInstanceKey() throws -> InstanceKey {
        let engine = try writableEngine()
        let key = try write { try engine.resetInstanceKey($0) }
        sync.didChangeKey(to: key)
        return key
    }

    /// This database was moved (to another file or machine), not copied: it keeps its instance
    /// key, and syncs again. Never call it on a copy whose original still syncs: the copy's writes
    /// would be lost.
    public func confirmMove() throws {
        let engine = try writableEngine()
        try write { try engine.confirmMove($0) }
    }

    /// Writes a consistent copy of this database to `path` while it (or another process) keeps
    /// writing, with SQLite's online backup API. The copy takes a new instance key when it is
    /// first opened to write, so restoring it is safe: it never syncs under this database's key.
    /// Refuses to overwrite an existing file.
    public func backup(to path: String) throws {
        guard !isMemory else {
            throw DatabaseError(
                extendedCode: SQLITE_MISUSE,
                message: "an in-memory database cannot be backed up to \(path): open it from a file")
        }
        guard !FileManager.default.fileExists(atPath: path) else {
            throw DatabaseError(
                extendedCode: SQLITE_CANTOPEN,
                message: "cannot back up to \(path): the file exists (choose another path, or remove it)")
        }
        do {
            let source = try Connection(path: self.path, flags: SQLITE_OPEN_READONLY)
            let copy = try Connection(path: path, flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE)
            try source.copyDatabase(into: copy)
            source.close()
            try copy.transaction(.immediate) { try InstanceIdentity.markForRekeyOnOpen(copy) }
            // Closing the last connection folds the copy's write-ahead log into its file: one file.
            copy.close()
        } catch {
            // A half-written copy would be mistaken for a backup.
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
            throw error
        }
    }

    private func writableEngine() throws -> SyncEngine {
        guard let syncEngine else {
            throw DatabaseError(
                extendedCode: SQLITE_READONLY, message: "the database is open read-only: its identity cannot change")
        }
        return syncEngine
    }
}
