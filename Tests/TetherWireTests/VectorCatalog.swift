import Foundation
import TetherBatch
@testable import TetherWire

/// The test vectors in Protocol/vectors, as made by this codec. Regenerate
/// with `TETHER_WRITE_VECTORS=1 swift test --filter VectorTests` (only when
/// the protocol changes: the frozen files are the reference).
struct Vector {
    enum Expectation {
        /// Decodes to the message; re-encoding it (compression on or off, columnar batches on or off) gives
        /// the same bytes.
        case valid(
            WireMessage, encoderCompression: Bool, encoderColumnarBatches: Bool = false,
            encoderCompactColumns: Bool = false)
        /// Decoding the frame alone fails with this error; `stream` says what the stream decoder does.
        case invalid(WireError, stream: StreamBehavior)
    }
    enum StreamBehavior: String, Codable {
        case sameError = "same error"
        case needsMoreBytes = "needs more bytes"
        case messageThenNeedsMoreBytes = "a message, then needs more bytes"
    }
    var file: String
    var description: String
    var bytes: [UInt8]
    var expectation: Expectation
    /// For a valid BATCH whose fate depends on the receiver's tables: what the receiver of §12
    /// (syncing `item` and the expiry store, with a table `secret` it does not sync) does with it.
    var receiver: Receiver?
}

/// What the receiver of §12 does with a valid BATCH, in a session and from a sync file.
struct Receiver: Codable, Equatable {
    enum Outcome: String, Codable {
        case applied
        case tableNotAllowed = "ERROR 5 tableNotAllowed"
        case keptForSchema = "kept for a later schema"
        case refused
    }
    var session: Outcome
    var syncFile: Outcome
}

/// One line of Protocol/vectors/manifest.json.
struct ManifestEntry: Codable, Equatable {
    var file: String
    var description: String
    var valid: Bool
    // Valid vectors
    var compressed: Bool?
    var encoderCompression: Bool?
    /// Set (true) for the BATCHes of format 3: the encoder that made them had `columnarBatches` on.
    var encoderColumnarBatches: Bool?
    /// Set (true) for the BATCHes of format 4: the encoder had `compactColumns` on too.
    var encoderCompactColumns: Bool?
    var message: JSONValue?
    // Invalid vectors
    var error: String?
    var code: Int?
    var codeName: String?
    var errorDescription: String?
    var stream: Vector.StreamBehavior?
    // Valid BATCHes whose fate depends on the receiver's tables (§12)
    var receiver: Receiver?
}

enum VectorCatalog {
    static func all() throws -> [Vector] {
        try valid() + invalid()
    }

