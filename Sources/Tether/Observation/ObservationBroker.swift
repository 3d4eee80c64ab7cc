import CSQLite
import Foundation
import Logging
import Synchronization

/// Sees every change committed through a database's writer and hands it to whoever observes:
/// listeners, streams of committed transactions, query observations. It is one observer on the
/// core's seam (`TransactionObserver`), next to the sync capture.
///
/// While nobody observes it is inactive: the writer steps its statements as if it were not
/// there (`observesStatements` is false), so that observation costs nothing until used. Watchers
/// of committed sequence numbers alone do not activate it: they only need the commit, so the
/// broker then sees statements and transactions but records no row.
/// Capture state is used on the writer only (under its lock); subscriptions come and go from
/// any thread, under `subscriptions`' lock.
final class ObservationBroker: TransactionObserver, DatabaseService, @unchecked Sendable {
    let changelog: (any ChangelogSource)?
    weak var database: Database?

    init(changelog: (any ChangelogSource)?) {
        self.changelog = changelog
    }

    /// Other connections' commits (other processes, other `Database`s on the file), for
    /// observation and for whoever else asks (`Database.observeExternalCommits`).
    let externalCommits = ExternalCommitWatch()
    /// What tests change (see `ObservationTestHooks`).
    let testHooks = Mutex(ObservationTestHooks())

    // MARK: The database's moments (DatabaseService)

    func databaseDidOpen(_ database: Database, writer: Connection) {
        self.database = database
        externalCommits.database = database
        writer.add(self)
        writer.setAttachment(self, as: ObservationBroker.self)
    }

    /// Observers come and go from any thread; the writer learns of it here, under its lock.
    func writerWillRun(_ writer: Connection) {
        if activationChanged { updateActivation(writer) }
    }

    /// Readers report the ORM's fetches to the broker.
    func readerDidOpen(_ reader: Connection) {
        reader.setAttachment(self, as: ObservationBroker.self)
    }

    // MARK: Subscriptions (any thread)

    let subscriptions = Mutex(Subscriptions())
    /// Set when subscriptions changed in a way the writer must act on (see `updateActivation`).
    private let activationFlag = Atomic<Bool>(false)
    /// How many listeners want fetches: read on every ORM fetch, so kept apart from the lock.
    private let fetchListenerCount = Atomic<Int>(0)
    /// Listeners are called on this queue, in commit order, never on the writer.
    let listenerQueue = DispatchQueue(label: "tether.observation.listeners")

    var activationChanged: Bool { activationFlag.load(ordering: .acquiring) }

    /// Adds a subscription and, unless the writer is busy on this thread, activates now (else at
    /// the next write).
    func subscribe(_ register: (inout Subscriptions) -> Void) {
        subscriptions.withLock { register(&$0) }
        subscriptionsDidChange()
    }

    func unsubscribe(_ id: Int) {
        let removedFetchListener = subscriptions.withLock { subscriptions -> Bool in
            let listener = subscriptions.listeners.removeValue(forKey: id)
            subscriptions.modelListeners[id] = nil
            subscriptions.streams[id] = nil
            subscriptions.queries[id] = nil
            subscriptions.sequenceWatchers[id] = nil
            return listener.map { $0.kinds.contains(.fetch) } ?? false
        }
        if removedFetchListener { fetchListenerCount.subtract(1, ordering: .relaxed) }
        activationFlag.store(true, ordering: .releasing)
        monitorIfNeeded()
    }

    func addListener(_ listener: Listener) -> Int {
        var id = 0
        subscribe { id = $0.add(listener: listener) }
        if listener.kinds.contains(.fetch) { fetchListenerCount.add(1, ordering: .relaxed) }
        return id
    }

    func addModelListener(_ listener: ModelListener) -> Int {
        var id = 0
        subscribe { id = $0.add(modelListener: listener) }
        return id
    }

    func addSequenceWatcher(_ watcher: @escaping @Sendable (Int64) -> Void) -> Int {
        var id = 0
        subscribe { subscriptions in
            id = subscriptions.newID()
            subscriptions.sequenceWatchers[id] = watcher
        }
        return id
    }

