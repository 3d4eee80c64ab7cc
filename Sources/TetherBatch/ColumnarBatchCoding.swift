import Foundation

/// Batch format 3, columnar (Protocol/README.md §7.5): the same batch as formats 1 and 2, laid out
/// column by column so that what repeats from row to row costs next to nothing. Summary:
///
///     "TB" 0x03, source, after, through, flags, sites, tables     as in format 1
///     changeCount   uvarint
///     then, when changeCount > 0, five integer columns of changeCount values:
///         table indices, sequences, change flags (format 2's), existence timestamps, existence sites
///     then per table, over its changes in batch order:
///         per key column          a value column of every change's key value
///         per value column        omitted   integer column (0 or 1), one per partial change
///                                 values    a value column of the values sent (not evicted, not left out)
///                                 versions  two integer columns, one value per change without uniform
///                                           versions: timestamp − existence timestamp, site index
///     integer column   nothing when empty, else a mode byte then the values:
///                      0 plain zigzag, 1 zigzag deltas, 2 runs of equal deltas (uvarint length, zigzag
///                      delta), 3 eight bytes little-endian, 4 runs of equal values (uvarint length, zigzag value)
///     value column     tags (integer column), then the integers, the reals' bit patterns (integer
///                      columns), the texts and the blobs (string columns) in that order
///     string column    shared prefix lengths, suffix lengths (integer columns), then the suffixes' bytes
///
/// A run of equal values or a shared prefix takes a few bytes however much it expands to, so the
/// bytes no longer bound what decoding allocates: `ColumnarLimits` does, checked before allocating.
///
/// Format 4 (§7.6) is format 3 with compact values: a real with a whole value is written as that
/// integer (value tag 5, in the integers column), and a string column whose strings repeat may be
/// a dictionary of its distinct strings and an index per value (a layout byte says which).
extension BatchCoding {
    /// The magic of format 3, columnar: sent only to a peer that announced `columnarBatches`.
    public static let columnarMagic: [UInt8] = [0x54, 0x42, 0x03]
    /// The number of the columnar format (`maximumFormat` to pass to read it).
    public static let columnarFormat: UInt8 = 3
    /// The magic of format 4, columnar with compact values: sent only to a peer that announced
    /// `columnarBatches` and `compactColumns`.
    public static let compactColumnarMagic: [UInt8] = [0x54, 0x42, 0x04]
    /// The number of the columnar format with compact values (`maximumFormat` to pass to read it).
    public static let compactColumnarFormat: UInt8 = 4

    /// `batch` in format 3 (4 when `compact`), or nil when it would decode to more than `limits`
    /// allow (the caller then sends it in format 1 or 2, which every peer reads). Checks
    /// `ChangeBatch.validate()` first: the columns are cut by the table's counts, which an invalid
    /// change would contradict.
    public static func encodeColumnar(_ batch: ChangeBatch, limits: ColumnarLimits = .default, compact: Bool = false)
        throws(BatchValidationError) -> [UInt8]?
    {
        try batch.validate()
        guard ColumnarSize(batch).fits(limits) else { return nil }
        var writer = ByteWriter()
        writer.bytes.reserveCapacity(256 + batch.changes.count * 4)
        writer.append(compact ? compactColumnarMagic : columnarMagic)
        var siteIndex = writeHeader(of: batch, into: &writer)
        let changes = batch.changes
        writer.uvarint(UInt64(changes.count))
        guard !changes.isEmpty else { return writer.bytes }

        let flags = changes.map(ColumnarFlags.of)
        writer.integerColumn(changes.map { Int64($0.table) })
        writer.integerColumn(changes.map(\.sequence))
        writer.integerColumn(flags.map { Int64($0.rawValue) })
        writer.integerColumn(changes.map { Int64(bitPattern: $0.existence.timestamp.rawValue) })
        writer.integerColumn(changes.map { Int64(siteIndex[$0.existence.origin] ?? 0) })

        var members = [[Int]](repeating: [], count: batch.tables.count)
        for (index, change) in changes.enumerated() { members[change.table].append(index) }
        for (tableIndex, table) in batch.tables.enumerated() {
            let all = members[tableIndex]
            guard !all.isEmpty else { continue }
            for column in table.keyColumns.indices {
                writer.valueColumn(all.lazy.map { changes[$0].key[column] }, compact: compact)
            }
            let live = all.filter { !flags[$0].contains(.evicted) }
            let partial = live.filter { flags[$0].contains(.partial) }
            let versioned = live.filter { !flags[$0].contains(.uniform) }
            for column in table.valueColumns.indices {
                writer.integerColumn(partial.map { changes[$0].omitted[column] ? 1 : 0 })
                let sent = live.filter { !flags[$0].contains(.partial) || !changes[$0].omitted[column] }
                writer.valueColumn(sent.lazy.map { changes[$0].values[column] }, compact: compact)
                writer.integerColumn(
                    versioned.map {
                        Int64(
                            bitPattern: changes[$0].versions[column].timestamp.rawValue
                                &- changes[$0].existence.timestamp.rawValue)
                    })
                writer.integerColumn(versioned.map { Int64(siteIndex[changes[$0].versions[column].origin] ?? 0) })
            }
        }
        return writer.bytes
    }

