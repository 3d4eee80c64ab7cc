/// The state of one row as a peer sends it: its identity, whether it exists,
/// and every synced column's value with its version. Rows are sent whole,
/// however many times they changed since the last sync (compaction), so
/// applying a change never depends on having seen an earlier one.
public struct RowChange: Sendable, Hashable {
    /// Index into the batch's `tables`.
    public var table: Int
    /// The identity columns' values (primary key, or the secondary key of a
    /// table whose primary key is local).
    public var key: [DatabaseValue]
    /// False for a deleted row (a tombstone).
    public var isAlive: Bool
    /// The version of the row's existence: its latest insert if alive, its deletion if not.
    public var existence: Version
    /// The other synced columns' values, in the table descriptor's order.
    public var values: [DatabaseValue]
    /// One version per value; empty when every value has the existence
    /// version (a row inserted and not updated since: the common case).
    public var versions: [Version]

    /// The version of value `index`.
    @inlinable
    public func version(_ index: Int) -> Version { versions.isEmpty ? existence : versions[index] }
    /// The sender's sequence number for this change.
    public var sequence: Int64
    /// Per value column, whether its value was left out because the receiver should already hold
    /// it at its version (the batch format's partial changes): the value here is NULL, the version
    /// is real. A receiver that does not hold that version asks for whole rows. Empty: nothing left out.
    public var omitted: [Bool]

    /// Whether some value columns were left out.
    @inlinable
    public var isPartial: Bool { omitted.contains(true) }

    /// Set for an eviction: the row left the receiver's scope (partial replication). The receiver
    /// removes its copy without a tombstone and relays nothing; the row still exists at the sender.
    /// An eviction carries the key and the sender's existence version, no value, version or omitted
    /// flag, and `isAlive` false. Encoded only in batch format 2 (`BatchCoding`).
    public var isEvicted: Bool

    /// The eviction of the row `key` of table `table` (see `isEvicted`).
    public static func eviction(table: Int, key: [DatabaseValue], existence: Version, sequence: Int64) -> RowChange {
        RowChange(
            table: table, key: key, isAlive: false, existence: existence, values: [], versions: [], sequence: sequence,
            isEvicted: true)
    }

    /// The change with only the value columns at `positions`, in that order: their values,
    /// versions and omissions (a receiver lacking the others, or a peer not syncing them).
    public func keepingValues(at positions: [Int]) -> RowChange {
        var result = self
        result.values = positions.map { values[$0] }
        if !versions.isEmpty { result.versions = positions.map { versions[$0] } }
        if !omitted.isEmpty {
            let kept = positions.map { omitted[$0] }
            result.omitted = kept.contains(true) ? kept : []
        }
        return result
    }

    public init(
        table: Int, key: [DatabaseValue], isAlive: Bool, existence: Version, values: [DatabaseValue],
        versions: [Version], sequence: Int64,
        omitted: [Bool] = [], isEvicted: Bool = false
    ) {
        self.omitted = omitted
        self.isEvicted = isEvicted
        self.table = table
        self.key = key
        self.isAlive = isAlive
        self.existence = existence
        self.values = values
        self.versions = versions
        self.sequence = sequence
    }
}

/// A synced table as described in a batch: the receiver maps columns by name.
public struct TableDescriptor: Sendable, Hashable {
    public var name: String
    public var keyColumns: [String]
    public var valueColumns: [String]
    public init(name: String, keyColumns: [String], valueColumns: [String]) {
        self.name = name
        self.keyColumns = keyColumns
        self.valueColumns = valueColumns
    }
}

/// Where `ChangeBatch.decodedFrom` is kept: equal to any other, so that a batch's equality is its content's.
struct DecodedBytes: Sendable, Hashable {
    var bytes: [UInt8]? = nil

    static func == (_: DecodedBytes, _: DecodedBytes) -> Bool { true }
    func hash(into hasher: inout Hasher) {}
}

