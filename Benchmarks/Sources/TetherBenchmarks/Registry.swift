import Foundation

/// Which way a number is better.
enum Direction: String, Sendable {
    case higher, lower
}

/// A line's goal, as a ratio to another line measured in the same run.
struct Comparison: Sendable {
    /// The name of the line this one is divided by.
    let baseline: String
    let goal: Double
    /// Whether the ratio should be at least (`higher`) or at most (`lower`) the goal.
    let better: Direction
    /// The goal of the instruction-count mode, for a goal stated there of its own: this line's
    /// instructions per row at most this many times the baseline's. Without it, the time goal
    /// read for instructions (`instructionCeiling`).
    var instructionGoal: Double? = nil

    func isMet(by ratio: Double) -> Bool {
        better == .higher ? ratio >= goal : ratio <= goal
    }

    /// The most instructions per row this line may take, as a multiple of its baseline's: a
    /// rate at least `goal` times the baseline's is at most 1/`goal` times its instructions.
    /// (A line counted in that mode has a floor on its rate, or an `instructionGoal`:
    /// `validateRegistry` checks.)
    var instructionCeiling: Double {
        instructionGoal ?? 1 / goal
    }
}

/// One named measurement: one line of output.
struct Benchmark: Sendable {
    let name: String
    let unit: String
    /// Which of several runs' values is reported: the best one.
    let bestIs: Direction
    let comparison: Comparison?
    /// For a line of the instruction-count mode: how many rows its timed part handles (the
    /// count is divided by it). Set by `countingInstructions(rows:)`; nil for the lines that
    /// mode leaves out (those whose work is on other threads or in other processes, which
    /// callgrind's toggle on the timing thread does not see).
    var instructionRows: (@Sendable (BenchmarkContext) -> Int)? = nil
    /// Set for a line too long for the default run: it runs only when a name prefix given on
    /// the command line starts with this (`sync.10m` for the `sync.10m*` lines), never for a
    /// shorter prefix (`sync.`) or none.
    var onlyWhenAsked: String? = nil
    /// Runs the operation once, on fresh state, and returns its value in
    /// `unit`. It times only the operation itself, not its setup.
    let measure: @Sendable (BenchmarkContext) throws -> Double

    /// A throughput line in rows per second.
    static func rowsPerSecond(
        _ name: String, comparedTo comparison: Comparison? = nil,
        _ measure: @escaping @Sendable (BenchmarkContext) throws -> Double
    ) -> Benchmark {
        Benchmark(name: name, unit: "rows/s", bestIs: .higher, comparison: comparison, measure: measure)
    }

    /// This line, counted in the instruction-count mode too. `rows`: the rows its timed part
    /// handles (the run's row count unless the line takes fewer).
    func countingInstructions(rows: @escaping @Sendable (BenchmarkContext) -> Int = { $0.rowCount }) -> Benchmark {
        var line = self
        line.instructionRows = rows
        return line
    }

    /// This line, run only when a prefix on the command line starts with `group`.
    func runningOnlyWhenAsked(as group: String) -> Benchmark {
        var line = self
        line.onlyWhenAsked = group
        return line
    }

    func best(of values: [Double]) -> Double? {
        bestIs == .higher ? values.max() : values.min()
    }
}

struct UsageError: Error, CustomStringConvertible {
    let description: String
}

/// The benchmarks whose names start with one of `prefixes` (all of them when
/// there is none), plus every line those are compared with, so that a ratio
/// is always computed from two values of the same run. Registry order is kept.
/// A line run only when asked is chosen only by a prefix that starts with its group
/// (`sync.10m`, not `sync.`), and never when there is no prefix.
func selectBenchmarks(_ registry: [Benchmark], prefixes: [String]) throws -> [Benchmark] {
    func isChosen(_ benchmark: Benchmark, by prefix: String) -> Bool {
        guard benchmark.name.hasPrefix(prefix) else { return false }
        return benchmark.onlyWhenAsked.map { prefix.hasPrefix($0) } ?? true
    }
    guard !prefixes.isEmpty else { return registry.filter { $0.onlyWhenAsked == nil } }
    for prefix in prefixes where !registry.contains(where: { isChosen($0, by: prefix) }) {
        throw UsageError(
            description:
                "no benchmark name starts with \"\(prefix)\"; known: \(registry.map(\.name).joined(separator: ", "))")
    }
    var chosen = Set(registry.filter { benchmark in prefixes.contains { isChosen(benchmark, by: $0) } }.map(\.name))
    // Baselines may have baselines of their own (orm.insert → c.insert).
    var pending = Array(chosen)
    while let name = pending.popLast() {
        guard let baseline = registry.first(where: { $0.name == name })?.comparison?.baseline else { continue }
        if chosen.insert(baseline).inserted { pending.append(baseline) }
    }
    return registry.filter { chosen.contains($0.name) }
}

