import Foundation
import Testing
import TetherBatch
@testable import TetherWire

/// Fixed sample values: the same every run, so vectors can be regenerated identically.
enum WireSamples {
    static let keyA = InstanceKey(hex: "00112233445566778899aabbccddeeff") ?? .random()
    static let keyB = InstanceKey(hex: "fedcba98765432100123456789abcdef") ?? .random()
    static let fingerprint = SchemaFingerprint(uncheckedBytes: (0..<32).map { UInt8($0 * 7 + 1) })

    /// A hybrid timestamp near 2025-11-21 with a counter.
    static func timestamp(_ milliseconds: UInt64, _ counter: UInt16 = 0) -> HybridTimestamp {
        HybridTimestamp(milliseconds: 1_763_700_000_000 + milliseconds, counter: counter)
    }

    static let tables = [
        TableDescriptor(
            name: "player", keyColumns: ["id"], valueColumns: ["name", "email", "score", "team", "tags", "joined"]),
        TableDescriptor(name: "match", keyColumns: ["id"], valueColumns: ["player_id", "points"]),
        TableDescriptor(name: "pair", keyColumns: ["a", "b"], valueColumns: []),
        TableDescriptor(name: "ünïcode — 表", keyColumns: ["kéy"], valueColumns: ["välue"]),
    ]

    static let hello = Hello(
        instanceKey: keyA, schemaFingerprint: fingerprint, capabilities: [.lz4, .livePush], tables: tables)

