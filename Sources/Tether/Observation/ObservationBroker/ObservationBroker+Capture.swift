// The writer's changes captured as its statements run, kept or dropped with its savepoints, published at the commit.

import CSQLite
import Foundation

extension ObservationBroker {
    /// What the broker knows of a table the writer changes.
    final class CapturedTable {
        let name: String
        let cName: ContiguousArray<CChar>
        /// Internal tables (the sync layer's `tether_…`, SQLite's `sqlite_…`) are not reported.
        let isIgnored: Bool
        /// Positions of the primary key's columns; empty when the key is the rowid; nil until read.
        var keyPositions: [Int32]?
        /// Whether typed listeners want its deleted rows' values (`CommittedModels`).
        let keepsDeletedRows: Bool
        init(name: String, keepsDeletedRows: Bool) {
            self.name = name
            cName = ContiguousArray(name.utf8CString)
            isIgnored = name.hasPrefix("tether_") || name.hasPrefix("sqlite_")
            self.keepsDeletedRows = keepsDeletedRows
        }
    }

    /// The transaction the writer is making, as far as the broker captured it: the changes of
    /// its statements, where its statements and savepoints start, and what is known of the
    /// tables it changes. Touched only by the capture, below.
    struct Capture {
        fileprivate var tables: [String: CapturedTable] = [:]
        fileprivate var lastTable: CapturedTable?
        /// The committed transaction being built: the changes of the statements that completed.
        fileprivate var changes = TransactionChanges()
        /// Changes whose key could not be read in the hook (a table seen for the first time):
        /// index in `changes`, and the old row's values for a delete.
        fileprivate var unresolved: [(index: Int, table: CapturedTable, oldValues: [DatabaseValue]?)] = []
        /// Open savepoints (lowercased names) and how many changes came before each.
        fileprivate var savepoints: [(name: String, changeCount: Int, unresolvedCount: Int)] = []
        /// The statement whose changes come in, and where they start.
        fileprivate var currentStatement: Statement?
        fileprivate var statementStart = (changes: 0, unresolved: 0)
        fileprivate var currentOrigin = ChangeOrigin.local
        /// Whether the schema may have changed since the tables' keys were read.
        fileprivate var needsSchemaCheck = true
        fileprivate var schemaVersion: Int64 = -1

        /// Forgets what was learned of the tables: each is looked at again.
        mutating func forgetTables() {
            tables.removeAll()
            lastTable = nil
        }
    }

    /// Starts capturing afresh as observation starts or stops: nothing captured, and the tables
    /// met so far forgotten but the last one (the next statement's `checkSchema` forgets it too
    /// when the schema changed).
    func restartCapture() {
        resetCapture()
        capture.tables.removeAll()
    }

    private func resetCapture() {
        capture.changes.removeAll()
        capture.unresolved.removeAll()
        capture.savepoints.removeAll()
        capture.currentStatement = nil
        capture.needsSchemaCheck = true
        committedModels.reset()
    }

    /// Forgets what was learned of the tables' keys when the schema changed since.
    private func checkSchema(_ connection: Connection) throws {
        guard capture.needsSchemaCheck else { return }
        capture.needsSchemaCheck = false
        let version = try connection.fetchValue("PRAGMA schema_version", as: Int64.self) ?? 0
        if version != capture.schemaVersion {
            capture.schemaVersion = version
            capture.forgetTables()
            committedModels.schemaMayHaveChanged()
        }
    }

    func statementWillExecute(_ statement: Statement, _ connection: Connection) throws {
        guard isActive else { return }
        try checkSchema(connection)
        // A statement that did not run to its end (SQLITE_DONE) is no longer the current one:
        // nested statements (the capture's metadata writes) replace it.
        if let current = capture.currentStatement, current !== statement, sqlite3_stmt_busy(current.handle) != 0 {
            return
        }
        capture.currentStatement = statement
        capture.statementStart = (capture.changes.count, capture.unresolved.count)
        capture.currentOrigin = origin
    }

