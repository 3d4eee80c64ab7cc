import CSQLite
import Foundation

/// A change seen by the pre-update hook, waiting for the end of its
/// statement to get its sequence number and versions.
enum CapturedChange {
    case inserted(SyncedTable, rowid: Int64)
    case updated(SyncedTable, rowid: Int64, changedColumns: [Int], oldVersions: [UInt8]?, oldStatus: Int64)
    case deleted(SyncedTable, rowid: Int64, key: [DatabaseValue], values: [DatabaseValue], oldVersions: [UInt8]?, oldStatus: Int64)
}

/// Sync status of a row, stored in its `tether_status` column.
public enum SyncStatus: Int, Sendable, Codable, CaseIterable, DatabaseValueConvertible {
    /// Nothing local waits to be acknowledged.
    case synced = 0
    /// Inserted locally, not yet acknowledged.
    case created = 1
    /// Updated locally, not yet acknowledged.
    case updated = 2
    /// Deleted locally, not yet acknowledged (the row is in the tombstone table).
    case deleted = 3
}

// The hooks are C functions; the context is the engine, which the Database
// keeps alive for as long as the hooks are installed.
private func preUpdateHook(_ context: UnsafeMutableRawPointer?, _ db: OpaquePointer?, _ op: Int32,
                           _ databaseName: UnsafePointer<CChar>?, _ tableName: UnsafePointer<CChar>?,
                           _ oldRowid: Int64, _ newRowid: Int64) {
    guard let context, let db, let tableName, let databaseName else { return }
    Unmanaged<SyncEngine>.fromOpaque(context).takeUnretainedValue()
        .capture(db: db, op: op, databaseName: databaseName, tableName: tableName, oldRowid: oldRowid, newRowid: newRowid)
}

private func commitHook(_ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let context else { return 0 }
    let engine = Unmanaged<SyncEngine>.fromOpaque(context).takeUnretainedValue()
    // Every library path writes the clock and flushes before COMMIT; if not,
    // committing would lose sync metadata: refuse rather than diverge.
    if !engine.pending.isEmpty || engine.clockDirty { return 1 }
    engine.needsReload = true
    return 0
}

private func rollbackHook(_ context: UnsafeMutableRawPointer?) {
    guard let context else { return }
    Unmanaged<SyncEngine>.fromOpaque(context).takeUnretainedValue().didRollBack()
}

extension SyncEngine {
    func install(on connection: Connection) {
        guard let db = connection.handle else { return }
        let context = Unmanaged.passUnretained(self).toOpaque()
        sqlite3_commit_hook(db, commitHook, context)
        sqlite3_rollback_hook(db, rollbackHook, context)
        connection.syncEngine = self
        updateCaptureHook(connection)
    }

    func uninstall(from connection: Connection) {
        guard let db = connection.handle else { return }
        sqlite3_preupdate_hook(db, nil, nil)
        sqlite3_commit_hook(db, nil, nil)
        sqlite3_rollback_hook(db, nil, nil)
        connection.syncEngine = nil
        connection.capturingEngine = nil
    }

    /// The pre-update hook and the capturing step cost something on every
    /// write: they are in place only while some table is synced.
    func updateCaptureHook(_ connection: Connection) {
        guard let db = connection.handle, connection.syncEngine === self else { return }
        if tableList.isEmpty {
            sqlite3_preupdate_hook(db, nil, nil)
            connection.capturingEngine = nil
        } else {
            sqlite3_preupdate_hook(db, preUpdateHook, Unmanaged.passUnretained(self).toOpaque())
            connection.capturingEngine = self
        }
    }

    /// Runs `body` without the pre-update hook: for a bulk insert into a table
    /// without triggers, whose rows need no capture (they carry their metadata)
    /// and whose inserts cannot change any other table.
    func withoutCaptureHook<T>(_ connection: Connection, _ body: () throws -> T) rethrows -> T {
        guard let db = connection.handle, connection.capturingEngine === self else { return try body() }
        sqlite3_preupdate_hook(db, nil, nil)
        defer { sqlite3_preupdate_hook(db, preUpdateHook, Unmanaged.passUnretained(self).toOpaque()) }
        return try body()
    }

    func didRollBack() {
        pending.removeAll()
        // The rolled-back transaction's clock write is gone with it; the numbers
        // it used stay used in memory (skipping them is harmless). Left set, the
        // flag made the next COMMIT write the clock, which fails in a read-only
        // transaction (the reads of an in-memory database).
        clockDirty = false
        needsReload = true
        sitesMayBeStale = true
    }