    /// The body of a format 3 batch (4 when `compact`), after its header.
    static func decodeColumnarChanges(
        _ reader: inout ByteReader, header: BatchHeader, limits: ColumnarLimits, compact: Bool
    ) throws(BatchDecodingError) -> ChangeBatch {
        let tables = header.tables
        let declared = try reader.uvarint()
        // Each change counts as a value: its count is bounded before any column is read.
        guard declared <= UInt64(limits.maxValues) else {
            throw reader.failure(
                "\(declared) changes, above the limit of \(limits.maxValues) values a batch decodes to")
        }
        let count = Int(declared)
        var changes: [RowChange] = []
        if count > 0 {
            let tableColumn = try reader.integerColumn(count: count, "the changes' tables")
            let sequences = try reader.integerColumn(count: count, "the changes' sequences")
            let flagColumn = try reader.integerColumn(count: count, "the changes' flags")
            let timestamps = try reader.integerColumn(count: count, "the changes' existence timestamps")
            let siteColumn = try reader.integerColumn(count: count, "the changes' existence sites")

            // Where each change's values sit in its table's columns, and what they add up to.
            var parts = tables.map { _ in TablePart() }
            var places: [ChangePlace] = []
            places.reserveCapacity(count)
            var values = 0
            for index in 0..<count {
                let table = tableColumn[index]
                guard table >= 0, table < tables.count else {
                    throw reader.failure("change \(index) refers to table \(table) of \(tables.count)")
                }
                let raw = flagColumn[index]
                guard raw >= 0, raw <= 15 else {
                    throw reader.failure("change \(index) has unknown change flags \(raw)")
                }
                let flags = ColumnarFlags(rawValue: UInt8(raw))
                if flags.contains(.evicted), flags != [.evicted, .uniform] {
                    throw reader.failure(
                        "change \(index), an eviction of \(tables[Int(table)].name), has change flags \(raw), not 10")
                }
                let site = siteColumn[index]
                guard site >= 0, site < header.sites.count else {
                    throw reader.failure("change \(index) names site \(site) of \(header.sites.count)")
                }
                let place = parts[Int(table)].add(flags)
                places.append(place)
                let descriptor = tables[Int(table)]
                values +=
                    1 + descriptor.keyColumns.count
                    + (place.live >= 0 ? descriptor.valueColumns.count : 0)
                    + (place.versioned >= 0 ? descriptor.valueColumns.count : 0)
                guard values <= limits.maxValues else {
                    throw reader.failure(
                        """
                        the changes decode to more than the limit of \(limits.maxValues) values (exceeded at \
                        change \(index))
                        """)
                }
            }

            var budget = limits.maxValueBytes
            for (tableIndex, table) in tables.enumerated() where parts[tableIndex].count > 0 {
                try parts[tableIndex].read(table, &reader, sites: header.sites, compact: compact, budget: &budget)
            }

            changes.reserveCapacity(count)
            for index in 0..<count {
                let tableIndex = Int(tableColumn[index])
                let part = parts[tableIndex]
                let place = places[index]
                let existence = Version(
                    timestamp: HybridTimestamp(rawValue: UInt64(bitPattern: timestamps[index])),
                    origin: header.sites[Int(siteColumn[index])])
                let key = part.keys.map { $0[place.position] }
                guard place.live >= 0 else {
                    changes.append(
                        .eviction(table: tableIndex, key: key, existence: existence, sequence: sequences[index]))
                    continue
                }
                let omitted = place.partial >= 0 ? part.omitted.map { $0[place.partial] } : []
                guard place.partial < 0 || omitted.contains(true) else {
                    throw reader.failure(
                        "change \(index), a partial change of \(tables[tableIndex].name), leaves no column out")
                }
                var versions: [Version] = []
                if place.versioned >= 0 {
                    versions.reserveCapacity(part.versions.count)
                    for column in part.versions {
                        let relative = column[place.versioned]
                        versions.append(
                            Version(
                                timestamp: HybridTimestamp(
                                    rawValue: existence.timestamp.rawValue &+ relative.timestamp.rawValue),
                                origin: relative.origin))
                    }
                }
                changes.append(
                    RowChange(
                        table: tableIndex, key: key, isAlive: place.isAlive, existence: existence,
                        values: part.values.map { $0[place.live] }, versions: versions, sequence: sequences[index],
                        omitted: omitted))
            }
        }
        guard reader.isAtEnd else { throw reader.failure("\(reader.remaining) unexpected byte(s) after the batch") }
        return ChangeBatch(
            source: header.source, after: header.after, through: header.through, isLast: header.isLast,
            isResync: header.isResync, tables: tables, changes: changes)
    }
}

