import Foundation

// What the tests wait for happens in another task, thread or process that gives no notification
// ("this row arrived"), so the only way to wait is to check again after a short pause.
//
// The window is a safety net, not a speed goal: a condition that holds returns at once, and one
// that never holds fails after it. It is long because the whole suite shares two cores and one
// cooperative thread pool: in CI, nine loopback links that connect in 40 ms alone took over 20 s
// while the convergence and fuzz suites ran beside them.
public let eventuallyWindow = Duration.seconds(120)

/// Checks `condition` every `pause` until it holds (true) or `limit` has passed (false).
/// Blocks the calling thread between checks: for synchronous tests.
public func eventually(
    within limit: Duration = eventuallyWindow, checkingEvery pause: Duration = .milliseconds(20),
    _ condition: () throws -> Bool
) rethrows -> Bool {
    let deadline = ContinuousClock.now + limit
    while true {
        if try condition() { return true }
        if ContinuousClock.now >= deadline { return false }
        Thread.sleep(forTimeInterval: pause.seconds)
    }
}

/// Checks `condition` every `pause` until it holds (true) or `limit` has passed (false),
/// suspending the task between checks.
public func eventually(
    within limit: Duration = eventuallyWindow, checkingEvery pause: Duration = .milliseconds(20),
    _ condition: () throws -> Bool
) async throws -> Bool {
    let deadline = ContinuousClock.now + limit
    while true {
        if try condition() { return true }
        if ContinuousClock.now >= deadline { return false }
        try await Task.sleep(for: pause)
    }
}

extension Duration {
    fileprivate var seconds: TimeInterval {
        TimeInterval(components.seconds) + TimeInterval(components.attoseconds) / 1e18
    }
}
