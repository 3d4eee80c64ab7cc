// A child process for tests that need another process: applies batch files to a database,
// saying what it does on stdout, so that a crash-safety test can kill it with SIGKILL at a
// chosen point and check what survived; or commits SQL whose publication lags its last write to
// the write-ahead log by SECONDS (a slow disk, `SlowLogWriter`), says "committed" and keeps its
// connection open until its standard input ends.
//
//     TetherTestWorker apply DATABASE BATCH...
//     TetherTestWorker commit-slowly DATABASE SECONDS SQL
import Foundation
import Tether
import TetherTestSupport

/// Unbuffered, so that the test sees each line the moment it is written.
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("TetherTestWorker: \(message)\n".utf8))
    exit(2)
}

let arguments = CommandLine.arguments
let usage = "usage: TetherTestWorker apply DATABASE BATCH... | commit-slowly DATABASE SECONDS SQL"
guard arguments.count >= 3 else { fail(usage) }
do {
    switch arguments[1] {
    case "apply":
        let db = try Database(path: arguments[2])
        for (index, path) in arguments.dropFirst(3).enumerated() {
            let batch = try BatchCoding.decode([UInt8](try Data(contentsOf: URL(fileURLWithPath: path))))
            say("begin \(index)")
            let report = try db.apply(batch)
            say("done \(index) applied \(report.applied) duplicate \(report.wasDuplicate)")
        }
        say("finished")
    case "commit-slowly":
        guard arguments.count == 5, let seconds = Double(arguments[3]) else { fail(usage) }
        let writer = try SlowLogWriter(path: arguments[2], syncDelay: .milliseconds(Int(seconds * 1000)))
        try writer.commit(arguments[4])
        say("committed")
        _ = FileHandle.standardInput.readDataToEndOfFile()
        writer.close()
    default:
        fail(usage)
    }
} catch {
    fail("\(error)")
}
