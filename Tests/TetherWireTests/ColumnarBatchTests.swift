import Foundation
import Testing
@testable import TetherBatch
@testable import TetherWire

/// Batch format 3, columnar (Protocol/README.md §7.5): random batches survive it as they survive
/// the row formats, it is much smaller on the batches that bulk inserts and narrow updates make,
/// and its decoder refuses what it must before allocating.
@Suite struct ColumnarBatchTests {
    // MARK: Random batches

    /// A random valid batch, canonical as decoders give it back: a change whose versions all equal
    /// its existence version has none, one that leaves nothing out has no omitted flags, and a
    /// value left out is NULL. Drawn to hit the encoder's modes: runs of keys, sites and
    /// timestamps, repeated and shared-prefix strings, and values of every type in one column.
    static func randomBatch(_ random: inout SeededGenerator) -> ChangeBatch {
        let sites = (0..<Int.random(in: 1...4, using: &random)).map { _ in
            InstanceKey(uncheckedBytes: (0..<16).map { _ in UInt8.random(in: 0...255, using: &random) })
        }
        let tables = (0..<Int.random(in: 0...3, using: &random)).map { index in
            TableDescriptor(
                name: "t\(index)", keyColumns: (0..<Int.random(in: 1...2, using: &random)).map { "k\($0)" },
                valueColumns: (0..<Int.random(in: 0...4, using: &random)).map { "v\($0)" })
        }
        let after = Int64.random(in: 0...1_000_000, using: &random)
        var sequence = after
        var timestamp = UInt64.random(in: 0...UInt64.max, using: &random)
        var changes: [RowChange] = []
        let count = tables.isEmpty ? 0 : Int.random(in: 0...60, using: &random)
        let regular = Bool.random(using: &random)
        for index in 0..<count {
            sequence += regular ? 1 : Int64.random(in: 1...1_000, using: &random)
            timestamp = timestamp &+ (regular ? 1 : UInt64.random(in: 0...UInt64.max, using: &random))
            let tableIndex = Int.random(in: 0..<tables.count, using: &random)
            let table = tables[tableIndex]
            let site = sites[regular ? 0 : Int.random(in: 0..<sites.count, using: &random)]
            let existence = Version(timestamp: HybridTimestamp(rawValue: timestamp), origin: site)
            let key = table.keyColumns.map { _ in regular ? DatabaseValue.integer(Int64(index)) : randomValue(&random) }
            if Int.random(in: 0..<8, using: &random) == 0 {
                changes.append(.eviction(table: tableIndex, key: key, existence: existence, sequence: sequence))
                continue
            }
            var values = table.valueColumns.map { _ in randomValue(&random) }
            var versions: [Version] = []
            if !values.isEmpty, Bool.random(using: &random) {
                versions = values.map { _ in
                    Version(
                        timestamp: HybridTimestamp(rawValue: timestamp &+ UInt64.random(in: 0...3, using: &random)),
                        origin: sites[Int.random(in: 0..<sites.count, using: &random)])
                }
                if versions.allSatisfy({ $0 == existence }) { versions = [] }
            }
            var omitted: [Bool] = []
            if !values.isEmpty, Int.random(in: 0..<3, using: &random) == 0 {
                omitted = values.map { _ in Bool.random(using: &random) }
                if !omitted.contains(true) { omitted = [] }
                for (column, left) in omitted.enumerated() where left { values[column] = .null }
            }
            changes.append(
                RowChange(
                    table: tableIndex, key: key, isAlive: Int.random(in: 0..<5, using: &random) > 0,
                    existence: existence,
                    values: values, versions: versions, sequence: sequence, omitted: omitted))
        }
        return ChangeBatch(
            source: sites[0], after: after, through: sequence + Int64.random(in: 0...3, using: &random),
            isLast: Bool.random(using: &random), isResync: Bool.random(using: &random), tables: tables, changes: changes
        )
    }