    func rowWillChange(_ change: PreUpdateChange) {
        guard isActive, strcmp(change.databaseName, "main") == 0 else { return }
        let table: CapturedTable
        if let last = capture.lastTable,
            last.cName.withUnsafeBufferPointer({ $0.baseAddress.map { strcmp($0, change.tableName) == 0 } ?? false })
        {
            table = last
        } else {
            let name = String(cString: change.tableName)
            if let known = capture.tables[name] {
                table = known
            } else {
                table = CapturedTable(name: name, keepsDeletedRows: committedModels.wantsRows(of: name))
                capture.tables[name] = table
            }
            capture.lastTable = table
        }
        if table.isIgnored { return }
        let kind: DatabaseEvent.Kind
        let rowID: Int64
        switch change.operation {
        case SQLITE_INSERT: kind = .insert; rowID = change.newRowid
        case SQLITE_DELETE: kind = reportsDeletesAsEvictions ? .evict : .delete; rowID = change.oldRowid
        default: kind = .update; rowID = change.newRowid
        }
        let deletes = kind == .delete || kind == .evict
        if table.keepsDeletedRows && deletes {
            // The row is gone once the statement ends: typed listeners get it from these values.
            committedModels.rowWillBeDeleted(change: capture.changes.count, values: change.oldValues)
        }
        var keyValues: [DatabaseValue]?
        if let positions = table.keyPositions {
            if !positions.isEmpty {
                keyValues = positions.map {
                    DatabaseValue(sqliteValue: deletes ? change.oldValue($0) : change.newValue($0))
                }
            }
        } else {
            // The key's columns are read at the end of the statement; a deleted row keeps its values now.
            let oldValues = deletes ? change.oldValues : nil
            capture.unresolved.append((capture.changes.count, table, oldValues))
        }
        capture.changes.append(
            DatabaseEvent(
                kind: kind, table: table.name, rowID: rowID, keyValues: keyValues, origin: capture.currentOrigin,
                sourceTransaction: kind == .evict ? nil : sourceTransaction))
    }

    // MARK: Bulk inserts and schema changes

    /// The rows of a bulk insert are taken as rowid ranges — stepping each statement observed
    /// with the pre-update hook costs more than the insert — when the table's key is its rowid
    /// (the range then says it all) and the insert runs in a transaction (whose commit, or the
    /// rollback of its savepoint, settles what is recorded).
    func bulkInsertWillBegin(into name: String, rowCount: Int, _ connection: Connection) throws
        -> BulkInsertObservation
    {
        // Watchers of sequence numbers alone need no row: ranges cost nothing to ignore.
        guard isActive else { return .rowidRanges }
        guard connection.isInTransaction else { return .eachRow }
        try checkSchema(connection)
        let table: CapturedTable
        if let known = capture.tables[name] {
            table = known
        } else {
            table = CapturedTable(name: name, keepsDeletedRows: committedModels.wantsRows(of: name))
            capture.tables[name] = table
        }
        guard try table.isIgnored || keyPositions(of: table, connection).isEmpty else { return .eachRow }
        return .rowidRanges
    }

    func rowsInserted(into name: String, rowids: ClosedRange<Int64>, _ connection: Connection) throws {
        guard isActive, let table = capture.tables[name], !table.isIgnored else { return }
        capture.changes.appendInserted(
            into: table.name, rowids: rowids, origin: origin, sourceTransaction: sourceTransaction)
    }

    /// What was learned of the tables' keys may be stale.
    func schemaDidChange(_ change: SchemaChange, _ connection: Connection) throws {
        capture.needsSchemaCheck = true
    }

    func statementDidExecute(_ statement: Statement, _ connection: Connection) throws {
        guard isActive else { return }
        if statement === capture.currentStatement { capture.currentStatement = nil }
        if !capture.unresolved.isEmpty { try resolveKeys(connection) }
        // Without an observer writing in the transaction, a write in autocommit mode is its own
        // transaction, committed as it ends.
        if !connection.isInTransaction && capture.currentStatement == nil { transactionDidCommit(connection) }
    }

    func statementDidFail(_ statement: Statement, _ connection: Connection) {
        guard isActive, statement === capture.currentStatement else { return }
        capture.currentStatement = nil
        capture.changes.removeChanges(from: capture.statementStart.changes)
        capture.unresolved.removeSubrange(min(capture.statementStart.unresolved, capture.unresolved.count)...)
        committedModels.discardChanges(from: capture.changes.count)
    }

    func savepointWillBegin(_ name: String, _ connection: Connection) throws {
        guard isActive else { return }
        capture.savepoints.append((name, capture.changes.count, capture.unresolved.count))
    }

    func savepointWillRelease(_ name: String) {
        guard isActive, let index = capture.savepoints.lastIndex(where: { $0.name == name }) else { return }
        capture.savepoints.removeSubrange(index...)
    }

