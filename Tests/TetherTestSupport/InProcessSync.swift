import Tether

/// One batch of an in-process exchange: as the sender extracted it, as the receiver decoded it, and
/// what applying it did.
public struct SentBatch: Sendable {
    public var batch: ChangeBatch
    public var delivered: ChangeBatch
    public var report: ApplyReport
}

/// The sender still had batches after more than any test sends: it is stuck in a loop.
public struct ExchangeDidNotEnd: Error, CustomStringConvertible {
    public var source: InstanceKey
    public var destination: InstanceKey
    public var description: String { "sending from \(source) to \(destination) did not reach the last batch" }
}

/// More batches than any test sends.
private let maximumBatches = 10_000

/// Sends everything `source` has for `destination`, batch by batch from the receiver's cursor and
/// through the wire encoding, as a network peer would, until the last batch. The sender is told
/// what was applied (acknowledge) unless `acknowledging` is false; unacknowledged rows stay in flight.
@discardableResult
public func sendChanges(
    from source: Database, to destination: Database, limits: BatchLimits = BatchLimits(),
    allowingPartialRows: Bool = false,
    acknowledging: Bool = true
) throws -> [SentBatch] {
    var sent: [SentBatch] = []
    for _ in 0..<maximumBatches {
        let cursor = try destination.cursor(for: source.instanceKey)
        let batch = try source.extractChanges(
            for: destination.instanceKey, after: cursor.after, resuming: cursor.resyncing, limits: limits,
            allowingPartialRows: allowingPartialRows)
        let delivered = try BatchCoding.decode(BatchCoding.encode(batch), maximumFormat: BatchCoding.latestFormat)
        let report = try destination.apply(delivered)
        if acknowledging { try source.acknowledge(peer: destination.instanceKey, through: report.cursor) }
        sent.append(SentBatch(batch: batch, delivered: delivered, report: report))
        if batch.isLast { return sent }
    }
    throw ExchangeDidNotEnd(source: source.instanceKey, destination: destination.instanceKey)
}

/// What one scoped exchange sent: the batches of changes, then the backfill batches.
public struct ScopedExchange: Sendable {
    public var changes: [SentBatch]
    public var backfill: [SentBatch]
    /// Every change sent, in order (changes, then backfill).
    public var allChanges: [RowChange] { (changes + backfill).flatMap(\.delivered.changes) }
    public var evicted: Int { (changes + backfill).reduce(0) { $0 + $1.report.evicted } }
}

/// Sends `destination` what it holds of `source` under `scope`, as a scoped network peer would: the
/// batches of changes (`extractChanges(…scope:)`, acknowledged), then the scope backfill
/// (`extractScopeBackfill`, applied with `backfill: true`), each through the wire encoding.
/// `adapting`: what a session does to each batch on the way (cut to the schema both share).
@discardableResult
public func sendScopedChanges(
    from source: Database, to destination: Database, scope: SyncScope,
    limits: BatchLimits = BatchLimits(), adapting adapt: (ChangeBatch) -> ChangeBatch = { $0 }
) throws -> ScopedExchange {
    var exchange = ScopedExchange(changes: [], backfill: [])
    var finished = false
    for _ in 0..<maximumBatches {
        let cursor = try destination.cursor(for: source.instanceKey)
        let batch = try source.extractChanges(
            for: destination.instanceKey, after: cursor.after, resuming: cursor.resyncing, limits: limits,
            scope: scope)
        let delivered = try BatchCoding.decode(
            BatchCoding.encode(adapt(batch)), maximumFormat: BatchCoding.latestFormat)
        let report = try destination.apply(delivered)
        try source.acknowledge(peer: destination.instanceKey, through: report.cursor)
        exchange.changes.append(SentBatch(batch: batch, delivered: delivered, report: report))
        if batch.isLast { finished = true; break }
    }
    guard finished else { throw ExchangeDidNotEnd(source: source.instanceKey, destination: destination.instanceKey) }
    for _ in 0..<maximumBatches {
        let cursor = try destination.cursor(for: source.instanceKey)
        let batch = try source.extractScopeBackfill(
            for: destination.instanceKey, after: cursor.after, scope: scope, limits: limits)
        let delivered = try BatchCoding.decode(
            BatchCoding.encode(adapt(batch)), maximumFormat: BatchCoding.latestFormat)
        let report = try destination.apply(delivered, backfill: true)
        exchange.backfill.append(SentBatch(batch: batch, delivered: delivered, report: report))
        if batch.isLast { return exchange }
    }
    throw ExchangeDidNotEnd(source: source.instanceKey, destination: destination.instanceKey)
}

/// Sends `writer`'s changes to `receiver`, which checks each against `scope` (the writer's) as a
/// scoped peer's writes are checked; the writer records what was refused. Returns the refusals.
/// `adapting`: what a session does to each batch on the way (cut to the schema both share).
@discardableResult
public func sendScopedWrites(
    from writer: Database, to receiver: Database, scope: SyncScope,
    limits: BatchLimits = BatchLimits(), adapting adapt: (ChangeBatch) -> ChangeBatch = { $0 }
) throws -> [RefusedChange] {
    var refused: [RefusedChange] = []
    for _ in 0..<maximumBatches {
        let cursor = try receiver.cursor(for: writer.instanceKey)
        let batch = try writer.extractChanges(
            for: receiver.instanceKey, after: cursor.after, resuming: cursor.resyncing, limits: limits)
        let report = try receiver.apply(try BatchCoding.decode(BatchCoding.encode(adapt(batch))), scope: scope)
        try writer.acknowledge(peer: receiver.instanceKey, through: report.cursor)
        if !report.refused.isEmpty { try writer.recordRefusals(report.refused, by: receiver.instanceKey) }
        refused += report.refused
        if batch.isLast { return refused }
    }
    throw ExchangeDidNotEnd(source: writer.instanceKey, destination: receiver.instanceKey)
}