    /// A small batch with every value type, a tombstone, non-uniform versions and two sites.
    static let smallBatch: ChangeBatch = {
        let tables = [
            TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["v"]),
            TableDescriptor(name: "pair", keyColumns: ["a", "b"], valueColumns: ["x", "y", "z"]),
        ]
        let changes = [
            RowChange(
                table: 0, key: [.integer(1)], isAlive: true, existence: Version(timestamp: timestamp(0), origin: keyA),
                values: [.text("héllo")], versions: [], sequence: 11),
            RowChange(
                table: 0, key: [.integer(-2)], isAlive: false,
                existence: Version(timestamp: timestamp(5, 1), origin: keyB),
                values: [.null], versions: [], sequence: 12),
            RowChange(
                table: 1, key: [.text("k"), .blob(Data([1, 2, 0xff]))], isAlive: true,
                existence: Version(timestamp: timestamp(3), origin: keyA),
                values: [.integer(.min), .real(-2.25), .blob(Data())],
                versions: [
                    Version(timestamp: timestamp(1), origin: keyB), Version(timestamp: timestamp(3), origin: keyA),
                    Version(timestamp: timestamp(7, 9), origin: keyB),
                ],
                sequence: 15),
        ]
        return ChangeBatch(
            source: keyA, after: 10, through: 15, isLast: true, isResync: false, tables: tables, changes: changes)
    }()

    /// A batch of two partial changes (§7.2): value column 0 of three left out, versions per column
    /// in the first, uniform versions in the second.
    static let partialBatch: ChangeBatch = {
        let tables = [TableDescriptor(name: "player", keyColumns: ["id"], valueColumns: ["name", "email", "score"])]
        let inserted = Version(timestamp: timestamp(2), origin: keyA)
        let updated = Version(timestamp: timestamp(9, 3), origin: keyB)
        let changes = [
            RowChange(
                table: 0, key: [.integer(7)], isAlive: true, existence: inserted,
                values: [.null, .text("new@example.com"), .integer(70)],
                versions: [inserted, updated, updated], sequence: 31, omitted: [true, false, false]),
            RowChange(
                table: 0, key: [.integer(8)], isAlive: true, existence: inserted, values: [.null, .null, .integer(80)],
                versions: [], sequence: 32, omitted: [true, true, false]),
        ]
        return ChangeBatch(
            source: keyB, after: 30, through: 32, isLast: true, isResync: false, tables: tables, changes: changes)
    }()

    /// A batch whose body is several kilobytes of repetitive rows: compressed when allowed.
    static let largeBatch: ChangeBatch = {
        let tables = [TableDescriptor(name: "player", keyColumns: ["id"], valueColumns: ["name", "email", "score"])]
        var changes: [RowChange] = []
        for index in 0..<120 {
            let origin: InstanceKey = index % 3 == 0 ? keyB : keyA
            let existence = Version(timestamp: timestamp(UInt64(index) * 10), origin: origin)
            let values: [DatabaseValue] = [
                .text("Player number \(index)"), .text("player\(index)@example.com"), .integer(Int64(index) * 100),
            ]
            changes.append(
                RowChange(
                    table: 0, key: [.integer(Int64(index))], isAlive: true, existence: existence,
                    values: values, versions: [], sequence: 1_000 + Int64(index)))
        }
        return ChangeBatch(
            source: keyB, after: 999, through: 1_119, isLast: false, isResync: true, tables: tables, changes: changes)
    }()

    /// Vector 32's batch (format 2): a row of orders sent whole, then the eviction of row 8.
    static let evictionBatch: ChangeBatch = {
        let orders = TableDescriptor(name: "orders", keyColumns: ["id"], valueColumns: ["site", "status"])
        let version = Version(timestamp: timestamp(0), origin: keyA)
        return ChangeBatch(
            source: keyA, after: 40, through: 42, isLast: true, tables: [orders],
            changes: [
                RowChange(
                    table: 0, key: [.integer(7)], isAlive: true, existence: version,
                    values: [.text("north"), .text("open")], versions: [], sequence: 41),
                .eviction(table: 0, key: [.integer(8)], existence: version, sequence: 42),
            ])
    }()

    static let record = TableDescriptor(name: "record", keyColumns: ["id"], valueColumns: ["name", "count", "value"])

    /// `rows` rows as a bulk insert makes them (the wire benchmarks' records): consecutive keys and
    /// sequences, one site, timestamps a counter apart.
    static func bulkInsertBatch(rows: Int) -> ChangeBatch {
        let changes = (1...rows).map { (number: Int) -> RowChange in
            let existence = Version(timestamp: timestamp(0, UInt16(number % 60_000)), origin: keyA)
            let values: [DatabaseValue] = [
                .text("name-\(number)"), .integer(Int64(number % 1000)), .real(Double(number) * 0.25),
            ]
            return RowChange(
                table: 0, key: [.integer(Int64(number))], isAlive: true, existence: existence, values: values,
                versions: [],
                sequence: Int64(number))
        }
        return ChangeBatch(
            source: keyA, after: 0, through: Int64(rows), isLast: true, tables: [record], changes: changes)
    }

    /// Eight flights (table `flights`: key id; carrier, origin, tailnum, dep_delay, distance):
    /// whole reals but one 0.5 and one −0.0, carriers and origins that repeat, tail numbers that do not.
    static let flightsBatch: ChangeBatch = {
        let table = TableDescriptor(
            name: "flights", keyColumns: ["id"],
            valueColumns: ["carrier", "origin", "tailnum", "dep_delay", "distance"])
        let rows: [(String, String, String, Double, Double)] = [
            ("UA", "EWR", "N14228", 2, 1400), ("UA", "LGA", "N24211", 4, 1416), ("AA", "JFK", "N619AA", 2, 1089),
            ("B6", "JFK", "N804JB", -1, 1576), ("DL", "LGA", "N668DN", -6, 762), ("UA", "EWR", "N39463", -4, 719),
            ("B6", "EWR", "N516JB", 0.5, 1065), ("AA", "LGA", "N3ALAA", -0.0, 733),
        ]
        let changes = rows.enumerated().map { index, row in
            RowChange(
                table: 0, key: [.integer(Int64(index + 1))], isAlive: true,
                existence: Version(timestamp: timestamp(0, UInt16(index)), origin: keyA),
                values: [.text(row.0), .text(row.1), .text(row.2), .real(row.3), .real(row.4)], versions: [],
                sequence: Int64(index + 1))
        }
        return ChangeBatch(
            source: keyA, after: 0, through: Int64(rows.count), isLast: true, tables: [table], changes: changes)
    }()

    /// The same rows after an update of two of their columns: value left out, name and count at a later version.
    static func updateBatch(rows: Int) -> ChangeBatch {
        let inserted = bulkInsertBatch(rows: rows)
        let changes = inserted.changes.enumerated().map { (index: Int, change: RowChange) -> RowChange in
            let updated = Version(timestamp: timestamp(5_000, UInt16(index % 60_000)), origin: keyA)
            guard case let .text(name) = change.values[0], case let .integer(count) = change.values[1] else {
                return change
            }
            return RowChange(
                table: 0, key: change.key, isAlive: true, existence: change.existence,
                values: [.text(name + "-v2"), .integer(count + 1), .null],
                versions: [updated, updated, change.existence],
                sequence: Int64(rows + index + 1), omitted: [false, false, true])
        }
        return ChangeBatch(
            source: keyA, after: Int64(rows), through: Int64(2 * rows), isLast: true, tables: [record], changes: changes
        )
    }

    static let emptyBatch = ChangeBatch(source: keyB, after: 42, through: 42, isLast: true, tables: [], changes: [])

    /// One or more of every message type (all canonical: they decode to themselves).
    /// A scope backfill PULL (version 3, flag bit 4).
    static var scopeBackfillPull: Pull {
        var pull = Pull(after: 250, maxChanges: 10_000, maxBytes: 4 << 20)
        pull.scopeBackfill = true
        return pull
    }

    /// SCOPE with an interest in two tables (one a reference narrowed by a filter) and one table sent in part.
    static let sampleScope = ScopeAnnouncement(
        interest: [
            "orders": .filter("status <> 'archived'"),
            "order_line": .both(.reference(column: "order_id", parent: "orders"), .filter("quantity > 0")),
        ],
        scoped: ["orders"])

    static let messages: [WireMessage] = [
        .hello(hello),
        .hello(Hello(instanceKey: keyB, schemaFingerprint: fingerprint, capabilities: [], tables: [])),
        .pull(Pull(after: 0, maxChanges: 2_000, maxBytes: 1 << 20)),
        .pull(Pull(after: Int64.max, resumingResync: true, maxChanges: 1, maxBytes: Int.max)),
        .batch(smallBatch),
        .batch(largeBatch),
        .batch(emptyBatch),
        .ack(through: 0),
        .ack(through: 1_119),
        .changed(latest: Int64.max),
        .deferred(
            Deferral(
                after: 0, through: Int64.max, reason: .clockSkew, retryAfterMilliseconds: 30_000,
                message: "clock skew: 7200 s ahead")),
        .deferred(Deferral(after: 9, through: 10, reason: .other, retryAfterMilliseconds: 0, message: "")),
        .history(HistoryMark(through: 0, clock: 0)),
        .history(HistoryMark(through: Int64.max, clock: UInt64.max)),
        .pull(Pull(after: 7, maxChanges: 1, maxBytes: 1, history: HistoryMark(through: 7, clock: 1))),
        .pull(scopeBackfillPull),
        .scope(ScopeAnnouncement()),
        .scope(sampleScope),
        .refused([
            RefusedChange(
                table: "orders", key: [.integer(7)], sequence: 12,
                reason: "outside the scope of the writer: site = :peer_name"),
            RefusedChange(
                table: "order_line", key: [.text("a"), .blob(Data([1, 2])), .null, .real(1.5)], sequence: .max,
                reason: ""),
        ]),
        .ping(0),
        .ping(0x0123_4567_89ab_cdef),
        .pong(UInt64.max),
        .error(code: .schemaMismatch, message: "table player: column score is missing here"),
        .error(code: .internal, message: String(repeating: "a long and repetitive explanation; ", count: 40)),
        .bye(reason: ""),
        .bye(reason: "shutting down — à bientôt 👋"),
    ]
}

