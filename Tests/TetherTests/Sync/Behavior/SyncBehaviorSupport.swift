import Foundation
import Testing
@testable import Tether
import TetherTestSupport

// Shared helpers of the SyncBehavior* tests. Every top-level name starts with
// `SyncTest` so that it cannot collide with other test files.

/// A model on the plain synced table used by many tests.
struct SyncTestItem: Model, Equatable {
    var id: Int64
    var name: String
    var count: Int
    static let tableName = "sync_item"
}

/// A model whose primary key is local (AUTOINCREMENT) and whose rows are
/// identified across peers by `uuid`.
struct SyncTestNote: Model, Equatable {
    var id: Int64?
    var uuid: String
    var title: String
    static let tableName = "sync_note"
    static var secondaryKeys: [[ColumnRef<SyncTestNote>]] { [["uuid"]] }
    static var constraints: [Constraint<SyncTestNote>] { [.autoIncrement] }
}

/// A model with a local AUTOINCREMENT key and no secondary key: cannot be synced.
struct SyncTestCounter: Model, Equatable {
    var id: Int64?
    var value: Int
    static let tableName = "sync_counter"
    static var constraints: [Constraint<SyncTestCounter>] { [.autoIncrement] }
}

/// An error thrown on purpose by a test (a merge function, an aborted transaction).
struct SyncTestAbort: Error, Equatable {}

extension SyncError {
    /// The case's name, to compare errors without their messages.
    var syncTestCase: String {
        switch self {
        case .invalidTable: return "invalidTable"
        case .schemaMismatch: return "schemaMismatch"
        case .notSynced: return "notSynced"
        case .clockSkew: return "clockSkew"
        case .invalidSyncFile: return "invalidSyncFile"
        case .corruptMetadata: return "corruptMetadata"
        case .missingMergeFunction: return "missingMergeFunction"
        case .needsWholeRows: return "needsWholeRows"
        case .invalidBatch: return "invalidBatch"
        case .forgedVersion: return "forgedVersion"
        case .copiedDatabase: return "copiedDatabase"
        case .instanceKeyReused: return "instanceKeyReused"
        case .historyDiverged: return "historyDiverged"
        case .instanceKeyPinned: return "instanceKeyPinned"
        case .refusedExpiry: return "refusedExpiry"
        case .awaitingResync: return "awaitingResync"
        case .invalidValue: return "invalidValue"
        }
    }
}

enum SyncTestKit {
    /// The raw-SQL table most tests use.
    static let schema = "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, count INTEGER)"

    /// `count` in-memory databases, each with `t` synced under `policy`.
    static func peers(_ count: Int, policy: ConflictPolicy = .lastWriterWins, capturingExternalWrites: Bool = false)
        throws -> [Database]
    {
        try (0..<count).map { _ in
            try makeDatabase(
                schema: schema, syncing: ["t"], policy: policy, capturingExternalWrites: capturingExternalWrites)
        }
    }

    /// Runs `body` and returns the error it threw, if any.
    static func error(_ body: () throws -> Void) -> (any Error)? {
        do {
            try body()
            return nil
        } catch {
            return error
        }
    }

    /// The `SyncError` case `body` threw ("none" when it did not throw, the
    /// error's type when it threw something else).
    static func syncErrorCase(_ body: () throws -> Void) -> String {
        guard let error = error(body) else { return "none" }
        guard let syncError = error as? SyncError else { return "not a SyncError: \(type(of: error)): \(error)" }
        return syncError.syncTestCase
    }

    /// Sends everything `from` has for `to`, batch by batch and through the
    /// wire encoding, as a network peer would; the sender is told what was
    /// applied (acknowledge) unless `acknowledge` is false.
    @discardableResult
    static func sync(_ from: Database, _ to: Database, maximumChanges: Int = 2_000, acknowledge: Bool = true) throws
        -> [ApplyReport]
    {
        try sendChanges(
            from: from, to: to, limits: BatchLimits(maximumChanges: maximumChanges), acknowledging: acknowledge
        ).map(\.report)
    }

    /// Syncs every pair both ways, twice (enough for two or three peers).
    static func settle(_ peers: [Database], maximumChanges: Int = 2_000) throws {
        for _ in 0..<2 {
            for from in peers {
                for to in peers where to !== from { try sync(from, to, maximumChanges: maximumChanges) }
            }
        }
    }

    /// The rows of a query as text, one line per row (for readable failures).
    static func dump(_ db: Database, _ sql: String = "SELECT id, name, count FROM t ORDER BY id") throws -> [String] {
        try db.fetchRows(sql).map { $0.values.map(\.description).joined(separator: "|") }
    }

