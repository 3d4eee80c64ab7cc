import Foundation

/// The binary form of a `ChangeBatch`, shared by sync files and the wire
/// protocol (which carries it as a message payload). Specified in
/// Protocol/ (batch encoding); summary:
///
///     "TB" 0x01                       magic and format version (0x02: the batch holds an eviction;
///                                     0x03: columnar, `encodeColumnar`, ColumnarBatchCoding.swift;
///                                     0x04: columnar with compact values, the same)
///     source        16 bytes
///     after, through                 uvarint
///     flags         1 byte           bit 0 isLast, bit 1 isResync
///     sites         uvarint count, 16 bytes each (origins referenced below)
///     tables        uvarint count; each: name, key column names, value column names
///     changes       uvarint count; each:
///         table index   uvarint
///         sequence      zigzag varint, delta from the previous change's
///         flags         1 byte: bit 0 alive, bit 1 every version equals existence, bit 2 partial,
///                       bit 3 evicted (format 2 only: then bits 0 and 2 are clear, bit 1 set, and
///                       the key values are all that follow the existence)
///         existence     timestamp (zigzag delta from the previous change's), site index
///         key values
///         omitted       only with bit 2: a bitmap of the value columns left out, ceil(v / 8) bytes
///         values        those not left out (counts from the table)
///         versions      unless bit 1: per value column (left out or not), timestamp (zigzag delta from
///                       existence), site index
///     value         tag 0 NULL | 1 integer (zigzag varint) | 2 real (8 bytes LE) | 3 text | 4 blob
///     text, blob, names: uvarint length then bytes (UTF-8 for text)
///
/// Decoding checks every count and length against the bytes that remain, so
/// a hostile input can neither crash the decoder nor make it allocate more
/// than the input's size; what decodes is then checked by `ChangeBatch.validate()`.
///
/// Format 2 differs from format 1 only by the evicted flag (bit 3 of a change's flags). A batch
/// without eviction is always written in format 1, byte for byte as before format 2 existed, so
/// that a peer that knows only format 1 reads it; one with an eviction is written in format 2,
/// which such a peer refuses by its magic (a session must not send it one: see `containsEvictions`).
public enum BatchCoding {
    public static let magic: [UInt8] = [0x54, 0x42, 0x01]
    /// The magic of format 2, which adds evictions.
    public static let evictionMagic: [UInt8] = [0x54, 0x42, 0x02]
    /// The latest format this code reads and writes (4, columnar with compact values: `encodeColumnar`).
    public static let latestFormat: UInt8 = compactColumnarFormat

    /// The format `encode` writes `batch` in: 1 unless it holds an eviction.
    public static func format(of batch: ChangeBatch) -> UInt8 { batch.containsEvictions ? 2 : 1 }

    public static func encode(_ batch: ChangeBatch) -> [UInt8] {
        var writer = ByteWriter()
        writer.bytes.reserveCapacity(64 + batch.changes.count * 32)
        writer.append(batch.containsEvictions ? evictionMagic : magic)
        var siteIndex = writeHeader(of: batch, into: &writer)

        writer.uvarint(UInt64(batch.changes.count))
        var previousSequence: Int64 = batch.after
        var previousTimestamp: UInt64 = 0
        for change in batch.changes {
            writer.uvarint(UInt64(change.table))
            writer.zigzag(change.sequence &- previousSequence)
            previousSequence = change.sequence
            if change.isEvicted {
                // The key alone: the row leaves the receiver, whatever its values.
                writer.byte(8 | 2)
                let existence = change.existence.timestamp.rawValue
                writer.zigzag(Int64(bitPattern: existence &- previousTimestamp))
                previousTimestamp = existence
                writer.uvarint(UInt64(siteIndex[change.existence.origin] ?? 0))
                for value in change.key { writer.value(value) }
                continue
            }
            let partial = change.omitted.count == change.values.count && change.isPartial
            let sent = { (index: Int) in !partial || !change.omitted[index] }
            let uniform = change.versions.allSatisfy { $0 == change.existence }
            writer.byte((change.isAlive ? 1 : 0) | (uniform ? 2 : 0) | (partial ? 4 : 0))
            let existence = change.existence.timestamp.rawValue
            writer.zigzag(Int64(bitPattern: existence &- previousTimestamp))
            previousTimestamp = existence
            writer.uvarint(UInt64(siteIndex[change.existence.origin] ?? 0))
            for value in change.key { writer.value(value) }
            if partial {
                var bitmap = [UInt8](repeating: 0, count: (change.values.count + 7) / 8)
                for (index, left) in change.omitted.enumerated() where left {
                    bitmap[index / 8] |= 1 << UInt8(index % 8)
                }
                writer.append(bitmap)
            }
            for (index, value) in change.values.enumerated() where sent(index) { writer.value(value) }
            if !uniform {
                for version in change.versions {
                    writer.zigzag(Int64(bitPattern: version.timestamp.rawValue &- existence))
                    writer.uvarint(UInt64(siteIndex[version.origin] ?? 0))
                }
            }
        }
        return writer.bytes
    }

