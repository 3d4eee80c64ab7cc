import Metrics
import Tether

/// What a server's garbage collections record (``SyncMetrics/Name`` lists the names): one run's
/// report in, counters, the gauge of tombstones kept and the run's duration out.
struct GarbageCollectionMetrics: Sendable {
    private let factory: any MetricsFactory
    private let tombstonesRemoved: Counter
    private let evictionsRemoved: Counter
    private let peersForgotten: Counter
    private let tombstonesKept: Gauge
    private let duration: Timer

    /// Records into `factory` (nil: the global `MetricsSystem.factory`).
    init(factory: (any MetricsFactory)?) {
        let factory = factory ?? MetricsSystem.factory
        self.factory = factory
        tombstonesRemoved = Counter(label: SyncMetrics.Name.gcTombstonesRemoved, factory: factory)
        evictionsRemoved = Counter(label: SyncMetrics.Name.gcEvictionsRemoved, factory: factory)
        peersForgotten = Counter(label: SyncMetrics.Name.gcPeersForgotten, factory: factory)
        tombstonesKept = Gauge(label: SyncMetrics.Name.gcTombstonesKept, factory: factory)
        duration = Timer(label: SyncMetrics.Name.gcRunSeconds, factory: factory)
    }

    /// A run ended with `report`.
    func record(_ report: Database.GarbageCollectionReport) {
        run(result: report.isComplete ? "complete" : "partial")
        tombstonesRemoved.increment(by: report.tombstonesRemoved)
        evictionsRemoved.increment(by: report.evictionsRemoved)
        peersForgotten.increment(by: report.peersForgotten.count)
        keptTombstones(report.tombstonesKept)
        duration.record(duration: report.duration)
    }

    /// A run failed (the database's error is logged).
    func failed() {
        run(result: "failed")
    }

    /// The tombstones kept now (also recorded as the server starts, before its first run).
    func keptTombstones(_ count: Int) {
        tombstonesKept.record(count)
    }

    private func run(result: String) {
        Counter(label: SyncMetrics.Name.gcRuns, dimensions: [("result", result)], factory: factory).increment()
    }
}