    static func int(_ db: Database, _ sql: String, _ arguments: StatementArguments = StatementArguments()) throws
        -> Int64?
    {
        try db.fetchValue(sql, arguments, as: Int64.self)
    }

    /// `table` with its rows' sync metadata as columns (`tether_seq`, `tether_status`,
    /// `tether_in_flight`, `tether_versions`, `tether_via`, `tether_effective_seq`), to read in
    /// place of the table: `SELECT tether_status FROM \(SyncTestKit.meta("t")) WHERE id = 1`.
    static func meta(_ table: String) -> String { RowMetadataLayout.inspectionSQL(table: table) }

    /// The sequence number of a row of `table`, live or dead.
    static func sequence(_ db: Database, _ table: String = "t", id: Int64) throws -> Int64? {
        if let live = try int(db, "SELECT tether_effective_seq FROM \(meta(table)) WHERE id = ?", [id]) { return live }
        return try int(db, "SELECT tether_seq FROM tether_dead_\(table) WHERE id = ?", [id])
    }

    /// The sync status of a live row.
    static func status(_ db: Database, _ table: String = "t", id: Int64) throws -> SyncStatus? {
        try int(db, "SELECT tether_status FROM \(meta(table)) WHERE id = ?", [id]).flatMap {
            SyncStatus(rawValue: Int($0))
        }
    }

    /// `tether_status` of a tombstone.
    static func deadStatus(_ db: Database, _ table: String = "t", id: Int64) throws -> SyncStatus? {
        try int(db, "SELECT tether_status FROM tether_dead_\(table) WHERE id = ?", [id]).flatMap {
            SyncStatus(rawValue: Int($0))
        }
    }

    /// The sync status of the live row whose `id` is `key`.
    static func status(_ db: Database, _ table: String, key: String) throws -> SyncStatus? {
        try int(db, "SELECT tether_status FROM \(meta(table)) WHERE id = ?", [key]).flatMap {
            SyncStatus(rawValue: Int($0))
        }
    }

    static func inFlight(_ db: Database, _ table: String, key: String) throws -> Bool? {
        try int(db, "SELECT tether_in_flight FROM \(meta(table)) WHERE id = ?", [key]).map { $0 != 0 }
    }

    static func inFlight(_ db: Database, _ table: String = "t", id: Int64) throws -> Bool? {
        try int(db, "SELECT tether_in_flight FROM \(meta(table)) WHERE id = ?", [id]).map { $0 != 0 }
    }

    static func pendingCount(_ db: Database, _ table: String = "t") throws -> Int64 {
        try int(db, "SELECT count(*) FROM \(meta(table)) WHERE tether_status != 0 OR tether_in_flight != 0") ?? -1
    }

    /// A peer that only exists as an instance key (batches are extracted for it, never applied).
    static func fakePeer() -> InstanceKey { InstanceKey.random() }

    static var nowMilliseconds: UInt64 { UInt64(Date().timeIntervalSince1970 * 1000) }

    /// Moves `db`'s hybrid clock `milliseconds` ahead of the wall clock, so
    /// that its next changes are later than anything other peers write until
    /// they hear from it (white box: the clock is stored in tether_clock).
    static func moveClockAhead(_ db: Database, by milliseconds: UInt64 = 120_000) throws {
        let target = HybridTimestamp(milliseconds: nowMilliseconds + milliseconds, counter: 0)
        try db.execute(
            "UPDATE tether_clock SET timestamp = max(timestamp, ?) WHERE id = 1", [Int64(bitPattern: target.rawValue)])
    }

    static func version(_ milliseconds: UInt64, _ origin: InstanceKey, counter: UInt16 = 0) -> Version {
        Version(timestamp: HybridTimestamp(milliseconds: milliseconds, counter: counter), origin: origin)
    }

    /// The descriptor of `t` as peers send it.
    static let tDescriptor = TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["name", "count"])

    /// A hand-made batch of changes to `t` from `source`.
    static func batch(
        from source: InstanceKey, after: Int64 = 0, through: Int64? = nil, tables: [TableDescriptor] = [tDescriptor],
        changes: [RowChange]
    ) -> ChangeBatch {
        ChangeBatch(
            source: source, after: after, through: through ?? after + Int64(max(1, changes.count)), isLast: true,
            tables: tables, changes: changes)
    }

    /// A live row of `t` with every value at `version`.
    static func row(
        _ id: Int64, name: String, count: Int64, at version: Version, sequence: Int64 = 1, alive: Bool = true,
        versions: [Version] = []
    ) -> RowChange {
        RowChange(
            table: 0, key: [.integer(id)], isAlive: alive, existence: version, values: [.text(name), .integer(count)],
            versions: versions, sequence: sequence)
    }
}