    /// The batch `bytes` encode, which must keep the rules of `ChangeBatch.validate()`. A format
    /// after `maximumFormat` is refused as a bad magic, as before format 2 existed: a reader that
    /// takes evictions (a session that agreed on them) passes 2, one that takes columnar batches
    /// too (a session that agreed on them) `columnarFormat`, or `compactColumnarFormat` with
    /// compact values, and bounds what it expands to by `columnarLimits`.
    public static func decode(
        _ bytes: [UInt8], maximumFormat: UInt8 = 1,
        columnarLimits: ColumnarLimits = .default
    ) throws(BatchDecodingError) -> ChangeBatch {
        var batch = try decodeWithoutValidating(bytes, maximumFormat: maximumFormat, columnarLimits: columnarLimits)
        do { try batch.validate() } catch { throw .invalid(error) }
        batch.decoded = DecodedBytes(bytes: bytes)
        return batch
    }

    /// The batch `bytes` encode, without `ChangeBatch.validate()`: for a batch a database stored
    /// itself after validating it, such as a kept-aside change (kept as a batch of that one
    /// change with `after` and `through` 0, the change keeping its sender's sequence number).
    public static func decodeWithoutValidating(
        _ bytes: [UInt8], maximumFormat: UInt8 = 1,
        columnarLimits: ColumnarLimits = .default
    ) throws(BatchDecodingError) -> ChangeBatch {
        // withUnsafeBytes only rethrows untyped errors: carry the typed one out in a Result.
        let result = bytes.withUnsafeBytes { buffer -> Result<ChangeBatch, BatchDecodingError> in
            var reader = ByteReader(buffer)
            do throws(BatchDecodingError) {
                return .success(try decode(&reader, maximumFormat: maximumFormat, columnarLimits: columnarLimits))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    private static func decode(_ reader: inout ByteReader, maximumFormat: UInt8, columnarLimits: ColumnarLimits)
        throws(BatchDecodingError) -> ChangeBatch
    {
        let magicBytes = try reader.bytes(3)
        let format: UInt8
        if magicBytes == magic[...] {
            format = 1
        } else if magicBytes == evictionMagic[...] && maximumFormat >= 2 {
            format = 2
        } else if magicBytes == columnarMagic[...] && maximumFormat >= columnarFormat {
            format = columnarFormat
        } else if magicBytes == compactColumnarMagic[...] && maximumFormat >= compactColumnarFormat {
            format = compactColumnarFormat
        } else {
            throw reader.failure("not a Tether change batch (bad magic or format version)")
        }
        let header = try readHeader(&reader)
        if format >= columnarFormat {
            return try decodeColumnarChanges(
                &reader, header: header, limits: columnarLimits, compact: format == compactColumnarFormat)
        }
        let knownChangeFlags: UInt8 = format >= 2 ? 15 : 7
        let sites = header.sites
        let tables = header.tables
        let after = header.after

        let changeCount = try reader.count(minimumElementSize: 4)
        var changes: [RowChange] = []
        changes.reserveCapacity(changeCount)
        var previousSequence = after
        var previousTimestamp: UInt64 = 0
        for _ in 0..<changeCount {
            let tableIndex = try reader.uvarint()
            // The table says how many values follow: without it the bytes cannot be read on.
            guard tableIndex < UInt64(tables.count) else {
                throw reader.failure("change refers to table \(tableIndex) of \(tables.count)")
            }
            let table = tables[Int(tableIndex)]
            let sequence = previousSequence &+ (try reader.zigzag())
            previousSequence = sequence
            let changeFlags = try reader.byte()
            guard changeFlags & ~knownChangeFlags == 0 else {
                throw reader.failure("unknown change flags \(changeFlags)")
            }
            let existenceTimestamp = previousTimestamp &+ UInt64(bitPattern: try reader.zigzag())
            previousTimestamp = existenceTimestamp
            let existence = Version(
                timestamp: HybridTimestamp(rawValue: existenceTimestamp), origin: try site(&reader, sites))
            var key: [DatabaseValue] = []
            key.reserveCapacity(table.keyColumns.count)
            for _ in table.keyColumns { key.append(try reader.value()) }
            if changeFlags & 8 != 0 {
                guard changeFlags == 8 | 2 else {
                    throw reader.failure("an eviction of \(table.name) has change flags \(changeFlags), not 10")
                }
                changes.append(.eviction(table: Int(tableIndex), key: key, existence: existence, sequence: sequence))
                continue
            }
            var omitted: [Bool] = []
            if changeFlags & 4 != 0 {
                let count = table.valueColumns.count
                let bitmap = try reader.bytes((count + 7) / 8)
                omitted = (0..<count).map { bitmap[bitmap.startIndex + $0 / 8] & (1 << UInt8($0 % 8)) != 0 }
                // The flag and its bitmap must agree (a table without value columns has an empty one).
                guard omitted.contains(true) else {
                    throw reader.failure("a partial change of \(table.name) leaves no column out")
                }
                let used = count % 8 == 0 ? 0xFF : UInt8((1 << (count % 8)) - 1)
                guard bitmap.last.map({ $0 & ~used == 0 }) ?? true else {
                    throw reader.failure("a partial change of \(table.name) leaves out a column beyond its \(count)")
                }
            }
            let sent = { (index: Int) in omitted.isEmpty || !omitted[index] }
            var values: [DatabaseValue] = []
            values.reserveCapacity(table.valueColumns.count)
            for index in table.valueColumns.indices {
                if sent(index) { values.append(try reader.value()) } else { values.append(.null) }
            }
            var versions: [Version] = []
            if changeFlags & 2 == 0 {
                versions.reserveCapacity(values.count)
                for _ in values.indices {
                    let timestamp = existenceTimestamp &+ UInt64(bitPattern: try reader.zigzag())
                    versions.append(
                        Version(timestamp: HybridTimestamp(rawValue: timestamp), origin: try site(&reader, sites)))
                }
            }
            changes.append(
                RowChange(
                    table: Int(tableIndex), key: key, isAlive: changeFlags & 1 != 0, existence: existence,
                    values: values, versions: versions, sequence: sequence, omitted: omitted))
        }
        guard reader.isAtEnd else { throw reader.failure("\(reader.remaining) unexpected byte(s) after the batch") }
        // Format 2 is written only for a batch holding an eviction: one without is not canonical.
        guard format == 1 || changes.contains(where: \.isEvicted) else {
            throw reader.failure("a format 2 batch without eviction (format 1 encodes it)")
        }
        return ChangeBatch(
            source: header.source, after: after, through: header.through, isLast: header.isLast,
            isResync: header.isResync,
            tables: tables, changes: changes)
    }

    /// Source, after, through, flags, sites and tables: what every format writes after its magic.
    /// Returns each site's index. Sites are listed in order of first use: for each change, its
    /// existence origin, then its versions' origins.
    static func writeHeader(of batch: ChangeBatch, into writer: inout ByteWriter) -> SiteIndex {
        writer.append(batch.source.bytes)
        writer.uvarint(UInt64(bitPattern: batch.after))
        writer.uvarint(UInt64(bitPattern: batch.through))
        writer.byte((batch.isLast ? 1 : 0) | (batch.isResync ? 2 : 0))

        var siteIndex = SiteIndex()
        for change in batch.changes {
            siteIndex.add(change.existence.origin)
            for version in change.versions { siteIndex.add(version.origin) }
        }
        writer.uvarint(UInt64(siteIndex.sites.count))
        for key in siteIndex.sites { writer.append(key.bytes) }

        writer.uvarint(UInt64(batch.tables.count))
        for table in batch.tables {
            writer.string(table.name)
            writer.uvarint(UInt64(table.keyColumns.count))
            for name in table.keyColumns { writer.string(name) }
            writer.uvarint(UInt64(table.valueColumns.count))
            for name in table.valueColumns { writer.string(name) }
        }
        return siteIndex
    }

    /// The sites a batch names, in the order first named, and each one's index. A batch usually
    /// names a few (its source, the peers whose changes it relays): a look along them, starting
    /// at the last found, costs less than hashing a key for every version of every change. Past
    /// `scanned` sites (a hub relaying many), a dictionary.
    struct SiteIndex {
        static let scanned = 8
        private(set) var sites: [InstanceKey] = []
        private var last = 0
        private var byKey: [InstanceKey: Int]?

        mutating func add(_ key: InstanceKey) {
            guard self[key] == nil else { return }
            byKey?[key] = sites.count
            sites.append(key)
            if byKey == nil, sites.count > Self.scanned {
                byKey = Dictionary(uniqueKeysWithValues: sites.enumerated().map { ($1, $0) })
            }
        }

        /// The index of `key`, nil when not added.
        subscript(key: InstanceKey) -> Int? {
            mutating get {
                if last < sites.count, sites[last] == key { return last }
                if let byKey { return byKey[key] }
                guard let found = sites.firstIndex(of: key) else { return nil }
                last = found
                return found
            }
        }
    }

    /// What `writeHeader` writes.
    static func readHeader(_ reader: inout ByteReader) throws(BatchDecodingError) -> BatchHeader {
        guard let source = InstanceKey(bytes: Array(try reader.bytes(16))) else {
            throw reader.failure("bad source key")
        }
        let after = Int64(bitPattern: try reader.uvarint())
        let through = Int64(bitPattern: try reader.uvarint())
        let flags = try reader.byte()
        guard flags & ~3 == 0 else { throw reader.failure("unknown batch flags \(flags)") }

        let siteCount = try reader.count(minimumElementSize: 16)
        var sites: [InstanceKey] = []
        sites.reserveCapacity(siteCount)
        for _ in 0..<siteCount { sites.append(InstanceKey(uncheckedBytes: Array(try reader.bytes(16)))) }

        let tableCount = try reader.count(minimumElementSize: 3)
        var tables: [TableDescriptor] = []
        for _ in 0..<tableCount {
            let name = try reader.string()
            let keyCount = try reader.count(minimumElementSize: 1)
            var keys: [String] = []
            for _ in 0..<keyCount { keys.append(try reader.string()) }
            let valueCount = try reader.count(minimumElementSize: 1)
            var values: [String] = []
            for _ in 0..<valueCount { values.append(try reader.string()) }
            tables.append(TableDescriptor(name: name, keyColumns: keys, valueColumns: values))
        }
        return BatchHeader(
            source: source, after: after, through: through, isLast: flags & 1 != 0, isResync: flags & 2 != 0,
            sites: sites, tables: tables)
    }

    private static func site(_ reader: inout ByteReader, _ sites: [InstanceKey]) throws(BatchDecodingError)
        -> InstanceKey
    {
        let index = try reader.uvarint()
        guard index < UInt64(sites.count) else { throw reader.failure("site \(index) of \(sites.count)") }
        return sites[Int(index)]
    }
}

/// What every batch format writes between its magic and its changes.
struct BatchHeader {
    var source: InstanceKey
    var after: Int64
    var through: Int64
    var isLast: Bool
    var isResync: Bool
    var sites: [InstanceKey]
    var tables: [TableDescriptor]
}

/// Why bytes are not a valid change batch, and where.
public enum BatchDecodingError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The bytes stop being a change batch at byte `offset`.
    case malformed(offset: Int, reason: String)
    /// The bytes are a change batch, but one that breaks a rule of its own (`ChangeBatch.validate()`).
    case invalid(BatchValidationError)

    /// What is wrong, without where.
    public var reason: String {
        switch self {
        case let .malformed(_, reason): return reason
        case let .invalid(rule): return rule.description
        }
    }

    public var description: String {
        switch self {
        case let .malformed(offset, reason): return "invalid change batch at byte \(offset): \(reason)"
        case let .invalid(rule): return "invalid change batch: \(rule)"
        }
    }
}

// MARK: - Bytes

/// Appends varints, values and strings to a byte array.
public struct ByteWriter: Sendable {
    public var bytes: [UInt8] = []
    public init() {}

    @inline(__always) public mutating func byte(_ value: UInt8) { bytes.append(value) }
    @inline(__always) public mutating func append(_ data: some Sequence<UInt8>) { bytes.append(contentsOf: data) }

    @inline(__always)
    public mutating func uvarint(_ value: UInt64) {
        var value = value
        while value >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        bytes.append(UInt8(value))
    }

    @inline(__always)
    public mutating func zigzag(_ value: Int64) { uvarint(UInt64(bitPattern: (value << 1) ^ (value >> 63))) }

    public mutating func string(_ value: String) {
        var value = value
        value.withUTF8 { utf8 in
            uvarint(UInt64(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    public mutating func value(_ value: DatabaseValue) {
        switch value {
        case .null: byte(0)
        case let .integer(v): byte(1); zigzag(v)
        case let .real(v):
            byte(2)
            withUnsafeBytes(of: v.bitPattern.littleEndian) { bytes.append(contentsOf: $0) }
        case let .text(v): byte(3); string(v)
        case let .blob(v): byte(4); uvarint(UInt64(v.count)); bytes.append(contentsOf: v)
        }
    }
}

/// Reads what `ByteWriter` writes, refusing anything that runs past the end.
public struct ByteReader {
    let buffer: UnsafeRawBufferPointer
    public private(set) var offset = 0

    public init(_ buffer: UnsafeRawBufferPointer) { self.buffer = buffer }

    public var remaining: Int { buffer.count - offset }
    public var isAtEnd: Bool { offset == buffer.count }

    public func failure(_ reason: String) -> BatchDecodingError { .malformed(offset: offset, reason: reason) }

    public mutating func byte() throws(BatchDecodingError) -> UInt8 {
        guard offset < buffer.count else { throw failure("unexpected end of data") }
        defer { offset += 1 }
        return buffer[offset]
    }

    public mutating func bytes(_ count: Int) throws(BatchDecodingError) -> ArraySlice<UInt8> {
        guard count >= 0, count <= remaining else { throw failure("needs \(count) byte(s), \(remaining) remain") }
        defer { offset += count }
        return Array(UnsafeRawBufferPointer(rebasing: buffer[offset..<offset + count]))[...]
    }

    /// The next `count` bytes in place (valid while the buffer is), checked against what remains.
    mutating func unsafeBytes(_ count: Int) throws(BatchDecodingError) -> UnsafeRawBufferPointer {
        guard count >= 0, count <= remaining else { throw failure("needs \(count) byte(s), \(remaining) remain") }
        defer { offset += count }
        return UnsafeRawBufferPointer(rebasing: buffer[offset..<offset + count])
    }

    /// Eight bytes, little-endian.
    mutating func littleEndianInt64() throws(BatchDecodingError) -> Int64 {
        guard remaining >= 8 else { throw failure("needs 8 byte(s), \(remaining) remain") }
        defer { offset += 8 }
        return Int64(littleEndian: buffer.loadUnaligned(fromByteOffset: offset, as: Int64.self))
    }

    public mutating func uvarint() throws(BatchDecodingError) -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let byte = try byte()
            if shift == 63 && byte > 1 { throw failure("varint overflows 64 bits") }
            result |= UInt64(byte & 0x7f) << shift
            if byte & 0x80 == 0 { return result }
            shift += 7
            if shift > 63 { throw failure("varint longer than 10 bytes") }
        }
    }

    public mutating func zigzag() throws(BatchDecodingError) -> Int64 {
        let raw = try uvarint()
        return Int64(bitPattern: raw >> 1) ^ -Int64(bitPattern: raw & 1)
    }

    /// A count of elements that each take at least `minimumElementSize` bytes:
    /// more than the remaining bytes can hold is an error, before any allocation.
    public mutating func count(minimumElementSize: Int) throws(BatchDecodingError) -> Int {
        let value = try uvarint()
        guard value <= UInt64(remaining / max(1, minimumElementSize)) else {
            throw failure("count \(value) exceeds what \(remaining) remaining byte(s) can hold")
        }
        return Int(value)
    }

    public mutating func string() throws(BatchDecodingError) -> String {
        let length = try count(minimumElementSize: 1)
        let start = offset
        offset += length
        let utf8 = UnsafeRawBufferPointer(rebasing: buffer[start..<start + length])
        // ASCII needs no validation (the common case, and the generic validator is slow).
        if Self.isASCII(utf8) { return String(decoding: utf8, as: UTF8.self) }
        guard let text = String(validating: utf8, as: UTF8.self) else {
            offset = start
            throw failure("text is not valid UTF-8")
        }
        return text
    }

    /// Whether every byte is below 0x80, eight at a time.
    @inline(__always)
    static func isASCII(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        let count = bytes.count
        while index + 8 <= count {
            if bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self) & 0x8080_8080_8080_8080 != 0 { return false }
            index += 8
        }
        while index < count {
            if bytes[index] >= 0x80 { return false }
            index += 1
        }
        return true
    }

    public mutating func value() throws(BatchDecodingError) -> DatabaseValue {
        switch try byte() {
        case 0: return .null
        case 1: return .integer(try zigzag())
        case 2:
            guard remaining >= 8 else { throw failure("needs 8 byte(s), \(remaining) remain") }
            let bits = UInt64(littleEndian: buffer.loadUnaligned(fromByteOffset: offset, as: UInt64.self))
            offset += 8
            return .real(Double(bitPattern: bits))
        case 3: return .text(try string())
        case 4:
            let length = try count(minimumElementSize: 1)
            let start = offset
            offset += length
            return .blob(Data(UnsafeRawBufferPointer(rebasing: buffer[start..<start + length])))
        case let tag: throw failure("unknown value tag \(tag)")
        }
    }
}
