/// A version as stored locally: the timestamp and the origin's id in
/// `tether_sites` (the instance key would cost 16 bytes per column).
struct LocalVersion: Hashable {
    var timestamp: UInt64
    var site: Int32
}

/// The versions of a row, stored in its `tether_versions` column: the
/// existence version, then one version per value column. Usually every
/// column has the existence version (a row inserted and never updated
/// column by column), which is stored in 13 bytes.
///
///     0x00  timestamp (8 bytes LE)  site (4 bytes LE)                          uniform
///     0x01  existence (12 bytes)    count (2 bytes LE)  count × 12 bytes      explicit
///     0x02  existence (12 bytes)    count (2 bytes LE)  n (2 bytes LE)
///           n × (column index (2 bytes LE), version (12 bytes)), indexes rising  sparse
///
/// The sparse form lists only the columns whose version is not the existence's, and is written
/// when it is the shorter: one column of 19 updated takes 31 bytes, not 243 (metadata rewritten
/// per row by every scattered update, its apply, its acknowledgement). Columns beyond `count`
/// (added to the table later) have the existence version.
struct RowVersions: Equatable {
    var existence: LocalVersion
    /// nil when every column has the existence version.
    var columns: [LocalVersion]?

    static func uniform(_ version: LocalVersion) -> RowVersions { RowVersions(existence: version, columns: nil) }

    func column(_ index: Int) -> LocalVersion {
        guard let columns, index < columns.count else { return existence }
        return columns[index]
    }

    /// The row's newest version (the first of those with the latest timestamp): the transaction
    /// that last wrote the row, where it was written.
    var newest: LocalVersion {
        var newest = existence
        for version in columns ?? [] where version.timestamp > newest.timestamp { newest = version }
        return newest
    }

    /// The latest timestamp of the row's versions.
    var latestTimestamp: UInt64 { newest.timestamp }

    /// Sets column `index`, expanding the uniform form when needed.
    mutating func setColumn(_ index: Int, to version: LocalVersion, columnCount: Int) {
        if columns == nil {
            if version == existence { return }
            columns = Array(repeating: existence, count: columnCount)
        }
        while let count = columns?.count, count < columnCount { columns?.append(existence) }
        columns?[index] = version
    }

    /// A deletion at `version`: the columns keep their versions (a later
    /// re-insert merges with them); only the existence changes.
    mutating func markDeleted(at version: LocalVersion, columnCount: Int) {
        if columns == nil { columns = Array(repeating: existence, count: columnCount) }
        existence = version
        normalize()
    }

    /// The versions `change` returns a new version for (the others as they are).
    func mapping(_ change: (LocalVersion) -> LocalVersion?) -> RowVersions {
        var result = self
        result.existence = change(existence) ?? existence
        result.columns = columns?.map { change($0) ?? $0 }
        result.normalize()
        return result
    }

    /// Back to the uniform form when every column has the existence version.
    mutating func normalize() {
        if let columns, columns.allSatisfy({ $0 == existence }) { self.columns = nil }
    }

    func encoded() -> [UInt8] {
        guard let all = columns else {
            return Self.bytes(count: 13) { writer in
                writer.byte(0)
                writer.version(existence)
            }
        }
        let columns = all.prefix(Int(UInt16.max))
        let differing = columns.indices.reduce(0) { $0 + (columns[$1] == existence ? 0 : 1) }
        if 17 + 14 * differing < 15 + 12 * columns.count {
            return Self.bytes(count: 17 + 14 * differing) { writer in
                writer.byte(2)
                writer.version(existence)
                writer.uint16(columns.count)
                writer.uint16(differing)
                for (index, version) in columns.enumerated() where version != existence {
                    writer.uint16(index)
                    writer.version(version)
                }
            }
        }
        return Self.bytes(count: 15 + 12 * columns.count) { writer in
            writer.byte(1)
            writer.version(existence)
            writer.uint16(columns.count)
            for version in columns { writer.version(version) }
        }
    }

    /// Writes the stored form into an array of its size, allocated once (the apply encodes a row's
    /// versions per change: appending piece by piece cost a tenth of an update's apply).
    private static func bytes(count: Int, _ write: (inout Writer) -> Void) -> [UInt8] {
        [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            var writer = Writer(buffer: UnsafeMutableRawBufferPointer(buffer))
            write(&writer)
            initialized = writer.offset
        }
    }

    private struct Writer {
        let buffer: UnsafeMutableRawBufferPointer
        var offset = 0

        mutating func byte(_ value: UInt8) {
            buffer[offset] = value
            offset += 1
        }
        mutating func uint16(_ value: Int) {
            buffer.storeBytes(of: UInt16(clamping: value).littleEndian, toByteOffset: offset, as: UInt16.self)
            offset += 2
        }
        mutating func version(_ version: LocalVersion) {
            buffer.storeBytes(of: version.timestamp.littleEndian, toByteOffset: offset, as: UInt64.self)
            buffer.storeBytes(of: version.site.littleEndian, toByteOffset: offset + 8, as: Int32.self)
            offset += 12
        }
    }

    /// Decodes the stored form; nil when it is not one (a damaged or hand-edited row).
    init?(encoded bytes: UnsafeRawBufferPointer) {
        func version(at offset: Int) -> LocalVersion {
            var timestamp: UInt64 = 0
            var site: UInt32 = 0
            for i in 0..<8 { timestamp |= UInt64(bytes[offset + i]) << (8 * UInt64(i)) }
            for i in 0..<4 { site |= UInt32(bytes[offset + 8 + i]) << (8 * UInt32(i)) }
            return LocalVersion(timestamp: timestamp, site: Int32(bitPattern: site))
        }
        guard bytes.count >= 13 else { return nil }
        existence = version(at: 1)
        switch bytes[0] {
        case 0 where bytes.count == 13:
            columns = nil
        case 1 where bytes.count >= 15:
            let count = Int(bytes[13]) | Int(bytes[14]) << 8
            guard bytes.count == 15 + 12 * count else { return nil }
            columns = (0..<count).map { version(at: 15 + 12 * $0) }
        case 2 where bytes.count >= 17:
            let count = Int(bytes[13]) | Int(bytes[14]) << 8
            let listed = Int(bytes[15]) | Int(bytes[16]) << 8
            guard bytes.count == 17 + 14 * listed else { return nil }
            var columns = Array(repeating: existence, count: count)
            var next = 0
            for entry in 0..<listed {
                let offset = 17 + 14 * entry
                let index = Int(bytes[offset]) | Int(bytes[offset + 1]) << 8
                // Rising, within the count: anything else is not a form this type writes.
                guard index >= next, index < count else { return nil }
                columns[index] = version(at: offset + 2)
                next = index + 1
            }
            self.columns = columns
        default:
            return nil
        }
    }

    init(existence: LocalVersion, columns: [LocalVersion]?) {
        self.existence = existence
        self.columns = columns
    }

    init?(encoded bytes: [UInt8]) {
        guard let decoded = bytes.withUnsafeBytes({ RowVersions(encoded: $0) }) else { return nil }
        self = decoded
    }
}
