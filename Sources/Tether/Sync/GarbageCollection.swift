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

        /// A run that forgets no peer and has no time limit unless told; steps of at least one tombstone.
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

        /// An empty report, which the run fills in.
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
        let rules = try write { conn -> [CollectionRule] in
            if let forgetAfter = options.forgetPeersUnseenFor {
                let unseenSince = Date().timeIntervalSince1970 - forgetAfter.seconds
                report.peersForgotten = try conn.peerStore.forgetPeers(unseenSince: unseenSince)
            }
            try engine.prepareClock(conn)
            let rules = try CollectionRule.rules(
                acknowledgements: conn.peerStore.rememberedAcknowledgements(),
                lastSequence: engine.clock.lastSequence
            ) { try engine.sites.knownID(of: $0, conn) }
            report.evictionsRemoved = try EvictionLog.collect(through: rules[0].through, conn)
            try engine.pruneInsertRanges(conn)
            return rules
        }
        report.horizon = rules[0].through
        report.longestStep = clock.now - start
        collecting: for table in try write({ _ in engine.tableList }) {
            for rule in rules {
                while true {
                    let stepStart = clock.now
                    let removed = try write { conn -> Int in
                        // A table unsynced since the list was read has no tombstones left to collect.
                        guard engine.tables[table.name] != nil else { return 0 }
                        try conn.execute(
                            table.layout.collectDead, [rule.through, options.tombstonesPerStep, rule.receivedFrom])
                        let removed = conn.changes
                        // A peer behind what was collected can no longer be sent every delete after its cursor.
                        if removed > 0 {
                            try HybridClock.recordCollected(through: rule.through, echoesOf: rule.receivedFrom, conn)
                        }
                        return removed
                    }
                    report.longestStep = max(report.longestStep, clock.now - stepStart)
                    report.tombstonesRemoved += removed
                    if removed < options.tombstonesPerStep { break }
                    if let limit = options.timeLimit, clock.now - start >= limit {
                        report.isComplete = false
                        break collecting
                    }
                }
            }
        }
        report.tombstonesKept = try tombstoneCount()
        report.duration = clock.now - start
        configuration.logger.debug(
            "collected garbage",
            metadata: [
                "tether.tombstones_removed": "\(report.tombstonesRemoved)",
                "tether.tombstones_kept": "\(report.tombstonesKept)",
                "tether.horizon": "\(report.horizon)", "tether.peers_forgotten": "\(report.peersForgotten.count)",
            ])
        for peer in report.peersForgotten {
            configuration.logger.notice(
                """
                forgot a peer not seen within the horizon: it no longer holds tombstones back, and gets a full \
                resync if it returns
                """,
                metadata: ["tether.peer": "\(peer)"])
        }
        return report
    }

    /// The tombstones kept, or those after this database's sequence `sequence`: with a peer's
    /// acknowledged sequence, the ones it holds back from collection while it is remembered (and,
    /// with the sequence of the last collection, the deletes since). One count per synced table,
    /// a range of the sequence index when `sequence` is given.
    public func tombstoneCount(after sequence: Int64? = nil) throws -> Int {
        let engine = try self.engine()
        return try read { conn in
            try engine.tableList.reduce(0) { total, table in
                let count =
                    if let sequence {
                        try conn.fetchValue(
                            "SELECT count(*) FROM \(table.layout.deadTable) WHERE tether_seq > ?", [sequence],
                            as: Int.self)
                    } else {
                        try conn.fetchValue("SELECT count(*) FROM \(table.layout.deadTable)", as: Int.self)
                    }
                return total + (count ?? 0)
            }
        }
    }
}

/// Which tombstones one pass of a garbage collection removes: those through `through`, or, with
/// `receivedFrom`, only those of deletes received from that peer's site.
struct CollectionRule: Equatable {
    let through: Int64
    let receivedFrom: Int32?

    /// The first rule: tombstones every remembered peer acknowledged (without one, all of them).
    /// Then, for each remembered peer, the tombstones of deletes it sent here, which every *other*
    /// remembered peer acknowledged: that peer has them (it sent them, and is never sent them
    /// back), so they do not wait for its acknowledgement — which a node that only receives from
    /// it would never get, having nothing of its own to send.
    static func rules(
        acknowledgements: [(peer: InstanceKey, through: Int64)], lastSequence: Int64,
        site: (InstanceKey) throws -> Int32?
    ) throws -> [CollectionRule] {
        let horizon = acknowledgements.map(\.through).min() ?? lastSequence
        var rules = [CollectionRule(through: horizon, receivedFrom: nil)]
        for (peer, _) in acknowledgements {
            guard let site = try site(peer) else { continue }
            let others = acknowledgements.filter { $0.peer != peer }.map(\.through).min() ?? lastSequence
            if others > horizon { rules.append(CollectionRule(through: others, receivedFrom: site)) }
        }
        return rules
    }
}
