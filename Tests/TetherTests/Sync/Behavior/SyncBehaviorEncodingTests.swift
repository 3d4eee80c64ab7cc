import Foundation
import Testing
import TetherTestSupport
@testable import Tether

/// The batch encoding, clock skew and schema mismatches: what a peer may send.
@Suite struct SyncBehaviorEncodingTests {
    static let values: [DatabaseValue] = [
        .null,
        .integer(0), .integer(1), .integer(-1), .integer(63), .integer(-64), .integer(64), .integer(1 << 40),
        .integer(.min), .integer(.max), .integer(.min + 1), .integer(.max - 1),
        .real(0), .real(-0.0), .real(1.5), .real(-2.25), .real(.pi), .real(.infinity), .real(-.infinity),
        .real(.greatestFiniteMagnitude), .real(.leastNonzeroMagnitude), .real(-.leastNormalMagnitude), .real(.nan),
        .text(""), .text("plain"), .text("é ü ß — 漢字 🎉 👩‍👩‍👧"), .text("nul\u{0}inside"),
        .text(String(repeating: "long ", count: 300)),
        .blob(Data()), .blob(Data([0])), .blob(Data(0...255)), .blob(Data(repeating: 0xFF, count: 1_000)),
    ]

    /// Values equal, reals by bit pattern (so -0.0 and NaN count).
    func same(_ a: DatabaseValue, _ b: DatabaseValue) -> Bool {
        if case let .real(x) = a, case let .real(y) = b { return x.bitPattern == y.bitPattern }
        return a == b
    }

