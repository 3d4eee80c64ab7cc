import Tether

/// The changes this side sent that the peer may still refuse (REFUSED, §6.11): from the batches it
/// has not settled yet, when it sends this side part of some table (a peer whose policy scopes this
/// side's writes says so in SCOPE, and may refuse any change of a scoped writer). A refusal is a
/// claim about one of them, matched by table, key and sequence number, and taken once; anything else
/// is a protocol violation, so that no peer can make this side drop a row it was never sent.
struct RefusableChanges {
    private struct Sent: Hashable {
        var table: String
        var key: [DatabaseValue]
        var sequence: Int64
    }

    /// Per batch sent, in order: its `through` (nil for a backfill, which is not acknowledged) and
    /// its changes the peer may refuse.
    private var batches: [(through: Int64?, changes: Set<Sent>)] = []

    /// `batch` went to the peer, which may refuse its changes.
    mutating func sent(_ batch: ChangeBatch, isBackfill: Bool) {
        var changes = Set<Sent>()
        for change in batch.changes where !change.isEvicted {
            changes.insert(Sent(table: batch.tables[change.table].name, key: change.key, sequence: change.sequence))
        }
        if !changes.isEmpty { batches.append((isBackfill ? nil : batch.through, changes)) }
    }

    /// The peer acknowledged through `sequence`: it sent the refusals of those batches before.
    mutating func acknowledged(through sequence: Int64) {
        batches.removeAll { $0.through.map { $0 <= sequence } == true }
    }

    /// The peer pulled again after a backfill: it applied the backfill, and sent its refusals, first.
    mutating func pulledAfterBackfill() {
        batches.removeAll { $0.through == nil }
    }

    /// The peer deferred the batches not yet acknowledged (DEFERRED, §6.9): it applied none of them.
    mutating func deferred() {
        batches.removeAll { $0.through != nil }
    }

    /// Takes `refusal` if it names a change sent and not yet settled; false if it does not.
    mutating func take(_ refusal: RefusedChange) -> Bool {
        let sent = Sent(table: refusal.table, key: refusal.key, sequence: refusal.sequence)
        guard let index = batches.firstIndex(where: { $0.changes.contains(sent) }) else { return false }
        batches[index].changes.remove(sent)
        return true
    }
}
