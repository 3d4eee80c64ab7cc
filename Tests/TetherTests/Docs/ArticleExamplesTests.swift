import Foundation
import Testing
import Tether
import TetherTestSupport

// The code of the DocC articles (Sources/*/*.docc), compiled and run: here, or in the tests of the
// README's examples that an article shows too. Each ```swift block of an article must appear in a
// test source token for token, whitespace and line breaks aside (`everyArticleBlockIsCompiledAndRun`):
// when an article's example changes, change it in its test too.

@Model
struct Note: Equatable {
    var id: Int64
    var title: String
    var done = false
}

@Model
struct Chore: Equatable {
    var id: Int64
    var title: String
    var priority: Int
    var done = false

    static var constraints: [Constraint<Chore>] { [.check("priority BETWEEN 0 AND 5"), .index(["priority"])] }
}

@Suite struct ArticleExamplesTests {
    /// Tether.md, the landing page.
    @Test func landingPage() throws {
        try withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("notes.sqlite").path
            let db = try Database(path: path)
            try db.createTable(Note.self)
            try db.insert(Note(id: 1, title: "Write the docs"))
            let open = try db.fetchAll(Note.where(\.done == false))
            #expect(open == [Note(id: 1, title: "Write the docs")])
        }
    }

    /// GettingStarted.md.
    @Test func gettingStarted() throws {
        try withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("chores.sqlite").path
            let db = try Database(path: path)
            try db.createTable(Chore.self)
            try db.insert(Chore(id: 1, title: "Read the guide", priority: 2))
            try db.insert(contentsOf: [
                Chore(id: 2, title: "Sync two nodes", priority: 4),
                Chore(id: 3, title: "Watch a query", priority: 1),
            ])
            try db.write { conn in
                var task = try conn.fetch(Chore.self, key: PrimaryKey(Int64(1)))
                task?.done = true
                if let task { try conn.update(task) }
            }

            let urgent = try db.fetchAll(Chore.where(\.priority >= 3).orderBy(\.priority, ascending: false))
            let open = try db.count(Chore.where(\.done == false))
            #expect(urgent.map(\.id) == [2])
            #expect(open == 2)
        }
    }

    /// Every ```swift block of every article appears, token for token (whitespace and line breaks
    /// aside), in a test source: the articles show only code that is compiled and run.
    @Test func everyArticleBlockIsCompiledAndRun() throws {
        let files = FileManager.default
        let articles = try ["Sources/Tether/Tether.docc", "Sources/TetherSync/TetherSync.docc"].flatMap {
            catalog -> [URL] in
            let folder = Self.root.appendingPathComponent(catalog)
            return try files.contentsOfDirectory(at: folder, includingPropertiesForKeys: nil).filter {
                $0.pathExtension == "md"
            }
        }
        #expect(articles.count >= 2)
        try Self.expectEveryBlockInATest(of: articles)
    }

    /// The README's examples too: it keeps a short tour, whose code must stay what the tests run.
    @Test func everyReadmeBlockIsCompiledAndRun() throws {
        try Self.expectEveryBlockInATest(of: [Self.root.appendingPathComponent("README.md")])
    }

    /// The package's root folder.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    /// Records an issue for each ```swift block of `documents` (a Package.swift excerpt aside) that
    /// no source under Tests/TetherTests or Tests/TetherSyncTests holds token for token.
    static func expectEveryBlockInATest(of documents: [URL]) throws {
        var sources: [String] = []
        for folder in ["Tests/TetherTests", "Tests/TetherSyncTests"] {
            guard
                let walk = FileManager.default.enumerator(
                    at: root.appendingPathComponent(folder), includingPropertiesForKeys: nil)
            else { continue }
            for case let file as URL in walk where file.pathExtension == "swift" {
                sources.append(tokens(try String(contentsOf: file, encoding: .utf8)))
            }
        }
        #expect(!sources.isEmpty)
        for document in documents {
            let blocks = swiftBlocks(try String(contentsOf: document, encoding: .utf8))
            #expect(!blocks.isEmpty, "\(document.lastPathComponent) has no swift block: is the path right?")
            for block in blocks where !isPackageManifest(block) {
                let code = tokens(block)
                #expect(
                    sources.contains { $0.contains(code) },
                    "a block of \(document.lastPathComponent) is in no test:\n\(block)")
            }
        }
    }

    /// The ```swift blocks of a Markdown text.
    static func swiftBlocks(_ text: String) -> [String] {
        var blocks: [String] = []
        var current: [Substring]?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if current == nil, trimmed == "```swift" {
                current = []
            } else if let lines = current, trimmed == "```" {
                blocks.append(lines.joined(separator: "\n"))
                current = nil
            } else {
                current?.append(line)
            }
        }
        return blocks
    }

    /// `code` without its whitespace and line breaks, nor the comma before a closing bracket that
    /// swift-format adds to a list it wraps: an article may show an example laid out for reading
    /// (comments aligned, one line) while its test is laid out by `./Scripts/format.sh`.
    static func tokens(_ code: String) -> String {
        let characters = Array(code.filter { !$0.isWhitespace })
        var kept = ""
        kept.reserveCapacity(characters.count)
        for (index, character) in characters.enumerated() {
            let next = index + 1 < characters.count ? characters[index + 1] : nil
            if character == ",", next == ")" || next == "]" { continue }
            kept.append(character)
        }
        return kept
    }

    /// A Package.swift excerpt, which no test can compile.
    static func isPackageManifest(_ block: String) -> Bool { block.contains(".package(url:") }
}