    func sampleBatch() -> ChangeBatch {
        let source = InstanceKey.random()
        let other = InstanceKey.random()
        let now = SyncTestKit.nowMilliseconds
        let tables = [
            TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["v"]),
            TableDescriptor(name: "pair", keyColumns: ["a", "b"], valueColumns: ["x", "y", "z"]),
        ]
        var changes: [RowChange] = []
        for (index, value) in Self.values.enumerated() {
            changes.append(
                RowChange(
                    table: 0, key: [.integer(Int64(index))], isAlive: index % 5 != 3,
                    existence: SyncTestKit.version(now - UInt64(index) * 1_000, index % 2 == 0 ? source : other),
                    values: [value], versions: [], sequence: Int64(10 + index)))
        }
        changes.append(
            RowChange(
                table: 1, key: [.text("k"), .blob(Data([1, 2]))], isAlive: true,
                existence: SyncTestKit.version(now, source),
                values: [.integer(.min), .text("ü"), .real(-0.0)],
                versions: [
                    SyncTestKit.version(now - 5, other), SyncTestKit.version(now + 5, source, counter: 9),
                    SyncTestKit.version(1, other),
                ],
                sequence: Int64(10 + Self.values.count)))
        return ChangeBatch(
            source: source, after: 7, through: Int64.max - 1, isLast: false, isResync: true, tables: tables,
            changes: changes)
    }

    @Test func everyValueTypeRoundTrips() throws {
        let batch = sampleBatch()
        let decoded = try BatchCoding.decode(BatchCoding.encode(batch))
        #expect(decoded.source == batch.source)
        #expect(decoded.after == batch.after)
        #expect(decoded.through == batch.through)
        #expect(decoded.isLast == batch.isLast)
        #expect(decoded.isResync == batch.isResync)
        #expect(decoded.tables == batch.tables)
        #expect(decoded.changes.count == batch.changes.count)
        for (got, sent) in zip(decoded.changes, batch.changes) {
            #expect(got.table == sent.table)
            #expect(got.key.count == sent.key.count && zip(got.key, sent.key).allSatisfy(same))
            #expect(
                got.values.count == sent.values.count && zip(got.values, sent.values).allSatisfy(same),
                "\(sent.values) became \(got.values)")
            #expect(got.isAlive == sent.isAlive)
            #expect(got.existence == sent.existence)
            #expect(got.sequence == sent.sequence)
            #expect(sent.values.indices.allSatisfy { got.version($0) == sent.version($0) })
        }
        // Batches without NaN compare equal as a whole.
        var plain = batch
        plain.changes.removeAll { change in
            change.values.contains { if case let .real(v) = $0 { return v.isNaN } else { return false } }
        }
        #expect(try BatchCoding.decode(BatchCoding.encode(plain)) == plain)
        // An empty batch too.
        let empty = ChangeBatch(
            source: InstanceKey.random(), after: 0, through: 0, isLast: true, tables: [], changes: [])
        #expect(try BatchCoding.decode(BatchCoding.encode(empty)) == empty)
    }

    @Test func valuesRoundTripThroughTwoDatabases() throws {
        let a = try Database.inMemory()
        let b = try Database.inMemory()
        for db in [a, b] {
            try db.execute("CREATE TABLE v (id INTEGER PRIMARY KEY, value ANY) STRICT")
            try db.enableSync(table: "v")
        }
        // SQLite stores NaN as NULL; every other value is kept as is.
        let stored = Self.values.filter { if case let .real(v) = $0 { return !v.isNaN } else { return true } }
        try a.write { conn in
            for (index, value) in stored.enumerated() {
                try conn.execute(
                    "INSERT INTO v (id, value) VALUES (?, ?)",
                    StatementArguments(values: [.integer(Int64(index)), value]))
            }
        }
        try SyncTestKit.sync(a, b)
        let received = try b.fetchRows("SELECT value FROM v ORDER BY id").map { $0[0] }
        #expect(received.count == stored.count)
        for (got, sent) in zip(received, stored) { #expect(same(got, sent), "\(sent) arrived as \(got)") }
    }

    func expectRejected(_ bytes: [UInt8], _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        do throws(BatchDecodingError) {
            let batch = try BatchCoding.decode(bytes)
            Issue.record("\(what): decoded as \(batch.changes.count) change(s)", sourceLocation: sourceLocation)
        } catch {
            guard case let .malformed(offset, _) = error else { return }
            #expect(offset >= 0 && offset <= bytes.count, "\(what): offset \(offset)", sourceLocation: sourceLocation)
        }
    }

    @Test func truncatedInputIsRejected() {
        let bytes = BatchCoding.encode(sampleBatch())
        for length in 0..<bytes.count {
            expectRejected(Array(bytes.prefix(length)), "truncated to \(length) of \(bytes.count)")
        }
        expectRejected(bytes + [0], "a trailing byte")
    }

    @Test func wrongMagicHugeCountsAndInvalidUTF8AreRejected() {
        let valid = BatchCoding.encode(sampleBatch())
        expectRejected([], "no bytes")
        expectRejected([0x54, 0x42], "half a magic")
        expectRejected([0x54, 0x42, 0x02] + valid.dropFirst(3), "another format version")
        expectRejected([0x00] + valid.dropFirst(1), "a wrong magic")
        expectRejected(Array("SQLite format 3\u{0}".utf8) + Array(repeating: 0, count: 100), "an SQLite file")

        func header(_ writer: inout ByteWriter) {
            writer.append(BatchCoding.magic)
            writer.append(InstanceKey.random().bytes)
            writer.uvarint(0)
            writer.uvarint(1)
            writer.byte(1)
        }
        func oneTable(_ writer: inout ByteWriter, name: [UInt8] = Array("t".utf8)) {
            writer.uvarint(1)
            writer.uvarint(UInt64(name.count))
            writer.append(name)
            writer.uvarint(1)
            writer.string("id")
            writer.uvarint(1)
            writer.string("v")
        }
        var sites = ByteWriter()
        header(&sites)
        sites.uvarint(1 << 40)
        expectRejected(sites.bytes + Array(repeating: 0, count: 64), "2^40 sites")

        var tables = ByteWriter()
        header(&tables)
        tables.uvarint(0)
        tables.uvarint(UInt64.max)
        expectRejected(tables.bytes + Array(repeating: 0, count: 64), "2^64-1 tables")

        var changes = ByteWriter()
        header(&changes)
        changes.uvarint(0)
        oneTable(&changes)
        changes.uvarint(1_000_000)
        expectRejected(changes.bytes + Array(repeating: 0, count: 64), "a million changes in 64 bytes")

        var longName = ByteWriter()
        header(&longName)
        longName.uvarint(0)
        longName.uvarint(1)
        longName.uvarint(1 << 50)
        longName.append(Array("t".utf8))
        expectRejected(longName.bytes, "a name of 2^50 bytes")

        var badName = ByteWriter()
        header(&badName)
        badName.uvarint(0)
        oneTable(&badName, name: [0xC3, 0x28])
        badName.uvarint(0)
        expectRejected(badName.bytes, "a table name that is not UTF-8")

        // One change whose text value is not UTF-8, or whose blob is longer than the input.
        func change(_ value: [UInt8]) -> [UInt8] {
            var writer = ByteWriter()
            header(&writer)
            writer.uvarint(1)
            writer.append(InstanceKey.random().bytes)
            oneTable(&writer)
            writer.uvarint(1)  // one change
            writer.uvarint(0)  // table
            writer.zigzag(1)  // sequence
            writer.byte(3)  // alive, uniform
            writer.zigzag(1_000)  // existence
            writer.uvarint(0)  // site
            writer.value(.integer(1))
            writer.append(value)
            return writer.bytes
        }
        var check = ByteWriter()
        check.value(.text("ok"))
        #expect((try? BatchCoding.decode(change(check.bytes)))?.changes.first?.values == [.text("ok")])
        expectRejected(change([3, 2, 0xFF, 0xFE]), "a text value that is not UTF-8")
        expectRejected(change([3, 3, 0xED, 0xA0, 0x80]), "a text value holding a UTF-16 surrogate")
        expectRejected(change([4, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 1, 2]), "a blob longer than the input")
        expectRejected(change([9]), "an unknown value tag")
        expectRejected(
            change([1, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]), "a varint of 11 bytes")
    }

    /// Random damage to encoded batches never crashes the decoder: it throws
    /// BatchDecodingError or returns a batch that encodes again.
    @Test func randomlyMutatedBatchesNeverCrashTheDecoder() throws {
        var random = SeededGenerator(seed: 0x7E7E_5EED)
        let peers = try SyncTestKit.peers(2)
        try peers[0].execute("INSERT INTO t (id, name, count) VALUES (1, 'one', 1), (2, 'two', NULL), (3, '', -3)")
        try peers[0].execute("UPDATE t SET name = 'uno' WHERE id = 1")
        try peers[0].execute("DELETE FROM t WHERE id = 3")
        let samples = [
            BatchCoding.encode(sampleBatch()),
            BatchCoding.encode(try peers[0].extractChanges(for: peers[1].instanceKey, after: 0, markInFlight: false)),
            BatchCoding.encode(
                ChangeBatch(source: InstanceKey.random(), after: 0, through: 0, isLast: true, tables: [], changes: [])),
        ]
        var decoded = 0
        for iteration in 0..<10_000 {
            var bytes = samples[iteration % samples.count]
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                switch Int.random(in: 0..<6, using: &random) {
                case 0 where !bytes.isEmpty:
                    bytes[Int.random(in: 0..<bytes.count, using: &random)] ^= UInt8(
                        1 << Int.random(in: 0..<8, using: &random))
                case 1 where !bytes.isEmpty:
                    bytes[Int.random(in: 0..<bytes.count, using: &random)] = UInt8.random(
                        in: .min ... .max, using: &random)
                case 2:
                    bytes.insert(
                        UInt8.random(in: .min ... .max, using: &random),
                        at: Int.random(in: 0...bytes.count, using: &random))
                case 3 where !bytes.isEmpty:
                    bytes.remove(at: Int.random(in: 0..<bytes.count, using: &random))
                case 4 where !bytes.isEmpty:
                    bytes.removeLast(Int.random(in: 1...bytes.count, using: &random))
                default:
                    // A large varint or count somewhere.
                    let at = Int.random(in: 0...bytes.count, using: &random)
                    bytes.insert(contentsOf: [0xFF, 0xFF, 0xFF, 0xFF, 0x7F], at: at)
                }
            }
            do throws(BatchDecodingError) {
                let batch = try BatchCoding.decode(bytes)
                decoded += 1
                let again = BatchCoding.encode(batch)
                let redecoded = try BatchCoding.decode(again)
                #expect(BatchCoding.encode(redecoded) == again, "iteration \(iteration): re-encoding is not stable")
            } catch {
                // A BatchDecodingError (typed throws): the expected outcome for most mutations.
                _ = error.reason
            }
        }
        #expect(decoded > 0, "no mutation decoded: the test exercises only rejection")
    }

    // MARK: Clock skew

    @Test func aPeerMoreThanAnHourAheadIsRefusedAndNothingIsApplied() throws {
        let db = try SyncTestKit.peers(1)[0]
        try db.execute("INSERT INTO t (id, name, count) VALUES (1, 'local', 0)")
        let source = InstanceKey.random()
        let now = SyncTestKit.nowMilliseconds
        let everything = """
            SELECT id, name, count, tether_seq, tether_status, hex(tether_versions) FROM \(SyncTestKit.meta("t")) \
            ORDER BY id
            """
        let rows = try SyncTestKit.dump(db, everything)
        let sequence = try db.lastSequence()

        let ahead = SyncTestKit.batch(
            from: source,
            changes: [
                SyncTestKit.row(2, name: "fine", count: 2, at: SyncTestKit.version(now, source), sequence: 1),
                SyncTestKit.row(
                    3, name: "future", count: 3, at: SyncTestKit.version(now + 2 * 3_600_000, source), sequence: 2),
            ])
        #expect(SyncTestKit.syncErrorCase { try db.apply(ahead) } == "clockSkew")
        // A single column version from the future is refused too.
        let column = SyncTestKit.batch(
            from: source,
            changes: [
                SyncTestKit.row(
                    1, name: "future name", count: 0, at: SyncTestKit.version(now - 1_000, source), sequence: 1,
                    versions: [
                        SyncTestKit.version(now + 2 * 3_600_000, source), SyncTestKit.version(now - 1_000, source),
                    ])
            ])
        #expect(SyncTestKit.syncErrorCase { try db.apply(column) } == "clockSkew")
        #expect(try SyncTestKit.dump(db, everything) == rows)
        #expect(try db.lastSequence() == sequence)
        #expect(try db.cursor(for: source).after == 0)
        #expect(try db.peers().isEmpty)
        #expect(try db.keptAsideChanges().isEmpty)

        // Half an hour ahead is within the limit; and the clock moves past it.
        let soon = SyncTestKit.batch(
            from: source,
            changes: [
                SyncTestKit.row(
                    4, name: "soon", count: 4, at: SyncTestKit.version(now + 1_800_000, source), sequence: 1)
            ])
        try db.apply(soon)
        #expect(try SyncTestKit.dump(db) == ["1|'local'|0", "4|'soon'|4"])
        try db.execute("UPDATE t SET name = 'later' WHERE id = 4")
        let local = try db.extractChanges(for: source, after: 0, markInFlight: false)
        let change = try #require(local.changes.first { $0.key == [.integer(4)] })
        #expect(change.version(0).timestamp > HybridTimestamp(milliseconds: now + 1_800_000, counter: 0))
    }

    // MARK: Schema mismatch

    @Test func aBatchForATableOrColumnNotSyncedHereIsKeptUntilAMigrationAddsIt() throws {
        let db = try Database.inMemory()
        try db.execute("CREATE TABLE sync_items (id INTEGER PRIMARY KEY, name TEXT, count INTEGER)")
        try db.enableSync(table: "sync_items")
        let source = InstanceKey.random()
        let version = SyncTestKit.version(SyncTestKit.nowMilliseconds - 1_000, source)
        let items = TableDescriptor(name: "sync_items", keyColumns: ["id"], valueColumns: ["name", "count"])
        let good = RowChange(
            table: 0, key: [.integer(1)], isAlive: true, existence: version, values: [.text("one"), .integer(1)],
            versions: [], sequence: 1)

        // A table not synced here: the rest of the batch applies, its change is kept.
        let ghost = TableDescriptor(name: "ghost_table", keyColumns: ["id"], valueColumns: ["name"])
        let ghostChange = RowChange(
            table: 1, key: [.integer(1)], isAlive: true, existence: version, values: [.text("boo")], versions: [],
            sequence: 2)
        var report = try db.apply(
            SyncTestKit.batch(from: source, tables: [items, ghost], changes: [good, ghostChange]))
        #expect(report.applied == 1 && report.keptForSchema == 1)
        // A column this table lacks: the row applies without it, the value is kept with its version.
        let wider = TableDescriptor(
            name: "sync_items", keyColumns: ["id"], valueColumns: ["name", "count", "extra_column"])
        let widerChange = RowChange(
            table: 0, key: [.integer(2)], isAlive: true, existence: version,
            values: [.text("two"), .integer(2), .integer(7)], versions: [], sequence: 3)
        report = try db.apply(SyncTestKit.batch(from: source, after: 2, tables: [wider], changes: [widerChange]))
        #expect(report.applied == 1 && report.keptForSchema == 1)
        #expect(
            try SyncTestKit.dump(db, "SELECT id, name, count FROM sync_items ORDER BY id") == [
                "1|'one'|1", "2|'two'|2",
            ])
        #expect(try SyncTestKit.int(db, "SELECT count(*) FROM tether_kept_for_schema") == 2)

        // Another identity is still refused whole: rows cannot be matched.
        let other = SyncTestKit.batch(
            from: source, after: 3,
            tables: [TableDescriptor(name: "sync_items", keyColumns: ["name"], valueColumns: ["count"])],
            changes: [
                RowChange(
                    table: 0, key: [.text("x")], isAlive: true, existence: version, values: [.integer(1)], versions: [],
                    sequence: 4)
            ])
        guard case let .schemaMismatch(message)? = SyncTestKit.error({ try db.apply(other) }) as? SyncError else {
            Issue.record("a batch identifying rows by another key was not refused"); return
        }
        #expect(message.contains("sync_items"), "\(message)")
        // A change with the wrong number of values: a batch that breaks a rule of its own.
        let short = SyncTestKit.batch(
            from: source, after: 3, tables: [items],
            changes: [
                RowChange(
                    table: 0, key: [.integer(3)], isAlive: true, existence: version, values: [.text("short")],
                    versions: [], sequence: 4)
            ])
        let error = SyncTestKit.error { try db.apply(short) }
        if case let .invalidBatch(rule)? = error as? SyncError {
            #expect(rule == .wrongCount(change: 0, table: "sync_items", part: .values, count: 1, expected: 2))
        } else {
            Issue.record(
                "a change with one value of two was not refused as an invalid batch: \(String(describing: error))")
        }

        // A migration adds the column: the kept value lands, with its version.
        var migrator = Migrator()
        migrator.register("extra column") { try $0.addColumn("extra_column", to: "sync_items", "INTEGER") }
        try migrator.migrate(db)
        #expect(try SyncTestKit.dump(db, "SELECT id, extra_column FROM sync_items ORDER BY id") == ["1|NULL", "2|7"])
        #expect(try SyncTestKit.int(db, "SELECT count(*) FROM tether_kept_for_schema") == 1)
        // Syncing the table lands its kept change too.
        try db.execute("CREATE TABLE ghost_table (id INTEGER PRIMARY KEY, name TEXT)")
        try db.enableSync(table: "ghost_table")
        #expect(try SyncTestKit.dump(db, "SELECT id, name FROM ghost_table") == ["1|'boo'"])
        #expect(try SyncTestKit.int(db, "SELECT count(*) FROM tether_kept_for_schema") == 0)
    }
}
