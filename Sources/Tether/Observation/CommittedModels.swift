/// What typed listeners (`ModelEvent`) need of a transaction's rows, gathered on the writer: the
/// values of rows as they are deleted (from the pre-update hook, where no SQL may run), and the
/// rows changed, read before each COMMIT or RELEASE (`transactionWillCommit`), in the snapshot
/// that the commit is about to make durable. Used on the writer only, under its lock.
final class CommittedModels {
    /// The model of one row, or why it could not be read.
    typealias Read = Result<any Sendable, any Error>
    /// The models of a commit's changes: by the change's index, then by model type.
    typealias ByChange = [Int: [ObjectIdentifier: Read]]

    /// One row of one model type.
    private struct RowRef: Hashable {
        let modelType: ObjectIdentifier
        let key: PrimaryKey
    }

    /// The readers typed listeners want, by table (one per model type): the writer's copy of
    /// the subscriptions, renewed when they change (`ObservationBroker.updateActivation`).
    private(set) var readersByTable: [String: [any CommittedRowReading]] = [:]
    var isEmpty: Bool { readersByTable.isEmpty }

    /// Deleted rows' values, by the index of their change, in change order.
    private var deletedValues: [Int: [DatabaseValue]] = [:]
    /// Changes before this index have been read.
    private var readThrough = 0
    /// Rows inserted or updated, as last read (nil: gone by then).
    private var rows: [RowRef: Read?] = [:]
    /// Deleted rows, decoded, by change index.
    private var deleted: ByChange = [:]
    /// Each table's column names in the pre-update hook's order (cleared with the schema).
    private var columnNames: [String: [String]] = [:]

    /// Takes the listeners' readers; true when the set of tables changed.
    func setReaders(_ listeners: some Sequence<ObservationBroker.ModelListener>) -> Bool {
        var byTable: [String: [any CommittedRowReading]] = [:]
        for listener in listeners
        where !(byTable[listener.table]?.contains { $0.modelType == listener.reader.modelType } ?? false) {
            byTable[listener.table, default: []].append(listener.reader)
        }
        let tablesChanged = Set(byTable.keys) != Set(readersByTable.keys)
        readersByTable = byTable
        return tablesChanged
    }

    func wantsRows(of table: String) -> Bool { readersByTable[table] != nil }

    /// A row of a listened table is about to be deleted: `values` are its columns' (pre-update hook).
    func rowWillBeDeleted(change index: Int, values: [DatabaseValue]) {
        deletedValues[index] = values
    }

    func schemaMayHaveChanged() { columnNames.removeAll() }

    /// A statement failed: its changes, from `index` on, are gone.
    func discardChanges(from index: Int) {
        deletedValues = deletedValues.filter { $0.key < index }
        deleted = deleted.filter { $0.key < index }
        readThrough = min(readThrough, index)
    }

    /// A savepoint rolled back to `index`: rows read since may show what was undone, so every row
    /// is read again before the commit (rare enough not to be worth finer bookkeeping).
    func rolledBack(to index: Int) {
        deletedValues = deletedValues.filter { $0.key < index }
        deleted.removeAll()
        rows.removeAll()
        readThrough = 0
    }

    func reset() {
        deletedValues.removeAll()
        deleted.removeAll()
        rows.removeAll()
        readThrough = 0
    }

    /// Before a COMMIT or RELEASE: reads the rows the changes since the last call touched, as the
    /// transaction holds them now, and decodes the deleted ones. A row changed again later is read
    /// again at the next call, which always comes before the commit that makes it durable.
    func readRows(of changes: TransactionChanges, _ connection: Connection) {
        guard readThrough < changes.count else { return }
        var pending: [(row: RowRef, reader: any CommittedRowReading)] = []
        var seen: Set<RowRef> = []
        for index in readThrough..<changes.count {
            let change = changes[index]
            guard let readers = readersByTable[change.table] else { continue }
            switch change.kind {
            case .insert, .update:
                for reader in readers {
                    let ref = RowRef(modelType: reader.modelType, key: change.key)
                    if seen.insert(ref).inserted { pending.append((ref, reader)) }
                }
            case .delete, .evict:
                guard let values = deletedValues[index] else { continue }
                let columns: [String]
                do {
                    columns = try self.columns(of: change.table, connection)
                } catch {
                    deleted[index] = Dictionary(uniqueKeysWithValues: readers.map { ($0.modelType, .failure(error)) })
                    continue
                }
                // Generated columns may make the two counts differ: the common prefix is what both know.
                let count = min(columns.count, values.count)
                var models: [ObjectIdentifier: Read] = [:]
                for reader in readers {
                    // No model from the values: a mandatory nested child is missing (the row reads as absent).
                    models[reader.modelType] = Result {
                        try reader.model(
                            columns: Array(columns.prefix(count)), values: Array(values.prefix(count)), connection)
                    }
                    .flatMap {
                        $0.map { .success($0) }
                            ?? .failure(
                                ModelError.notFound(
                                    table: change.table,
                                    key: change.key.values.map(\.description).joined(separator: ", ")))
                    }
                }
                deleted[index] = models
            case .fetch:
                continue
            }
        }
        readThrough = changes.count
        for (row, reader) in pending {
            do {
                rows[row] = try reader.model(key: row.key, connection).map { .success($0) }
            } catch {
                rows[row] = .failure(error)
            }
        }
    }

    /// The models of a committed transaction's changes (after `readRows`); the bookkeeping is reset.
    func takeModels(of changes: TransactionChanges) -> ByChange {
        defer { reset() }
        var models = deleted
        for (index, change) in changes.enumerated() where change.kind == .insert || change.kind == .update {
            guard let readers = readersByTable[change.table] else { continue }
            var byType: [ObjectIdentifier: Read] = [:]
            for reader in readers {
                // Absent: the row was gone at the commit (deleted later in the transaction).
                if case let .some(.some(read)) = rows[RowRef(modelType: reader.modelType, key: change.key)] {
                    byType[reader.modelType] = read
                }
            }
            if !byType.isEmpty { models[index] = byType }
        }
        return models
    }

    /// Models of changes read back from the changelog (other processes' writes), read as the
    /// rows are now; deleted rows are gone and have none.
    func readModels(of changes: [DatabaseEvent], _ connection: Connection) -> ByChange {
        var models: ByChange = [:]
        for (index, change) in changes.enumerated() where change.kind == .insert || change.kind == .update {
            guard let readers = readersByTable[change.table] else { continue }
            var byType: [ObjectIdentifier: Read] = [:]
            for reader in readers {
                do {
                    if let model = try reader.model(key: change.key, connection) {
                        byType[reader.modelType] = .success(model)
                    }
                } catch {
                    byType[reader.modelType] = .failure(error)
                }
            }
            if !byType.isEmpty { models[index] = byType }
        }
        return models
    }

    /// `table`'s column names in declaration order: the order of the pre-update hook's values.
    private func columns(of table: String, _ connection: Connection) throws -> [String] {
        if let known = columnNames[table] { return known }
        let names = try connection.fetchRows("SELECT name FROM pragma_table_info(?) ORDER BY cid", [table]).map {
            try $0.get(0, as: String.self)
        }
        columnNames[table] = names
        return names
    }
}
