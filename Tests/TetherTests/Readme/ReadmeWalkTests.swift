import Foundation
import Testing

/// README.md › Layout › "One change, end to end" walks one insert from node A to B's observers,
/// file by file, each file once, where the code first enters it. Whether it follows the calls is
/// checked by reading the code; what a test can hold is that every file it names exists (files
/// move: the walk must move with them) and that none is listed twice. The paragraph after it,
/// which names the owner of each kind of sync state, must name files that exist too.
@Suite struct ReadmeWalkTests {
    /// The package's root folder, found from this file (Tests/TetherTests/Readme/…).
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    /// The walk's section of README.md: from its heading to the next heading.
    static func walkSection() throws -> [Substring] {
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        let lines = readme.split(separator: "\n", omittingEmptySubsequences: false)
        guard let start = lines.firstIndex(where: { $0.hasPrefix("### One change, end to end") }) else { return [] }
        let end = lines[(start + 1)...].firstIndex { $0.hasPrefix("#") } ?? lines.endIndex
        return Array(lines[(start + 1)..<end])
    }

    /// The walk's numbered items, each with its continuation lines, and their numbers.
    static func items(of section: [Substring]) -> [(number: Int, text: String)] {
        var items: [(number: Int, text: String)] = []
        var inList = false
        for line in section {
            if let dot = line.firstIndex(of: "."), let number = Int(line[..<dot]), line[dot...].hasPrefix(". ") {
                items.append((number, String(line[line.index(after: dot)...])))
                inList = true
            } else if inList, line.hasPrefix(" "), !items.isEmpty {
                items[items.count - 1].text += " " + line.trimmingCharacters(in: .whitespaces)
            } else if inList {
                break
            }
        }
        return items
    }

    /// The spans of `text` between backticks that end in `.swift`.
    static func swiftPaths(in text: String) -> [String] {
        text.split(separator: "`", omittingEmptySubsequences: false).enumerated()
            .filter { $0.offset % 2 == 1 && $0.element.hasSuffix(".swift") }
            .map { String($0.element) }
    }

    @Test("the walk's items are numbered 1, 2, 3, … and each names its file first")
    func itemsAreNumberedInOrder() throws {
        let items = Self.items(of: try Self.walkSection())
        #expect(items.count >= 30, "the walk's numbered list should be found under its heading in README.md")
        #expect(items.map(\.number) == Array(1...max(1, items.count)))
        for item in items {
            #expect(
                item.text.hasPrefix(" `"),
                "item \(item.number) should begin with the path of the file the walk enters")
        }
    }

    @Test("every file the walk names exists under Sources/, and none is listed twice")
    func everyFileExistsOnce() throws {
        let items = Self.items(of: try Self.walkSection())
        let paths = items.flatMap { Self.swiftPaths(in: $0.text) }
        #expect(paths.count >= 30)
        let sources = Self.root.appendingPathComponent("Sources")
        for path in paths {
            #expect(
                FileManager.default.fileExists(atPath: sources.appendingPathComponent(path).path),
                "the walk names Sources/\(path), which does not exist")
        }
        var seen = Set<String>()
        for path in paths where !seen.insert(path).inserted {
            Issue.record("the walk lists \(path) twice: once, where the walk first enters it (then \"back in …\")")
        }
    }

    @Test("the owners of the sync state named after the walk exist under Sources/Tether/")
    func ownersExist() throws {
        let section = try Self.walkSection()
        guard let start = section.firstIndex(where: { $0.hasPrefix("Each kind of sync state has one owner") }) else {
            Issue.record("the paragraph naming the owners of the sync state should follow the walk")
            return
        }
        let paragraph = section[start...].prefix { !$0.isEmpty }.joined(separator: " ")
        let paths = Self.swiftPaths(in: paragraph)
        #expect(paths.count >= 10)
        let sources = Self.root.appendingPathComponent("Sources/Tether")
        for path in paths {
            #expect(
                FileManager.default.fileExists(atPath: sources.appendingPathComponent(path).path),
                "the owners' paragraph names Sources/Tether/\(path), which does not exist")
        }
    }
}