    static func randomValue(_ random: inout SeededGenerator) -> DatabaseValue {
        let words = ["name-1", "name-12", "name-13", "", "é—表", "name-1"]
        switch Int.random(in: 0..<10, using: &random) {
        case 0: return .null
        case 1: return .integer(Int64.random(in: -3...3, using: &random))
        case 2: return .integer(Int64(bitPattern: random.next()))
        case 3: return .real(Double.random(in: -1e6...1e6, using: &random))
        // NaN is not equal to itself
        case 4: return .real([-0.0, .infinity, 0.25, -1e-300].randomElement(using: &random) ?? 0)
        case 5, 6: return .text(words.randomElement(using: &random) ?? "")
        case 7: return .text(String(repeating: "ab", count: Int.random(in: 0...40, using: &random)))
        // Whole reals, at and beyond what format 4 writes as integers (2^53)
        case 8:
            return .real(
                [
                    Double(Int.random(in: -1000...1000, using: &random)), 9_007_199_254_740_992, -9_007_199_254_740_992,
                    9_007_199_254_740_994, 1e300,
                ]
                .randomElement(using: &random) ?? 0)
        default:
            return .blob(
                Data((0..<Int.random(in: 0...5, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) })
            )
        }
    }

    @Test("random batches encode and decode to themselves in the row formats and in the columnar format")
    func randomBatchesRoundTrip() throws {
        var random = SeededGenerator(seed: 0xC0_1A_4E)
        var columnarBytes = 0, rowBytes = 0
        for iteration in 0..<600 {
            let batch = Self.randomBatch(&random)
            try batch.validate()
            let rows = BatchCoding.encode(batch)
            #expect(
                try BatchCoding.decode(rows, maximumFormat: 2) == batch,
                "iteration \(iteration), format \(BatchCoding.format(of: batch))")
            let columnar = try #require(try BatchCoding.encodeColumnar(batch))
            #expect(Array(columnar.prefix(3)) == BatchCoding.columnarMagic)
            #expect(
                try BatchCoding.decode(columnar, maximumFormat: BatchCoding.columnarFormat) == batch,
                "iteration \(iteration)")
            let compact = try #require(try BatchCoding.encodeColumnar(batch, compact: true))
            #expect(Array(compact.prefix(3)) == BatchCoding.compactColumnarMagic)
            let decoded = try BatchCoding.decode(compact, maximumFormat: BatchCoding.compactColumnarFormat)
            #expect(decoded == batch, "iteration \(iteration)")
            // Equality of doubles does not see the sign of zero: the bits must survive too.
            #expect(
                decoded.changes.map { $0.values.map(Self.realBits) }
                    == batch.changes.map { $0.values.map(Self.realBits) },
                "iteration \(iteration)")
            // And as BATCH frames, compressed or not.
            for compression in [false, true] {
                let frame = try FrameEncoder(compression: compression, columnarBatches: true).encode(.batch(batch))
                #expect(try FrameDecoder.decode(frame: frame) == .batch(batch), "iteration \(iteration)")
            }
            columnarBytes += columnar.count
            rowBytes += rows.count
        }
        // Random values do not compress, but the per-row headers still go.
        #expect(columnarBytes < rowBytes)
    }

    @Test("a batch relaying the changes of many sites (more than a short look covers) names each once, in any format")
    func manySites() throws {
        let sites = (0..<40).map { InstanceKey(uncheckedBytes: Array(repeating: UInt8($0), count: 15) + [UInt8($0)]) }
        let table = TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["v", "w"])
        let changes = (1...400).map { number in
            let site = sites[number * 7 % sites.count]
            let other = sites[number % sites.count]
            return RowChange(
                table: 0, key: [.integer(Int64(number))], isAlive: true,
                existence: Version(timestamp: HybridTimestamp(rawValue: UInt64(number)), origin: site),
                values: [.integer(Int64(number)), .text("w")],
                versions: [
                    Version(timestamp: HybridTimestamp(rawValue: UInt64(number) + 1), origin: other),
                    Version(timestamp: HybridTimestamp(rawValue: UInt64(number)), origin: site),
                ], sequence: Int64(number))
        }
        let batch = ChangeBatch(
            source: sites[0], after: 0, through: 400, isLast: true, tables: [table], changes: changes)
        #expect(try BatchCoding.decode(BatchCoding.encode(batch)) == batch)
        for compact in [false, true] {
            let columnar = try #require(try BatchCoding.encodeColumnar(batch, compact: compact))
            #expect(try BatchCoding.decode(columnar, maximumFormat: BatchCoding.compactColumnarFormat) == batch)
        }
    }

    static func realBits(_ value: DatabaseValue) -> UInt64? {
        if case let .real(number) = value { return number.bitPattern }
        return nil
    }

    // MARK: Format 4

    @Test(
        """
        format 4 writes whole reals as integers and repeated strings as a dictionary: the same batch, fewer \
        bytes than format 3; a reader that agreed on format 3 only refuses it by its magic
        """)
    func compactValues() throws {
        // 2,000 flights-like rows: whole delays and distances, 16 carriers, 3 origins, unique tail numbers.
        let table = TableDescriptor(
            name: "flights", keyColumns: ["id"], valueColumns: ["carrier", "origin", "tailnum", "delay", "distance"])
        var random = SeededGenerator(seed: 0xF1_16)
        let changes = (1...2_000).map { number in
            RowChange(
                table: 0, key: [.integer(Int64(number))], isAlive: true,
                existence: Version(
                    timestamp: HybridTimestamp(rawValue: 1_000 + UInt64(number)), origin: WireSamples.keyA),
                values: [
                    .text("C\(Int.random(in: 0..<16, using: &random))"),
                    .text(["EWR", "JFK", "LGA"].randomElement(using: &random) ?? ""), .text("N\(number)XY"),
                    .real(Double(Int.random(in: -30...300, using: &random))),
                    .real(Double(Int.random(in: 80...4_983, using: &random))),
                ], versions: [], sequence: Int64(number))
        }
        let batch = ChangeBatch(
            source: WireSamples.keyA, after: 0, through: 2_000, isLast: true, tables: [table], changes: changes)
        let columnar = try #require(try BatchCoding.encodeColumnar(batch))
        let compact = try #require(try BatchCoding.encodeColumnar(batch, compact: true))
        #expect(try BatchCoding.decode(compact, maximumFormat: BatchCoding.compactColumnarFormat) == batch)
        #expect(
            Double(compact.count) < 0.6 * Double(columnar.count), "format 4: \(compact.count), 3: \(columnar.count)")
        #expect(throws: BatchDecodingError.self) {
            try BatchCoding.decode(compact, maximumFormat: BatchCoding.columnarFormat)
        }
        let frame = try FrameEncoder(compression: true, columnarBatches: true, compactColumns: true).encode(
            .batch(batch))
        #expect(Array(frame[6...]).count < compact.count, "LZ4 on top")
        #expect(throws: WireError.self) { try FrameDecoder.decode(frame: frame, acceptsCompactColumns: false) }
        #expect(try FrameDecoder.decode(frame: frame) == .batch(batch))
    }

    @Test("format 4 counts a dictionary's strings once against the bytes a batch decodes to, before making them")
    func dictionaryBudget() throws {
        // 1,000 values of one 1,000-byte text: 1 MB as values, 1 KB as a dictionary.
        let text = String(repeating: "x", count: 1_000)
        let table = TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["v"])
        let changes = (1...1_000).map { number in
            RowChange(
                table: 0, key: [.integer(Int64(number))], isAlive: true,
                existence: Version(timestamp: HybridTimestamp(rawValue: UInt64(number)), origin: WireSamples.keyA),
                values: [.text(text)], versions: [], sequence: Int64(number))
        }
        let batch = ChangeBatch(
            source: WireSamples.keyA, after: 0, through: 1_000, isLast: true, tables: [table], changes: changes)
        let compact = try #require(try BatchCoding.encodeColumnar(batch, compact: true))
        #expect(compact.count < 2_000)
        let format = BatchCoding.compactColumnarFormat
        #expect(
            try BatchCoding.decode(compact, maximumFormat: format, columnarLimits: ColumnarLimits(maxValueBytes: 1_000))
                == batch)
        #expect(throws: BatchDecodingError.self) {
            try BatchCoding.decode(compact, maximumFormat: format, columnarLimits: ColumnarLimits(maxValueBytes: 999))
        }
    }

    // MARK: What it saves

    @Test("a decoded batch keeps the bytes it came from, in any format, until one of its fields changes")
    func aDecodedBatchKeepsItsBytes() throws {
        var random = SeededGenerator(seed: 0xB17E5)
        var batch = Self.randomBatch(&random)
        while batch.changes.isEmpty { batch = Self.randomBatch(&random) }
        #expect(batch.decodedFrom == nil)
        let rows = BatchCoding.encode(batch)
        let columnar = try #require(try BatchCoding.encodeColumnar(batch))
        for bytes in [rows, columnar] {
            var decoded = try BatchCoding.decode(bytes, maximumFormat: BatchCoding.columnarFormat)
            #expect(decoded.decodedFrom == bytes)
            #expect(decoded == batch)
            decoded.isLast.toggle()
            #expect(decoded.decodedFrom == nil)
            var changed = try BatchCoding.decode(bytes, maximumFormat: BatchCoding.columnarFormat)
            changed.changes.removeLast()
            #expect(changed.decodedFrom == nil)
        }
        // What a decoder does not check (a stored batch read back) keeps nothing to store again.
        #expect(try BatchCoding.decodeWithoutValidating(rows, maximumFormat: 2).decodedFrom == nil)
    }

    @Test(
        """
        a bulk insert's and a two-column update's batches take a fraction of their row format's bytes, with LZ4 \
        or without
        """)
    func columnarIsSmallOnRegularBatches() throws {
        for (name, batch, bound) in [
            ("insert", WireSamples.bulkInsertBatch(rows: 2_000), 0.25),
            ("update2", WireSamples.updateBatch(rows: 2_000), 0.4),
        ] {
            let rows = try FrameEncoder(compression: true).encode(.batch(batch))
            let columnar = try FrameEncoder(compression: true, columnarBatches: true).encode(.batch(batch))
            let rawRows = BatchCoding.encode(batch)
            let rawColumnar = try #require(try BatchCoding.encodeColumnar(batch))
            #expect(
                Double(columnar.count) < bound * Double(rows.count),
                "\(name): \(columnar.count) bytes against \(rows.count)")
            #expect(
                Double(rawColumnar.count) < bound * Double(rawRows.count),
                "\(name): \(rawColumnar.count) raw bytes against \(rawRows.count)")
            #expect(try FrameDecoder.decode(frame: columnar) == .batch(batch))
        }
    }

    // MARK: Limits and negotiation

    @Test("a columnar batch is read only by a decoder that accepts it; to the others it is a bad magic")
    func onlyNegotiatedDecodersReadIt() throws {
        let frame = try FrameEncoder(compression: false, columnarBatches: true).encode(.batch(WireSamples.smallBatch))
        #expect(Array(frame[6..<9]) == BatchCoding.columnarMagic)
        #expect(try FrameDecoder.decode(frame: frame) == .batch(WireSamples.smallBatch))
        expectWireError(
            .batch(.malformed(offset: 3, reason: "not a Tether change batch (bad magic or format version)"))
        ) {
            _ = try FrameDecoder.decode(frame: frame, acceptsColumnarBatches: false)
        }
        #expect(
            throws: BatchDecodingError.malformed(
                offset: 3, reason: "not a Tether change batch (bad magic or format version)")
        ) {
            try BatchCoding.decode(Array(frame[6...]), maximumFormat: 2)
        }
        // Without the capability, the encoder writes format 1, and 2 for an eviction.
        #expect(
            Array(try FrameEncoder(compression: false).encode(.batch(WireSamples.smallBatch))[6..<9])
                == BatchCoding.magic)
    }

    @Test(
        """
        a batch that would decode to more than the limits allow is sent in the row format, and refused in columns \
        before allocating
        """)
    func limitsBoundWhatItExpandsTo() throws {
        let batch = WireSamples.bulkInsertBatch(rows: 100)
        // 100 changes × (1 + 1 key + 3 values) = 500 values; name-1 … name-100 are 692 bytes of text.
        let text = (1...100).map { "name-\($0)".utf8.count }.reduce(0, +)
        #expect(text == 692)
        #expect(
            try BatchCoding.encodeColumnar(batch, limits: ColumnarLimits(maxValues: 500, maxValueBytes: text)) != nil)
        #expect(try BatchCoding.encodeColumnar(batch, limits: ColumnarLimits(maxValues: 499)) == nil)
        #expect(try BatchCoding.encodeColumnar(batch, limits: ColumnarLimits(maxValueBytes: text - 1)) == nil)
        let small = WireLimits(maxBatchValues: 499)
        let frame = try FrameEncoder(limits: small, compression: false, columnarBatches: true).encode(.batch(batch))
        #expect(Array(frame[6..<9]) == BatchCoding.magic, "sent in format 1")
        #expect(try FrameDecoder.decode(frame: frame, limits: small) == .batch(batch))

        let columnar = try #require(try BatchCoding.encodeColumnar(batch))
        #expect(throws: BatchDecodingError.self) {
            try BatchCoding.decode(columnar, maximumFormat: 3, columnarLimits: ColumnarLimits(maxValues: 499))
        }
        #expect(throws: BatchDecodingError.self) {
            try BatchCoding.decode(columnar, maximumFormat: 3, columnarLimits: ColumnarLimits(maxValueBytes: text - 1))
        }
        #expect(
            try BatchCoding.decode(
                columnar, maximumFormat: 3, columnarLimits: ColumnarLimits(maxValues: 500, maxValueBytes: text))
                == batch)
        expectWireError(case: "batch") {
            _ = try FrameDecoder.decode(frame: rawFrame(type: 3, body: columnar), limits: small)
        }
    }

    @Test(
        """
        a few bytes claiming a million changes, or strings sharing a long prefix many times, are refused before \
        they expand
        """)
    func expansionBombsAreRefused() throws {
        // One table t (key id), no value columns, through `through`.
        func header(through: Int) -> ByteWriter {
            var writer = ByteWriter()
            writer.append(BatchCoding.columnarMagic)
            writer.append(WireSamples.keyA.bytes)
            writer.append(
                [0] + uvarintBytes(UInt64(through)) + [1, 1] + WireSamples.keyA.bytes + [
                    1, 1, 0x74, 1, 2, 0x69, 0x64, 0,
                ])
            return writer
        }
        /// An integer column of `count` values in one run (mode 4, repeats) of `zigzag`.
        func run(_ count: Int, _ zigzag: UInt8) -> [UInt8] { [4] + uvarintBytes(UInt64(count)) + [zigzag] }

        // 2^40 changes: refused by the count alone.
        var huge = header(through: 1)
        huge.uvarint(1 << 40)
        #expect(
            throws: BatchDecodingError.malformed(
                offset: huge.bytes.count,
                reason: "1099511627776 changes, above the limit of 4194304 values a batch decodes to")
        ) {
            try BatchCoding.decode(huge.bytes, maximumFormat: 3)
        }
        // 300,000 changes in five runs of three bytes: within the count, beyond the values (two each: the
        // change, its key).
        let count = 300_000
        var runs = header(through: count)
        runs.uvarint(UInt64(count))
        runs.append(
            run(count, 0) + [2] + uvarintBytes(UInt64(count)) + [2] + run(count, 6) + run(count, 0) + run(count, 0))
        let limits = ColumnarLimits(maxValues: 500_000, maxValueBytes: 1 << 20)
        #expect(
            throws: BatchDecodingError.malformed(
                offset: runs.bytes.count,
                reason: "the changes decode to more than the limit of 500000 values (exceeded at change 250000)")
        ) {
            try BatchCoding.decode(runs.bytes, maximumFormat: 3, columnarLimits: limits)
        }

        // 1,000 keys: a text of 4 KiB, then 999 sharing all of it: 4 MB from 4 KiB, beyond a limit of 1 MiB.
        let keys = 1_000
        var strings = header(through: keys)
        strings.uvarint(UInt64(keys))
        strings.append(
            run(keys, 0) + [2] + uvarintBytes(UInt64(keys)) + [2] + run(keys, 6) + run(keys, 0) + run(keys, 0))
        strings.append(run(keys, 6))  // tags: text (3)
        // shared: 0, then 4096 each
        strings.append([4, 1, 0] + uvarintBytes(UInt64(keys - 1)) + uvarintBytes(2 * 4_096))
        // suffixes: 4096, then none
        strings.append([4, 1] + uvarintBytes(2 * 4_096) + uvarintBytes(UInt64(keys - 1)) + [0])
        strings.append([UInt8](repeating: 0x61, count: 4_096))
        do {
            _ = try BatchCoding.decode(strings.bytes, maximumFormat: 3, columnarLimits: limits)
            Issue.record("4 MB of keys decoded under a limit of 1 MiB")
        } catch {
            #expect(error.reason.contains("the texts and blobs decode to more than the limit"), "\(error)")
        }
        // Within a limit that holds them, the same bytes decode (so the refusal above is the limit's).
        let decoded = try BatchCoding.decode(
            strings.bytes, maximumFormat: 3, columnarLimits: ColumnarLimits(maxValueBytes: 4_096 * keys))
        #expect(
            decoded.changes.count == keys && decoded.changes.last?.key == [.text(String(repeating: "a", count: 4_096))])
    }

    @Test("every cut of a columnar batch is refused with a typed error, and mutated ones never crash")
    func cutAndMutatedBatchesAreRefused() throws {
        var random = SeededGenerator(seed: 0xC07)
        var seeds = [
            WireSamples.smallBatch, WireSamples.partialBatch, WireSamples.largeBatch, WireSamples.updateBatch(rows: 50),
        ]
        for _ in 0..<10 { seeds.append(Self.randomBatch(&random)) }
        var decoded = 0, refused = 0
        for batch in seeds {
            let bytes = try #require(try BatchCoding.encodeColumnar(batch))
            for length in 0..<bytes.count {
                #expect(throws: BatchDecodingError.self) {
                    try BatchCoding.decode(Array(bytes.prefix(length)), maximumFormat: 3)
                }
            }
            for _ in 0..<200 {
                var mutant = bytes
                for _ in 0..<Int.random(in: 1...3, using: &random) {
                    let index = Int.random(in: 3..<mutant.count, using: &random)
                    mutant[index] =
                        Bool.random(using: &random) ? UInt8.random(in: 0...255, using: &random) : mutant[index] ^ 1
                }
                do {
                    let batch = try BatchCoding.decode(mutant, maximumFormat: 3)
                    decoded += 1
                    // What decodes is a valid batch, which encodes again, stably.
                    let again = try #require(try BatchCoding.encodeColumnar(batch))
                    #expect(try BatchCoding.encodeColumnar(try BatchCoding.decode(again, maximumFormat: 3)) == again)
                } catch {
                    refused += 1
                }
            }
        }
        #expect(decoded > 0 && refused > 0)
    }

    @Test("the encoder picks, per column, the mode that takes the fewest bytes")
    func integerColumnModes() throws {
        func mode(_ values: [Int64]) -> UInt8? {
            var writer = ByteWriter()
            writer.integerColumn(values)
            return writer.bytes.first
        }
        #expect(mode([]) == nil)
        #expect(mode([3, -1, 2]) == IntegerColumnMode.plain.rawValue)
        #expect(mode([1_000_000, 1_000_001, 1_000_003, 1_000_006]) == IntegerColumnMode.deltas.rawValue)
        #expect(mode(Array(1...1_000)) == IntegerColumnMode.deltaRuns.rawValue)
        #expect(
            mode([0x1234_5678_9ABC_DEF0, -0x0FED_CBA9_8765_4321, 0x7654_3210_FEDC_BA98, -0x5555_5555_5555_5555])
                == IntegerColumnMode.fixed.rawValue)
        #expect(mode([7, 7, 7, 7, 0, 0, 0, 0, 7, 7, 7]) == IntegerColumnMode.repeats.rawValue)
        // Each reads back.
        for values in [[3, -1, 2], Array(1...1_000), [.min, .max, .min], [7, 7, 7, 0, 0, 7]] as [[Int64]] {
            var writer = ByteWriter()
            writer.integerColumn(values)
            let read = try writer.bytes.withUnsafeBytes { buffer in
                var reader = ByteReader(buffer)
                return try reader.integerColumn(count: values.count, "test")
            }
            #expect(read == values)
        }
    }
}