    static func valid() throws -> [Vector] {
        let cases: [(String, String, WireMessage, Bool)] = [
            (
                "hello",
                """
                HELLO: version 2, capabilities lz4 and livePush, four tables (one without value columns, one with \
                non-ASCII names)
                """,
                .hello(WireSamples.hello), true
            ),
            (
                "hello-minimal",
                """
                HELLO with no tables and capability bits 0b1000001: lz4 and an unknown bit 6, which a receiver \
                keeps and ignores
                """,
                .hello(
                    Hello(
                        instanceKey: WireSamples.keyB, schemaFingerprint: WireSamples.fingerprint,
                        capabilities: Capabilities(rawValue: 0b100_0001), tables: [])), true
            ),
            (
                "pull", "PULL from the start: after 0, not resuming, at most 2000 changes and 1 MiB",
                .pull(Pull(after: 0, maxChanges: 2_000, maxBytes: 1 << 20)), true
            ),
            (
                "pull-resuming", "PULL resuming a resync after 123456789, at most 500 changes and 64 KiB",
                .pull(Pull(after: 123_456_789, resumingResync: true, maxChanges: 500, maxBytes: 65_536)), true
            ),
            (
                "batch",
                """
                BATCH, uncompressed (below the threshold): every value type, a tombstone, per-column versions \
                from two sites
                """,
                .batch(WireSamples.smallBatch), true
            ),
            (
                "batch-compressed", "BATCH of 120 rows, LZ4-compressed: uvarint raw length, then an LZ4 block",
                .batch(WireSamples.largeBatch), true
            ),
            (
                "batch-uncompressed", "the same BATCH of 120 rows from an encoder with compression off",
                .batch(WireSamples.largeBatch), false
            ),
            (
                "batch-empty", "BATCH with no tables and no changes: nothing after 42",
                .batch(WireSamples.emptyBatch), true
            ),
            ("ack", "ACK through 1119", .ack(through: 1_119), true),
            ("changed", "CHANGED, latest 2^63-1 (a nine-byte varint)", .changed(latest: .max), true),
            ("ping", "PING, nonce 0x0123456789abcdef (big-endian)", .ping(0x0123_4567_89ab_cdef), true),
            ("pong", "PONG, nonce 0xfedcba9876543210", .pong(0xfedc_ba98_7654_3210), true),
            (
                "error", "ERROR schemaMismatch (2) with a message",
                .error(code: .schemaMismatch, message: "table player: column score is missing here"), true
            ),
            (
                "error-compressed", "ERROR internal (11) with a long repetitive message, LZ4-compressed",
                .error(code: .internal, message: String(repeating: "a long and repetitive explanation; ", count: 40)),
                true
            ),
            ("bye", "BYE with a non-ASCII reason", .bye(reason: "shutting down — à bientôt 👋"), true),
            ("bye-empty", "BYE with an empty reason", .bye(reason: ""), true),
            (
                "pull-whole-rows", "PULL after 77 asking for whole rows (flag bit 1), at most 10,000 changes and 4 MiB",
                .pull(Pull(after: 77, maxChanges: 10_000, maxBytes: 4 << 20, wholeRows: true)), true
            ),
            (
                "batch-partial",
                """
                BATCH of two partial changes: column name left out (bitmap 01) with per-column versions, then \
                name and email left out (bitmap 03) with uniform versions
                """,
                .batch(WireSamples.partialBatch), true
            ),
            (
                "deferred",
                "DEFERRED of the batches after 120 through 250 for clock skew (reason 1), pulled again in 30 s",
                .deferred(
                    Deferral(
                        after: 120, through: 250, reason: .clockSkew, retryAfterMilliseconds: 30_000,
                        message: "clock skew: a peer's timestamp is 7200 s ahead of this machine's clock (limit 3600 s)"
                    )), true
            ),
            (
                "hello-renames",
                """
                HELLO (version 2) of one table whose value column points was renamed from score: a peer with \
                score syncs it as points
                """,
                .hello(
                    Hello(
                        instanceKey: WireSamples.keyB, schemaFingerprint: WireSamples.fingerprint,
                        capabilities: [.lz4, .livePush, .deferrals],
                        tables: [
                            TableDescriptor(name: "player", keyColumns: ["id"], valueColumns: ["name", "points"])
                        ],
                        renames: [ColumnRename(table: "player", from: "score", to: "points")])), true
            ),
            (
                "pull-backfill",
                """
                PULL of a backfill (flag bit 2) after 0 through 900: rows of player holding a value in color, and \
                every row of tag
                """,
                .pull(
                    Pull(
                        after: 0, maxChanges: 10_000, maxBytes: 4 << 20,
                        backfill: Backfill(
                            through: 900,
                            tables: [
                                Backfill.Table(name: "player", columns: ["color"]),
                                Backfill.Table(name: "tag", columns: []),
                            ]))), true
            ),
            (
                "history",
                """
                HISTORY (11, with histories): the BATCH that follows leaves a mark of the sender's history \
                through 250 at clock 0x0191f0a7c1000003
                """,
                .history(HistoryMark(through: 250, clock: 0x0191_f0a7_c100_0003)), true
            ),
            (
                "pull-history",
                """
                PULL after 250 showing the mark kept of the receiver's history (flag bit 3): through 250 at clock \
                0x0191f0a7c1000003
                """,
                .pull(
                    Pull(
                        after: 250, maxChanges: 10_000, maxBytes: 4 << 20,
                        history: HistoryMark(through: 250, clock: 0x0191_f0a7_c100_0003))), true
            ),
        ]
        let general = try cases.enumerated().map { index, item in
            let (name, description, message, compression) = item
            let bytes = try FrameEncoder(compression: compression).encode(message)
            return Vector(
                file: String(format: "valid/%02d-%@.hex", index + 1, name), description: description, bytes: bytes,
                expectation: .valid(message, encoderCompression: compression))
        }
        let batches = try receiverBatches().enumerated().map { index, item in
            let (name, description, batch, receiver) = item
            let message = WireMessage.batch(batch)
            return Vector(
                file: String(format: "valid/%02d-%@.hex", general.count + index + 1, name), description: description,
                bytes: try FrameEncoder(compression: false).encode(message),
                expectation: .valid(message, encoderCompression: false),
                receiver: receiver)
        }
        // Version 3 (capability version3, §6.11, §6.12, §8.10): numbered after the receiver's batches.
        let version3 = try version3Messages().enumerated().map { index, item in
            let (name, description, message) = item
            return Vector(
                file: String(format: "valid/%02d-%@.hex", general.count + batches.count + index + 1, name),
                description: description,
                bytes: try FrameEncoder(compression: false).encode(message),
                expectation: .valid(message, encoderCompression: false))
        }
        // Batch format 3 (capability columnarBatches, §7.5): numbered after version 3's.
        let columnar = try columnarBatches().enumerated().map { index, item in
            let (name, description, batch, compression) = item
            let message = WireMessage.batch(batch)
            return Vector(
                file: String(
                    format: "valid/%02d-%@.hex", general.count + batches.count + version3.count + index + 1, name),
                description: description,
                bytes: try FrameEncoder(compression: compression, columnarBatches: true).encode(message),
                expectation: .valid(message, encoderCompression: compression, encoderColumnarBatches: true))
        }
        // Batch format 4 (capability compactColumns, §7.6): numbered after format 3's.
        let compactStart: Int = general.count + batches.count + version3.count + columnar.count
        let compact = try compactBatches().enumerated().map { (index: Int, item: (String, String, ChangeBatch)) in
            let (name, description, batch) = item
            let message = WireMessage.batch(batch)
            let number: Int = compactStart + index + 1
            return Vector(
                file: String(format: "valid/%02d-%@.hex", number, name),
                description: description,
                bytes: try FrameEncoder(compression: false, columnarBatches: true, compactColumns: true).encode(
                    message),
                expectation: .valid(
                    message, encoderCompression: false, encoderColumnarBatches: true, encoderCompactColumns: true))
        }
        // Parked pulls and quiet heartbeats (§8.4, §8.5): numbered after format 4's.
        let parkStart: Int = compactStart + compact.count
        let parked = try parkedPullMessages().enumerated().map { (index: Int, item: (String, String, WireMessage)) in
            let (name, description, message) = item
            let number: Int = parkStart + index + 1
            return Vector(
                file: String(format: "valid/%02d-%@.hex", number, name), description: description,
                bytes: try FrameEncoder(compression: false).encode(message),
                expectation: .valid(message, encoderCompression: false))
        }
        return general + batches + version3 + columnar + compact + parked
    }

