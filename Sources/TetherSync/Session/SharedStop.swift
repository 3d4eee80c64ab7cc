import NIOConcurrencyHelpers

/// A stop that runs once: whoever asks for it, during the stop or after, waits for that one run
/// and gets its outcome (the server's and the node's `stop()`).
final class SharedStop: Sendable {
    private let task = NIOLockedValueBox<Task<Void, any Error>?>(nil)

    /// Whether a stop was asked for.
    var wasRequested: Bool { task.withLockedValue { $0 != nil } }

    /// Runs `body` the first time; every call waits for that run.
    func run(_ body: @escaping @Sendable () async throws -> Void) async throws {
        let stop = task.withLockedValue { task in
            if let task { return task }
            let started = Task { try await body() }
            task = started
            return started
        }
        try await stop.value
    }
}
