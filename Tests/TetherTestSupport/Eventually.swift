import Foundation

// What the tests wait for happens in another task, thread or process that gives no notification
// ("this row arrived"), so the only way to wait is to check again after a short pause.

/// Checks `condition` every `pause` until it holds (true) or `limit` has passed (false).
/// Blocks the calling thread between checks: for synchronous tests.
public func eventually(
    within limit: Duration = .seconds(30), checkingEvery pause: Duration = .milliseconds(20),
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
    within limit: Duration = .seconds(30), checkingEvery pause: Duration = .milliseconds(20),
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