    static func parkedPullMessages() -> [(String, String, WireMessage)] {
        var pull = Pull(after: 4_096, maxChanges: 10_000, maxBytes: 4 << 20)
        pull.park = true
        var followOn = Pull(after: 0, maxChanges: 10_000, maxBytes: 4 << 20)
        followOn.followOn = true
        return [
            (
                "pull-park",
                "PULL after 4096 to park (flag bit 5): answered once the receiver has changes after 4096",
                .pull(pull)
            ),
            (
                "hello-parked-quiet",
                """
                HELLO with no tables and capabilities livePush, parkedPulls and quietHeartbeats (bits 1, 7 and 8: \
                0x182, a two-byte varint)
                """,
                .hello(
                    Hello(
                        instanceKey: WireSamples.keyB, schemaFingerprint: WireSamples.fingerprint,
                        capabilities: [.livePush, .parkedPulls, .quietHeartbeats], tables: []))
            ),
            (
                "pull-follow-on",
                """
                PULL follow-on (flag bit 6, after 0): the batch after the one answering the requester's previous \
                PULL, at most 10000 changes and 4 MiB
                """,
                .pull(followOn)
            ),
            (
                "scope-column-rules",
                """
                SCOPE (13) with capability mergeRules: no interest, nothing sent in part, and column stock of \
                inventory merging as a counter (rule 1)
                """,
                .scope(
                    ScopeAnnouncement(columnRules: [ColumnRuleClaim(table: "inventory", column: "stock", rule: 1)]))
            ),
            (
                "scope-ordered-rules",
                """
                SCOPE (13) with capability mergeRules: the rows of devices merging as add-wins (empty column, \
                row rule 1), column last_seen as max (rule 2), first_seen as min (rule 3)
                """,
                .scope(
                    ScopeAnnouncement(columnRules: [
                        ColumnRuleClaim(table: "devices", column: "", rule: 1),
                        ColumnRuleClaim(table: "devices", column: "last_seen", rule: 2),
                        ColumnRuleClaim(table: "devices", column: "first_seen", rule: 3),
                    ]))
            ),
        ]
    }

    static func compactBatches() -> [(String, String, ChangeBatch)] {
        [
            (
                "batch-compact",
                """
                BATCH of format 4 (magic TB 04), compact values: 8 flights whose reals are whole (value tag 5, \
                in the integers column) but one (0.5) and −0.0, whose carriers and origins repeat (dictionaries) \
                and whose tail numbers do not (front-coded)
                """,
                WireSamples.flightsBatch
            ),
            (
                "batch-compact-columnar-sample",
                "BATCH of format 4 of vector 5's batch (every value type, a tombstone, per-column versions)",
                WireSamples.smallBatch
            ),
        ]
    }

    static func columnarBatches() -> [(String, String, ChangeBatch, Bool)] {
        [
            (
                "batch-columnar",
                """
                BATCH of format 3 (magic TB 03), columnar: vector 5's batch (every value type, a tombstone, \
                per-column versions from two sites)
                """,
                WireSamples.smallBatch, true
            ),
            (
                "batch-columnar-compressed", "BATCH of format 3 of vector 6's 120 rows, LZ4-compressed",
                WireSamples.largeBatch, true
            ),
            (
                "batch-columnar-insert",
                """
                BATCH of format 3 of a bulk insert of 100 rows: keys, sequences and timestamps in runs, names \
                front-coded
                """,
                WireSamples.bulkInsertBatch(rows: 100), true
            ),
            (
                "batch-columnar-partial",
                """
                BATCH of format 3 of vector 18's two partial changes (omitted flags per column, versions of the \
                first)
                """,
                WireSamples.partialBatch, true
            ),
            (
                "batch-columnar-eviction",
                "BATCH of format 3 of vector 32's row of orders and the eviction of row 8 (change flags 10)",
                WireSamples.evictionBatch, true
            ),
        ]
    }

    static func version3Messages() throws -> [(String, String, WireMessage)] {
        let eviction = WireSamples.evictionBatch
        return [
            (
                "scope",
                """
                SCOPE (13): an interest in orders (a filter) and in order_line (a reference to orders narrowed by \
                a filter); orders is sent to the receiver in part
                """,
                .scope(WireSamples.sampleScope)
            ),
            (
                "pull-scope-backfill",
                """
                PULL after 250 of a scope backfill (flag bit 4): the rows that bring the requester's back to its \
                scope
                """,
                .pull(WireSamples.scopeBackfillPull)
            ),
            (
                "refused", "REFUSED (12) of change 12 to orders [7]: outside the writer's scope there",
                .refused([
                    RefusedChange(
                        table: "orders", key: [.integer(7)], sequence: 12,
                        reason: "outside the scope of the writer: site = :peer_name")
                ])
            ),
            (
                "batch-eviction",
                """
                BATCH of format 2 (magic TB 02): a row of orders sent whole, then the eviction of row 8 (change \
                flag bit 3)
                """,
                .batch(eviction)
            ),
        ]
    }

