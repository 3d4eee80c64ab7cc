// The observation broker: its state, the database's moments, subscriptions coming and going, and activation.

import Foundation
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

    func databaseWillClose() {
        stopWatchingOtherProcesses()
        let (streams, queries) = subscriptions.withLock { subscriptions in
            defer { subscriptions.streams.removeAll(); subscriptions.queries.removeAll() }
            return (subscriptions.streams, subscriptions.queries)
        }
        for stream in streams.values { stream.finish() }
        for query in queries.values { query.finish() }
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

    // MARK: Fetches (any connection)

    var listensToFetches: Bool { fetchListenerCount.load(ordering: .relaxed) > 0 }

    /// Whether a listener wants the fetches of `table`.
    func listensToFetches(of table: String) -> Bool {
        listensToFetches
            && subscriptions.withLock {
                $0.listeners.values.contains { $0.table == table && $0.kinds.contains(.fetch) }
            }
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
    let committedModels = CommittedModels()

    /// Called by `Database` under the writer lock when subscriptions changed.
    func updateActivation(_ writer: Connection) {
        activationFlag.store(false, ordering: .releasing)
        let (wanted, watching, modelListeners) = subscriptions.withLock {
            (!$0.isEmpty, !$0.sequenceWatchers.isEmpty, $0.modelListeners.values)
        }
        if committedModels.setReaders(modelListeners) {
            // The tables whose deleted rows are kept changed: each table is looked at again.
            capture.forgetTables()
        }
        let watchingChanged = watching != watchesSequences
        watchesSequences = watching
        guard wanted != isActive else {
            if watchingChanged { writer.observersDidChange() }
            return
        }
        isActive = wanted
        restartCapture()
        if wanted {
            let start = try? readStart(writer)
            readBackCursor.start(sequence: start?.sequence ?? 0, dataVersion: start?.dataVersion ?? 0)
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

    // MARK: Capture (writer; see ObservationBroker+Capture.swift)

    /// The transaction the writer is making, as far as it is captured.
    var capture = Capture()
    /// Where the writes in progress on the writer come from (a peer's batch, an import); local
    /// otherwise (see `Connection.withChangeOrigin`).
    var origin = ChangeOrigin.local
    /// The source transaction of the peer's change being written (set by the apply through
    /// `Connection.sourceTransactionRecorder`).
    var sourceTransaction: SourceTransaction?
    /// Set while an eviction removes rows: their deletes are reported as `evict`.
    var reportsDeletesAsEvictions = false

    // MARK: Other processes (see ObservationBroker+ReadBack.swift)

    /// Where reading other connections' commits back has reached (writer only).
    var readBackCursor = ReadBackCursor()
    /// The watch of other connections' commits and the retry of a failed read-back (any thread).
    let otherProcesses = OtherProcessesWatch()
}
