#if canImport(Glibc)
    import Glibc
#endif
import Dispatch
import Foundation

/// Tells when files are written, from the kernel (Linux's inotify), so that noticing another
/// process's commit costs nothing while nobody writes. One inotify instance serves the whole
/// process (the kernel allows few per user: 128 by default), each file watched once however
/// many watch it. Where inotify is unavailable (another system, or the instances are all taken)
/// `shared` is nil and the callers poll instead.
final class FileChangeNotifier: @unchecked Sendable {
    /// The process's notifier; nil where inotify cannot be used. Tests and `TETHER_NO_INOTIFY=1`
    /// turn it off per database (`Database.Configuration.watchesFiles`).
    static let shared: FileChangeNotifier? = FileChangeNotifier()

    /// What one watcher is called with: the file was written, or it can no longer be watched
    /// (deleted, or the kernel dropped events): the caller must then look by other means.
    enum Change: Sendable {
        case written
        case watchLost
    }

    typealias Handler = @Sendable (Change) -> Void

    /// The shortest time between two reads of the kernel's events.
    static let drainInterval = DispatchTimeInterval.microseconds(250)

    #if canImport(Glibc)
        private let descriptor: Int32
        private let source: DispatchSourceRead
    #endif
    private let queue = DispatchQueue(label: "tether.file-changes")
    private let lock = NSLock()
    /// Handlers by watch descriptor, then by the id of their watch (guarded by lock).
    private var handlers: [Int32: [Int: Handler]] = [:]
    private var nextID = 1

    private init?() {
        #if canImport(Glibc)
            let descriptor = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
            guard descriptor >= 0 else { return nil }
            self.descriptor = descriptor
            source = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
            source.setEventHandler { [unowned self] in
                readEvents()
                // A writer appends to its log page by page, and a bulk load of this very process
                // writes thousands of pages: drained at most every 250 µs (the kernel merges the
                // same file's events meanwhile), the burst wakes this thread 4,000 times a second
                // rather than once per page. A lone commit is still told at once, and one landing
                // just after another process's (or this one's: its acknowledgements, a fold) waits
                // a quarter of the millisecond a longer pause made it wait (issue 38).
                source.suspend()
                queue.asyncAfter(deadline: .now() + Self.drainInterval) { [unowned self] in source.resume() }
            }
            source.resume()
        #else
            return nil
        #endif
    }

    /// A file watched for someone: released (or `cancel`led), it stops calling its handler.
    final class Watch: @unchecked Sendable {
        private weak var notifier: FileChangeNotifier?
        private let entries: [(descriptor: Int32, id: Int)]
        private let lock = NSLock()
        private var cancelled = false

        fileprivate init(notifier: FileChangeNotifier, entries: [(descriptor: Int32, id: Int)]) {
            self.notifier = notifier
            self.entries = entries
        }

        deinit { cancel() }

        func cancel() {
            let first = lock.withLock {
                defer { cancelled = true }
                return !cancelled
            }
            if first { notifier?.remove(entries) }
        }
    }

    /// Calls `handler` (on the notifier's queue) each time one of `paths` is written; nil if one
    /// of them cannot be watched (it does not exist), with nothing left watched.
    func watch(_ paths: [String], _ handler: @escaping Handler) -> Watch? {
        #if canImport(Glibc)
            var entries: [(descriptor: Int32, id: Int)] = []
            lock.lock()
            defer { lock.unlock() }
            for path in paths {
                // IN_MODIFY: each write (a commit appends to the log); IN_CLOSE_WRITE: a writer that
                // closes the file; the others: the file is gone, and with it the watch.
                let mask = UInt32(IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF) | UInt32(IN_MASK_ADD)
                let watchDescriptor = inotify_add_watch(descriptor, path, mask)
                guard watchDescriptor >= 0 else {
                    removeLocked(entries)
                    return nil
                }
                let id = nextID
                nextID += 1
                handlers[watchDescriptor, default: [:]][id] = handler
                entries.append((watchDescriptor, id))
            }
            return Watch(notifier: self, entries: entries)
        #else
            return nil
        #endif
    }

    private func remove(_ entries: [(descriptor: Int32, id: Int)]) {
        lock.withLock { removeLocked(entries) }
    }

    private func removeLocked(_ entries: [(descriptor: Int32, id: Int)]) {
        #if canImport(Glibc)
            for (watchDescriptor, id) in entries {
                handlers[watchDescriptor]?[id] = nil
                if handlers[watchDescriptor]?.isEmpty == true {
                    handlers[watchDescriptor] = nil
                    inotify_rm_watch(descriptor, watchDescriptor)
                }
            }
        #endif
    }

    #if canImport(Glibc)
        /// Reads every pending event, then calls each handler concerned once.
        private func readEvents() {
            var written = Set<Int32>()
            var lost = Set<Int32>()
            var overflowed = false
            let capacity = 64 * (MemoryLayout<inotify_event>.size + Int(NAME_MAX) + 1)
            let buffer = UnsafeMutableRawPointer.allocate(
                byteCount: capacity, alignment: MemoryLayout<inotify_event>.alignment)
            defer { buffer.deallocate() }
            while true {
                let count = read(descriptor, buffer, capacity)
                guard count > 0 else { break }
                var offset = 0
                while offset + MemoryLayout<inotify_event>.size <= count {
                    let event = buffer.load(fromByteOffset: offset, as: inotify_event.self)
                    if event.mask & UInt32(IN_Q_OVERFLOW) != 0 {
                        overflowed = true
                    } else if event.mask & UInt32(IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF) != 0 {
                        lost.insert(event.wd)
                    } else {
                        written.insert(event.wd)
                    }
                    offset += MemoryLayout<inotify_event>.size + Int(event.len)
                }
            }
            let calls: [(Handler, Change)] = lock.withLock {
                if overflowed {
                    // Events were dropped: every watcher looks again.
                    return handlers.values.flatMap { $0.values.map { ($0, Change.written) } }
                }
                var calls = written.subtracting(lost).flatMap {
                    handlers[$0]?.values.map { ($0, Change.written) } ?? []
                }
                for watchDescriptor in lost {
                    calls += handlers[watchDescriptor]?.values.map { ($0, Change.watchLost) } ?? []
                    // The kernel removed the watch (IN_IGNORED follows): its descriptor may be reused.
                    handlers[watchDescriptor] = nil
                }
                return calls
            }
            for (handler, change) in calls { handler(change) }
        }
    #endif
}