// MARK: - Helpers

enum Hex {
    static func encode(_ bytes: [UInt8], lineLength: Int = 32) -> String {
        let digits = Array("0123456789abcdef")
        var lines: [String] = []
        var index = 0
        while index < bytes.count {
            let line = bytes[index..<min(bytes.count, index + lineLength)]
            lines.append(String(line.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0xf)]] }))
            index += lineLength
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// Whitespace is ignored; nil for anything else that is not a hex digit pair.
    static func decode(_ text: String) -> [UInt8]? {
        let digits = text.unicodeScalars.filter { !CharacterSet.whitespacesAndNewlines.contains($0) }.map(
            Character.init)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        var index = 0
        while index < digits.count {
            guard let byte = UInt8(String(digits[index...index + 1]), radix: 16) else { return nil }
            bytes.append(byte)
            index += 2
        }
        return bytes
    }
}

extension WireError {
    /// The case's name, as the vector manifest states it.
    var caseName: String { Mirror(reflecting: self).children.first?.label ?? String(describing: self) }
}

/// Where the repository's Protocol/ directory is.
let protocolDirectory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()
    .appendingPathComponent("Protocol")

/// Builds a frame by hand (for invalid ones the encoder refuses to make).
func rawFrame(type: UInt8, flags: UInt8 = 0, body: [UInt8], length: Int? = nil) -> [UInt8] {
    let length = length ?? body.count + 2
    return [
        UInt8(truncatingIfNeeded: length >> 24), UInt8(truncatingIfNeeded: length >> 16),
        UInt8(truncatingIfNeeded: length >> 8), UInt8(truncatingIfNeeded: length), type, flags,
    ] + body
}

func uvarintBytes(_ value: UInt64) -> [UInt8] {
    var writer = ByteWriter()
    writer.uvarint(value)
    return writer.bytes
}

func encode(_ message: WireMessage, compression: Bool = false, limits: WireLimits = .default) throws(WireError)
    -> [UInt8]
{
    try FrameEncoder(limits: limits, compression: compression).encode(message)
}

/// Expects `body` to throw exactly `expected`.
func expectWireError(
    _ expected: WireError, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void
) {
    do {
        try body()
        Issue.record("expected \(expected), got no error", sourceLocation: sourceLocation)
    } catch {
        #expect(error as? WireError == expected, sourceLocation: sourceLocation)
    }
}

/// Expects `body` to throw a WireError of the named case.
func expectWireError(case name: String, sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) {
    do {
        try body()
        Issue.record("expected \(name), got no error", sourceLocation: sourceLocation)
    } catch {
        #expect((error as? WireError)?.caseName == name, "\(error)", sourceLocation: sourceLocation)
    }
}
