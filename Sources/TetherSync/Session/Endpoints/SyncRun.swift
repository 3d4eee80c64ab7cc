// A `syncOnce` in progress: its progress, its summary, its cancel.

import NIOPosix
import Tether

/// A `syncOnce` in progress (`SyncClient.startSync`): its progress, and its end.
public final class SyncRun: Sendable {
    /// Snapshots of the session's progress, the newest 64 kept when the reader is slower; finishes
    /// when the session ends.
    public let progress: AsyncStream<SyncSessionProgress>
    private let client: SyncClient.OpenedSession

    init(client: SyncClient.OpenedSession, progress: AsyncStream<SyncSessionProgress>) {
        self.client = client
        self.progress = progress
    }

    /// Waits for the end of the session and returns its summary, or throws why it failed.
    public func summary() async throws -> SyncSummary {
        let summary: SyncSummary
        do {
            summary = try await client.finished.get()
        } catch {
            try? await client.channel.close()
            try? await client.drained.get()
            try? await client.group.shutdownGracefully()
            throw error
        }
        try? await client.drained.get()
        try await client.group.shutdownGracefully()
        return summary
    }

    /// Closes the connection now (as a network failure would): the batch being applied is
    /// committed or rolled back whole; `summary()` then throws `connectionClosed`.
    public func cancel() {
        client.channel.close(promise: nil)
    }
}