    private func subscriptionsDidChange() {
        activationFlag.store(true, ordering: .releasing)
        // Activating now (rather than at the next write) spares the first commit a missed event;
        // from inside a write on this thread the lock is refused and the next write does it.
        _ = try? database?.writeWithoutTransaction { _ in }
        monitorIfNeeded()
    }

    // MARK: Activation (writer)

    /// Whether anyone observes the committed changes: they are recorded only then.
    private(set) var isActive = false
    /// Whether anyone watches the committed sequence numbers (`Database.observeCommittedSequences`).
    private(set) var watchesSequences = false
    /// The writer's hooks are in place only while someone observes or watches.
    var observesStatements: Bool { isActive || watchesSequences }
    /// While typed listeners exist, a write outside a transaction runs in a savepoint: its rows
    /// are read before it commits (`transactionWillCommit`).
    var writesInTransaction: Bool { isActive && !committedModels.isEmpty }
    /// What typed listeners need of the transaction's rows (writer only).
    private let committedModels = CommittedModels()

    /// Called by `Database` under the writer lock when subscriptions changed.
    func updateActivation(_ writer: Connection) {
        activationFlag.store(false, ordering: .releasing)
        let (wanted, watching, modelListeners) = subscriptions.withLock { (!$0.isEmpty, !$0.sequenceWatchers.isEmpty, $0.modelListeners.values) }
        if committedModels.setReaders(modelListeners) {
            // The tables whose deleted rows are kept changed: each table is looked at again.
            tables.removeAll()
            lastTable = nil
        }
        let watchingChanged = watching != watchesSequences
        watchesSequences = watching
        guard wanted != isActive else {
            if watchingChanged { writer.observersDidChange() }
            return
        }
        isActive = wanted
        resetCapture()
        tables.removeAll()
        if wanted {
            let start = try? readStart(writer)
            knownSequence = start?.sequence ?? 0
            lastDataVersion = start?.dataVersion ?? 0
            ownSequences.removeAll()
        }
        writer.observersDidChange()
    }

    /// Where the changelog ends and the data version that stands for, read in one snapshot: read
    /// apart, another connection's commit landing in between was counted as seen (its data
    /// version) but not as read (its sequence numbers), and waited for the next commit to be told.
    private func readStart(_ writer: Connection) throws -> (sequence: Int64, dataVersion: Int64) {
        try writer.transaction(.deferred) {
            let sequence = try changelog?.lastStoredSequence(writer) ?? 0
            subscriptionReached(.activating)
            return (sequence, try writer.fetchValue("PRAGMA data_version", as: Int64.self) ?? 0)
        }
    }

    // MARK: Capture (writer)

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

    private var tables: [String: CapturedTable] = [:]
    private var lastTable: CapturedTable?
    /// The committed transaction being built: the changes of the statements that completed.
    private var changes = TransactionChanges()
    /// Changes whose key could not be read in the hook (a table seen for the first time):
    /// index in `changes`, and the old row's values for a delete.
    private var unresolved: [(index: Int, table: CapturedTable, oldValues: [DatabaseValue]?)] = []
    /// Open savepoints (lowercased names) and how many changes came before each.
    private var savepoints: [(name: String, changeCount: Int, unresolvedCount: Int)] = []
    /// The statement whose changes come in, and where they start.
    private var currentStatement: Statement?
    private var statementStart = (changes: 0, unresolved: 0)
    private var currentOrigin = ChangeOrigin.local
    /// Where the writes in progress on the writer come from (a peer's batch, an import); local
    /// otherwise (see `Connection.withChangeOrigin`).
    var origin = ChangeOrigin.local
    /// Set while an eviction removes rows: their deletes are reported as `evict`.
    var reportsDeletesAsEvictions = false
    /// Whether the schema may have changed since the tables' keys were read.
    private var needsSchemaCheck = true
    private var schemaVersion: Int64 = -1

