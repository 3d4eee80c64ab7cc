import Foundation

/// The instruction-count mode (`TetherBenchmarks --instructions [NAME-PREFIX ...]`, which
/// `./Scripts/bench.sh --instructions` runs on a copy of the binary without debug info):
/// each line counted (`Benchmark.instructionRows`) runs once, in a process of its own under
/// valgrind's callgrind, counting only inside `measuredRegion` (the line's timed part), and
/// is reported as instructions per row, with its ratio to its baseline's. Callgrind counts the
/// same instructions for the same binary however busy the host is, so these ratios do not move
/// from run to run as the time ratios do.
///
/// Callgrind's toggle counts on the thread that enters the region only: the lines counted are
/// those whose timed part does all its work on that thread (the C, ORM, synced, engine apply
/// and extract lines, gc.rate); the network and observation lines, whose work is on event-loop
/// or listener threads and in other processes, are left out.
enum InstructionCounts {
    static let flag = "--instructions"
    /// The hidden mode of the process valgrind runs: one line, once.
    static let childFlag = "--instruction-child"
    /// The C function every timed part runs in (BenchRegion, called by `measuredRegion`).
    static let regionSymbol = "tether_bench_measured_region"
    /// Rows per line unless TETHER_BENCH_ROWS says otherwise: a run of every line in minutes.
    static let defaultRowCount = 50_000

    /// One line's count.
    struct Count {
        var instructions: Int
        var rows: Int
        var perRow: Double { Double(instructions) / Double(rows) }
    }

    // MARK: Driver

    /// Counts each selected line in turn and prints their JSON lines (stdout) and goals (stderr).
    static func run(registry: [Benchmark], prefixes: [String]) throws {
        let counted = registry.filter { $0.instructionRows != nil }
        let selected = try selectBenchmarks(counted, prefixes: prefixes)
        let rowCount = try positiveIntegerSetting("TETHER_BENCH_ROWS", default: defaultRowCount)
        let outputDirectory = FileManager.default.temporaryDirectory
            .appendingPathComponent("tether-bench-callgrind-\(ProcessInfo.processInfo.processIdentifier)")
        try FileManager.default.createDirectory(at: outputDirectory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: outputDirectory) }

