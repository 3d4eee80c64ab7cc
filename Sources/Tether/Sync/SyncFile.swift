import Foundation
#if canImport(Glibc)
    import Glibc
#endif

/// What exporting or importing a sync file did (AgileDB's return values, and counts).
public struct SyncFileSummary: Sendable, Equatable {
    /// The database that made the file.
    public let source: InstanceKey
    /// The database the file is for.
    public let target: InstanceKey
    /// The sequence to export from next time (pass it as `since`).
    public let nextSequence: Int64
    /// The changes written to the file, or read from it.
    public let changes: Int
    /// The batches they were in.
    public let batches: Int
    /// On import, the changes to tables (or columns) this database does not sync yet: kept
    /// whole, and applied by the migration that syncs them (`enableSync`, `addColumn`).
    public let keptForSchema: Int
    /// On import, the tables of the file this database does not sync, whose changes were kept.
    public let tablesNotSynced: [String]
}

/// Sync files: the change batches of the network protocol, written to a file
/// for air-gapped transfer.
///
///     "TETHERSYNC" 0x01   magic and version
///     source, target      16 bytes each
///     since               uvarint
///     batches             uvarint length, then the batch (BatchCoding)…
///     end                 uvarint 0, changes (uvarint), through (uvarint),
///                         FNV-1a 64 of everything before it (8 bytes LE)
extension Database {
    private static let syncFileMagic = Array("TETHERSYNC".utf8) + [1]

    /// Writes the changes `target` lacks since `sequence` to `url`, atomically
    /// (a temporary file renamed into place: never a half-written file).
    @discardableResult
    public func exportSyncFile(
        to url: URL, for target: InstanceKey, since sequence: Int64,
        progress: ((SyncProgress) -> Void)? = nil
    ) throws -> SyncFileSummary {
        var writer = ByteWriter()
        writer.append(Self.syncFileMagic)
        writer.append(instanceKey.bytes)
        writer.append(target.bytes)
        writer.uvarint(UInt64(max(0, sequence)))
        let expected = try pendingChangeCount(after: sequence)
        var cursor = max(0, sequence)
        var changes = 0
        var batches = 0
        var resyncing = false
        while true {
            let batch = try extractChanges(for: target, after: cursor, resuming: resyncing, markInFlight: false)
            resyncing = resyncing || batch.isResync
            if !batch.changes.isEmpty || batch.isResync {
                let bytes = BatchCoding.encode(batch)
                writer.uvarint(UInt64(bytes.count))
                writer.append(bytes)
                batches += 1
                changes += batch.changes.count
                progress?(
                    SyncProgress(
                        changesDone: changes, changesExpected: max(expected, changes), bytesDone: writer.bytes.count))
            }
            cursor = batch.through
            if batch.isLast { break }
        }
        writer.uvarint(0)
        writer.uvarint(UInt64(changes))
        writer.uvarint(UInt64(cursor))
        let checksum = fnv1a(writer.bytes)
        withUnsafeBytes(of: checksum.littleEndian) { writer.append($0) }

        let temporary = url.deletingLastPathComponent().appendingPathComponent(
            ".\(url.lastPathComponent).\(UUID().uuidString).partial")
        do {
            var isDirectory: ObjCBool = false
            if FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory), isDirectory.boolValue {
                throw CocoaError(.fileWriteFileExists, userInfo: [NSFilePathErrorKey: url.path])
            }
            try Data(writer.bytes).write(to: temporary)
            // rename(2) replaces a file atomically (and refuses a directory).
            // FileManager.replaceItemAt on Linux deletes the old file, then
            // fails ("The file doesn't exist"), and replaces a directory.
            guard rename(temporary.path, url.path) == 0 else {
                throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
            }
        } catch {
            try? FileManager.default.removeItem(at: temporary)
            throw SyncError.invalidSyncFile("cannot write \(url.path): \(error.localizedDescription)")
        }
        return SyncFileSummary(
            source: instanceKey, target: target, nextSequence: cursor, changes: changes, batches: batches,
            keptForSchema: 0, tablesNotSynced: [])
    }

    /// Applies a sync file made for this database, all of it in one
    /// transaction: a damaged file, or a failure midway, changes nothing.
    ///
    /// Changes to a table this database does not sync (or to columns it lacks) are no error
    /// (Protocol/README.md §7.2, rules checked by the receiver, 2): they are kept whole, with
    /// their versions, and the migration (or `enableSync`) that syncs the table applies them. The
    /// summary counts them (`keptForSchema`) and names the tables (`tablesNotSynced`). Only a
    /// table no database can sync (one of Tether's or SQLite's own, a name holding U+0000) has
    /// the file refused whole (`SyncError.invalidTable`). A live session is stricter: the peer
    /// was told this database's tables, and a batch naming another is refused whole (ERROR 5).
    @discardableResult
    public func importSyncFile(from url: URL, progress: ((SyncProgress) -> Void)? = nil) throws -> SyncFileSummary {
        let data: Data
        do { data = try Data(contentsOf: url) } catch {
            throw SyncError.invalidSyncFile("cannot read \(url.path): \(error.localizedDescription)")
        }
        let bytes = [UInt8](data)
        let header = Self.syncFileMagic.count + 32
        guard bytes.count >= header + 12, Array(bytes.prefix(Self.syncFileMagic.count)) == Self.syncFileMagic else {
            throw SyncError.invalidSyncFile("\(url.lastPathComponent) is not a Tether sync file")
        }
        let stored = bytes.suffix(8).enumerated().reduce(UInt64(0)) {
            $0 | UInt64($1.element) << (8 * UInt64($1.offset))
        }
        guard fnv1a(bytes.dropLast(8)) == stored else {
            throw SyncError.invalidSyncFile("\(url.lastPathComponent) is damaged or truncated (checksum mismatch)")
        }
        guard let engine = syncEngine else {
            throw DatabaseError(extendedCode: 8, message: "the database is open read-only: it cannot import")
        }

        let contents: SyncFileContents
        do {
            contents = try SyncFileContents(Array(bytes.dropLast(8)), magicLength: Self.syncFileMagic.count)
        } catch {
            throw SyncError.invalidSyncFile("\(url.lastPathComponent): \(error)")
        }
        let summary = contents
        let batches = contents.batches
        guard summary.target == instanceKey else {
            throw SyncError.invalidSyncFile(
                """
                \(url.lastPathComponent) was made for instance \(summary.target), not for this database \
                (\(instanceKey))
                """)
        }
        guard batches.allSatisfy({ $0.source == summary.source }) else {
            throw SyncError.invalidSyncFile("\(url.lastPathComponent) mixes batches from several sources")
        }
        var conflicts: [Conflict] = []
        var kept = 0
        var notSynced = Set<String>()
        try write { conn in
            try conn.withChangeOrigin(.syncFile(summary.source)) {
                var done = 0
                for batch in batches {
                    let report = try engine.apply(batch, connection: conn)
                    conflicts += report.conflicts
                    kept += report.keptForSchema
                    if report.keptForSchema > 0 {
                        notSynced.formUnion(
                            batch.changes.map { batch.tables[$0.table].name }.filter { engine.tables[$0] == nil })
                    }
                    done += batch.changes.count
                    progress?(SyncProgress(changesDone: done, changesExpected: summary.changes, bytesDone: 0))
                }
            }
        }
        if let observer = engine.conflictObserver { conflicts.forEach(observer) }
        return SyncFileSummary(
            source: summary.source, target: summary.target, nextSequence: summary.through,
            changes: summary.changes, batches: batches.count, keptForSchema: kept, tablesNotSynced: notSynced.sorted())
    }

    /// How many rows changed after `sequence` (for progress).
    private func pendingChangeCount(after sequence: Int64) throws -> Int {
        guard syncEngine != nil else { return 0 }
        return try pendingChangeCount(tables: nil, after: sequence)
    }
}