    private func resetCapture() {
        changes.removeAll()
        unresolved.removeAll()
        savepoints.removeAll()
        currentStatement = nil
        needsSchemaCheck = true
        committedModels.reset()
    }

    /// Forgets what was learned of the tables' keys when the schema changed since.
    private func checkSchema(_ connection: Connection) throws {
        guard needsSchemaCheck else { return }
        needsSchemaCheck = false
        let version = try connection.fetchValue("PRAGMA schema_version", as: Int64.self) ?? 0
        if version != schemaVersion {
            schemaVersion = version
            tables.removeAll()
            lastTable = nil
            committedModels.schemaMayHaveChanged()
        }
    }

    func statementWillExecute(_ statement: Statement, _ connection: Connection) throws {
        guard isActive else { return }
        try checkSchema(connection)
        // A statement that did not run to its end (SQLITE_DONE) is no longer the current one:
        // nested statements (the capture's metadata writes) replace it.
        if let current = currentStatement, current !== statement, sqlite3_stmt_busy(current.handle) != 0 { return }
        currentStatement = statement
        statementStart = (changes.count, unresolved.count)
        currentOrigin = origin
    }

    func rowWillChange(_ change: PreUpdateChange) {
        guard isActive, strcmp(change.databaseName, "main") == 0 else { return }
        let table: CapturedTable
        if let last = lastTable, last.cName.withUnsafeBufferPointer({ $0.baseAddress.map { strcmp($0, change.tableName) == 0 } ?? false }) {
            table = last
        } else {
            let name = String(cString: change.tableName)
            if let known = tables[name] {
                table = known
            } else {
                table = CapturedTable(name: name, keepsDeletedRows: committedModels.wantsRows(of: name))
                tables[name] = table
            }
            lastTable = table
        }
        if table.isIgnored { return }
        let kind: DatabaseEvent.Kind
        let rowID: Int64
        switch change.operation {
        case SQLITE_INSERT: kind = .insert; rowID = change.newRowid
        case SQLITE_DELETE: kind = reportsDeletesAsEvictions ? .evict : .delete; rowID = change.oldRowid
        default: kind = .update; rowID = change.newRowid
        }
        if table.keepsDeletedRows && (kind == .delete || kind == .evict) {
            // The row is gone once the statement ends: typed listeners get it from these values.
            let values = (0..<sqlite3_preupdate_count(change.db)).map { DatabaseValue(sqliteValue: change.oldValue($0)) }
            committedModels.rowWillBeDeleted(change: changes.count, values: values)
        }
        var keyValues: [DatabaseValue]?
        if let positions = table.keyPositions {
            if !positions.isEmpty {
                keyValues = positions.map { DatabaseValue(sqliteValue: kind == .delete || kind == .evict ? change.oldValue($0) : change.newValue($0)) }
            }
        } else {
            // The key's columns are read at the end of the statement; a deleted row keeps its values now.
            let oldValues = kind == .delete || kind == .evict ? (0..<sqlite3_preupdate_count(change.db)).map { DatabaseValue(sqliteValue: change.oldValue($0)) } : nil
            unresolved.append((changes.count, table, oldValues))
        }
        changes.append(DatabaseEvent(kind: kind, table: table.name, rowID: rowID, keyValues: keyValues, origin: currentOrigin))
    }

    // MARK: Bulk inserts and schema changes

    /// The rows of a bulk insert are taken as rowid ranges — stepping each statement observed
    /// with the pre-update hook costs more than the insert — when the table's key is its rowid
    /// (the range then says it all) and the insert runs in a transaction (whose commit, or the
    /// rollback of its savepoint, settles what is recorded).
    func bulkInsertWillBegin(into name: String, rowCount: Int, _ connection: Connection) throws -> BulkInsertObservation {
        // Watchers of sequence numbers alone need no row: ranges cost nothing to ignore.
        guard isActive else { return .rowidRanges }
        guard connection.isInTransaction else { return .eachRow }
        try checkSchema(connection)
        let table: CapturedTable
        if let known = tables[name] {
            table = known
        } else {
            table = CapturedTable(name: name, keepsDeletedRows: committedModels.wantsRows(of: name))
            tables[name] = table
        }
        guard try table.isIgnored || keyPositions(of: table, connection).isEmpty else { return .eachRow }
        return .rowidRanges
    }

