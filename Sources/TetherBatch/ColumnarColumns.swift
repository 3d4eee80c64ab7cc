import Foundation

// The columns of batch format 3 (§7.5): integer, value and string columns, written and read.

/// How an integer column's values follow its mode byte (§7.5). The encoder picks the shortest.
enum IntegerColumnMode: UInt8, CaseIterable {
    /// Each value, zigzag.
    case plain = 0
    /// Each value minus the previous one (the first: minus 0), zigzag.
    case deltas = 1
    /// Runs of equal deltas: uvarint length (at least 1), then the delta, zigzag.
    case deltaRuns = 2
    /// Each value, 8 bytes little-endian.
    case fixed = 3
    /// Runs of equal values: uvarint length (at least 1), then the value, zigzag.
    case repeats = 4
}

/// The tags of a value column, as in formats 1 and 2; format 4 adds `integralReal`.
private enum ValueTag: Int64 {
    case null = 0, integer = 1, real = 2, text = 3, blob = 4
    /// Format 4: a real whose value is whole, kept in the integers column as that integer.
    case integralReal = 5
}

/// How a string column of format 4 is laid out (its first byte).
private enum StringColumnLayout: UInt8 {
    /// Front-coded, as in format 3.
    case frontCoded = 0
    /// A dictionary: its distinct strings front-coded, then an index per string.
    case dictionary = 1
}

/// The largest magnitude of a real written as an integer: up to 2^53 every whole number is a
/// double, so the integer converts back exactly.
private let largestIntegralReal: Int64 = 1 << 53

extension ByteWriter {
    /// An integer column (§7.5): nothing when empty, else its mode byte and its values in the mode
    /// that takes the fewest bytes (the first of equals).
    mutating func integerColumn(_ values: [Int64]) {
        guard let first = values.first else { return }
        var plain = 0, deltas = 0, deltaRuns = 0, repeats = 0
        var previous: Int64 = 0
        var runDelta = first, runDeltaLength = 0
        var runValue = first, runValueLength = 0
        for value in values {
            plain += Self.zigzagSize(value)
            let delta = value &- previous
            deltas += Self.zigzagSize(delta)
            if runDeltaLength > 0, delta == runDelta {
                runDeltaLength += 1
            } else {
                if runDeltaLength > 0 {
                    deltaRuns += Self.uvarintSize(UInt64(runDeltaLength)) + Self.zigzagSize(runDelta)
                }
                runDelta = delta
                runDeltaLength = 1
            }
            if runValueLength > 0, value == runValue {
                runValueLength += 1
            } else {
                if runValueLength > 0 {
                    repeats += Self.uvarintSize(UInt64(runValueLength)) + Self.zigzagSize(runValue)
                }
                runValue = value
                runValueLength = 1
            }
            previous = value
        }
        deltaRuns += Self.uvarintSize(UInt64(runDeltaLength)) + Self.zigzagSize(runDelta)
        repeats += Self.uvarintSize(UInt64(runValueLength)) + Self.zigzagSize(runValue)
        let sizes: [(IntegerColumnMode, Int)] = [
            (.plain, plain), (.deltas, deltas), (.deltaRuns, deltaRuns), (.fixed, 8 * values.count),
            (.repeats, repeats),
        ]
        var mode = IntegerColumnMode.plain
        var smallest = Int.max
        for (candidate, size) in sizes where size < smallest {
            mode = candidate
            smallest = size
        }
        byte(mode.rawValue)
        bytes.reserveCapacity(bytes.count + smallest)
        switch mode {
        case .plain:
            for value in values { zigzag(value) }
        case .deltas:
            previous = 0
            for value in values {
                zigzag(value &- previous)
                previous = value
            }
        case .fixed:
            for value in values { withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) } }
        case .deltaRuns, .repeats:
            let ofDeltas = mode == .deltaRuns
            previous = 0
            var runStart = 0
            var index = 0
            while index < values.count {
                let item = ofDeltas ? values[index] &- previous : values[index]
                runStart = index
                previous = values[index]
                index += 1
                while index < values.count, (ofDeltas ? values[index] &- previous : values[index]) == item {
                    previous = values[index]
                    index += 1
                }
                uvarint(UInt64(index - runStart))
                zigzag(item)
            }
        }
    }

    /// A value column (§7.5; §7.6 when `compact`): the tags, then the integers, the reals, the
    /// texts and the blobs. Generic so that callers pass a lazy view of their changes' values, not a copy.
    mutating func valueColumn<Values: Collection<DatabaseValue>>(_ values: Values, compact: Bool) {
        guard !values.isEmpty else { return }
        var tags: [Int64] = []
        tags.reserveCapacity(values.count)
        var integers: [Int64] = []
        var reals: [Int64] = []
        var texts = StringColumnWriter(compact: compact)
        var blobs = StringColumnWriter(compact: compact)
        for value in values {
            switch value {
            case .null: tags.append(ValueTag.null.rawValue)
            case let .integer(number):
                tags.append(ValueTag.integer.rawValue)
                integers.append(number)
            case let .real(number):
                if compact, let whole = Self.integralValue(of: number) {
                    tags.append(ValueTag.integralReal.rawValue)
                    integers.append(whole)
                } else {
                    tags.append(ValueTag.real.rawValue)
                    reals.append(Int64(bitPattern: number.bitPattern))
                }
            case var .text(text):
                tags.append(ValueTag.text.rawValue)
                text.withUTF8 { texts.add($0) }
            case let .blob(data):
                tags.append(ValueTag.blob.rawValue)
                data.withUnsafeBytes { blobs.add($0.assumingMemoryBound(to: UInt8.self)) }
            }
        }
        integerColumn(tags)
        integerColumn(integers)
        integerColumn(reals)
        texts.write(into: &self)
        blobs.write(into: &self)
    }

    /// `real` as an integer when it is a whole number of at most 2^53 in magnitude, not −0.0
    /// (whose sign an integer would lose); NaN and the infinities are not.
    @inline(__always)
    static func integralValue(of real: Double) -> Int64? {
        guard real.magnitude <= Double(largestIntegralReal), real.rounded(.towardZero) == real,
            !(real == 0 && real.sign == .minus)
        else { return nil }
        return Int64(real)
    }

    @inline(__always)
    static func uvarintSize(_ value: UInt64) -> Int { value == 0 ? 1 : (64 - value.leadingZeroBitCount + 6) / 7 }

    @inline(__always)
    static func zigzagSize(_ value: Int64) -> Int { uvarintSize(UInt64(bitPattern: (value << 1) ^ (value >> 63))) }
}