    /// Valid BATCHes naming tables the receiver of §12 does or does not sync, and entries of the
    /// synced expiry store (§7.2, rules checked by the receiver, 2 and 5).
    static func receiverBatches() -> [(String, String, ChangeBatch, Receiver)] {
        let item = TableDescriptor(name: "item", keyColumns: ["id"], valueColumns: ["name"])
        let expiry = TableDescriptor(
            name: "tether_synced_expiry", keyColumns: ["table_name", "row_key"], valueColumns: ["expires_at"])
        let version = Version(timestamp: WireSamples.timestamp(0), origin: WireSamples.keyA)
        func change(_ table: Int, sequence: Int64, key: [DatabaseValue], values: [DatabaseValue]) -> RowChange {
            RowChange(
                table: table, key: key, isAlive: true, existence: version, values: values, versions: [],
                sequence: sequence)
        }
        func batch(_ tables: [TableDescriptor], _ changes: [RowChange]) -> ChangeBatch {
            ChangeBatch(
                source: WireSamples.keyA, after: 0, through: Int64(changes.count), isLast: true, tables: tables,
                changes: changes)
        }
        func one(_ table: TableDescriptor, key: [DatabaseValue], values: [DatabaseValue]) -> ChangeBatch {
            batch([table], [change(0, sequence: 1, key: key, values: values)])
        }
        return [
            (
                "batch-table-not-synced", "BATCH of a row of secret, a table the receiver has but does not sync",
                one(
                    TableDescriptor(name: "secret", keyColumns: ["id"], valueColumns: ["body"]), key: [.integer(1)],
                    values: [.text("classified")]),
                Receiver(session: .tableNotAllowed, syncFile: .keptForSchema)
            ),
            (
                "batch-table-named-like-sql",
                """
                BATCH of a row of a table named `bulk; DROP TABLE item` (a valid quoted SQLite name), which the \
                receiver lacks
                """,
                one(
                    TableDescriptor(name: "bulk; DROP TABLE item", keyColumns: ["id"], valueColumns: ["v"]),
                    key: [.integer(1)], values: [.text("x")]),
                Receiver(session: .tableNotAllowed, syncFile: .keptForSchema)
            ),
            (
                "batch-internal-table",
                "BATCH of a row of tether_peers, one of Tether's own tables, which no database syncs",
                one(
                    TableDescriptor(
                        name: "tether_peers", keyColumns: ["instance_key"], valueColumns: ["received_through"]),
                    key: [.blob(Data(WireSamples.keyB.bytes))], values: [.integer(0)]),
                Receiver(session: .tableNotAllowed, syncFile: .refused)
            ),
            (
                "batch-expiry",
                """
                BATCH of a row of item and its expiry: entry (table_name \"item\", row_key \"[1]\") expiring at \
                1893456000.0 (2030-01-01, Unix seconds, a real)
                """,
                batch(
                    [item, expiry],
                    [
                        change(0, sequence: 1, key: [.integer(1)], values: [.text("kept until 2030")]),
                        change(1, sequence: 2, key: [.text("item"), .text("[1]")], values: [.real(1_893_456_000)]),
                    ]),
                Receiver(session: .applied, syncFile: .applied)
            ),
            (
                "batch-expiry-table-not-synced",
                """
                BATCH of an expiry entry naming a row of secret, a table the receiver does not sync, at a date \
                already past
                """,
                one(expiry, key: [.text("secret"), .text("[1]")], values: [.real(0)]),
                Receiver(session: .tableNotAllowed, syncFile: .refused)
            ),
        ]
    }

