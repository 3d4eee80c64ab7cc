extension ChangeBatch {
    /// How one of a batch's tables goes into a cut of the batch (see ``cut(tables:changes:)``).
    public struct TableCut: Sendable {
        /// The table as the cut describes it (its names may differ: a peer's names for the columns).
        public var descriptor: TableDescriptor
        /// The value columns kept, by position in the batch's table, in the order `descriptor`
        /// lists them; nil keeps every one, in place.
        public var keptValues: [Int]?

        public init(descriptor: TableDescriptor, keptValues: [Int]? = nil) {
            self.descriptor = descriptor
            self.keptValues = keptValues
        }
    }

    /// This batch cut down: `tables` says, per table, whether it stays and as what (nil: its
    /// changes go); `changes`, when given, which changes of the tables kept stay — tables left
    /// with none are then dropped too. The cursor range and flags stay as they are.
    ///
    /// The one way a batch is cut to what a peer may receive or has: the tables it syncs, the
    /// columns it has, under its names.
    public func cut(tables cutting: (TableDescriptor) -> TableCut?, changes keeping: ((RowChange) -> Bool)? = nil)
        -> ChangeBatch
    {
        let cuts = tables.map(cutting)
        var keptChanges: [RowChange] = []
        keptChanges.reserveCapacity(changes.count)
        // Without a change filter every table kept stays, changes or not.
        var hasChanges = Array(repeating: keeping == nil, count: tables.count)
        for change in changes where cuts.indices.contains(change.table) && cuts[change.table] != nil {
            guard keeping?(change) ?? true else { continue }
            hasChanges[change.table] = true
            keptChanges.append(change)
        }
        var newIndex = Array(repeating: -1, count: tables.count)
        var descriptors: [TableDescriptor] = []
        for (index, cut) in cuts.enumerated() {
            guard let cut, hasChanges[index] else { continue }
            newIndex[index] = descriptors.count
            descriptors.append(cut.descriptor)
        }
        for position in keptChanges.indices {
            let table = keptChanges[position].table
            if let kept = cuts[table]?.keptValues {
                keptChanges[position] = keptChanges[position].keepingValues(at: kept)
            }
            keptChanges[position].table = newIndex[table]
        }
        return ChangeBatch(
            source: source, after: after, through: through, isLast: isLast, isResync: isResync,
            tables: descriptors, changes: keptChanges)
    }
}
