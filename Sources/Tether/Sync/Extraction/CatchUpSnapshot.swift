// A catch-up served from one read of the source: its last batch marks a state the source held,
// however fast the source is written meanwhile.

import Foundation

/// One read of this database that serves a peer's whole catch-up (`Database.extractChanges`,
/// `servedFrom:`).
///
/// A receiver applies a catch-up only at its last batch (`isLast`): each batch is a read of its
/// own, its rows at their newest values, so only a read that found nothing after its batch closes
/// a state the source held. A source written faster than it sends would never find that. Served
/// from one snapshot instead, the catch-up ends when the snapshot is sent: its first batch is read
/// as any other, the snapshot is taken as it commits, and every later batch is read there, up to
/// the snapshot's end, where the last is marked. Together they are the source's state when the
/// snapshot was taken (a row sent by the first batch and changed before the snapshot comes again
/// from it); what was written after it comes with the next catch-up. The rows sent are recorded
/// (in flight, and the peer's send position) on the writer, as for any batch: a row changed since
/// the snapshot has a later sequence number and is not marked.
///
/// Held by a session for one peer, on one thread at a time. The snapshot ends with the catch-up's
/// last batch, a pull that does not follow the batch before (a new catch-up), ``close()`` or the
/// object's end; while it lasts, the write-ahead log cannot be folded past it.
public final class CatchUpSnapshot: @unchecked Sendable {
    private let lock = NSLock()
    /// The snapshot's connection, in a read transaction; nil between catch-ups.
    private var reader: Connection?  // guarded by lock
    /// The peer and the `through` of the batch last served: the next pull goes on from there.
    private var served: (peer: InstanceKey, through: Int64)?  // guarded by lock
    /// The database's count of snapshots open, which this one's reader counts in.
    private var slots: SnapshotSlots?  // guarded by lock

    /// A snapshot holder for one peer's catch-ups; no read is held until a batch needs one.
    public init() {}

    deinit { closeReader() }

    /// Ends the snapshot (the next batch is read afresh).
    public func close() {
        lock.lock()
        defer { lock.unlock() }
        closeReader()
    }

    /// Whether a catch-up is being served from a snapshot now.
    public var isOpen: Bool {
        lock.lock()
        defer { lock.unlock() }
        return reader != nil
    }

    /// The snapshot to read a batch for `peer` after `cursor` from: the current one if the pull
    /// follows the batch it served last; nil otherwise (any snapshot of an earlier catch-up ends).
    func reader(continuing cursor: Int64, for peer: InstanceKey) -> Connection? {
        lock.lock()
        defer { lock.unlock() }
        if let served, served.peer == peer, served.through == cursor, let reader { return reader }
        closeReader()
        return nil
    }

    /// After `batch` was sent to `peer` (its recording committed): the last ends the snapshot; a
    /// batch read afresh that is not the last takes one from `database` now, for the rest.
    func served(_ batch: ChangeBatch, to peer: InstanceKey, on database: Database) throws {
        lock.lock()
        defer { lock.unlock() }
        guard !batch.isLast else {
            closeReader()
            return
        }
        if reader == nil {
            // Past the database's limit, the batches of this catch-up are read afresh each.
            let slots = database.sync.snapshotSlots
            guard slots.take() else { return }
            do {
                guard let opened = try Self.openSnapshot(of: database) else {
                    slots.give()
                    return
                }
                reader = opened
                self.slots = slots
            } catch {
                slots.give()
                throw error
            }
        }
        served = (peer, batch.through)
    }

    /// How often a snapshot is taken again when another program's writes, not yet given their
    /// sequence numbers, are in it.
    static let attempts = 5

    /// A reader in a read transaction on `database` that holds no write of another program not yet
    /// folded (`ChangeCapture.hasUnfoldedExternalChanges`): such a write is in the rows read but not in their
    /// sequence numbers, and would go torn (half a transfer sent). Folded first, then taken again,
    /// a few times; nil if another program keeps writing in between (the batches are read afresh).
    private static func openSnapshot(of database: Database) throws -> Connection? {
        guard let reader = try database.openDetachedReader() else { return nil }
        for attempt in 1...attempts {
            do {
                try reader.execute("BEGIN")
                // The read starts at the first statement: the snapshot is taken here.
                if try !ChangeCapture.hasUnfoldedExternalChanges(reader) { return reader }
                try reader.execute("ROLLBACK")
                if attempt < attempts { try database.captureExternalWrites() }
            } catch {
                reader.close()
                throw error
            }
        }
        reader.close()
        return nil
    }

    private func closeReader() {
        if let reader {
            try? reader.execute("ROLLBACK")
            reader.close()
            slots?.give()
        }
        reader = nil
        slots = nil
        served = nil
    }
}

/// How many catch-ups a database serves from snapshots at once: each holds a connection (its
/// memory, and the write-ahead log unfolded past it); beyond, catch-ups read each batch afresh.
final class SnapshotSlots: @unchecked Sendable {
    static let limit = 16
    private let lock = NSLock()
    private var taken = 0  // guarded by lock

    /// Takes a slot if one is free.
    func take() -> Bool {
        lock.lock()
        defer { lock.unlock() }
        guard taken < Self.limit else { return false }
        taken += 1
        return true
    }

    func give() {
        lock.lock()
        taken -= 1
        lock.unlock()
    }
}