    // MARK: The hook

    @inline(__always)
    func capture(db: OpaquePointer, op: Int32, databaseName: UnsafePointer<CChar>, tableName: UnsafePointer<CChar>, oldRowid: Int64, newRowid: Int64) {
        guard suppression == 0, strcmp(databaseName, "main") == 0 else { return }
        guard let table = tableList.first(where: { $0.cName.withUnsafeBufferPointer { $0.baseAddress.map { strcmp($0, tableName) == 0 } ?? false } }) else { return }
        if table.capturesExternalWrites {
            externalFoldNeeded = true
            return
        }
        if isApplying && sqlite3_preupdate_depth(db) == 0 { return }
        switch op {
        case SQLITE_INSERT:
            if table === directInsertTable && sqlite3_preupdate_depth(db) == 0 { return }
            pending.append(.inserted(table, rowid: newRowid))
        case SQLITE_DELETE:
            pending.append(deletedRow(db, table, rowid: oldRowid))
        case SQLITE_UPDATE:
            let keyChanged = table.keyPositions.contains { !sameValue(old(db, $0), new(db, $0)) }
            if keyChanged {
                pending.append(deletedRow(db, table, rowid: oldRowid))
                pending.append(.inserted(table, rowid: newRowid))
                return
            }
            let changed = table.valuePositions.indices.filter { !sameValue(old(db, table.valuePositions[$0]), new(db, table.valuePositions[$0])) }
            // UPDATE … SET x = x, or a write to tether_ columns only: nothing to sync.
            guard !changed.isEmpty else { return }
            pending.append(.updated(table, rowid: newRowid, changedColumns: changed,
                                    oldVersions: blob(old(db, table.versionsPosition)),
                                    oldStatus: sqlite3_value_int64(old(db, table.statusPosition))))
        default:
            break
        }
    }

    private func deletedRow(_ db: OpaquePointer, _ table: SyncedTable, rowid: Int64) -> CapturedChange {
        .deleted(table, rowid: rowid, key: table.keyPositions.map { DatabaseValue(sqliteValue: old(db, $0)) },
                 values: table.valuePositions.map { DatabaseValue(sqliteValue: old(db, $0)) },
                 oldVersions: blob(old(db, table.versionsPosition)),
                 oldStatus: sqlite3_value_int64(old(db, table.statusPosition)))
    }

    @inline(__always)
    private func old(_ db: OpaquePointer, _ position: Int32) -> OpaquePointer? {
        var value: OpaquePointer?
        sqlite3_preupdate_old(db, position, &value)
        return value
    }

    @inline(__always)
    private func new(_ db: OpaquePointer, _ position: Int32) -> OpaquePointer? {
        var value: OpaquePointer?
        sqlite3_preupdate_new(db, position, &value)
        return value
    }

    private func blob(_ value: OpaquePointer?) -> [UInt8]? {
        guard sqlite3_value_type(value) == SQLITE_BLOB, let bytes = sqlite3_value_blob(value) else { return nil }
        return Array(UnsafeRawBufferPointer(start: bytes, count: Int(sqlite3_value_bytes(value))))
    }

    // MARK: Flush

    /// `flush` when a statement captured changes or a trigger recorded some.
    @inline(__always)
    func flushIfNeeded(_ connection: Connection) throws {
        if !pending.isEmpty || externalFoldNeeded { try flush(connection) }
    }

    /// Gives the changes of the statement that just finished their sequence
    /// numbers, versions and status, in the same transaction.
    func flush(_ connection: Connection) throws {
        if externalFoldNeeded { try foldExternalChanges(connection) }
        guard !pending.isEmpty else { return }
        suppression += 1
        defer { suppression -= 1 }
        let changes = pending
        pending.removeAll(keepingCapacity: true)
        try prepareClock(connection)
        let version = LocalVersion(timestamp: nextTimestamp().rawValue, site: Self.localSite)
        for change in changes {
            switch change {
            case let .inserted(table, rowid):
                try stampInserted(table, rowid: rowid, versions: RowVersions.uniform(version).encoded(), connection)
            case let .updated(table, rowid, changedColumns, oldVersions, oldStatus):
                var versions = try storedVersions(oldVersions, table, rowid, connection) ?? .uniform(version)
                for column in changedColumns { versions.setColumn(column, to: version, columnCount: table.valueColumns.count) }
                try stamp(table, rowid: rowid, status: Self.statusAfterUpdate(oldStatus), versions: versions.encoded(), connection)
            case let .deleted(table, rowid, key, values, oldVersions, _):
                var versions = try storedVersions(oldVersions, table, rowid, connection) ?? .uniform(version)
                versions.markDeleted(at: version, columnCount: table.valueColumns.count)
                try table.statement(.upsertDead, connection)
                    .execute(StatementArguments(values: key + values + [.integer(nextSequence()), .integer(Int64(SyncStatus.deleted.rawValue)),
                                                                        .integer(0), .blob(Data(versions.encoded())), .null]))
                table.mayHaveDeadRows = true
            }
        }
    }
}