    func rowsInserted(into name: String, rowids: ClosedRange<Int64>, _ connection: Connection) throws {
        guard isActive, let table = tables[name], !table.isIgnored else { return }
        changes.appendInserted(into: table.name, rowids: rowids, origin: origin)
    }

    /// What was learned of the tables' keys may be stale.
    func schemaDidChange(_ change: SchemaChange, _ connection: Connection) throws {
        needsSchemaCheck = true
    }

    func statementDidExecute(_ statement: Statement, _ connection: Connection) throws {
        guard isActive else { return }
        if statement === currentStatement { currentStatement = nil }
        if !unresolved.isEmpty { try resolveKeys(connection) }
        // Without an observer writing in the transaction, a write in autocommit mode is its own
        // transaction, committed as it ends.
        if !connection.isInTransaction && currentStatement == nil { transactionDidCommit(connection) }
    }

    func statementDidFail(_ statement: Statement, _ connection: Connection) {
        guard isActive, statement === currentStatement else { return }
        currentStatement = nil
        changes.removeChanges(from: statementStart.changes)
        unresolved.removeSubrange(min(statementStart.unresolved, unresolved.count)...)
        committedModels.discardChanges(from: changes.count)
    }

    func savepointWillBegin(_ name: String, _ connection: Connection) throws {
        guard isActive else { return }
        savepoints.append((name, changes.count, unresolved.count))
    }

    func savepointWillRelease(_ name: String) {
        guard isActive, let index = savepoints.lastIndex(where: { $0.name == name }) else { return }
        savepoints.removeSubrange(index...)
    }

    func savepointWillRollBack(_ name: String) {
        guard isActive else { return }
        guard let index = savepoints.lastIndex(where: { $0.name == name }) else {
            // Opened before observation started: what it holds is unknown, so nothing is kept.
            changes.removeAll()
            unresolved.removeAll()
            committedModels.rolledBack(to: 0)
            return
        }
        let mark = savepoints[index]
        changes.removeChanges(from: mark.changeCount)
        unresolved.removeSubrange(min(mark.unresolvedCount, unresolved.count)...)
        committedModels.rolledBack(to: changes.count)
        // ROLLBACK TO keeps the savepoint open.
        savepoints.removeSubrange((index + 1)...)
    }

    func transactionDidRollBack() {
        resetCapture()
        _ = changelog?.takeCommittedSequences()
    }

    /// Before COMMIT (or a RELEASE, which may end the transaction), with the transaction's writes
    /// all made: typed listeners' rows are read now, in the snapshot the commit makes durable.
    func transactionWillCommit(_ connection: Connection) throws {
        guard isActive, !committedModels.isEmpty else { return }
        committedModels.readRows(of: changes, connection)
    }

    func transactionDidCommit(_ connection: Connection) {
        let sequences = changelog?.takeCommittedSequences()
        if watchesSequences, let last = sequences?.upperBound {
            for watcher in subscriptions.withLock({ Array($0.sequenceWatchers.values) }) { watcher(last) }
        }
        guard isActive else { return }
        let committed = changes
        let models = committedModels.isEmpty ? [:] : committedModels.takeModels(of: committed)
        resetCapture()
        if let sequences, monitorsOtherProcesses { noteOwn(sequences) }
        guard !committed.isEmpty else { return }
        publish(committed, sequences: sequences, models: models)
    }