/// A string column: front coding (each string as the length it shares with the previous one,
/// then the rest), or in format 4 (`compact`) a dictionary of its distinct strings when that is
/// shorter.
private struct StringColumnWriter {
    var shared: [Int64] = []
    var suffixLengths: [Int64] = []
    var suffixes: [UInt8] = []
    var previous: [UInt8] = []
    /// Format 4: a layout byte first, and a dictionary when it is shorter.
    let compact: Bool
    /// Built while the strings repeat enough to pay (nil: not compact, or given up).
    var dictionary: StringDictionary?

    init(compact: Bool) {
        self.compact = compact
        dictionary = compact ? StringDictionary() : nil
    }

    mutating func add(_ bytes: UnsafeBufferPointer<UInt8>) {
        let limit = min(previous.count, bytes.count)
        var common = 0
        while common < limit, previous[common] == bytes[common] { common += 1 }
        shared.append(Int64(common))
        suffixLengths.append(Int64(bytes.count - common))
        suffixes.append(contentsOf: bytes[common...])
        previous.removeAll(keepingCapacity: true)
        previous.append(contentsOf: bytes)
        if dictionary != nil, dictionary?.add(bytes) == false { dictionary = nil }
    }

    /// Nothing when empty; in format 4 a layout byte first.
    func write(into writer: inout ByteWriter) {
        guard !shared.isEmpty else { return }
        guard let dictionary, dictionary.count < shared.count else {
            if compact { writer.byte(StringColumnLayout.frontCoded.rawValue) }
            writeFrontCoded(into: &writer)
            return
        }
        var frontCoded = ByteWriter()
        writeFrontCoded(into: &frontCoded)
        var coded = ByteWriter()
        dictionary.write(into: &coded)
        if coded.bytes.count < frontCoded.bytes.count {
            writer.byte(StringColumnLayout.dictionary.rawValue)
            writer.append(coded.bytes)
        } else {
            writer.byte(StringColumnLayout.frontCoded.rawValue)
            writer.append(frontCoded.bytes)
        }
    }

    private func writeFrontCoded(into writer: inout ByteWriter) {
        writer.integerColumn(shared)
        writer.integerColumn(suffixLengths)
        writer.append(suffixes)
    }
}

/// The distinct strings of a column in the order they first appear, and each string's index:
/// an open-addressing table over their bytes (no allocation per string looked up).
private struct StringDictionary {
    private var bytes: [UInt8] = []
    private var starts: [Int] = [0]
    private var hashes: [UInt64] = []
    /// Entry index + 1 per slot, 0 when empty; a power of two, at most half full.
    private var slots = [Int32](repeating: 0, count: 64)
    private(set) var indices: [Int64] = []

    var count: Int { hashes.count }