    static func invalid() throws -> [Vector] {
        let limits = WireLimits.default
        let ping = try FrameEncoder(compression: false).encode(.ping(0x0123_4567_89ab_cdef))
        let helloBody = Array(try FrameEncoder(compression: false).encode(.hello(WireSamples.hello))[6...])
        let helloStart = Array(helloBody.prefix(1 + 16 + 32 + 1))  // version, key, fingerprint, capabilities
        let batchBody = BatchCoding.encode(WireSamples.smallBatch)
        // A hand-made LZ4 block: one sequence of five literals, the BYE body "\u{4}bye!".
        let literalBlock: [UInt8] = [0x50, 0x04] + Array("bye!".utf8)
        let compressedBatch = try FrameEncoder(compression: true).encode(.batch(WireSamples.largeBatch))
        let compressedBatchBlock = Array(
            compressedBatch[6...].dropFirst(
                uvarintBytes(UInt64(BatchCoding.encode(WireSamples.largeBatch).count)).count))

        // Batches that break a rule checked from the batch alone (§7.2), as the batch encoder writes
        // them (it trusts its input; the frame encoder would refuse them).
        let t = TableDescriptor(name: "t", keyColumns: ["id"], valueColumns: ["v"])
        func row(_ id: Int64, sequence: Int64) -> RowChange {
            RowChange(
                table: 0, key: [.integer(id)], isAlive: true,
                existence: Version(timestamp: WireSamples.timestamp(0), origin: WireSamples.keyA),
                values: [.text("x")], versions: [], sequence: sequence)
        }
        func batchFrame(after: Int64, through: Int64, tables: [TableDescriptor] = [t], _ changes: [RowChange])
            -> [UInt8]
        {
            rawFrame(
                type: 3,
                body: BatchCoding.encode(
                    ChangeBatch(
                        source: WireSamples.keyA, after: after, through: through, isLast: true,
                        tables: tables, changes: changes)))
        }

        let cases: [(String, String, [UInt8], WireError, Vector.StreamBehavior)] = [
            (
                "frame-too-large",
                "length 16 MiB + 1, above maxFrameSize: refused from the 4-byte header, before any body arrives",
                [0x01, 0x00, 0x00, 0x01, 6, 0] + Array(repeating: 0, count: 8),
                .frameTooLarge(length: limits.maxFrameSize + 1, limit: limits.maxFrameSize), .sameError
            ),
            (
                "frame-too-short", "length 1: a frame needs at least its type and flags bytes",
                [0, 0, 0, 1, 6], .frameTooShort(length: 1), .sameError
            ),
            (
                "truncated-frame", "a PING frame missing its last 3 bytes (a stream decoder waits for them)",
                Array(ping.dropLast(3)), .truncatedFrame(expected: 14, available: 11), .needsMoreBytes
            ),
            (
                "trailing-frame-bytes", "a PING frame followed by one more byte, given as a single frame",
                ping + [0], .trailingBytes(after: "frame", count: 1), .messageThenNeedsMoreBytes
            ),
            ("unknown-type", "message type 14", rawFrame(type: 14, body: []), .unknownMessageType(14), .sameError),
            (
                "unknown-flags", "PING with flag bit 1 set", rawFrame(type: 6, flags: 2, body: Array(ping[6...])),
                .unknownFlags(2), .sameError
            ),
            (
                "compressed-hello", "HELLO with the compression flag: HELLO is never compressed",
                rawFrame(
                    type: 1, flags: 1,
                    body: uvarintBytes(UInt64(helloBody.count)) + (LZ4Block.compress(helloBody) ?? [])),
                .compressionNotAllowed(.hello), .sameError
            ),
            (
                "decompression-bomb",
                "compressed BATCH declaring 4 GiB of raw data: refused before allocating (limit 64 MiB)",
                rawFrame(type: 3, flags: 1, body: uvarintBytes(1 << 32) + compressedBatchBlock),
                .decompressedSizeTooLarge(declared: 1 << 32, limit: limits.maxDecompressedSize), .sameError
            ),
            (
                "corrupt-lz4", "compressed BATCH whose LZ4 block announces more literals than it holds",
                rawFrame(type: 3, flags: 1, body: uvarintBytes(300) + [0xF0, 0xFF, 0x10, 0x41, 0x41]),
                .decompressionFailed(.batch), .sameError
            ),
            (
                "raw-length-mismatch", "compressed BYE declaring 6 raw bytes whose LZ4 block produces 5",
                rawFrame(type: 9, flags: 1, body: uvarintBytes(6) + literalBlock),
                .decompressedSizeMismatch(declared: 6, actual: 5), .sameError
            ),
            (
                "raw-length-too-small",
                "compressed BYE declaring 4 raw bytes whose LZ4 block produces 5 (LZ4 stops at the declared size)",
                rawFrame(type: 9, flags: 1, body: uvarintBytes(4) + literalBlock), .decompressionFailed(.bye),
                .sameError
            ),
            (
                "trailing-body-bytes", "ACK through 5 followed by an extra byte in the body",
                rawFrame(type: 4, body: [5, 0]), .trailingBytes(after: "ACK body", count: 1), .sameError
            ),
            (
                "bad-utf8", "BYE whose reason is the bytes c3 28 (not UTF-8)",
                rawFrame(type: 9, body: [2, 0xC3, 0x28]),
                .malformedBody(type: .bye, reason: "reason at body byte 0 is not valid UTF-8"), .sameError
            ),
            (
                "truncated-varint", "ACK whose varint has its continuation bit set on its last byte",
                rawFrame(type: 4, body: [0xFF, 0x80]), .truncated(field: "ACK.through", offset: 0), .sameError
            ),
            (
                "varint-overflow", "CHANGED with a ten-byte varint above 2^64-1",
                rawFrame(type: 5, body: Array(repeating: 0xFF, count: 9) + [0x02]),
                .malformedBody(type: .changed, reason: "latest: varint overflows 64 bits"), .sameError
            ),
            (
                "sequence-too-large", "ACK through 2^63, above the largest sequence number",
                rawFrame(type: 4, body: uvarintBytes(1 << 63)),
                .malformedBody(type: .ack, reason: "through 9223372036854775808 is above 2^63-1"), .sameError
            ),
            (
                "string-too-long", "ERROR whose message declares 65537 bytes: refused from the length alone",
                rawFrame(type: 8, body: [6] + uvarintBytes(65_537) + Array("…".utf8)),
                .stringTooLong(field: "ERROR.message", length: 65_537, limit: limits.maxStringLength), .sameError
            ),
            (
                "unsupported-version",
                """
                HELLO with protocol version 1, the version before schema negotiation (the version is checked \
                before anything else)
                """,
                rawFrame(type: 1, body: [1] + helloBody.dropFirst()), .unsupportedProtocolVersion(1), .sameError
            ),
            (
                "hello-rename-unknown-column",
                "HELLO renaming column score of table t to points, which t does not list",
                rawFrame(
                    type: 1,
                    body: helloStart + [1, 1, 0x74, 1, 2, 0x69, 0x64, 0, 1, 1, 0x74, 5] + Array("score".utf8) + [6]
                        + Array("points".utf8)),
                .malformedBody(type: .hello, reason: "table t: renamed column points is not one of its columns"),
                .sameError
            ),
            (
                "too-many-tables", "HELLO announcing 4097 tables",
                rawFrame(type: 1, body: helloStart + uvarintBytes(4_097)),
                .tooManyTables(count: 4_097, limit: limits.maxTables), .sameError
            ),
            (
                "hello-duplicate-table", "HELLO listing table t twice",
                rawFrame(type: 1, body: helloStart + [2, 1, 0x74, 1, 2, 0x69, 0x64, 0, 1, 0x74, 1, 2, 0x69, 0x64, 0]),
                .malformedBody(type: .hello, reason: "table t is listed twice"), .sameError
            ),
            (
                "pull-zero-max-changes", "PULL asking for at most 0 changes",
                rawFrame(type: 2, body: [0, 0, 0, 1]),
                .malformedBody(type: .pull, reason: "maxChanges 0 is not between 1 and \(Int.max)"), .sameError
            ),
            (
                "pull-unknown-flags", "PULL with flag bit 7 set",
                rawFrame(type: 2, body: [0, 0x80, 1, 1]), .malformedBody(type: .pull, reason: "unknown flags 0x80"),
                .sameError
            ),
            (
                "batch-bad-magic", "BATCH whose body starts with batch format version 5",
                rawFrame(type: 3, body: [0x54, 0x42, 0x05] + batchBody.dropFirst(3)),
                .batch(
                    BatchDecodingError.malformed(
                        offset: 3, reason: "not a Tether change batch (bad magic or format version)")), .sameError
            ),
            (
                "batch-trailing-bytes", "BATCH with one byte after the change batch",
                rawFrame(type: 3, body: batchBody + [0]),
                .batch(
                    BatchDecodingError.malformed(
                        offset: batchBody.count, reason: "1 unexpected byte(s) after the batch")), .sameError
            ),
            (
                "batch-unknown-site", "BATCH whose only change names site 1 of 1",
                rawFrame(
                    type: 3,
                    body: BatchCoding.magic + WireSamples.keyA.bytes + [0, 1, 1] + [1] + WireSamples.keyA.bytes
                        + [1, 1, 0x74, 1, 2, 0x69, 0x64, 0] + [1, 0, 2, 2, 4, 1] + [1, 2]),
                .batch(BatchDecodingError.malformed(offset: 53, reason: "site 1 of 1")), .sameError
            ),
            (
                "batch-sequence-not-increasing",
                "BATCH after 0 through 2 whose second change has sequence 1, not above the first's 2",
                batchFrame(after: 0, through: 2, [row(1, sequence: 2), row(2, sequence: 1)]),
                .batch(.invalid(.sequenceNotIncreasing(change: 1, table: "t", sequence: 1, previous: 2))), .sameError
            ),
            (
                "batch-sequence-outside-range", "BATCH after 0 through 1 whose only change has sequence 2",
                batchFrame(after: 0, through: 1, [row(1, sequence: 2)]),
                .batch(.invalid(.sequenceOutOfRange(change: 0, table: "t", sequence: 2, after: 0, through: 1))),
                .sameError
            ),
            (
                "batch-after-above-through", "BATCH after 2 through 1, with no changes: not a range",
                batchFrame(after: 2, through: 1, []), .batch(.invalid(.invalidRange(after: 2, through: 1))), .sameError
            ),
            (
                "batch-duplicate-table", "BATCH describing table t twice",
                batchFrame(after: 0, through: 1, tables: [t, t], [row(1, sequence: 1)]),
                .batch(.invalid(.tableNamedTwice(name: "t", first: 0, second: 1))), .sameError
            ),
            (
                "hello-too-many-renames",
                "HELLO of table t announcing 65537 renames, more than 16 × maxTables: refused from the count alone",
                rawFrame(type: 1, body: helloStart + [1, 1, 0x74, 1, 2, 0x69, 0x64, 0] + uvarintBytes(65_537)),
                .malformedBody(type: .hello, reason: "65537 renames, more than 65536"), .sameError
            ),
            (
                "hello-renames-beyond-body", "HELLO of table t announcing 2 renames with no bytes left for them",
                rawFrame(type: 1, body: helloStart + [1, 1, 0x74, 1, 2, 0x69, 0x64, 0] + [2]),
                .truncated(field: "HELLO.rename count", offset: helloStart.count + 8), .sameError
            ),
            (
                "pull-backfill-duplicate-table", "PULL of a backfill through 9 listing table t twice",
                rawFrame(type: 2, body: [0, 4, 1, 1] + [9, 2] + [1, 0x74, 0] + [1, 0x74, 0]),
                .malformedBody(type: .pull, reason: "backfill table t is listed twice"), .sameError
            ),
            (
                "pull-backfill-duplicate-column", "PULL of a backfill through 9 listing column c of table t twice",
                rawFrame(type: 2, body: [0, 4, 1, 1] + [9, 1] + [1, 0x74, 2, 1, 0x63, 1, 0x63]),
                .malformedBody(type: .pull, reason: "backfill table t: column c is listed twice"), .sameError
            ),
            (
                "pull-backfill-no-table", "PULL of a backfill through 9 naming no table",
                rawFrame(type: 2, body: [0, 4, 1, 1] + [9, 0]),
                .malformedBody(type: .pull, reason: "a backfill names 1 to 4096 tables, not 0"), .sameError
            ),
            (
                "pull-backfill-too-many-tables",
                "PULL of a backfill announcing 4097 tables: refused from the count alone",
                rawFrame(type: 2, body: [0, 4, 1, 1] + [9] + uvarintBytes(4_097)),
                .malformedBody(type: .pull, reason: "a backfill names 1 to 4096 tables, not 4097"), .sameError
            ),
            (
                "pull-backfill-before-after", "PULL after 10 of a backfill through 9, before its after",
                rawFrame(type: 2, body: [10, 4, 1, 1] + [9, 1, 1, 0x74, 0]),
                .malformedBody(type: .pull, reason: "backfill through 9 is before after 10"), .sameError
            ),
            (
                "deferred-empty-range", "DEFERRED after 5 through 5: it must cover at least one sequence",
                rawFrame(type: 10, body: [5, 5, 1, 0, 0]),
                .malformedBody(type: .deferred, reason: "through 5 is not after 5"), .sameError
            ),
            // Version 3.
            (
                "pull-scope-backfill-and-backfill",
                "PULL with flags scopeBackfill and backfill (bits 4 and 2) together",
                rawFrame(type: 2, body: [0, 0x14, 1, 1] + [9, 1, 1, 0x74, 0]),
                .malformedBody(type: .pull, reason: "a scope backfill is not also a schema backfill"), .sameError
            ),
            (
                "pull-scope-backfill-resuming",
                "PULL with flags scopeBackfill and resumingResync (bits 4 and 0) together",
                rawFrame(type: 2, body: [0, 0x11, 1, 1]),
                .malformedBody(type: .pull, reason: "a scope backfill does not resume a full resync"), .sameError
            ),
            // Parked pulls (§8.4).
            (
                "pull-park-resuming", "PULL with flags park and resumingResync (bits 5 and 0) together",
                rawFrame(type: 2, body: [0, 0x21, 1, 1]),
                .malformedBody(type: .pull, reason: "a parked PULL does not resume a full resync"), .sameError
            ),
            (
                "pull-park-backfill", "PULL with flags park and backfill (bits 5 and 2) together",
                rawFrame(type: 2, body: [0, 0x24, 1, 1] + [9, 1, 1, 0x74, 0]),
                .malformedBody(type: .pull, reason: "a parked PULL is not a backfill"), .sameError
            ),
            (
                "pull-park-scope-backfill", "PULL with flags park and scopeBackfill (bits 5 and 4) together",
                rawFrame(type: 2, body: [0, 0x30, 1, 1]),
                .malformedBody(type: .pull, reason: "a parked PULL is not a scope backfill"), .sameError
            ),
            // Follow-on pulls (§8.3).
            (
                "pull-follow-on-after", "PULL follow-on (flag bit 6) with after 7",
                rawFrame(type: 2, body: [7, 0x40, 1, 1]),
                .malformedBody(type: .pull, reason: "a follow-on PULL has after 0, not 7"), .sameError
            ),
            (
                "pull-follow-on-park", "PULL with flags followOn and park (bits 6 and 5) together",
                rawFrame(type: 2, body: [0, 0x60, 1, 1]),
                .malformedBody(
                    type: .pull,
                    reason:
                        "a follow-on PULL is an ordinary pull (no resync, backfill, scope backfill, park or history)"),
                .sameError
            ),
            (
                "scope-unknown-rule", "SCOPE whose interest in t has rule kind 3",
                rawFrame(type: 13, body: [1, 1, 0x74, 3, 0]),
                .malformedBody(type: .scope, reason: "unknown rule kind 3"), .sameError
            ),
            (
                "scope-rules-too-deep",
                "SCOPE whose interest in t nests `both` five deep: refused before the fifth is read",
                rawFrame(type: 13, body: [1, 1, 0x74, 2, 2, 2, 2, 2]),
                .malformedBody(type: .scope, reason: "an interest's rules nest more than 4 deep"), .sameError
            ),
            (
                "scope-duplicate-interest", "SCOPE naming table t twice in its interest",
                rawFrame(type: 13, body: [2, 1, 0x74, 0, 1, 0x31, 1, 0x74, 0, 1, 0x31, 0]),
                .malformedBody(type: .scope, reason: "the interest names table t twice"), .sameError
            ),
            (
                "scope-empty-filter", "SCOPE whose interest in t is an empty filter",
                rawFrame(type: 13, body: [1, 1, 0x74, 0, 0, 0]),
                .malformedBody(type: .scope, reason: "the interest in t: an empty filter"), .sameError
            ),
            (
                "scope-too-many-tables", "SCOPE announcing an interest in 4097 tables: refused from the count alone",
                rawFrame(type: 13, body: uvarintBytes(4_097)),
                .malformedBody(type: .scope, reason: "an interest in 4097 tables, more than 4096"), .sameError
            ),
            (
                "scope-duplicate-scoped", "SCOPE listing scoped table t twice",
                rawFrame(type: 13, body: [0, 2, 1, 0x74, 1, 0x74]),
                .malformedBody(type: .scope, reason: "scoped table t is listed twice"), .sameError
            ),
            (
                "scope-column-rule-twice", "SCOPE giving column c of t two rules",
                rawFrame(type: 13, body: [0, 0, 2, 1, 0x74, 1, 0x63, 1, 1, 0x74, 1, 0x63, 0]),
                .malformedBody(type: .scope, reason: "column c of t has two rules"), .sameError
            ),
            (
                "scope-too-many-column-rules", "SCOPE listing 65537 column rules, more than 16 × maxTables",
                rawFrame(type: 13, body: [0, 0, 0x81, 0x80, 0x04]),
                .malformedBody(type: .scope, reason: "65537 column rules, more than 65536"), .sameError
            ),
            (
                "refused-none", "REFUSED listing no change",
                rawFrame(type: 12, body: [0]), .malformedBody(type: .refused, reason: "REFUSED lists no change"),
                .sameError
            ),
            (
                "refused-no-key", "REFUSED of a change to t with no key value",
                rawFrame(type: 12, body: [1, 1, 0x74, 0, 5, 0]),
                .malformedBody(type: .refused, reason: "a refused change of t has no key"), .sameError
            ),
            (
                "refused-bad-value", "REFUSED of a change to t whose key value has tag 9",
                rawFrame(type: 12, body: [1, 1, 0x74, 1, 9, 5, 0]),
                .malformedBody(type: .refused, reason: "key value at body byte 4: unknown value tag 9"), .sameError
            ),
        ]
        return (cases + (try columnarInvalid()) + compactInvalid()).map { name, description, bytes, error, stream in
            Vector(
                file: "invalid/\(name).hex", description: description, bytes: bytes,
                expectation: .invalid(error, stream: stream))
        }
    }