/// Checks what a registry's author could get wrong: duplicate names, or a
/// comparison with a line that is not registered before the one compared.
func validateRegistry(_ registry: [Benchmark]) {
    var seen = Set<String>()
    for benchmark in registry {
        precondition(seen.insert(benchmark.name).inserted, "benchmark \(benchmark.name) is registered twice")
        if let comparison = benchmark.comparison {
            precondition(
                seen.contains(comparison.baseline),
                "\(benchmark.name) is compared with \(comparison.baseline), which must be registered before it")
            precondition(
                benchmark.instructionRows == nil || comparison.better == .higher || comparison.instructionGoal != nil,
                """
                \(benchmark.name) is counted in instructions with a ceiling on its rate: give its \
                Comparison an instructionGoal
                """)
        }
    }
}

/// Runs each benchmark `repeats` times and returns each one's best value.
/// Rounds interleave the benchmarks (a, b, a, b, …) rather than running one
/// benchmark's repeats back to back, so that a slow spell of a shared machine
/// does not fall on one side of a ratio only.
func runBenchmarks(_ benchmarks: [Benchmark], repeats: Int, context: BenchmarkContext) throws -> [String: Double] {
    var values: [String: [Double]] = [:]
    for round in 1...repeats {
        for benchmark in benchmarks {
            let value = try benchmark.measure(context)
            values[benchmark.name, default: []].append(value)
            log("round \(round)/\(repeats) \(benchmark.name): \(formatNumber(value)) \(benchmark.unit)")
        }
    }
    var best: [String: Double] = [:]
    for benchmark in benchmarks {
        best[benchmark.name] = benchmark.best(of: values[benchmark.name] ?? [])
    }
    return best
}

/// The line's JSON object: name, value and unit, and for a line with a goal
/// its ratio to the baseline line's value.
func jsonLine(for benchmark: Benchmark, results: [String: Double]) -> String? {
    guard let value = results[benchmark.name] else { return nil }
    var fields = [
        "\"name\": \(jsonString(benchmark.name))",
        "\"value\": \(formatNumber(value))",
        "\"unit\": \(jsonString(benchmark.unit))",
    ]
    if let comparison = benchmark.comparison, let baselineValue = results[comparison.baseline], baselineValue != 0 {
        fields += [
            "\"ratio_to\": \(jsonString(comparison.baseline))",
            "\"ratio\": \(String(format: "%.3f", value / baselineValue))",
            "\"goal\": \(comparison.goal)",
            "\"better\": \(jsonString(comparison.better.rawValue))",
        ]
    }
    return "{" + fields.joined(separator: ", ") + "}"
}

/// A human summary of the goals, for stderr.
func goalSummary(_ benchmarks: [Benchmark], results: [String: Double]) -> [String] {
    benchmarks.compactMap { benchmark in
        guard let comparison = benchmark.comparison,
            let value = results[benchmark.name], let baselineValue = results[comparison.baseline], baselineValue != 0
        else { return nil }
        let ratio = value / baselineValue
        let sign = comparison.better == .higher ? ">=" : "<="
        let verdict = comparison.isMet(by: ratio) ? "met" : "MISSED"
        return """
            \(benchmark.name) / \(comparison.baseline) = \(String(format: "%.3f", ratio)) (goal \(sign) \
            \(comparison.goal)): \(verdict)
            """
    }
}

/// Large values as whole numbers, small ones with four significant digits.
func formatNumber(_ value: Double) -> String {
    guard value.isFinite else { return "null" }
    return abs(value) >= 100 ? String(format: "%.0f", value) : String(format: "%.4g", value)
}

func jsonString(_ text: String) -> String {
    var escaped = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": escaped += "\\\""
        case "\\": escaped += "\\\\"
        case "\n": escaped += "\\n"
        case _ where scalar.value < 0x20: escaped += String(format: "\\u%04x", scalar.value)
        default: escaped.unicodeScalars.append(scalar)
        }
    }
    return escaped + "\""
}

/// Progress and diagnostics: stderr, so that stdout holds only JSON lines.
func log(_ message: String) {
    FileHandle.standardError.write(Data((message + "\n").utf8))
}