    /// Adds the next string; false once the strings are too varied for a dictionary to pay: more
    /// distinct ones than half of those added and 1,024 more (which bounds the work spent on a
    /// column of unique strings, while a column whose values repeat only later keeps it).
    mutating func add(_ string: UnsafeBufferPointer<UInt8>) -> Bool {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in string { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        let mask = slots.count - 1
        var slot = Int(truncatingIfNeeded: hash) & mask
        while slots[slot] != 0 {
            let entry = Int(slots[slot]) - 1
            if hashes[entry] == hash, equals(entry, string) {
                indices.append(Int64(entry))
                return true
            }
            slot = (slot + 1) & mask
        }
        guard count < indices.count / 2 + 1024 else { return false }
        slots[slot] = Int32(count + 1)
        hashes.append(hash)
        bytes.append(contentsOf: string)
        starts.append(bytes.count)
        indices.append(Int64(count - 1))
        if count * 2 > slots.count { grow() }
        return true
    }

    /// The count of distinct strings, them front-coded, then the indices (§7.6).
    func write(into writer: inout ByteWriter) {
        writer.uvarint(UInt64(count))
        var entries = StringColumnWriter(compact: false)
        bytes.withUnsafeBufferPointer { all in
            for entry in 0..<count {
                entries.add(UnsafeBufferPointer(rebasing: all[starts[entry]..<starts[entry + 1]]))
            }
        }
        entries.write(into: &writer)
        writer.integerColumn(indices)
    }

    private func equals(_ entry: Int, _ string: UnsafeBufferPointer<UInt8>) -> Bool {
        let start = starts[entry]
        guard starts[entry + 1] - start == string.count else { return false }
        for offset in 0..<string.count where bytes[start + offset] != string[offset] { return false }
        return true
    }

    private mutating func grow() {
        slots = [Int32](repeating: 0, count: slots.count * 2)
        let mask = slots.count - 1
        for (entry, hash) in hashes.enumerated() {
            var slot = Int(truncatingIfNeeded: hash) & mask
            while slots[slot] != 0 { slot = (slot + 1) & mask }
            slots[slot] = Int32(entry + 1)
        }
    }
}

extension ByteReader {
    /// An integer column of `count` values (§7.5), refused before allocating when the bytes left
    /// cannot hold it; `column` names it in errors.
    mutating func integerColumn(count: Int, _ column: @autoclosure () -> String) throws(BatchDecodingError) -> [Int64] {
        guard count > 0 else { return [] }
        let rawMode = try byte()
        guard let mode = IntegerColumnMode(rawValue: rawMode) else {
            throw failure("\(column()): unknown column mode \(rawMode)")
        }
        let least: Int
        switch mode {
        case .plain, .deltas: least = count
        case .fixed: least = 8 * count
        case .deltaRuns, .repeats: least = 2
        }
        guard least <= remaining else {
            throw failure("\(column()): \(count) values need at least \(least) byte(s), \(remaining) remain")
        }
        var values: [Int64] = []
        values.reserveCapacity(count)
        switch mode {
        case .plain:
            for _ in 0..<count { values.append(try zigzag()) }
        case .deltas:
            var previous: Int64 = 0
            for _ in 0..<count {
                previous = previous &+ (try zigzag())
                values.append(previous)
            }
        case .fixed:
            for _ in 0..<count { values.append(try littleEndianInt64()) }
        case .deltaRuns, .repeats:
            var previous: Int64 = 0
            while values.count < count {
                let length = try uvarint()
                guard length >= 1, length <= UInt64(count - values.count) else {
                    throw failure(
                        "\(column()): a run of \(length) value(s) where \(count - values.count) of \(count) remain")
                }
                let item = try zigzag()
                for _ in 0..<Int(length) {
                    previous = mode == .deltaRuns ? previous &+ item : item
                    values.append(previous)
                }
            }
        }
        return values
    }

