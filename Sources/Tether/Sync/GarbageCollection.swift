// Collecting what no peer needs any more: tombstones every remembered peer acknowledged, the
// evictions they were sent, insert ranges with nothing left to tell; and forgetting peers gone
// for longer than the horizon, so that they stop holding the rest back.

import Foundation

extension Database {
    /// How one run of `collectGarbage(_:)` goes.
    public struct GarbageCollectionOptions: Sendable, Equatable {
        /// Peers not seen for this long are forgotten first: they no longer hold tombstones back,
        /// and one that comes back gets a full resync before its changes are taken (see
        /// "Running tether serve in production" › Garbage collection). Nil: no peer is forgotten.
        public var forgetPeersUnseenFor: Duration?
        /// How long the run may take, roughly (it stops between two steps): what is left goes at
        /// the next run. Nil: until everything collectable is collected.
        public var timeLimit: Duration?
        /// Tombstones removed in one write transaction: the writer is free between two of them.
        public var tombstonesPerStep: Int

        public init(forgetPeersUnseenFor: Duration? = nil, timeLimit: Duration? = nil, tombstonesPerStep: Int = 5_000) {
            self.forgetPeersUnseenFor = forgetPeersUnseenFor
            self.timeLimit = timeLimit
            self.tombstonesPerStep = max(1, tombstonesPerStep)
        }
    }

    /// What one run of `collectGarbage(_:)` did.
    public struct GarbageCollectionReport: Sendable, Equatable {
        /// Tombstones removed.
        public var tombstonesRemoved = 0
        /// Records of rows evicted from scoped peers, removed (every peer acknowledged them).
        public var evictionsRemoved = 0
        /// Peers forgotten by this run (not seen for `forgetPeersUnseenFor`).
        public var peersForgotten: [InstanceKey] = []
        /// This database's changes every remembered peer acknowledged, through this sequence:
        /// the tombstones up to it may go.
        public var horizon: Int64 = 0
        /// Tombstones still kept: after the horizon, in flight, or left for the next run.
        public var tombstonesKept = 0
        /// False when the run stopped at its time limit with collectable tombstones left.
        public var isComplete = true
        /// How long the run took.
        public var duration: Duration = .zero
        /// The longest of its write transactions (the first, which reads the horizon, and each step
        /// of tombstones): the longest a writer waited for it.
        public var longestStep: Duration = .zero

        public init() {}
    }

    /// Deletes tombstones every known peer has acknowledged. Peers not seen
    /// for `forgetAfter` are forgotten first (if they come back, they get a
    /// full resync). Returns how many tombstones were removed.
    @discardableResult
    public func collectGarbage(forgettingPeersUnseenFor forgetAfter: Duration? = nil) throws -> Int {
        try collectGarbage(GarbageCollectionOptions(forgetPeersUnseenFor: forgetAfter)).tombstonesRemoved
    }

    /// Collects what no remembered peer needs any more, in steps of one write transaction each so
    /// that writers go on between them: tombstones every remembered peer acknowledged, the records
    /// of evictions they acknowledged, insert ranges with nothing left to tell. Peers not seen for
    /// `options.forgetPeersUnseenFor` are forgotten first. `tether serve`, `SyncServer` and
    /// `SyncNode` run it on a schedule; `tether gc` runs it by hand.
    public func collectGarbage(_ options: GarbageCollectionOptions) throws -> GarbageCollectionReport {
        let engine = try self.engine()
        let clock = ContinuousClock()
        let start = clock.now
        var report = GarbageCollectionReport()
        report.horizon = try write { conn -> Int64 in
            if let forgetAfter = options.forgetPeersUnseenFor {
                let seconds = Double(forgetAfter.components.seconds) + Double(forgetAfter.components.attoseconds) / 1e18
                report.peersForgotten = try conn.peerStore.forgetPeers(unseenSince: Date().timeIntervalSince1970 - seconds)
            }
            try engine.prepareClock(conn)
            let horizon = try conn.peerStore.acknowledgedByEveryPeer() ?? engine.clock.lastSequence
            report.evictionsRemoved = try EvictionLog.collect(through: horizon, conn)
            try engine.pruneInsertRanges(conn)
            return horizon
        }
        report.longestStep = clock.now - start
        let horizon = report.horizon
        for table in try write({ _ in engine.tableList }) {
            while true {
                let stepStart = clock.now
                let removed = try write { conn -> Int in
                    // A table unsynced since the list was read has no tombstones left to collect.
                    guard engine.tables[table.name] != nil else { return 0 }
                    try conn.execute(table.layout.collectDead, [horizon, options.tombstonesPerStep])
                    let removed = conn.changes
                    // A peer behind the horizon can no longer be sent every delete after its cursor.
                    if removed > 0 { try HybridClock.recordCollected(through: horizon, conn) }
                    return removed
                }
                report.longestStep = max(report.longestStep, clock.now - stepStart)
                report.tombstonesRemoved += removed
                if removed < options.tombstonesPerStep { break }
                if let limit = options.timeLimit, clock.now - start >= limit {
                    report.isComplete = false
                    break
                }
            }
            if !report.isComplete { break }
        }
        report.tombstonesKept = try read { conn in
            try engine.tableList.reduce(0) { $0 + (try conn.fetchValue("SELECT count(*) FROM \($1.layout.deadTable)", as: Int.self) ?? 0) }
        }
        report.duration = clock.now - start
        configuration.logger.debug("collected garbage", metadata: [
            "tether.tombstones_removed": "\(report.tombstonesRemoved)", "tether.tombstones_kept": "\(report.tombstonesKept)",
            "tether.horizon": "\(horizon)", "tether.peers_forgotten": "\(report.peersForgotten.count)",
        ])
        for peer in report.peersForgotten {
            configuration.logger.notice("forgot a peer not seen within the horizon: it no longer holds tombstones back, and gets a full resync if it returns",
                                        metadata: ["tether.peer": "\(peer)"])
        }
        return report
    }
}