    /// Reads the keys the hook could not: the table's layout first, then, for a row still there,
    /// its key columns.
    private func resolveKeys(_ connection: Connection) throws {
        let pending = unresolved
        unresolved.removeAll(keepingCapacity: true)
        for entry in pending {
            let positions = try keyPositions(of: entry.table, connection)
            guard !positions.isEmpty else { continue }
            let change = changes[entry.index]
            let values: [DatabaseValue]
            if let old = entry.oldValues {
                values = positions.map { Int($0) < old.count ? old[Int($0)] : .null }
            } else {
                let columns = try connection.fetchRows("SELECT name FROM pragma_table_info(?) ORDER BY cid", [entry.table.name])
                    .map { try $0.get(0, as: String.self) }
                let selected = positions.map { quoteIdentifier(columns[Int($0)]) }.joined(separator: ", ")
                values = try connection.fetchRow("SELECT \(selected) FROM \(quoteIdentifier(entry.table.name)) WHERE rowid = ?", [change.rowID ?? 0])?.values
                    ?? positions.map { _ in .null }
            }
            changes.replaceEvent(at: entry.index, with: DatabaseEvent(kind: change.kind, table: change.table, rowID: change.rowID,
                                                                      keyValues: values, origin: change.origin))
        }
    }

    /// The positions of `table`'s primary key columns; empty when the key is the rowid.
    private func keyPositions(of table: CapturedTable, _ connection: Connection) throws -> [Int32] {
        if let known = table.keyPositions { return known }
        let columns = try connection.fetchRows("SELECT cid, pk, upper(type) FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", [table.name])
        let hasKeyIndex = try connection.fetchValue("SELECT EXISTS (SELECT 1 FROM pragma_index_list(?) WHERE origin = 'pk')", [table.name], as: Bool.self) ?? false
        let singleType = columns.count == 1 ? try columns[0].get(2, as: String.self) : nil
        let rowidIsKey = columns.isEmpty || (singleType == "INTEGER" && !hasKeyIndex)
        let positions = rowidIsKey ? [] : try columns.map { try $0.get(0, as: Int32.self) }
        table.keyPositions = positions
        return positions
    }

    // MARK: Publishing

    /// Hands a committed transaction to every subscriber that wants it: listeners go through
    /// its changes as collected, typed listeners get the rows in `models` (by change index and
    /// model type); streams get the changes as events, made only when one listens.
    func publish(_ changes: TransactionChanges, sequences: ClosedRange<Int64>?, isReadBack: Bool = false,
                 models: CommittedModels.ByChange = [:]) {
        let (listeners, modelListeners, streams, queries) = subscriptions.withLock { ($0.listeners, $0.modelListeners, $0.streams, $0.queries) }
        if !listeners.isEmpty || !modelListeners.isEmpty {
            listenerQueue.async {
                if !listeners.isEmpty { Self.call(listeners, for: changes) }
                if !modelListeners.isEmpty { Self.call(modelListeners, for: changes, models: models) }
            }
        }
        if !streams.isEmpty {
            let transaction = CommittedTransaction(changes: Array(changes), sequences: sequences, isReadBack: isReadBack)
            for (id, stream) in streams where !stream.deliver(transaction) { unsubscribe(id) }
        }
        if !queries.isEmpty {
            let tables = changes.tables
            for query in queries.values { query.databaseDidChange(tables: tables) }
        }
    }

    /// Another program committed: what it did to tables outside `recorded` (those the changelog
    /// does not record) cannot be told apart, so every query observation that reads one fetches again.
    func publishUnknownChange(outside recorded: Set<String> = []) {
        let queries = subscriptions.withLock { $0.queries }
        for query in queries.values { query.databaseDidChange(outside: recorded) }
    }