/// FNV-1a, 64 bits: detects a damaged or truncated file (not an adversary).
func fnv1a(_ bytes: some Sequence<UInt8>) -> UInt64 {
    var hash: UInt64 = 0xcbf2_9ce4_8422_2325
    for byte in bytes {
        hash ^= UInt64(byte)
        hash &*= 0x100_0000_01b3
    }
    return hash
}

/// The parsed body of a sync file.
private struct SyncFileContents {
    var source: InstanceKey
    var target: InstanceKey
    var batches: [ChangeBatch] = []
    var changes: Int
    var through: Int64

    init(_ body: [UInt8], magicLength: Int) throws(BatchDecodingError) {
        let parsed = body.withUnsafeBytes { buffer -> Result<SyncFileContents, BatchDecodingError> in
            var reader = ByteReader(buffer)
            do throws(BatchDecodingError) {
                return .success(try SyncFileContents(&reader, magicLength: magicLength))
            } catch {
                return .failure(error)
            }
        }
        self = try parsed.get()
    }

    private init(_ reader: inout ByteReader, magicLength: Int) throws(BatchDecodingError) {
        _ = try reader.bytes(magicLength)
        source = InstanceKey(uncheckedBytes: Array(try reader.bytes(16)))
        target = InstanceKey(uncheckedBytes: Array(try reader.bytes(16)))
        _ = try reader.uvarint()
        while true {
            let length = try reader.count(minimumElementSize: 1)
            if length == 0 { break }
            batches.append(try BatchCoding.decode(Array(try reader.bytes(length))))
        }
        changes = Int(clamping: try reader.uvarint())
        through = Int64(bitPattern: try reader.uvarint())
        guard reader.isAtEnd else { throw reader.failure("unexpected bytes after the end record") }
    }
}
