import Foundation
import Tether

/// Databases of one synced table, `note`, in files that the copies, backups and restores tests
/// reopen, copy and restore.
public enum NoteDatabase {
    public static let schema = "CREATE TABLE note (id TEXT PRIMARY KEY, body TEXT)"

    /// The database at `path`, with `note` created and synced on first open.
    public static func open(_ path: String) throws -> Database {
        let db = try Database(path: path)
        if try !db.tableExists("note") {
            try db.execute(schema)
            try db.enableSync(table: "note")
        }
        return db
    }

    /// One row per id, its body naming it.
    public static func insert(_ ids: [String], into db: Database) throws {
        for id in ids { try db.execute("INSERT INTO note (id, body) VALUES (?, ?)", [id, "from \(id)"]) }
    }

    /// The ids of `note`, in order.
    public static func ids(_ db: Database) throws -> [String] {
        try db.fetchRows("SELECT id FROM note ORDER BY id").map { try $0.get(0, as: String.self) }
    }
}

/// Puts the bytes of `snapshot` back into the file at `path`, which keeps its inode: what a file
/// system or VM snapshot rolled back does (a copy made by `cp` would be a new file).
public func restoreInPlace(_ path: String, from snapshot: Data) throws {
    for suffix in ["-wal", "-shm"] where FileManager.default.fileExists(atPath: path + suffix) {
        try FileManager.default.removeItem(atPath: path + suffix)
    }
    guard let handle = FileHandle(forWritingAtPath: path) else { throw CocoaError(.fileNoSuchFile) }
    try handle.truncate(atOffset: 0)
    try handle.write(contentsOf: snapshot)
    try handle.close()
}
