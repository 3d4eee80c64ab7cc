import Foundation

/// Work the layer above must do on the writer once a moment has come, before any read or
/// write begins after it — deleting expired rows, which must never be read. `Database`
/// checks it as each `read`, `write` or `transaction` begins, and a timer wakes the database
/// at the moment itself, so that the work is done even while nobody reads.
///
/// Without a deadline the check costs one lock; no work is ever done per row.
final class DueWork: @unchecked Sendable {
    private let lock = NSLock()
    private var deadline = Double.infinity  // seconds since 1970; guarded by lock
    private var work: ((Connection) throws -> Double?)?  // guarded by lock
    private var timer: DispatchSourceTimer?  // guarded by lock
    /// Called by the timer at the deadline (the database runs the work on its writer).
    private var wake: (@Sendable () -> Void)?  // guarded by lock

    func setWake(_ wake: @escaping @Sendable () -> Void) {
        lock.withLock { self.wake = wake }
    }

    /// Installs the work: it runs on the writer, and returns the next deadline (nil: none).
    func install(_ work: @escaping (Connection) throws -> Double?) {
        lock.withLock { self.work = work }
    }

    /// The work is due at `time` (seconds since 1970), or earlier if it already was.
    func due(at time: Double) {
        lock.withLock {
            guard time < deadline else { return }
            deadline = time
            scheduleTimer()
        }
    }

    var isDue: Bool {
        let deadline = lock.withLock { self.deadline }
        return deadline != .infinity && deadline <= Date().timeIntervalSince1970
    }

    /// Runs the work on `writer` when it is due. Callers hold the writer.
    func runIfDue(_ writer: Connection) throws {
        guard isDue, let work = lock.withLock({ self.work }) else { return }
        reset(to: try work(writer))
    }

    /// The next deadline is `time` (nil: none), whatever it was: the work was just done.
    func reset(to time: Double?) {
        lock.withLock {
            deadline = time ?? .infinity
            scheduleTimer()
        }
    }

    /// Stops the timer (the database is closing).
    func stop() {
        lock.withLock {
            timer?.cancel()
            timer = nil
            wake = nil
        }
    }

    private func scheduleTimer() {
        timer?.cancel()
        timer = nil
        guard deadline != .infinity, let wake else { return }
        let delay = max(0, deadline - Date().timeIntervalSince1970)
        let timer = DispatchSource.makeTimerSource(queue: .global(qos: .utility))
        // A little after the deadline, so that the check as the write begins finds it passed.
        timer.schedule(deadline: .now() + delay + 0.005, leeway: .milliseconds(50))
        timer.setEventHandler(handler: wake)
        timer.resume()
        self.timer = timer
    }
}
