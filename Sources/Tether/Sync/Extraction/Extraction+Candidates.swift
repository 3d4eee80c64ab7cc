// What becomes of each row the readers read — the one decision every source shares — and the batch
// cut from the candidates.

import CSQLite
import Foundation

extension Extraction {
    /// A row read that goes as it is: its key and values, and what it does to what a scoped peer holds.
    struct Admitted {
        var key: [DatabaseValue]
        var values: [DatabaseValue]
        let step: ScopedExtraction.Step?
    }

    /// Decides the row `sequence` of `table`, the current row of `handle` (key and value columns
    /// first): nil when it is left out — as an echo (`isEcho`), by a backfill, or by the scope
    /// (`place`, where the row stands with a scoped peer; nil for a table the scope does not name)
    /// — its candidate collected here, with the eviction the scope sends in its place (counted in
    /// `stream`'s bytes); otherwise the row to send, for the reader to collect.
    mutating func admit(
        _ sequence: Int64, of table: TableRead, isEcho: Bool, place: ScopedExtraction.Place?,
        leavingOut omitted: [Bool] = [], _ handle: OpaquePointer, _ stream: inout Stream
    ) -> Admitted? {
        guard let (isSent, readRow) = screen(isEcho: isEcho, handle, table) else {
            candidates.append(Candidate(table: table.index, sequence: sequence, change: nil))
            return nil
        }
        var step: ScopedExtraction.Step?
        if let place {
            let decision = place.decision(isSent: isSent)
            step = ScopedExtraction.step(of: decision, place, handle)
            if decision.sent != .asIs {
                var eviction: RowChange?
                var size = 0
                if decision.sent == .eviction {
                    let key = readRow?.key ?? Self.readColumns(handle, from: 0, count: table.keyCount)
                    let change = RowChange.eviction(
                        table: table.index, key: key,
                        existence: Version(timestamp: .zero, origin: engine.instanceKey),
                        sequence: sequence)
                    size = Self.estimatedSize(change)
                    eviction = change
                }
                stream.bytes += size
                // Built in the call: a candidate held in a variable was copied into the array.
                candidates.append(
                    Candidate(
                        table: table.index, sequence: sequence, change: eviction, size: size,
                        step: step))
                return nil
            }
        }
        guard var row = readRow else {
            let row = Self.readKeyAndValues(handle, table, leavingOut: omitted)
            return Admitted(key: row.key, values: row.values, step: step)
        }
        for (index, left) in omitted.enumerated() where left { row.values[index] = .null }
        return Admitted(key: row.key, values: row.values, step: step)
    }

    /// Whether a row read is sent as far as echoes and a backfill go, and the row when the
    /// backfill's check read it; nil when it is left out and nothing is to be decided of it (an
    /// echo, or a row a backfill does not send, of a table the scope does not name).
    private func screen(isEcho: Bool, _ handle: OpaquePointer, _ table: TableRead)
        -> (isSent: Bool, readRow: (key: [DatabaseValue], values: [DatabaseValue])?)?
    {
        if isEcho { return table.scoped == nil ? nil : (false, nil) }
        guard table.backfillColumns != nil else { return (true, nil) }
        let row = Self.readKeyAndValues(handle, table)
        if table.isBackfilled(row.values) { return (true, row) }
        return table.scoped == nil ? nil : (false, row)
    }

    /// Collects `change`, read by `stream`'s reader, with its membership `step`. Both are consumed:
    /// moved into the candidate, not copied (a change holds four arrays, each retained by a copy).
    mutating func collect(
        _ change: consuming RowChange, step: consuming ScopedExtraction.Step?,
        _ stream: inout Stream
    ) {
        let size = Self.estimatedSize(change)
        stream.bytes += size
        candidates.append(
            Candidate(
                table: change.table, sequence: change.sequence, change: change, size: size,
                step: step))
    }

    /// The batch cut from the candidates (sorted by sequence) at the batch's limits or the horizon.
    struct Cut {
        var changes: [RowChange] = []
        var through: Int64
        var isLast = false
        /// For a scoped peer: the rows the batch reaches (empty for another).
        var window: ScopedExtraction.Window
    }

    /// Cuts the batch from the candidates, sorted by sequence: they are moved into it.
    mutating func cutBatch() -> Cut {
        var cut = Cut(through: cursor, window: ScopedExtraction.Window(tableCount: scoped == nil ? 0 : tables.count))
        cut.changes.reserveCapacity(min(candidates.count, limits.maximumChanges))
        var bytes = 0
        var stoppedEarly = false
        // Only the expiry store's entries can be refused below: its table found once, not per change.
        let expiryTable = tables.firstIndex { $0.name == ExpiryStore.syncedTable }
        for index in candidates.indices {
            let sequence = candidates[index].sequence
            if sequence > horizon || cut.changes.count >= limits.maximumChanges
                || (bytes >= limits.maximumBytes && !cut.changes.isEmpty)
            {
                stoppedEarly = true
                break
            }
            cut.through = sequence
            if scoped != nil {
                // The fields read one by one: a candidate read whole as an argument was copied.
                let table = candidates[index].table
                let step = candidates[index].step
                cut.window.reach(table, sequence: sequence, step: step)
            }
            guard let change = candidates[index].change.take() else { continue }
            // An expiry entry stored before entries were checked on arrival is never relayed.
            if change.table == expiryTable,
                ExpiryStore.refusal(of: change, describedBy: tables[change.table].descriptor, engine) != nil
            {
                continue
            }
            bytes += candidates[index].size
            cut.changes.append(change)
        }
        // Without more rows anywhere, the cursor can move to the end of the log.
        cut.isLast = exhausted && !stoppedEarly
        if cut.isLast {
            let end = request.backfill?.through ?? logEnd
            cut.through = max(cut.through, end)
        }
        return cut
    }
}