    private static func call(_ listeners: [Int: Listener], for changes: TransactionChanges) {
        // Listeners grouped by table once per call, and looked up once per run of a table's changes.
        var byTable: [String: [Listener]] = [:]
        for listener in listeners.values.sorted(by: { $0.id < $1.id }) { byTable[listener.table, default: []].append(listener) }
        var lastTable: String?
        var current: [Listener] = []
        for run in changes.runs {
            switch run {
            case let .event(event):
                if event.table != lastTable {
                    lastTable = event.table
                    current = byTable[event.table] ?? []
                }
                let kind = DatabaseEvent.Kinds(event.kind)
                for listener in current where listener.kinds.contains(kind) {
                    if let key = listener.key, key != event.key { continue }
                    listener.body(event)
                }
            case let .inserted(table, rowids, origin):
                if table != lastTable {
                    lastTable = table
                    current = byTable[table] ?? []
                }
                let wanting = current.filter { $0.kinds.contains(.insert) }
                if wanting.isEmpty { continue }
                // A bulk insert's rows: one event whose rowid moves along the run (a new one per
                // row would copy and free its table name and origin a million times).
                var event = DatabaseEvent(kind: .insert, table: table, rowID: nil, keyValues: nil, origin: origin)
                for rowID in rowids {
                    event.rowID = rowID
                    for listener in wanting {
                        if let key = listener.key, key != event.key { continue }
                        listener.body(event)
                    }
                }
            }
        }
    }

    private static func call(_ listeners: [Int: ModelListener], for events: TransactionChanges, models: CommittedModels.ByChange) {
        let byTable = Dictionary(grouping: listeners.values.sorted { $0.id < $1.id }, by: \.table)
        for (index, event) in events.enumerated() {
            guard let current = byTable[event.table], let read = models[index] else { continue }
            let kind = DatabaseEvent.Kinds(event.kind)
            for listener in current where listener.kinds.contains(kind) {
                if let key = listener.key, key != event.key { continue }
                switch read[listener.reader.modelType] {
                case let .success(model)?: listener.body(event, model)
                case let .failure(error)?: listener.failure?(event, error)
                case nil: continue
                }
            }
        }
    }

    // MARK: Fetches (any connection)

    var listensToFetches: Bool { fetchListenerCount.load(ordering: .relaxed) > 0 }

    /// Whether a listener wants the fetches of `table`.
    func listensToFetches(of table: String) -> Bool {
        listensToFetches && subscriptions.withLock { $0.listeners.values.contains { $0.table == table && $0.kinds.contains(.fetch) } }
    }

    /// Rows of `table` the ORM fetched, by primary key.
    func didFetch(_ table: String, keys: [[DatabaseValue]]) {
        let listeners = subscriptions.withLock { $0.listeners.filter { $0.value.table == table && $0.value.kinds.contains(.fetch) } }
        guard !listeners.isEmpty else { return }
        let events = keys.map { DatabaseEvent(kind: .fetch, table: table, rowID: nil, keyValues: $0, origin: .local) }
        listenerQueue.async { Self.call(listeners, for: TransactionChanges(events)) }
    }

    // MARK: Other processes (writer)

    /// Sequence numbers through which the changelog has been reported (own commits or read back).
    private var knownSequence: Int64 = 0
    /// This process's commits since `knownSequence`, which reading the changelog back must skip.
    private var ownSequences: [ClosedRange<Int64>] = []
    private var lastDataVersion: Int64 = 0
    /// Other connections' commits, told by `externalCommits` while something observes (guarded by monitorLock).
    private var monitor: Int?
    private let monitorLock = NSLock()
    /// Whether other processes' commits are watched (then this process's commits are remembered, see `ownSequences`).
    private var monitorsOtherProcesses: Bool { monitorLock.withLock { monitor != nil } }

    private func noteOwn(_ sequences: ClosedRange<Int64>) {
        if let last = ownSequences.last, last.upperBound + 1 >= sequences.lowerBound {
            ownSequences[ownSequences.count - 1] = last.lowerBound...max(last.upperBound, sequences.upperBound)
        } else {
            ownSequences.append(sequences)
        }
    }

    /// Starts or stops watching for other processes' commits as subscriptions come and go.
    private func monitorIfNeeded() {
        guard let database, !database.isMemory, let interval = database.configuration.observationPollInterval else { return }
        let wanted = subscriptions.withLock { !$0.isEmpty }
        monitorLock.withLock {
            if wanted, monitor == nil {
                monitor = externalCommits.subscribe(pollInterval: interval) { [weak self] in
                    self?.checkOtherProcesses()
                }
            } else if !wanted, let id = monitor {
                externalCommits.unsubscribe(id)
                monitor = nil
            }
        }
    }

