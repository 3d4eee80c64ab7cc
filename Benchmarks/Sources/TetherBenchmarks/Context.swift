import BenchRegion
import Foundation

/// What the benchmarks of one run share: the row count, the input records
/// (built once, before any timing), a populated database to copy for the
/// fetch benchmarks, and the temporary directory everything lives in.
final class BenchmarkContext {
    let rowCount: Int
    private let runDirectory: URL
    private var directoryCounter = 0
    private var builtRecords: [BenchmarkRecord]?
    private var convertedInputs: [String: Any] = [:]
    private var populatedTemplate: URL?
    private var builtExpectedSummary: ContentSummary?
    private var templates: [String: String] = [:]
    private var sharedValues: [String: Any] = [:]
    private var sharedRuns: [String: (value: Any, takenBy: Set<String>)] = [:]

    init(rowCount: Int) throws {
        self.rowCount = rowCount
        runDirectory = FileManager.default.temporaryDirectory
            .appendingPathComponent("tether-bench-\(ProcessInfo.processInfo.processIdentifier)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: runDirectory, withIntermediateDirectories: true)
    }

    func removeRunDirectory() {
        try? FileManager.default.removeItem(at: runDirectory)
    }

    /// The records to insert, and the content every fetch must return.
    var records: [BenchmarkRecord] {
        if let builtRecords { return builtRecords }
        let records = BenchmarkRecord.makeInputs(count: rowCount)
        builtRecords = records
        return records
    }

    /// `records` converted to another record type (GRDB's), built once and
    /// kept so that the conversion is never timed.
    func inputs<Converted>(as type: Converted.Type, _ convert: (BenchmarkRecord) -> Converted) -> [Converted] {
        let key = String(reflecting: Converted.self)
        if let converted = convertedInputs[key] as? [Converted] { return converted }
        let converted = records.map(convert)
        convertedInputs[key] = converted
        return converted
    }

    /// Runs `body` with the path of a database file that does not exist yet,
    /// in a new directory that is removed afterwards (with the WAL and shm files).
    func withFreshDatabasePath<T>(_ body: (String) throws -> T) throws -> T {
        let directory = try makeDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        return try body(directory.appendingPathComponent("bench.sqlite").path)
    }

    /// Runs `body` with the path of a fresh copy of a database whose table
    /// holds `records` (a copy, so that every run starts from the same file
    /// without paying for the inserts again).
    func withPopulatedDatabasePath<T>(_ body: (String) throws -> T) throws -> T {
        let template = try populatedTemplateURL()
        let directory = try makeDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let copy = directory.appendingPathComponent("bench.sqlite")
        try FileManager.default.copyItem(at: template, to: copy)
        return try body(copy.path)
    }

    private func makeDirectory() throws -> URL {
        directoryCounter += 1
        let directory = runDirectory.appendingPathComponent("db-\(directoryCounter)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    /// The path of a database built once per run by `build`, for benchmarks to copy.
    func cachedTemplate(named name: String, build: (String) throws -> Void) throws -> String {
        if let path = templates[name] { return path }
        let path = runDirectory.appendingPathComponent("\(name)-template.sqlite").path
        try build(path)
        templates[name] = path
        return path
    }

    /// A value built once per run by `build` and kept for the run's other
    /// lines and rounds (the sync benchmarks' certificates).
    func cachedValue<T>(named name: String, build: () throws -> T) rethrows -> T {
        if let value = sharedValues[name] as? T { return value }
        let value = try build()
        sharedValues[name] = value
        return value
    }

    /// A directory that lives as long as the run (removed with it).
    func runSubdirectory(named name: String) throws -> URL {
        let directory = runDirectory.appendingPathComponent(name)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory
    }

    /// One measurement that gives the values of several lines (one two-process
    /// sync gives sync.tls and both sync.rss lines). Each line takes the latest
    /// run's result once; a line that already took it (it is the next round)
    /// gets a new run. So a round measures once however many of those lines
    /// are selected, and no line reports the same run twice.
    func sharedRun<T>(named name: String, for line: String, run: () throws -> T) rethrows -> T {
        if let shared = sharedRuns[name], !shared.takenBy.contains(line), let value = shared.value as? T {
            sharedRuns[name]?.takenBy.insert(line)
            return value
        }
        sharedRuns[name] = nil
        let value = try run()
        sharedRuns[name] = (value, [line])
        return value
    }

    private func populatedTemplateURL() throws -> URL {
        if let populatedTemplate { return populatedTemplate }
        let url = runDirectory.appendingPathComponent("populated-template.sqlite")
        log("building the populated database (\(rowCount) rows)")
        try populateWithCAPI(path: url.path, records: records)
        try verifyStoredRecords(at: url.path)
        populatedTemplate = url
        return url
    }

    // MARK: Checks (never timed)

    /// Checks that the database at `path` holds exactly `records`, through
    /// aggregates that any missing, extra or altered row would change.
    func verifyStoredRecords(at path: String) throws {
        try verifyStoredRecords(at: path, expected: expectedSummary)
    }

    /// Checks that the database at `path` holds the records `expected` summarizes.
    func verifyStoredRecords(at path: String, expected: ContentSummary) throws {
        let stored = try summarizeWithCAPI(path: path)
        guard stored == expected else {
            throw BenchmarkFailure(
                description:
                    "the database at \(path) does not hold the inserted records: found \(stored), expected \(expected)")
        }
    }

    /// Checks that a fetch returned `records`, in order.
    func verifyFetched<Fetched>(_ fetched: [Fetched], as plain: (Fetched) -> BenchmarkRecord) throws {
        let expected = records
        guard fetched.count == expected.count else {
            throw BenchmarkFailure(description: "fetched \(fetched.count) rows, expected \(expected.count)")
        }
        for (index, element) in fetched.enumerated() where plain(element) != expected[index] {
            throw BenchmarkFailure(
                description: "fetched row \(index) is \(plain(element)), expected \(expected[index])")
        }
    }

    private var expectedSummary: ContentSummary {
        if let builtExpectedSummary { return builtExpectedSummary }
        let summary = ContentSummary(records: records)
        builtExpectedSummary = summary
        return summary
    }
}

/// Aggregates of a table's content, compared after every insert benchmark.
struct ContentSummary: Equatable, CustomStringConvertible {
    var rowCount: Int64 = 0
    var idSum: Int64 = 0
    var countSum: Int64 = 0
    var nameBytes: Int64 = 0
    var valueSum: Double = 0

    init(rowCount: Int64, idSum: Int64, countSum: Int64, nameBytes: Int64, valueSum: Double) {
        self.rowCount = rowCount
        self.idSum = idSum
        self.countSum = countSum
        self.nameBytes = nameBytes
        self.valueSum = valueSum
    }

    init(records: [BenchmarkRecord]) {
        add(records)
    }

    /// Counts `records` in (a large table summarized a slice at a time).
    mutating func add(_ records: [BenchmarkRecord]) {
        for record in records {
            rowCount += 1
            idSum &+= record.id
            countSum &+= record.count
            nameBytes += Int64(record.name.utf8.count)
            valueSum += record.value
        }
    }

    var description: String {
        "\(rowCount) rows, sum(id) \(idSum), sum(count) \(countSum), \(nameBytes) name bytes, sum(value) \(valueSum)"
    }
}

struct BenchmarkFailure: Error, CustomStringConvertible {
    let description: String
}

/// Runs `operation` and returns its result and how long it took, in seconds.
///
/// The operation runs inside `measuredRegion`, where the instruction-count mode
/// (`--instructions`) has callgrind count: whatever a line times is what it counts. So a line
/// counted in that mode must not call `timed` inside `timed` (callgrind toggles counting at
/// each entry and exit of the region: a nested one would switch it off).
func timed<T>(_ operation: () throws -> T) throws -> (result: T, seconds: Double) {
    var outcome: Result<T, any Error>?
    let clock = ContinuousClock()
    let start = clock.now
    measuredRegion { outcome = Result { try operation() } }
    let elapsed = start.duration(to: clock.now).components
    guard let outcome else { preconditionFailure("measuredRegion returned without running its body") }
    return (try outcome.get(), Double(elapsed.seconds) + Double(elapsed.attoseconds) / 1e18)
}

/// Runs `body` inside the C function `tether_bench_measured_region` (BenchRegion), the one
/// symbol callgrind is told to count in (`InstructionCounts.regionSymbol`).
func measuredRegion(_ body: () -> Void) {
    withoutActuallyEscaping(body) { body in
        var closure = body
        withUnsafeMutablePointer(to: &closure) { pointer in
            tether_bench_measured_region(
                { context in
                    context?.assumingMemoryBound(to: (() -> Void).self).pointee()
                }, pointer)
        }
    }
}