    /// BATCHes of format 3 (§7.5) that break its rules, made by hand: each column is a mode byte
    /// (0 plain, 2 delta runs, 4 repeats) and its values, zigzag (a value v ≥ 0 is 2v).
    static func columnarInvalid() throws -> [(String, String, [UInt8], WireError, Vector.StreamBehavior)] {
        /// Magic, source keyA, after 0, `through`, isLast, one site (keyA), one table t (key id,
        /// value columns `values`).
        func header(through: Int, keys: [String] = ["id"], values: [String] = []) -> [UInt8] {
            var writer = ByteWriter()
            writer.append(BatchCoding.columnarMagic + WireSamples.keyA.bytes)
            writer.append([0] + uvarintBytes(UInt64(through)) + [1, 1] + WireSamples.keyA.bytes + [1])
            writer.string("t")
            for columns in [keys, values] {
                writer.uvarint(UInt64(columns.count))
                for column in columns { writer.string(column) }
            }
            return writer.bytes
        }
        /// `count` changes of table 0: sequences 1…count, flags `flags`, existence time 0 at site 0.
        func changes(_ count: Int, flags: UInt8 = 3) -> [UInt8] {
            uvarintBytes(UInt64(count)) + [4] + uvarintBytes(UInt64(count)) + [0] + [2] + uvarintBytes(UInt64(count))
                + [2]
                + [4] + uvarintBytes(UInt64(count)) + [2 * flags] + [4] + uvarintBytes(UInt64(count)) + [0] + [4]
                + uvarintBytes(UInt64(count)) + [0]
        }
        func batch(_ body: [UInt8]) -> [UInt8] { rawFrame(type: 3, body: body) }
        func failure(_ body: [UInt8]) -> WireError {
            do {
                _ = try BatchCoding.decode(body, maximumFormat: BatchCoding.columnarFormat)
                return .malformedBody(type: .batch, reason: "decoded")
            } catch {
                return .batch(error)
            }
        }
        func vector(_ name: String, _ description: String, _ body: [UInt8]) -> (
            String, String, [UInt8], WireError, Vector.StreamBehavior
        ) {
            ("batch-columnar-\(name)", description, batch(body), failure(body), .sameError)
        }
        let small = try BatchCoding.encodeColumnar(WireSamples.smallBatch) ?? []
        let manyKeys = (0..<100).map { "k\($0)" }
        return [
            vector(
                "truncated-column", "BATCH of format 3: vector 33's batch cut 3 bytes short, inside its last column",
                Array(small.dropLast(3))),
            vector(
                "too-many-changes",
                "BATCH of format 3 announcing 4194305 changes, above maxBatchValues: refused from the count alone",
                header(through: 1) + uvarintBytes(4_194_305)),
            vector(
                "run-overflow", "BATCH of format 3 of 2 changes whose table column is a run of 3 (repeats)",
                header(through: 2) + [2, 4, 3, 0]),
            vector(
                "zero-run", "BATCH of format 3 of 2 changes whose table column starts with a run of 0",
                header(through: 2) + [2, 4, 0, 0, 4, 2, 0]),
            vector(
                "unknown-mode", "BATCH of format 3 whose table column has mode 5", header(through: 2) + [2, 5, 0, 0]),
            vector(
                "bad-shared-prefix",
                "BATCH of format 3 of two text keys, the second sharing 5 bytes with the first, of 3 (abc)",
                header(through: 2) + changes(2) + [4, 2, 6] + [0, 0, 10] + [0, 6, 0] + Array("abc".utf8)),
            vector(
                "unknown-tag", "BATCH of format 3 whose key column has value tag 5",
                header(through: 2) + changes(2) + [4, 2, 10]),
            vector(
                "partial-leaves-nothing-out",
                "BATCH of format 3 of a partial change (flags 7) of t whose only value column v is not left out",
                header(through: 1, values: ["v"]) + changes(1, flags: 7) + [0, 2] + [0, 2] + [0, 0] + [0, 0]),
            vector(
                "too-many-values",
                """
                BATCH of format 3 of 41528 changes of a table of 100 key columns: 4194328 values, above \
                maxBatchValues
                """,
                header(through: 41_528, keys: manyKeys) + changes(41_528)),
        ]
    }