    func databaseWillClose() {
        monitorLock.withLock {
            if let id = monitor { externalCommits.unsubscribe(id) }
            monitor = nil
        }
        externalCommits.stop()
        let (streams, queries) = subscriptions.withLock { subscriptions in
            defer { subscriptions.streams.removeAll(); subscriptions.queries.removeAll() }
            return (subscriptions.streams, subscriptions.queries)
        }
        for stream in streams.values { stream.finish() }
        for query in queries.values { query.finish() }
    }

    /// One poll: cheap (`PRAGMA data_version` on the writer) unless another connection committed.
    /// A read-back that fails is logged and tried again (`retryReadBack`): the watch calls again
    /// only for a later commit, which may never come.
    func checkOtherProcesses() {
        guard let database else { return }
        do {
            try database.writeWithoutTransaction { connection in try readOtherProcessesChanges(connection) }
        } catch {
            return readBackFailed(error, logger: database.configuration.logger)
        }
        let failed = readBackRetry.withLock { retry in
            defer { retry.failures = 0 }
            return retry.failures
        }
        if failed > 0 {
            database.configuration.logger.notice("read back other connections' commits after failed attempts",
                                                 metadata: ["tether.failed-attempts": "\(failed)"])
        }
    }

    /// Milliseconds to wait before trying a failed read-back again, by failures in a row (the last
    /// repeated while it fails): a busy writer is waited for briefly, a failing disk once a second.
    static let readBackRetryDelays: [Int] = [10, 100, 1000]
    /// Failed read-backs in a row, and whether a retry is scheduled (at most one is).
    private let readBackRetry = Mutex((failures: 0, scheduled: false))
    private let readBackRetryQueue = DispatchQueue(label: "tether.observation.read-back-retry")

    /// Logs a failed read-back — the first of a run at `error`, the next ones at `debug` — and
    /// schedules a retry unless one is.
    private func readBackFailed(_ error: any Error, logger: Logger) {
        let (failures, schedules) = readBackRetry.withLock { retry in
            retry.failures += 1
            defer { retry.scheduled = true }
            return (retry.failures, !retry.scheduled)
        }
        let delay = Self.readBackRetryDelays[min(failures, Self.readBackRetryDelays.count) - 1]
        let metadata: Logger.Metadata = [
            "tether.error": "\(error)", "tether.failed-attempts": "\(failures)", "tether.retry-in-ms": "\(delay)",
        ]
        if failures == 1 {
            logger.error("could not read back other connections' commits; trying again", metadata: metadata)
        } else {
            logger.debug("could not read back other connections' commits again", metadata: metadata)
        }
        guard schedules else { return }
        readBackRetryQueue.asyncAfter(deadline: .now() + .milliseconds(delay)) { [weak self] in self?.retryReadBack() }
    }

    /// Tries a failed read-back again, while other connections' commits are watched.
    private func retryReadBack() {
        readBackRetry.withLock { $0.scheduled = false }
        guard monitorsOtherProcesses else {
            readBackRetry.withLock { $0.failures = 0 }
            return
        }
        checkOtherProcesses()
    }

