import Logging

/// One line a `Logger` made with `LogRecorder.logger()` logged: its level, message and metadata
/// (the logger's own and the line's, merged; values as text).
public struct RecordedLogEntry: Sendable, CustomStringConvertible {
    public var level: Logger.Level
    public var message: String
    public var metadata: [String: String]

    public var description: String {
        "[\(level)] \(message) \(metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" })"
    }
}

/// Records what the library logs through the `Logger` a test passes it, behind a lock: the
/// process-wide `LoggingSystem` is never touched (it can be bootstrapped once per process).
public final class LogRecorder: Sendable {
    private let recorded = LockedBox<[RecordedLogEntry]>([])

    public init() {}

    /// Everything logged so far, in order.
    public var entries: [RecordedLogEntry] { recorded.value }

    /// A logger at `level` whose lines this recorder keeps.
    public func logger(label: String = "test", level: Logger.Level = .trace) -> Logger {
        var logger = Logger(label: label) { _ in RecordingLogHandler(recorder: self) }
        logger.logLevel = level
        return logger
    }

    fileprivate func append(_ entry: RecordedLogEntry) {
        recorded.withLock { $0.append(entry) }
    }
}

private struct RecordingLogHandler: LogHandler {
    let recorder: LogRecorder
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let merged = metadata.merging(event.metadata ?? [:]) { _, line in line }
        recorder.append(
            RecordedLogEntry(
                level: event.level, message: "\(event.message)",
                metadata: merged.mapValues { "\($0)" }))
    }
}
