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
    from source: Database, to destination: Database, limits: BatchLimits = BatchLimits(), allowingPartialRows: Bool = false,
    acknowledging: Bool = true
) throws -> [SentBatch] {
    var sent: [SentBatch] = []
    for _ in 0..<maximumBatches {
        let cursor = try destination.cursor(for: source.instanceKey)
        let batch = try source.extractChanges(
            for: destination.instanceKey, after: cursor.after, resuming: cursor.resyncing, limits: limits,
            allowingPartialRows: allowingPartialRows)
        let delivered = try BatchCoding.decode(BatchCoding.encode(batch))
        let report = try destination.apply(delivered)
        if acknowledging { try source.acknowledge(peer: destination.instanceKey, through: report.cursor) }
        sent.append(SentBatch(batch: batch, delivered: delivered, report: report))
        if batch.isLast { return sent }
    }
    throw ExchangeDidNotEnd(source: source.instanceKey, destination: destination.instanceKey)
}