/// What a columnar batch (format 3) may decode to. In formats 1 and 2 every value takes a byte at
/// least, so the bytes bound what decoding allocates; in format 3 a run of a million equal values
/// or a string sharing its predecessor's prefix takes a few, so these bounds are stated and checked
/// before allocating. An encoder writes in format 3 only a batch within them.
public struct ColumnarLimits: Sendable, Hashable {
    /// The most values a batch decodes to: one per change, plus one per key value, value
    /// (left out or not) and version.
    public var maxValues: Int
    /// The most bytes of text and blob (key values and values together) a batch decodes to.
    public var maxValueBytes: Int

    public static let `default` = ColumnarLimits()

    public init(maxValues: Int = 1 << 22, maxValueBytes: Int = 64 << 20) {
        self.maxValues = max(0, maxValues)
        self.maxValueBytes = max(0, maxValueBytes)
    }
}

/// What a batch decodes to, counted as `ColumnarLimits` counts it.
private struct ColumnarSize {
    var values = 0
    var valueBytes = 0

    init(_ batch: ChangeBatch) {
        for change in batch.changes {
            values += 1 + change.key.count + change.values.count + change.versions.count
            for value in change.key { valueBytes += Self.bytes(of: value) }
            for (index, value) in change.values.enumerated() where change.omitted.isEmpty || !change.omitted[index] {
                valueBytes += Self.bytes(of: value)
            }
        }
    }

    func fits(_ limits: ColumnarLimits) -> Bool { values <= limits.maxValues && valueBytes <= limits.maxValueBytes }

    private static func bytes(of value: DatabaseValue) -> Int {
        switch value {
        case let .text(text): return text.utf8.count
        case let .blob(data): return data.count
        case .null, .integer, .real: return 0
        }
    }
}

/// A change's flags, as format 2 writes them and format 3 keeps them in a column.
struct ColumnarFlags: OptionSet {
    let rawValue: UInt8
    static let alive = ColumnarFlags(rawValue: 1)
    static let uniform = ColumnarFlags(rawValue: 2)
    static let partial = ColumnarFlags(rawValue: 4)
    static let evicted = ColumnarFlags(rawValue: 8)

    init(rawValue: UInt8) { self.rawValue = rawValue }

