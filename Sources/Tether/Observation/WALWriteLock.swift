#if canImport(Glibc)
    import Glibc
#endif
import Foundation

/// Whether a connection — of any process, this one's included — is in a write transaction on a
/// database in WAL mode: holds its write lock, byte 120 of the -shm file (a POSIX lock; see
/// "How the various locks are used" in https://www.sqlite.org/walformat.html). SQLite takes it
/// before writing to the log and releases it once the commit is published in the wal-index (or
/// the transaction rolled back).
///
/// The kernel is asked with F_OFD_GETLK, which unlike F_GETLK reports this process's own locks
/// too, on the descriptor SQLite keeps open on the -shm file (found in /proc/self/fd). The file
/// is never opened here: closing any descriptor of a file drops every POSIX lock the process
/// holds on it, SQLite's included. Linux only, like the inotify watch it serves.
struct WALWriteLock {
    private let sharedMemoryPath: String
    /// SQLite's descriptor of the -shm file, and which file that was (a descriptor SQLite closed
    /// may come back numbered alike for another file).
    private var found: (descriptor: Int32, file: FileIdentity)?

    /// nil where it cannot be asked: not Linux, or no descriptor of `databasePath`'s -shm file
    /// in the process (the database is not in WAL mode, or not open).
    init?(databasePath: String) {
        #if os(Linux)
            sharedMemoryPath = databasePath + "-shm"
            guard let found = Self.findDescriptor(of: sharedMemoryPath) else { return nil }
            self.found = found
        #else
            return nil
        #endif
    }

    /// Whether a connection holds the lock; nil when that cannot be told (SQLite closed its
    /// descriptor: the database is closing).
    mutating func isHeld() -> Bool? {
        #if os(Linux)
            if let found, FileIdentity(descriptor: found.descriptor) != found.file { self.found = nil }
            if found == nil { found = Self.findDescriptor(of: sharedMemoryPath) }
            guard let descriptor = found?.descriptor else { return nil }
            var lock = flock()
            lock.l_type = Int16(F_RDLCK)  // the lock a reader would take: only a write lock stands in its way
            lock.l_whence = Int16(SEEK_SET)
            lock.l_start = 120
            lock.l_len = 1
            guard fcntl(descriptor, Self.getOpenFileDescriptionLock, &lock) == 0 else { return nil }
            return lock.l_type != Int16(F_UNLCK)
        #else
            return nil
        #endif
    }

    #if os(Linux)
        /// F_OFD_GETLK (Linux 3.15), which Glibc declares only for _GNU_SOURCE.
        private static let getOpenFileDescriptionLock: Int32 = 36

        /// A descriptor of the process open on the file at `path`, if any.
        private static func findDescriptor(of path: String) -> (descriptor: Int32, file: FileIdentity)? {
            guard let wanted = FileIdentity(path: path),
                let names = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")
            else { return nil }
            return names.lazy.compactMap { Int32($0) }.first { FileIdentity(descriptor: $0) == wanted }.map {
                ($0, wanted)
            }
        }
    #endif
}

/// A file as the kernel knows it: its device and inode.
private struct FileIdentity: Equatable {
    let device: UInt64
    let inode: UInt64

    init?(path: String) {
        var status = stat()
        guard stat(path, &status) == 0 else { return nil }
        device = UInt64(status.st_dev)
        inode = UInt64(status.st_ino)
    }

    init?(descriptor: Int32) {
        var status = stat()
        guard fstat(descriptor, &status) == 0 else { return nil }
        device = UInt64(status.st_dev)
        inode = UInt64(status.st_ino)
    }
}