    /// BATCHes of format 4 (§7.6) that break its rules, made by hand: one table t (key id, value
    /// column v), as `columnarInvalid` lays them out, with the magic TB 04.
    static func compactInvalid() -> [(String, String, [UInt8], WireError, Vector.StreamBehavior)] {
        func body(changes count: Int, values: [UInt8]) -> [UInt8] {
            var writer = ByteWriter()
            writer.append(BatchCoding.compactColumnarMagic + WireSamples.keyA.bytes)
            writer.append([0] + uvarintBytes(UInt64(count)) + [1, 1] + WireSamples.keyA.bytes + [1])
            writer.string("t")
            for columns in [["id"], ["v"]] {
                writer.uvarint(UInt64(columns.count))
                for column in columns { writer.string(column) }
            }
            // changeCount, then tables, sequences 1…, flags 3, existence time 0, site 0 (repeats or delta runs)
            writer.append(
                uvarintBytes(UInt64(count)) + [4] + uvarintBytes(UInt64(count)) + [0] + [2]
                    + uvarintBytes(UInt64(count)) + [2] + [4] + uvarintBytes(UInt64(count)) + [6] + [4]
                    + uvarintBytes(UInt64(count)) + [0] + [4] + uvarintBytes(UInt64(count)) + [0])
            // key column id: tags all 1 (repeats), integers 1… (delta runs)
            writer.append([4] + uvarintBytes(UInt64(count)) + [2] + [2] + uvarintBytes(UInt64(count)) + [2])
            writer.append(values)
            return writer.bytes
        }
        func vector(_ name: String, _ description: String, _ bytes: [UInt8]) -> (
            String, String, [UInt8], WireError, Vector.StreamBehavior
        ) {
            var failure = WireError.malformedBody(type: .batch, reason: "decoded")
            do {
                _ = try BatchCoding.decode(bytes, maximumFormat: BatchCoding.compactColumnarFormat)
            } catch {
                failure = .batch(error)
            }
            return ("batch-compact-\(name)", description, rawFrame(type: 3, body: bytes), failure, .sameError)
        }
        // v's values: tags (repeats), then the integers, reals, texts as each case says.
        return [
            vector(
                "unknown-layout", "BATCH of format 4 of 2 texts whose string column has layout 2",
                body(changes: 2, values: [4, 2, 6] + [2])),
            vector(
                "dictionary-index-out-of-range",
                "BATCH of format 4 of 2 texts, a dictionary of 1 string (a) and the indices 0 and 1",
                body(changes: 2, values: [4, 2, 6] + [1, 1] + [0, 0] + [0, 2] + Array("a".utf8) + [0, 0, 2])),
            vector(
                "empty-dictionary", "BATCH of format 4 of 2 texts whose dictionary holds 0 strings",
                body(changes: 2, values: [4, 2, 6] + [1, 0] + [0, 0, 0])),
            vector(
                "dictionary-larger-than-column",
                "BATCH of format 4 of 1 text whose dictionary announces 2 strings",
                body(changes: 1, values: [4, 1, 6] + [1, 2] + [0, 0, 0] + [0, 2, 2] + Array("ab".utf8) + [0, 0])),
            vector(
                "whole-real-beyond-2-53",
                "BATCH of format 4 of 1 whole real (value tag 5) of 2^53 + 1, which a double cannot hold",
                body(changes: 1, values: [4, 1, 10] + [0] + uvarintBytes(2 * ((1 << 53) + 1)))),
        ]
    }

    static func manifestEntry(_ vector: Vector) -> ManifestEntry {
        var entry = ManifestEntry(file: vector.file, description: vector.description, valid: true)
        switch vector.expectation {
        case let .valid(message, encoderCompression, encoderColumnarBatches, encoderCompactColumns):
            entry.compressed = vector.bytes[5] & 1 != 0
            entry.encoderCompression = encoderCompression
            entry.encoderColumnarBatches = encoderColumnarBatches ? true : nil
            entry.encoderCompactColumns = encoderCompactColumns ? true : nil
            entry.message = MessageJSON.describe(message)
            entry.receiver = vector.receiver
        case let .invalid(error, stream):
            entry.valid = false
            entry.error = error.caseName
            entry.code = Int(error.code.rawValue)
            entry.codeName = String(describing: error.code)
            entry.errorDescription = error.description
            entry.stream = stream
        }
        return entry
    }
}