    /// The flags format 2 writes for `change` (a function, not an initializer, so that the change
    /// is borrowed rather than copied).
    static func of(_ change: RowChange) -> ColumnarFlags {
        if change.isEvicted { return [.evicted, .uniform] }
        var flags: ColumnarFlags = change.isAlive ? .alive : []
        if change.versions.allSatisfy({ $0 == change.existence }) { flags.insert(.uniform) }
        if change.omitted.count == change.values.count, change.isPartial { flags.insert(.partial) }
        return flags
    }
}

/// Where a change's values sit in its table's columns: its place among the table's changes,
/// among those not evicted, the partial ones and those with versions of their own (-1: not one).
private struct ChangePlace {
    var position: Int
    var live: Int
    var partial: Int
    var versioned: Int
    var isAlive: Bool
}

/// One table's columns, as decoded.
private struct TablePart {
    var count = 0
    var liveCount = 0
    var partialCount = 0
    var versionedCount = 0
    /// Per change not evicted, its place among the partial changes (-1: not partial).
    var partialOfLive: [Int] = []
    var keys: [[DatabaseValue]] = []
    /// Per value column, one value per change not evicted (NULL where left out).
    var values: [[DatabaseValue]] = []
    /// Per value column, one flag per partial change.
    var omitted: [[Bool]] = []
    /// Per value column, one version per change with versions of its own.
    var versions: [[Version]] = []

    mutating func add(_ flags: ColumnarFlags) -> ChangePlace {
        defer { count += 1 }
        guard !flags.contains(.evicted) else {
            return ChangePlace(position: count, live: -1, partial: -1, versioned: -1, isAlive: false)
        }
        var place = ChangePlace(
            position: count, live: liveCount, partial: -1, versioned: -1, isAlive: flags.contains(.alive))
        liveCount += 1
        if flags.contains(.partial) {
            place.partial = partialCount
            partialCount += 1
        }
        partialOfLive.append(place.partial)
        if !flags.contains(.uniform) {
            place.versioned = versionedCount
            versionedCount += 1
        }
        return place
    }

    mutating func read(
        _ table: TableDescriptor, _ reader: inout ByteReader, sites: [InstanceKey], compact: Bool, budget: inout Int
    ) throws(BatchDecodingError) {
        for column in table.keyColumns {
            keys.append(
                try reader.valueColumn(
                    count: count, "key column \(column) of \(table.name)", compact: compact, budget: &budget))
        }
        for column in table.valueColumns {
            let name = "column \(column) of \(table.name)"
            let flags = try reader.integerColumn(count: partialCount, "the omitted flags of \(name)")
            var left: [Bool] = []
            left.reserveCapacity(partialCount)
            for flag in flags {
                guard flag == 0 || flag == 1 else {
                    throw reader.failure("an omitted flag of \(name) is \(flag), not 0 or 1")
                }
                left.append(flag == 1)
            }
            let sent = try reader.valueColumn(
                count: liveCount - left.count(where: { $0 }), name, compact: compact, budget: &budget)
            // Back to one value per change not evicted, NULL for those left out.
            var full: [DatabaseValue] = []
            full.reserveCapacity(liveCount)
            var nextSent = 0
            for partial in partialOfLive {
                if partial >= 0, left[partial] {
                    full.append(.null)
                } else {
                    full.append(sent[nextSent])
                    nextSent += 1
                }
            }
            values.append(full)
            omitted.append(left)
            // Timestamps stay relative to the existence timestamp here: the change adds its own.
            let offsets = try reader.integerColumn(count: versionedCount, "the version timestamps of \(name)")
            let origins = try reader.integerColumn(count: versionedCount, "the version sites of \(name)")
            var columnVersions: [Version] = []
            columnVersions.reserveCapacity(versionedCount)
            for (offset, origin) in zip(offsets, origins) {
                guard origin >= 0, origin < sites.count else {
                    throw reader.failure("a version of \(name) names site \(origin) of \(sites.count)")
                }
                columnVersions.append(
                    Version(
                        timestamp: HybridTimestamp(rawValue: UInt64(bitPattern: offset)), origin: sites[Int(origin)]))
            }
            versions.append(columnVersions)
        }
    }
}