extension SyncEngine {
    /// Gives a live row a new sequence number, its status and its versions.
    /// `via`: the peer the row's state was received from; nil for a change made here.
    func stamp(_ table: SyncedTable, rowid: Int64, status: SyncStatus, versions: [UInt8], via peer: Int32? = nil, _ connection: Connection) throws {
        try table.statement(.updateMetaByRowid, connection).run { binder in
            try binder.bind(nextSequence())
            try binder.bind(Int64(status.rawValue))
            try binder.bind(blob: versions)
            try binder.bind(peer.map { DatabaseValue.integer(Int64($0)) } ?? .null)
            try binder.bind(rowid)
        }
    }

    /// A row inserted locally: its tombstone, if the key had one, goes (the
    /// insert is newer than anything seen here), and it is a new local change.
    func stampInserted(_ table: SyncedTable, rowid: Int64, versions: [UInt8], _ connection: Connection) throws {
        try removeTombstone(table, rowid: rowid, connection)
        try stamp(table, rowid: rowid, status: .created, versions: versions, connection)
    }

    func removeTombstone(_ table: SyncedTable, rowid: Int64, _ connection: Connection) throws {
        guard table.mayHaveDeadRows else { return }
        suppression += 1
        defer { suppression -= 1 }
        try table.statement(.deleteDeadForRowid, connection).execute([rowid])
    }

    /// The status after a local update: a synced row becomes updated; a
    /// created (or already updated) row stays as it is.
    static func statusAfterUpdate(_ old: Int64) -> SyncStatus {
        old == Int64(SyncStatus.synced.rawValue) ? .updated : SyncStatus(rawValue: Int(old)) ?? .updated
    }

    /// A row's versions before a change: its own, or its insert range's.
    func storedVersions(_ bytes: [UInt8]?, _ table: SyncedTable, _ rowid: Int64, _ connection: Connection) throws -> RowVersions? {
        if let bytes { return RowVersions(encoded: bytes) }
        return try rangeVersions(of: table, rowid: rowid, connection)
    }
}

extension DatabaseValue {
    /// Copies an unprotected sqlite3_value (from the pre-update hook).
    init(sqliteValue value: OpaquePointer?) {
        switch sqlite3_value_type(value) {
        case SQLITE_INTEGER: self = .integer(sqlite3_value_int64(value))
        case SQLITE_FLOAT: self = .real(sqlite3_value_double(value))
        case SQLITE_TEXT:
            let count = Int(sqlite3_value_bytes(value))
            self = .text(sqlite3_value_text(value).map { String(decoding: UnsafeBufferPointer(start: $0, count: count), as: UTF8.self) } ?? "")
        case SQLITE_BLOB:
            let count = Int(sqlite3_value_bytes(value))
            self = .blob(sqlite3_value_blob(value).map { Data(bytes: $0, count: count) } ?? Data())
        default: self = .null
        }
    }
}

/// Whether two sqlite3_values hold the same value of the same storage class.
@inline(__always)
func sameValue(_ a: OpaquePointer?, _ b: OpaquePointer?) -> Bool {
    let type = sqlite3_value_type(a)
    guard type == sqlite3_value_type(b) else { return false }
    switch type {
    case SQLITE_NULL: return true
    case SQLITE_INTEGER: return sqlite3_value_int64(a) == sqlite3_value_int64(b)
    case SQLITE_FLOAT: return sqlite3_value_double(a).bitPattern == sqlite3_value_double(b).bitPattern
    default:
        let pointerA = type == SQLITE_TEXT ? UnsafeRawPointer(sqlite3_value_text(a)) : sqlite3_value_blob(a)
        let countA = sqlite3_value_bytes(a)
        let pointerB = type == SQLITE_TEXT ? UnsafeRawPointer(sqlite3_value_text(b)) : sqlite3_value_blob(b)
        guard countA == sqlite3_value_bytes(b) else { return false }
        guard countA > 0 else { return true }
        guard let pointerA, let pointerB else { return pointerA == pointerB }
        return memcmp(pointerA, pointerB, Int(countA)) == 0
    }
}