    /// When another connection committed since the last look: its changes to synced tables are
    /// read back from the changelog (after folding what triggers recorded of other programs'
    /// writes); a commit that left nothing there is reported as an unknown change.
    func readOtherProcessesChanges(_ connection: Connection) throws {
        guard isActive else { return }
        let version = try connection.fetchValue("PRAGMA data_version", as: Int64.self) ?? 0
        guard version != lastDataVersion else {
            // Nobody else wrote: this process's commits are all there is up to now.
            if let last = ownSequences.last { knownSequence = max(knownSequence, last.upperBound) }
            ownSequences.removeAll()
            return
        }
        try injectedReadBackFailure()
        guard let changelog else {
            lastDataVersion = version
            return publishUnknownChange()
        }
        let own = ownSequences
        try changelog.foldExternalWrites(connection)
        // The fold's own commit is not one of this process's changes: it stands for other programs'.
        ownSequences = own
        // The changes, where the changelog ends and the data version they stand for, read in one
        // snapshot: read apart, a commit landing in between had its changes skipped (counted as
        // read) or its data version taken as seen, and was never told.
        let (readBack, last, readVersion) = try connection.transaction(.deferred) {
            let readVersion = try connection.fetchValue("PRAGMA data_version", as: Int64.self) ?? version
            return (try changelog.changes(after: knownSequence, connection), try changelog.lastStoredSequence(connection), readVersion)
        }
        let events = readBack.compactMap { event -> DatabaseEvent? in
            if let sequence = event.sequence, own.contains(where: { $0.contains(sequence) }) { return nil }
            guard case .local = event.origin else { return event }
            // Made on this database, but not by this process.
            return DatabaseEvent(kind: event.kind, table: event.table, rowID: event.rowID, keyValues: event.keyValues, origin: .external,
                                 sequence: event.sequence)
        }
        let first = knownSequence + 1
        knownSequence = max(knownSequence, last)
        ownSequences.removeAll()
        lastDataVersion = readVersion
        if !events.isEmpty {
            let models = committedModels.isEmpty ? [:] : committedModels.readModels(of: events, connection)
            publish(TransactionChanges(events), sequences: first <= last ? first...last : nil, isReadBack: true, models: models)
        }
        publishUnknownChange(outside: changelog.recordedTables)
    }
}

// MARK: - Subscriptions

extension ObservationBroker {
    /// A callback for some kinds of events of one table (and, with `key`, one row).
    struct Listener: Sendable {
        var id = 0
        let table: String
        let kinds: DatabaseEvent.Kinds
        let key: PrimaryKey?
        let body: @Sendable (DatabaseEvent) -> Void
    }

    /// A typed listener (`ModelEvent`): some kinds of changes of one table (and, with `key`, one
    /// row), with the rows read by `reader`.
    struct ModelListener: Sendable {
        var id = 0
        let table: String
        let kinds: DatabaseEvent.Kinds
        let key: PrimaryKey?
        let reader: any CommittedRowReading
        /// Called with the change and its model (of the reader's type).
        let body: @Sendable (DatabaseEvent, any Sendable) -> Void
        /// Called when the row could not be read as the model.
        let failure: (@Sendable (DatabaseEvent, any Error) -> Void)?
    }

    /// A subscriber that buffers committed transactions (`CommittedTransactions`).
    protocol TransactionSubscriber: Sendable {
        /// False when the subscriber is done (it fell behind, or its consumer went).
        func deliver(_ transaction: CommittedTransaction) -> Bool
        func finish()
    }

    /// A query observation: told which tables a commit changed, or that tables outside some
    /// set may have changed.
    protocol ChangeSubscriber: Sendable {
        func databaseDidChange(tables: Set<String>)
        func databaseDidChange(outside known: Set<String>)
        func finish()
    }

    struct Subscriptions {
        var listeners: [Int: Listener] = [:]
        var modelListeners: [Int: ModelListener] = [:]
        var streams: [Int: any TransactionSubscriber] = [:]
        var queries: [Int: any ChangeSubscriber] = [:]
        /// Told the last sequence number of each commit that gave some (they need no change recorded).
        var sequenceWatchers: [Int: @Sendable (Int64) -> Void] = [:]
        private var nextID = 1

        /// Whether nobody observes the committed changes themselves (sequence watchers aside).
        var isEmpty: Bool { listeners.isEmpty && modelListeners.isEmpty && streams.isEmpty && queries.isEmpty }

        mutating func newID() -> Int {
            defer { nextID += 1 }
            return nextID
        }

        mutating func add(listener: Listener) -> Int {
            var listener = listener
            listener.id = newID()
            listeners[listener.id] = listener
            return listener.id
        }

        mutating func add(modelListener: ModelListener) -> Int {
            var listener = modelListener
            listener.id = newID()
            modelListeners[listener.id] = listener
            return listener.id
        }
    }
}
