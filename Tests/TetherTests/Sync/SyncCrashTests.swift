import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Applies batches in a child process killed with SIGKILL at random points,
/// restarts it, and checks that nothing was lost and nothing applied twice.
@Suite struct SyncCrashTests {
    struct Item: Model, Equatable {
        var id: Int64
        var name: String
        var count: Int
        var note: String?
        static let tableName = "crash_item"
    }

    static var workerURL: URL {
        URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent(
            "TetherTestWorker")
    }

    /// Runs the worker; with `killAfter`, kills it with SIGKILL as soon as it prints that line.
    static func runWorker(database: String, batches: [String], killAfter line: String?) throws -> (
        killed: Bool, output: [String]
    ) {
        let process = Process()
        process.executableURL = workerURL
        process.arguments = ["apply", database] + batches
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.standardError
        try process.run()
        var output: [String] = []
        var buffer = Data()
        var killed = false
        let handle = pipe.fileHandleForReading
        reading: while true {
            let chunk = handle.availableData
            if chunk.isEmpty { break }
            buffer.append(chunk)
            while let newline = buffer.firstIndex(of: 0x0A) {
                let text = String(decoding: buffer[buffer.startIndex..<newline], as: UTF8.self)
                buffer.removeSubrange(buffer.startIndex...newline)
                output.append(text)
                if let line, text.hasPrefix(line) {
                    kill(process.processIdentifier, SIGKILL)
                    killed = true
                    break reading
                }
            }
        }
        process.waitUntilExit()
        return (killed, output)
    }

    /// `source`'s changes for a new peer, cut into batches of 150 written to files in `directory`:
    /// their paths, and the sequence the last one reaches.
    static func writeBatches(from source: Database, into directory: TemporaryDirectory) throws -> (
        paths: [String], through: Int64
    ) {
        let targetKey = InstanceKey.random()
        var paths: [String] = []
        var cursor: Int64 = 0
        while true {
            let batch = try source.extractChanges(
                for: targetKey, after: cursor, limits: BatchLimits(maximumChanges: 150))
            let path = directory.url.appendingPathComponent(String(format: "batch-%04d.bin", paths.count)).path
            try Data(BatchCoding.encode(batch)).write(to: URL(fileURLWithPath: path))
            paths.append(path)
            cursor = batch.through
            if batch.isLast { return (paths, cursor) }
        }
    }

    /// Applies `batches` to `database` in a worker killed `attempts` times (while a batch is being
    /// applied, or right after one committed), then once to the end; returns how many kills landed.
    static func killRepeatedly(database: String, batches: [String], attempts: Int, random: inout SeededGenerator) throws
        -> Int
    {
        var kills = 0
        for _ in 0..<attempts {
            let index = Int.random(in: 0..<batches.count, using: &random)
            let line = Bool.random(using: &random) ? "begin \(index)" : "done \(index)"
            if try runWorker(database: database, batches: batches, killAfter: line).killed { kills += 1 }
        }
        return kills
    }

    static func dump(_ db: Database) throws -> [String] {
        try db.fetchRows("SELECT id, name, count, note FROM crash_item ORDER BY id").map {
            $0.values.map(\.description).joined(separator: "|")
        }
    }

