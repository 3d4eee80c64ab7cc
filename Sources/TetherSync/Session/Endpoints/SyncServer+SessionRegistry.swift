// The server's open connections: what `stop` closes and waits for, and whom new changes are told to.

import NIOConcurrencyHelpers
import NIOCore
import Tether

extension SyncServer {
    /// The open connections and their sessions' end, so `stop` can close them and wait for their database work.
    final class SessionRegistry: Sendable {
        private struct State {
            var next = 0
            var open:
                [Int: (
                    channel: Channel, drained: EventLoopFuture<Void>,
                    session: NIOLoopBound<SyncSessionHandler>
                )] = [:]
        }
        private let state = NIOLockedValueBox(State())
        let results: AsyncStream<Result<SyncSummary, SyncSessionError>>.Continuation

        init(results: AsyncStream<Result<SyncSummary, SyncSessionError>>.Continuation) { self.results = results }

        func add(_ channel: Channel, _ session: SyncSessionHandler) {
            let id = state.withLockedValue { state in
                defer { state.next += 1 }
                state.open[state.next] = (
                    channel, session.drained.futureResult,
                    NIOLoopBound(session, eventLoop: channel.eventLoop)
                )
                return state.next
            }
            let results = self.results
            session.finished.futureResult.whenComplete { result in
                results.yield(result.mapError { $0 as? SyncSessionError ?? .internalFailure("\($0)") })
            }
            session.drained.futureResult.whenComplete { [state] _ in
                _ = state.withLockedValue { $0.open.removeValue(forKey: id) }
                MemoryRelease.afterSessionEnded()
            }
        }

        /// The connections open now.
        var openCount: Int { state.withLockedValue { $0.open.count } }

        func closeAll() -> [EventLoopFuture<Void>] {
            let open = state.withLockedValue { Array($0.open.values) }
            for (channel, _, _) in open { channel.close(promise: nil) }
            return open.map(\.drained)
        }

        /// Tells every open session that this database's changes go through `latest`.
        func localChangesCommitted(through latest: Int64) {
            let open = state.withLockedValue { Array($0.open.values) }
            for (channel, _, session) in open {
                // The monitor wakes on the server's one event loop: most sessions are on it already.
                if channel.eventLoop.inEventLoop {
                    session.value.localChangesCommitted(through: latest)
                } else {
                    channel.eventLoop.execute { session.value.localChangesCommitted(through: latest) }
                }
            }
        }
    }
}