/// Changes one database sends another, in sequence order: the unit of
/// transfer, the same over the network and in sync files.
public struct ChangeBatch: Sendable, Hashable {
    // Every field drops `decodedFrom` when changed: those bytes no longer encode the batch. (A
    // `didSet` that does not read `oldValue` still lets a field be changed in place.)
    /// The database that made this batch.
    public var source: InstanceKey { didSet { decoded = DecodedBytes() } }
    /// The changes follow the sender's sequence `after` (exclusive)…
    public var after: Int64 { didSet { decoded = DecodedBytes() } }
    /// …up to and including `through`: the receiver's cursor moves there once applied.
    public var through: Int64 { didSet { decoded = DecodedBytes() } }
    /// True when the sender has nothing after `through` (at the time it was made).
    public var isLast: Bool { didSet { decoded = DecodedBytes() } }
    /// Set when the receiver's cursor is older than the sender's collected history:
    /// this batch starts a full resync of every synced table.
    public var isResync: Bool { didSet { decoded = DecodedBytes() } }
    public var tables: [TableDescriptor] { didSet { decoded = DecodedBytes() } }
    public var changes: [RowChange] { didSet { decoded = DecodedBytes() } }
    /// The bytes `BatchCoding.decode` read this batch from, as long as no field has changed since
    /// (nil for a batch made otherwise): a receiver keeping the batch on disk stores them rather
    /// than encoding it again. Not part of the batch's equality.
    public var decodedFrom: [UInt8]? { decoded.bytes }
    var decoded = DecodedBytes()

    /// Whether some change is an eviction (the batch then needs format 2 to be encoded).
    public var containsEvictions: Bool { changes.contains { $0.isEvicted } }

    public init(
        source: InstanceKey, after: Int64, through: Int64, isLast: Bool, isResync: Bool = false,
        tables: [TableDescriptor], changes: [RowChange]
    ) {
        self.source = source
        self.after = after
        self.through = through
        self.isLast = isLast
        self.isResync = isResync
        self.tables = tables
        self.changes = changes
    }
}

extension ChangeBatch {
    /// Checks every rule the batch alone can show (Protocol/README.md §7.2, "Checked from the
    /// batch alone"): 0 ≤ `after` ≤ `through`; table names distinct, each table with a key column
    /// and no column named twice; each change naming a described table, with one key value per
    /// key column, one value per value column, one version per value or none, one omitted flag
    /// per value or none (and then at least one set); sequence numbers strictly increasing within
    /// (`after`, `through`]. Decoders run it on what they decode, `apply` on every batch (one
    /// built in code too), and the wire encoder on what it sends. What needs the receiver's state
    /// (its synced columns, its clock) is the receiver's to check. An eviction (`RowChange.isEvicted`)
    /// carries its key alone: no value, version or omitted flag, and it is not alive.
    public func validate() throws(BatchValidationError) {
        guard after >= 0, after <= through else { throw .invalidRange(after: after, through: through) }
        var names: [String: Int] = [:]
        names.reserveCapacity(tables.count)
        for (index, table) in tables.enumerated() {
            if let first = names.updateValue(index, forKey: table.name) {
                throw .tableNamedTwice(name: table.name, first: first, second: index)
            }
            guard !table.keyColumns.isEmpty else { throw .tableWithoutKey(name: table.name, index: index) }
            var columns = Set<String>()
            for column in table.keyColumns + table.valueColumns where !columns.insert(column).inserted {
                throw .columnNamedTwice(table: table.name, index: index, column: column)
            }
        }
        var previous = after
        for (index, change) in changes.enumerated() {
            guard tables.indices.contains(change.table) else {
                throw .unknownTable(change: index, table: change.table, tableCount: tables.count)
            }
            let table = tables[change.table]
            let valueCount = table.valueColumns.count
            func expect(_ part: BatchValidationError.ChangePart, _ count: Int, _ expected: Int, orNone: Bool = false)
                throws(BatchValidationError)
            {
                guard count == expected || (orNone && count == 0) else {
                    throw .wrongCount(change: index, table: table.name, part: part, count: count, expected: expected)
                }
            }
            try expect(.keyValues, change.key.count, table.keyColumns.count)
            if change.isEvicted {
                guard !change.isAlive, change.values.isEmpty, change.versions.isEmpty, change.omitted.isEmpty else {
                    throw .evictionWithRowState(change: index, table: table.name)
                }
            } else {
                try expect(.values, change.values.count, valueCount)
            }
            try expect(.versions, change.versions.count, valueCount, orNone: true)
            try expect(.omittedFlags, change.omitted.count, valueCount, orNone: true)
            guard change.omitted.isEmpty || change.isPartial else {
                throw .partialLeavesNothingOut(change: index, table: table.name)
            }
            guard change.sequence > after, change.sequence <= through else {
                throw .sequenceOutOfRange(
                    change: index, table: table.name, sequence: change.sequence, after: after, through: through)
            }
            guard change.sequence > previous else {
                throw .sequenceNotIncreasing(
                    change: index, table: table.name, sequence: change.sequence, previous: previous)
            }
            previous = change.sequence
        }
    }
}