    /// A value column of `count` values (§7.5; §7.6 when `compact`). Text and blob bytes are taken
    /// from `budget` (`ColumnarLimits.maxValueBytes`) before they are allocated.
    mutating func valueColumn(count: Int, _ column: @autoclosure () -> String, compact: Bool, budget: inout Int)
        throws(BatchDecodingError) -> [DatabaseValue]
    {
        let tags = try integerColumn(count: count, "the tags of \(column())")
        let tagCount = compact ? 6 : 5
        var counts = [Int](repeating: 0, count: 6)
        for tag in tags {
            guard tag >= 0, tag < tagCount else { throw failure("\(column()): unknown value tag \(tag)") }
            counts[Int(tag)] += 1
        }
        // Integers and whole reals share the integers column, in the order of their tags.
        let integers = try integerColumn(
            count: counts[Int(ValueTag.integer.rawValue)] + counts[Int(ValueTag.integralReal.rawValue)],
            "the integers of \(column())")
        let reals = try integerColumn(count: counts[Int(ValueTag.real.rawValue)], "the reals of \(column())")
        let texts = try stringColumn(
            count: counts[Int(ValueTag.text.rawValue)], "the texts of \(column())", compact: compact, budget: &budget
        ) { bytes in
            // ASCII needs no validation (the common case, and the generic validator is slow).
            Self.isASCII(bytes) ? String(decoding: bytes, as: UTF8.self) : String(validating: bytes, as: UTF8.self)
        }
        let blobs = try stringColumn(
            count: counts[Int(ValueTag.blob.rawValue)], "the blobs of \(column())", compact: compact, budget: &budget
        ) { bytes in
            Data(bytes)
        }
        var values: [DatabaseValue] = []
        values.reserveCapacity(count)
        var next = [Int](repeating: 0, count: 6)
        var nextInteger = 0
        for (position, tag) in tags.enumerated() {
            let index = next[Int(tag)]
            next[Int(tag)] += 1
            switch ValueTag(rawValue: tag) {
            case .integer:
                values.append(.integer(integers[nextInteger]))
                nextInteger += 1
            case .integralReal:
                let whole = integers[nextInteger]
                nextInteger += 1
                guard whole.magnitude <= largestIntegralReal.magnitude else {
                    throw failure("\(column()): value \(position), a whole real, is \(whole), beyond 2^53")
                }
                values.append(.real(Double(whole)))
            case .real: values.append(.real(Double(bitPattern: UInt64(bitPattern: reals[index]))))
            case .text: values.append(.text(texts[index]))
            case .blob: values.append(.blob(blobs[index]))
            case .null, nil: values.append(.null)
            }
        }
        return values
    }

    /// A string column of `count` strings (in format 4, `compact`, a layout byte first), each made
    /// by `make` from its bytes (nil: they are not valid UTF-8). A dictionary's strings are made
    /// and counted against `budget` once each; its values share them.
    private mutating func stringColumn<Value>(
        count: Int, _ column: @autoclosure () -> String, compact: Bool, budget: inout Int,
        _ make: (UnsafeRawBufferPointer) -> Value?
    ) throws(BatchDecodingError) -> [Value] {
        guard count > 0 else { return [] }
        guard compact else { return try frontCodedStrings(count: count, column(), budget: &budget, make) }
        let rawLayout = try byte()
        switch StringColumnLayout(rawValue: rawLayout) {
        case .frontCoded:
            return try frontCodedStrings(count: count, column(), budget: &budget, make)
        case .dictionary:
            let declared = try uvarint()
            guard declared >= 1, declared <= UInt64(count) else {
                throw failure("\(column()): a dictionary of \(declared) strings for \(count) value(s)")
            }
            let entries = try frontCodedStrings(
                count: Int(declared), "the dictionary of \(column())", budget: &budget, make)
            let indices = try integerColumn(count: count, "the dictionary indices of \(column())")
            var strings: [Value] = []
            strings.reserveCapacity(count)
            for (position, index) in indices.enumerated() {
                guard index >= 0, index < Int64(entries.count) else {
                    throw failure(
                        "\(column()): value \(position) refers to dictionary string \(index) of \(entries.count)")
                }
                strings.append(entries[Int(index)])
            }
            return strings
        case nil:
            throw failure("\(column()): unknown string column layout \(rawLayout)")
        }
    }

    /// A front-coded string column of `count` strings (§7.5).
    private mutating func frontCodedStrings<Value>(
        count: Int, _ column: @autoclosure () -> String, budget: inout Int,
        _ make: (UnsafeRawBufferPointer) -> Value?
    ) throws(BatchDecodingError) -> [Value] {
        let shared = try integerColumn(count: count, "the shared lengths of \(column())")
        let suffixLengths = try integerColumn(count: count, "the suffix lengths of \(column())")
        var suffixTotal = 0
        for length in suffixLengths {
            guard length >= 0, length <= Int64(remaining - suffixTotal) else {
                throw failure("\(column()): a suffix of \(length) byte(s), beyond the \(remaining - suffixTotal) left")
            }
            suffixTotal += Int(length)
        }
        var strings: [Value] = []
        strings.reserveCapacity(count)
        var current: [UInt8] = []
        for index in 0..<count {
            let keep = shared[index]
            guard keep >= 0, keep <= Int64(current.count) else {
                throw failure(
                    "\(column()): string \(index) shares \(keep) byte(s) with a previous string of \(current.count)")
            }
            let length = Int(keep) + Int(suffixLengths[index])
            guard length <= budget else {
                throw failure(
                    "\(column()): the texts and blobs decode to more than the limit of bytes a batch decodes to")
            }
            budget -= length
            current.removeSubrange(Int(keep)...)
            current.append(contentsOf: try unsafeBytes(Int(suffixLengths[index])))
            guard let made = current.withUnsafeBytes(make) else {
                throw failure("\(column()): string \(index) is not valid UTF-8")
            }
            strings.append(made)
        }
        return strings
    }
}
