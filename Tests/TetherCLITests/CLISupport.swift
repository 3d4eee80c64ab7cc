import Foundation
import Testing

/// The outcome of one run of the `tether` executable.
struct CLIResult: CustomStringConvertible {
    var status: Int32
    var stdout: String
    var stderr: String

    var description: String { "exit \(status)\nstdout: \(stdout)\nstderr: \(stderr)" }

    /// stderr is exactly one line, "tether: error: …", and holds no stack trace.
    var isOneLineError: Bool {
        let lines = stderr.split(separator: "\n", omittingEmptySubsequences: false)
        return lines.count == 2 && lines[1].isEmpty && lines[0].hasPrefix("tether: error: ")
            && !stderr.contains("Fatal error") && !stderr.contains("Stack dump") && !stderr.contains("0x")
    }
}

/// The built `tether` executable, next to the test bundle.
let tetherExecutable = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    .appendingPathComponent("tether")

/// Runs `tether` with `arguments`; returns its exit code and output.
func tether(_ arguments: String..., stdin: String? = nil) throws -> CLIResult {
    try run(tetherExecutable, arguments)
}

func tether(_ arguments: [String]) throws -> CLIResult {
    try run(tetherExecutable, arguments)
}

/// Runs `work` on a thread of its own and awaits it: a test waiting long for a process does not
/// hold one of the cooperative threads (one per core) that every async test of the run shares.
func offThePool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try work() }) }
    }
}

/// Runs `executable` with `arguments`, reading its output fully before waiting for it.
func run(_ executable: URL, _ arguments: [String]) throws -> CLIResult {
    let process = Process()
    process.executableURL = executable
    process.arguments = arguments
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    process.standardInput = FileHandle.nullDevice
    try process.run()
    // Read both pipes concurrently so that neither can fill up and block the child.
    let group = DispatchGroup()
    nonisolated(unsafe) var errData = Data()
    group.enter()
    DispatchQueue.global().async {
        errData = err.fileHandleForReading.readDataToEndOfFile()
        group.leave()
    }
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    group.wait()
    process.waitUntilExit()
    return CLIResult(
        status: process.terminationStatus, stdout: String(decoding: outData, as: UTF8.self),
        stderr: String(decoding: errData, as: UTF8.self))
}

/// Parses `tether sql --json` output.
func jsonRows(_ text: String) throws -> [[String: Any]] {
    let object = try JSONSerialization.jsonObject(with: Data(text.utf8))
    return (object as? [[String: Any]]) ?? []
}

/// `flags` (pairs `--name value`) with the value of `--name` replaced: a flag that takes one value
/// is refused when given twice, so a test changes it in place rather than adding it again.
func replacing(_ name: String, with value: String, in flags: [String]) -> [String] {
    var replaced = flags
    if let index = replaced.firstIndex(of: name), index + 1 < replaced.count {
        replaced[index + 1] = value
    } else {
        replaced += [name, value]
    }
    return replaced
}
