import Foundation
import Testing

/// The shape issue 36 gave the sources, held: no file over 600 lines, no function over 150, the
/// apply's context read only by the apply, and the engine small enough to read (its capture,
/// extraction and apply are types of their own).
@Suite struct SourceShapeTests {
    /// Sources/, found from this file (Tests/TetherTests/Sync/…).
    static let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Sources")

    static func swiftFiles() throws -> [(path: String, lines: [Substring])] {
        let root = sources.path + "/"
        let files = FileManager.default.enumerator(atPath: sources.path)?.compactMap { $0 as? String } ?? []
        return try files.filter { $0.hasSuffix(".swift") }.sorted().map {
            (
                $0,
                try String(contentsOfFile: root + $0, encoding: .utf8).split(
                    separator: "\n", omittingEmptySubsequences: false)
            )
        }
    }

    @Test("no source file is over 600 lines")
    func filesAreShort() throws {
        let files = try Self.swiftFiles()
        #expect(files.count > 100, "Sources/ should be found from the test's own path")
        for file in files where file.lines.count > 600 {
            Issue.record("\(file.path) has \(file.lines.count) lines")
        }
    }

    @Test("no function is over 150 lines")
    func functionsAreShort() throws {
        let declaration =
            try Regex(
                #"^\s*(?:@[\w()]+\s+)*(?:(?:public|private|fileprivate|internal|package|static|override|final|"#
                    + #"mutating|nonisolated|convenience|required|class)\s+)*(?:func\s|init[?!]?[(<])"#)
        for file in try Self.swiftFiles() {
            var index = 0
            while index < file.lines.count {
                defer { index += 1 }
                guard file.lines[index].firstMatch(of: declaration) != nil else { continue }
                var depth = 0, opened = false, end = index
                scan: for line in file.lines[index...] {
                    for character in Self.code(of: line) {
                        if character == "{" { depth += 1; opened = true }
                        if character == "}" { depth -= 1 }
                    }
                    if opened && depth <= 0 { break scan }
                    end += 1
                }
                if opened, end - index + 1 > 150 {
                    Issue.record("\(file.path):\(index + 1) — a function of \(end - index + 1) lines")
                }
            }
        }
    }

    @Test("the apply's context is read only under Sync/Apply/")
    func applyingIsTheApplys() throws {
        // The engine is in the Tether module; other modules say "applying" only in prose.
        for file in try Self.swiftFiles()
        where file.path.hasPrefix("Tether/") && !file.path.hasPrefix("Tether/Sync/Apply/") {
            for (number, line) in file.lines.enumerated() {
                let code = Self.code(of: line)
                guard code.firstMatch(of: /\bapplying\b/) != nil, code.firstMatch(of: /var applying\b/) == nil else {
                    continue
                }
                let advice = "ask the capture (`whileWritingPeerChanges`) or the apply"
                Issue.record("\(file.path):\(number + 1) reads `applying`: \(advice)")
            }
        }
    }

    @Test("SyncEngine holds at most 15 stored properties")
    func engineIsSmall() throws {
        let engine = try #require(try Self.swiftFiles().first { $0.path == "Tether/Sync/SyncEngine.swift" })
        let storedProperty = try Regex(
            #"^\s*(?:@\w+(?:\([^)]*\))?\s+)*(?:(?:private|fileprivate)(?:\(set\))?\s+)?"#
                + #"(?:lazy\s+)?(?:var|let)\s+(\w+)"#)
        var depth = 0, inClass = false, stored: [String] = []
        for line in engine.lines {
            let code = Self.code(of: line)
            if !inClass, code.contains("final class SyncEngine") { inClass = true }
            if inClass, depth == 1, let match = code.firstMatch(of: storedProperty),
                let name = match.output[1].substring
            {
                // A computed property's body opens on its line; a stored one's initial value does not.
                let computed = code.contains("{") && !code.contains("= ") && !code.contains("->")
                if !computed { stored.append(String(name)) }
            }
            for character in code {
                if character == "{" { depth += 1 }
                if character == "}" { depth -= 1 }
            }
            if inClass, depth == 0, code.contains("}") { break }
        }
        #expect(stored.count >= 5, "SyncEngine's stored properties should be found: \(stored)")
        #expect(stored.count <= 15, "SyncEngine has \(stored.count) stored properties: \(stored)")
    }

    /// The line without comments and string literals (whose braces do not count).
    static func code(of line: Substring) -> String {
        var code = String(line)
        if let comment = code.range(of: "//") { code = String(code[..<comment.lowerBound]) }
        return code.replacing(/"(?:[^"\\]|\\.)*"/, with: "\"\"")
    }
}
