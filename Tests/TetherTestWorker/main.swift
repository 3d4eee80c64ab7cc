// A child process for crash-safety tests: applies batch files to a database,
// saying what it does on stdout, so that the test can kill it with SIGKILL at
// a chosen point and check what survived.
//
//     TetherTestWorker apply DATABASE BATCH...
import Foundation
import Tether

/// Unbuffered, so that the test sees each line the moment it is written.
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("TetherTestWorker: \(message)\n".utf8))
    exit(2)
}

let arguments = CommandLine.arguments
guard arguments.count >= 3, arguments[1] == "apply" else { fail("usage: TetherTestWorker apply DATABASE BATCH...") }
do {
    let db = try Database(path: arguments[2])
    for (index, path) in arguments.dropFirst(3).enumerated() {
        let batch = try BatchCoding.decode([UInt8](try Data(contentsOf: URL(fileURLWithPath: path))))
        say("begin \(index)")
        let report = try db.apply(batch)
        say("done \(index) applied \(report.applied) duplicate \(report.wasDuplicate)")
    }
    say("finished")
} catch {
    fail("\(error)")
}
