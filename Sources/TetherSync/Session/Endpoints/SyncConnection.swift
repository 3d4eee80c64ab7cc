// A long-lived sync session: told of local changes, its result, its stop.

import NIOCore
import NIOPosix
import Tether

/// A long-lived sync session (§8.4): caught up both ways when `SyncClient.connect` returns,
/// then kept open, each side pulling the other's changes when told of them by CHANGED.
public final class SyncConnection: Sendable {
    /// The server's instance key.
    public let peer: InstanceKey
    /// Snapshots of the session's progress, the newest 64 kept when the reader is slower; finishes
    /// when the session ends.
    public let progress: AsyncStream<SyncSessionProgress>
    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let session: NIOLoopBound<SyncSessionHandler>
    private let finished: EventLoopFuture<SyncSummary>
    private let drained: EventLoopFuture<Void>
    /// Tells the session of this database's new changes (tests count its checks).
    let monitor: LocalChangeMonitor

    init(
        peer: InstanceKey, group: MultiThreadedEventLoopGroup, channel: Channel,
        session: NIOLoopBound<SyncSessionHandler>, finished: EventLoopFuture<SyncSummary>,
        drained: EventLoopFuture<Void>, progress: AsyncStream<SyncSessionProgress>, monitor: LocalChangeMonitor
    ) {
        self.monitor = monitor
        self.peer = peer
        self.progress = progress
        self.group = group
        self.channel = channel
        self.session = session
        self.finished = finished
        self.drained = drained
    }

    /// Tells the session that this database may have new changes: it sends CHANGED to the server
    /// if the server lacks them and is not pulling. A commit through the same `Database` does so
    /// by itself, at once, and another process's commit soon after (see `SyncServer.notifyLocalChanges`).
    public func notifyLocalChanges() {
        let session = self.session
        channel.eventLoop.execute { session.value.checkLocalChanges() }
    }

    /// Completes when the session ends: its summary after a graceful BYE (from either side), or why it failed.
    public func result() async throws -> SyncSummary {
        try await finished.get()
    }

    /// Says BYE, waits for the server's BYE and the end of the session's database work, and closes.
    /// Returns the session's summary; throws why the session failed if it had already failed.
    public func stop() async throws -> SyncSummary {
        let session = self.session
        channel.eventLoop.execute { session.value.sayBye() }
        let result: Result<SyncSummary, any Error>
        do { result = .success(try await finished.get()) } catch { result = .failure(error) }
        channel.close(promise: nil)
        try? await drained.get()
        try? await group.shutdownGracefully()
        return try result.get()
    }
}