    @Test(arguments: [1, 2, 3])
    func applySurvivesSIGKILL(seed: UInt64) throws {
        var random = SeededGenerator(seed: seed)
        let directory = try TemporaryDirectory()
        defer { directory.remove() }

        // The source: inserts, updates and deletes, cut into many batches.
        let source = try makeDatabase(syncing: Item.self)
        try source.insert(
            contentsOf: (1...3_000).map {
                Item(id: $0, name: "item \($0)", count: Int($0), note: $0 % 3 == 0 ? nil : "n\($0)")
            })
        for _ in 0..<600 {
            let id = Int64.random(in: 1...3_000, using: &random)
            if Bool.random(using: &random) {
                try source.execute("UPDATE crash_item SET count = count + 1, note = 'u' WHERE id = ?", [id])
            } else {
                try source.execute("DELETE FROM crash_item WHERE id = ?", [id])
            }
        }
        let (paths, through) = try Self.writeBatches(from: source, into: directory)

        func makeTarget(_ path: String) throws {
            let db = try Database(path: path)
            try db.createTable(Item.self)
            try db.enableSync(for: Item.self)
        }
        // The same batches applied without crashes: the reference.
        let referencePath = directory.url.appendingPathComponent("reference.sqlite").path
        try makeTarget(referencePath)
        let reference = try Self.runWorker(database: referencePath, batches: paths, killAfter: nil)
        #expect(reference.output.last == "finished")

        let targetPath = directory.url.appendingPathComponent("target.sqlite").path
        try makeTarget(targetPath)
        #expect(try Self.killRepeatedly(database: targetPath, batches: paths, attempts: 6, random: &random) > 0)
        let final = try Self.runWorker(database: targetPath, batches: paths, killAfter: nil)
        #expect(final.output.last == "finished")

        let target = try Database(path: targetPath)
        let referenceDB = try Database(path: referencePath)
        #expect(try Self.dump(target) == Self.dump(source))
        #expect(try Self.dump(referenceDB) == Self.dump(source))
        #expect(try target.cursor(for: source.instanceKey).after == through)
        // Every change applied exactly once: the target gave out exactly as
        // many sequence numbers as the run without crashes.
        #expect(try target.lastSequence() == referenceDB.lastSequence())
        #expect(try target.fetchValue("PRAGMA integrity_check", as: String.self) == "ok")
        #expect(try target.keptAsideChanges().isEmpty)
    }

    /// The same with `count` a counter (issue 39) holding the contributions of two sites: after
    /// the kills every row's count is the source's, each contribution counted once.
    @Test func countersSurviveSIGKILL() throws {
        var random = SeededGenerator(seed: 39)
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        func counterNode(_ path: String? = nil) throws -> Database {
            let db = try path.map { try Database(path: $0) } ?? Database.inMemory()
            try db.createTable(Item.self)
            try db.enableSync(for: Item.self, columnRules: ["count": .counter])
            return db
        }
        let source = try counterNode(), other = try counterNode()
        try source.insert(contentsOf: (1...3_000).map { Item(id: $0, name: "item \($0)", count: 100, note: nil) })
        try sendChanges(from: source, to: other)
        for _ in 0..<400 {
            let id = Int64.random(in: 1...3_000, using: &random)
            try other.execute(
                "UPDATE crash_item SET count = count - ? WHERE id = ?", [Int.random(in: 1...5, using: &random), id])
        }
        for _ in 0..<600 {
            let id = Int64.random(in: 1...3_000, using: &random)
            if Int.random(in: 0..<6, using: &random) == 0 {
                try source.execute("DELETE FROM crash_item WHERE id = ?", [id])
            } else {
                try source.execute(
                    "UPDATE crash_item SET count = count + ? WHERE id = ?", [Int.random(in: 1...9, using: &random), id])
            }
        }
        try sendChanges(from: other, to: source)
        #expect(
            try source.fetchValue(
                "SELECT count(*) FROM tether_rows_crash_item WHERE counters IS NOT NULL", as: Int64.self) ?? 0 > 300)
        let (paths, through) = try Self.writeBatches(from: source, into: directory)

        let referencePath = directory.url.appendingPathComponent("reference.sqlite").path
        try counterNode(referencePath).close()
        #expect(try Self.runWorker(database: referencePath, batches: paths, killAfter: nil).output.last == "finished")
        let targetPath = directory.url.appendingPathComponent("target.sqlite").path
        try counterNode(targetPath).close()
        #expect(try Self.killRepeatedly(database: targetPath, batches: paths, attempts: 6, random: &random) > 0)
        #expect(try Self.runWorker(database: targetPath, batches: paths, killAfter: nil).output.last == "finished")

        let target = try Database(path: targetPath)
        let referenceDB = try Database(path: referencePath)
        #expect(try Self.dump(target) == Self.dump(source))
        #expect(try Self.dump(referenceDB) == Self.dump(source))
        #expect(try target.cursor(for: source.instanceKey).after == through)
        #expect(try target.lastSequence() == referenceDB.lastSequence())
        // The states too: a later exchange with a third site counts each contribution once.
        try sendChanges(from: target, to: other)
        #expect(try Self.dump(other) == Self.dump(source))
    }
}