    func savepointWillRollBack(_ name: String) {
        guard isActive else { return }
        guard let index = capture.savepoints.lastIndex(where: { $0.name == name }) else {
            // Opened before observation started: what it holds is unknown, so nothing is kept.
            capture.changes.removeAll()
            capture.unresolved.removeAll()
            committedModels.rolledBack(to: 0)
            return
        }
        let mark = capture.savepoints[index]
        capture.changes.removeChanges(from: mark.changeCount)
        capture.unresolved.removeSubrange(min(mark.unresolvedCount, capture.unresolved.count)...)
        committedModels.rolledBack(to: capture.changes.count)
        // ROLLBACK TO keeps the savepoint open.
        capture.savepoints.removeSubrange((index + 1)...)
    }

    func transactionDidRollBack() {
        resetCapture()
        _ = changelog?.takeCommittedSequences()
        _ = changelog?.takeCommittedTransaction()
    }

    /// Before COMMIT (or a RELEASE, which may end the transaction), with the transaction's writes
    /// all made: typed listeners' rows are read now, in the snapshot the commit makes durable.
    func transactionWillCommit(_ connection: Connection) throws {
        guard isActive, !committedModels.isEmpty else { return }
        committedModels.readRows(of: capture.changes, connection)
    }

    func transactionDidCommit(_ connection: Connection) {
        let sequences = changelog?.takeCommittedSequences()
        let ownTransaction = changelog?.takeCommittedTransaction()
        if watchesSequences, let last = sequences?.upperBound {
            for watcher in subscriptions.withLock({ Array($0.sequenceWatchers.values) }) { watcher(last) }
        }
        guard isActive else { return }
        var committed = capture.changes
        committed.localTransaction = ownTransaction
        let models = committedModels.isEmpty ? [:] : committedModels.takeModels(of: committed)
        resetCapture()
        if let sequences, monitorsOtherProcesses { readBackCursor.noteOwn(sequences) }
        guard !committed.isEmpty else { return }
        publish(committed, sequences: sequences, models: models)
    }

    /// Reads the keys the hook could not: the table's layout first, then, for a row still there,
    /// its key columns.
    private func resolveKeys(_ connection: Connection) throws {
        let pending = capture.unresolved
        capture.unresolved.removeAll(keepingCapacity: true)
        for entry in pending {
            let positions = try keyPositions(of: entry.table, connection)
            guard !positions.isEmpty else { continue }
            let change = capture.changes[entry.index]
            let values: [DatabaseValue]
            if let old = entry.oldValues {
                values = positions.map { Int($0) < old.count ? old[Int($0)] : .null }
            } else {
                let columns =
                    try connection
                    .fetchRows("SELECT name FROM pragma_table_info(?) ORDER BY cid", [entry.table.name])
                    .map { try $0.get(0, as: String.self) }
                let selected = positions.map { quoteIdentifier(columns[Int($0)]) }.joined(separator: ", ")
                let sql = "SELECT \(selected) FROM \(quoteIdentifier(entry.table.name)) WHERE rowid = ?"
                values = try connection.fetchRow(sql, [change.rowID ?? 0])?.values ?? positions.map { _ in .null }
            }
            let resolved = DatabaseEvent(
                kind: change.kind, table: change.table, rowID: change.rowID, keyValues: values, origin: change.origin)
            capture.changes.replaceEvent(at: entry.index, with: resolved)
        }
    }

    /// The positions of `table`'s primary key columns; empty when the key is the rowid.
    private func keyPositions(of table: CapturedTable, _ connection: Connection) throws -> [Int32] {
        if let known = table.keyPositions { return known }
        let columns = try connection.fetchRows(
            "SELECT cid, pk, upper(type) FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", [table.name])
        let hasKeyIndex =
            try connection.fetchValue(
                "SELECT EXISTS (SELECT 1 FROM pragma_index_list(?) WHERE origin = 'pk')", [table.name], as: Bool.self
            ) ?? false
        let singleType = columns.count == 1 ? try columns[0].get(2, as: String.self) : nil
        let rowidIsKey = columns.isEmpty || (singleType == "INTEGER" && !hasKeyIndex)
        let positions = rowidIsKey ? [] : try columns.map { try $0.get(0, as: Int32.self) }
        table.keyPositions = positions
        return positions
    }
}

private extension PreUpdateChange {
    /// The values of the row before the change (a deleted row's last values).
    var oldValues: [DatabaseValue] {
        (0..<sqlite3_preupdate_count(db)).map { DatabaseValue(sqliteValue: oldValue($0)) }
    }
}
