import Foundation
import Testing
import TetherTestSupport

/// The scenario a new user met: a database copied with `sqlite3 .backup` kept its instance key
/// and its writes were never sent. Now the copy says so, refuses with the fix, and after
/// `tether rekey` every row reaches the third node; `tether backup` makes copies safe to restore.
@Suite struct IdentityCommandsTests {
    static let schema = "CREATE TABLE note (id INTEGER PRIMARY KEY, body TEXT);"

    static func initDatabase(_ directory: TemporaryDirectory, _ name: String) throws -> String {
        let schemaFile = try directory.write("schema.sql", schema)
        let result = try tether("init", "--db", directory.file(name), "--schema", schemaFile, "--sync", "note")
        #expect(result.status == 0, "\(result)")
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func insert(_ ids: ClosedRange<Int>, into path: String) throws {
        for id in ids {
            let result = try tether("sql", "--db", path, "INSERT INTO note (id, body) VALUES (\(id), 'note \(id)')")
            #expect(result.status == 0, "\(result)")
        }
    }

    /// Sends what `source` has for the database whose key is `destinationKey` by a sync file.
    static func send(
        _ directory: TemporaryDirectory, from source: String, to destination: String, key destinationKey: String
    ) throws -> CLIResult {
        let file = directory.file(UUID().uuidString + ".tether")
        let exported = try tether("export", "--db", source, "--for", destinationKey, "--since", "0", "--out", file)
        guard exported.status == 0 else { return exported }
        return try tether("import", "--db", destination, file)
    }

    @Test("a copy made by sqlite3 .backup is shown and refused until tether rekey; then the third node gets every row")
    func rekeyAfterACopy() throws {
        let directory = try TemporaryDirectory()
        let a = directory.file("a.db"), copy = directory.file("a2.db"), c = directory.file("c.db")
        let keyA = try Self.initDatabase(directory, "a.db")
        let keyC = try Self.initDatabase(directory, "c.db")
        try Self.insert(1...1, into: a)
        let shell = try run(URL(fileURLWithPath: "/usr/bin/sqlite3"), [a, ".backup '\(copy)'"])
        #expect(shell.status == 0, "\(shell)")
        try Self.insert(2...4, into: a)
        try Self.insert(5...7, into: copy)

        let status = try tether("status", "--db", copy)
        #expect(
            status.status == 0 && status.stdout.contains("COPY:") && status.stdout.contains("tether rekey"), "\(status)"
        )
        #expect(try Self.send(directory, from: a, to: c, key: keyC).status == 0)
        let refused = try Self.send(directory, from: copy, to: c, key: keyC)
        #expect(refused.status == 65 && refused.isOneLineError && refused.stderr.contains("tether rekey"), "\(refused)")

        let rekeyed = try tether("rekey", "--db", copy)
        #expect(rekeyed.status == 0 && rekeyed.stdout.contains(keyA), "\(rekeyed)")
        #expect(try Self.send(directory, from: copy, to: c, key: keyC).status == 0)
        let rows = try tether("sql", "--db", c, "SELECT id FROM note ORDER BY id", "--json")
        #expect(try jsonRows(rows.stdout).compactMap { ($0["id"] as? NSNumber)?.intValue } == Array(1...7), "\(rows)")
    }

    @Test("tether backup copies a live database; the copy takes a new key when opened; an existing target is refused")
    func backupIsSafeToRestore() throws {
        let directory = try TemporaryDirectory()
        let a = directory.file("a.db"), backup = directory.file("backup.db")
        let keyA = try Self.initDatabase(directory, "a.db")
        try Self.insert(1...3, into: a)
        let made = try tether("backup", "--db", a, "--to", backup)
        #expect(made.status == 0, "\(made)")
        let again = try tether("backup", "--db", a, "--to", backup)
        #expect(again.status == 73 && again.isOneLineError && again.stderr.contains("exists"), "\(again)")

        let restored = try tether("status", "--db", backup, "--json")
        #expect(restored.status == 0, "\(restored)")
        let object = try JSONSerialization.jsonObject(with: Data(restored.stdout.utf8)) as? [String: Any]
        let restoredKey = object?["instanceKey"] as? String
        #expect(restoredKey != nil && restoredKey != keyA)
        #expect(object?["copyDetected"] is NSNull)
        let rows = try tether("sql", "--db", backup, "SELECT count(*) AS n FROM note", "--json")
        #expect(try jsonRows(rows.stdout).first?["n"] as? NSNumber == 3, "\(rows)")
    }
}
