import Foundation

/// A new, empty directory under the system's temporary directory, for files a test makes.
/// It is removed when the object goes away, or earlier by `remove()`.
public final class TemporaryDirectory: Sendable {
    public let url: URL

    public init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent(
            "tether-test-\(UUID().uuidString)", isDirectory: true)
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { remove() }

    public var path: String { url.path }

    /// The path of `name` inside the directory (which need not exist yet).
    public func file(_ name: String) -> String { path + "/" + name }

    /// Writes `contents` to the file `name`; returns its path.
    public func write(_ name: String, _ contents: String) throws -> String {
        let path = file(name)
        try contents.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    /// The names in the directory or in its `subdirectory`, hidden ones included, sorted: to check
    /// that nothing half-written was left behind.
    public func contents(_ subdirectory: String = "") throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: subdirectory.isEmpty ? path : file(subdirectory)).sorted()
    }

    public func remove() { try? FileManager.default.removeItem(at: url) }
}

/// Runs `body` with a new, empty directory, removed afterwards.
public func withTemporaryDirectory<T>(_ body: (URL) throws -> T) throws -> T {
    let directory = try TemporaryDirectory()
    defer { directory.remove() }
    return try body(directory.url)
}

/// The async form of `withTemporaryDirectory`.
public func withTemporaryDirectory<T>(_ body: (URL) async throws -> T) async throws -> T {
    let directory = try TemporaryDirectory()
    defer { directory.remove() }
    return try await body(directory.url)
}