        log(
            """
            counting instructions of \(selected.map(\.name).joined(separator: ", ")): \(rowCount) rows, under \
            callgrind
            """)
        var counts: [String: Count] = [:]
        for benchmark in selected {
            let outputFile = outputDirectory.appendingPathComponent("\(benchmark.name).callgrind").path
            let count = try countInChild(benchmark.name, rowCount: rowCount, outputFile: outputFile)
            counts[benchmark.name] = count
            log(
                """
                \(benchmark.name): \(count.instructions) instructions for \(count.rows) rows, \
                \(formatNumber(count.perRow)) per row
                """)
        }
        let perRow = counts.mapValues(\.perRow)
        for benchmark in selected {
            guard let count = counts[benchmark.name] else { continue }
            print(jsonLine(for: benchmark, count: count, perRow: perRow))
        }
        for line in goalSummary(selected, perRow: perRow) { log(line) }
    }

    /// Runs `TetherBenchmarks --instruction-child NAME` under callgrind, counting only inside
    /// the region, and reads the child's row count (stdout) and callgrind's total.
    private static func countInChild(_ name: String, rowCount: Int, outputFile: String) throws -> Count {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        let executable = Bundle.main.executableURL?.path ?? CommandLine.arguments[0]
        process.arguments = [
            ProcessInfo.processInfo.environment["TETHER_VALGRIND"] ?? "valgrind",
            "--tool=callgrind", "--quiet",
            "--collect-atstart=no", "--toggle-collect=\(regionSymbol)",
            "--callgrind-out-file=\(outputFile)",
            executable, childFlag, name,
        ]
        var environment = ProcessInfo.processInfo.environment
        environment["TETHER_BENCH_ROWS"] = "\(rowCount)"
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationReason == .exit, process.terminationStatus == 0 else {
            throw BenchmarkFailure(
                description: """
                    counting \(name) under callgrind failed (status \(process.terminationStatus); is valgrind \
                    installed?)
                    """)
        }
        let rowsLine = printed.split(separator: "\n").first { $0.hasPrefix("rows ") }
        guard let rows = rowsLine.flatMap({ Int($0.dropFirst("rows ".count)) }), rows > 0 else {
            throw BenchmarkFailure(
                description: "the instruction child of \(name) did not report its rows (printed: \(printed))")
        }
        let instructions = try totalInstructions(inCallgrindOutput: outputFile)
        // Fewer instructions than rows: counting was off for most of the timed part (the symbol
        // stripped or renamed, or a `timed` inside `timed` toggling it off).
        guard instructions >= rows else {
            throw BenchmarkFailure(
                description:
                    "callgrind counted \(instructions) instructions in \(regionSymbol) for \(rows) rows of \(name): "
                    + "was the symbol renamed, or is a timed part nested in another?")
        }
        return Count(instructions: instructions, rows: rows)
    }

    /// The `totals:` (or, failing that, `summary:`) line of a callgrind output file: the
    /// instructions counted while collection was on (the only event counted by default).
    static func totalInstructions(inCallgrindOutput path: String) throws -> Int {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw BenchmarkFailure(description: "callgrind wrote no output file at \(path)")
        }
        let lines = String(decoding: data, as: UTF8.self).split(separator: "\n")
        for key in ["totals:", "summary:"] {
            if let line = lines.last(where: { $0.hasPrefix(key) }),
                let first = line.dropFirst(key.count).split(separator: " ").first, let value = Int(first)
            {
                return value
            }
        }
        throw BenchmarkFailure(description: "no totals: or summary: line in the callgrind output \(path)")
    }

    // MARK: Child

    /// Runs the line `arguments[0]` once (its setup and checks uncounted: only its timed part is
    /// inside the region) and prints `rows N`.
    static func runChild(_ arguments: [String]) -> Int32 {
        do {
            guard arguments.count == 1, let name = arguments.first,
                let benchmark = makeRegistry().first(where: { $0.name == name }), let rows = benchmark.instructionRows
            else {
                throw UsageError(
                    description: "usage: TetherBenchmarks \(childFlag) NAME (a line counted in the instruction mode)")
            }
            let context = try BenchmarkContext(
                rowCount: try positiveIntegerSetting("TETHER_BENCH_ROWS", default: defaultRowCount))
            defer { context.removeRunDirectory() }
            _ = context.records
            _ = try benchmark.measure(context)
            print("rows \(rows(context))")
            return 0
        } catch {
            log("instruction child: error: \(error)")
            return 1
        }
    }

    // MARK: Output

    /// The line's JSON object: instructions per row, and for a line with a goal its ratio to the
    /// baseline's instructions per row, with the goal read for instructions (at most).
    static func jsonLine(for benchmark: Benchmark, count: Count, perRow: [String: Double]) -> String {
        var fields = [
            "\"name\": \(jsonString(benchmark.name))",
            "\"value\": \(formatNumber(count.perRow))",
            "\"unit\": \"instructions/row\"",
            "\"instructions\": \(count.instructions)",
            "\"rows\": \(count.rows)",
        ]
        if let comparison = benchmark.comparison, let baseline = perRow[comparison.baseline], baseline != 0 {
            fields += [
                "\"ratio_to\": \(jsonString(comparison.baseline))",
                "\"ratio\": \(String(format: "%.3f", count.perRow / baseline))",
                "\"goal\": \(formatGoal(comparison.instructionCeiling))",
                "\"better\": \"lower\"",
            ]
        }
        return "{" + fields.joined(separator: ", ") + "}"
    }

    static func goalSummary(_ benchmarks: [Benchmark], perRow: [String: Double]) -> [String] {
        benchmarks.compactMap { benchmark in
            guard let comparison = benchmark.comparison, let value = perRow[benchmark.name],
                let baseline = perRow[comparison.baseline], baseline != 0
            else { return nil }
            let ratio = value / baseline
            let verdict = ratio <= comparison.instructionCeiling ? "met" : "MISSED"
            return "\(benchmark.name) / \(comparison.baseline) instructions per row = \(String(format: "%.3f", ratio)) "
                + "(goal <= \(formatGoal(comparison.instructionCeiling))): \(verdict)"
        }
    }

    /// A goal with at most three decimals (1/0.75 is 1.333).
    private static func formatGoal(_ goal: Double) -> String {
        String(format: "%.3f", goal).replacingOccurrences(of: #"\.?0+$"#, with: "", options: .regularExpression)
    }
}
