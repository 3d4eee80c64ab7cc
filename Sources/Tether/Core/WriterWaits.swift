// A write that holds the writer for long (a catch-up applied as its batches arrive, see
// `CatchUpApplier`) gives it up as soon as anyone else needs it: it learns so here.

/// Who waits for the writer, for those who hold it for long and give it up on demand. A holder
/// registers while it holds the writer (registered first, then taking it, it misses nobody): it
/// is called whenever a write (or a read that runs due work, or `close`) starts waiting for the
/// writer, and can ask `someoneIsWaiting` between its steps.
final class WriterWaits: @unchecked Sendable {
    private struct State {
        var holders: [ObjectIdentifier: @Sendable () -> Void] = [:]
        var waiting = 0
    }
    private let state = Protected(State())

    /// Runs `body` with `giveUp` called (on the waiting thread; it must not block) whenever a
    /// write starts waiting for the writer meanwhile. `holder` identifies the registration.
    func whileHolding<T>(_ holder: AnyObject, giveUp: @escaping @Sendable () -> Void, _ body: () throws -> T)
        rethrows -> T
    {
        let id = ObjectIdentifier(holder)
        state.withLock { $0.holders[id] = giveUp }
        defer { _ = state.withLock { $0.holders.removeValue(forKey: id) } }
        return try body()
    }

    /// Whether someone holds the writer for long now (and gives it up when asked).
    var someoneHoldsForLong: Bool { state.withLock { !$0.holders.isEmpty } }

    /// Whether a write waits for the writer now.
    var someoneIsWaiting: Bool { state.withLock { $0.waiting > 0 } }

    /// Runs `wait` (taking the writer's lock) counted as waiting, the holders told first.
    func waiting<T>(_ wait: () -> T) -> T {
        let giveUps = state.withLock { state in
            state.waiting += 1
            return Array(state.holders.values)
        }
        defer { state.withLock { $0.waiting -= 1 } }
        for giveUp in giveUps { giveUp() }
        return wait()
    }
}
