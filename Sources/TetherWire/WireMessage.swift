import TetherBatch

/// One message of the sync protocol, as a value: what a frame carries.
public enum WireMessage: Sendable, Equatable {
    /// Each side's first message: who it is, what it syncs, what it can do.
    case hello(Hello)
    /// A request for the sender's changes after a cursor.
    case pull(Pull)
    /// Changes answering a PULL.
    case batch(ChangeBatch)
    /// The sender applied the receiver's changes through this sequence.
    case ack(through: Int64)
    /// Live push notice: the sender has changes through this sequence.
    case changed(latest: Int64)
    /// Heartbeat; the receiver answers PONG with the same nonce.
    case ping(UInt64)
    case pong(UInt64)
    /// Why the sender is about to close the connection.
    case error(code: WireErrorCode, message: String)
    /// Graceful close.
    case bye(reason: String)
    /// The sender did not apply the receiver's batch, for a reason time may cure, and will pull
    /// it again later (only with `Capabilities.deferrals` negotiated).
    case deferred(Deferral)
    /// The mark of the sender's history that the BATCH following it leaves the receiver (only
    /// with `Capabilities.histories` negotiated, §8.9).
    case history(HistoryMark)
    /// The sender applied the receiver's batch but for these changes, which reached outside the
    /// receiver's scope there (version 3, §6.11): nothing of them was written.
    case refused([RefusedChange])
    /// What the sender asks to receive and what it sends only in part (version 3, §6.12): the
    /// first message after HELLO once both announce `Capabilities.version3`.
    case scope(ScopeAnnouncement)

    public var type: MessageType {
        switch self {
        case .hello: return .hello
        case .pull: return .pull
        case .batch: return .batch
        case .ack: return .ack
        case .changed: return .changed
        case .ping: return .ping
        case .pong: return .pong
        case .error: return .error
        case .bye: return .bye
        case .deferred: return .deferred
        case .history: return .history
        case .refused: return .refused
        case .scope: return .scope
        }
    }

    /// The ERROR message to send before closing because of `error`; its
    /// description is cut (at a character boundary) to fit `limits`.
    public static func error(reporting error: WireError, limits: WireLimits = .default) -> WireMessage {
        .error(code: error.code, message: truncatedUTF8(error.description, maxBytes: limits.maxStringLength))
    }

    static func truncatedUTF8(_ text: String, maxBytes: Int) -> String {
        guard text.utf8.count > maxBytes else { return text }
        var result = ""
        var used = 0
        for character in text {
            let size = character.utf8.count
            if used + size > maxBytes { break }
            result.append(character)
            used += size
        }
        return result
    }
}

/// The type byte of a frame.
public enum MessageType: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    case hello = 1, pull = 2, batch = 3, ack = 4, changed = 5, ping = 6, pong = 7, error = 8, bye = 9, deferred = 10,
        history = 11, refused = 12, scope = 13

    public var description: String {
        switch self {
        case .hello: return "HELLO"
        case .pull: return "PULL"
        case .batch: return "BATCH"
        case .ack: return "ACK"
        case .changed: return "CHANGED"
        case .ping: return "PING"
        case .pong: return "PONG"
        case .error: return "ERROR"
        case .bye: return "BYE"
        case .deferred: return "DEFERRED"
        case .history: return "HISTORY"
        case .refused: return "REFUSED"
        case .scope: return "SCOPE"
        }
    }
}

/// Optional features a peer announces in HELLO; a session uses the
/// intersection of both sides' sets. Unknown bits are kept when decoding
/// (a newer peer may announce more) and drop out of the intersection.
public struct Capabilities: OptionSet, Sendable, Hashable {
    public let rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }

    /// Frames may carry LZ4-compressed bodies.
    public static let lz4 = Capabilities(rawValue: 1 << 0)
    /// The peer sends CHANGED notices when it has new changes.
    public static let livePush = Capabilities(rawValue: 1 << 1)

    /// The peer sends and understands DEFERRED: a batch it cannot apply yet (its clock is behind
    /// the batch's timestamps) no longer ends the session.
    public static let deferrals = Capabilities(rawValue: 1 << 2)

    /// The peer sends HISTORY before each BATCH and shows the mark it keeps back in its first
    /// PULL (flag `history`), so that a peer restored in place and written since is noticed (§8.9).
    public static let histories = Capabilities(rawValue: 1 << 3)

    /// The peer speaks protocol version 3 (§2): partial replication — SCOPE after HELLO, batches
    /// of format 2 (evictions), REFUSED, and PULL's `scopeBackfill` flag. HELLO's own version field
    /// stays 2, which every peer since version 2 reads.
    public static let version3 = Capabilities(rawValue: 1 << 4)

    /// The peer reads BATCH bodies in batch format 3, columnar (§7.5), as well as formats 1 and 2:
    /// each side sends format 3 once both announce it (a batch beyond `WireLimits.columnarLimits`
    /// still goes in format 1 or 2).
    public static let columnarBatches = Capabilities(rawValue: 1 << 5)
    /// The peer reads batch format 4, columnar with compact values (§7.6): once both announce it
    /// and `columnarBatches`, each side sends format 4 where it would send format 3.
    public static let compactColumns = Capabilities(rawValue: 1 << 6)
    /// The peer parks PULLs and answers parked ones (§8.4): with `livePush` too, a caught-up
    /// requester leaves a PULL with flag `park` at the responder, which answers it when it commits
    /// changes the requester lacks, instead of sending CHANGED and waiting for a PULL.
    public static let parkedPulls = Capabilities(rawValue: 1 << 7)
    /// The peer keeps quiet sessions quiet (§8.5): once nothing but PING and PONG went either way
    /// for 60 s, both sides ping at most every 300 s and allow 900 s of silence, until any other
    /// frame; an idle hub then reads and answers one PING per peer every five minutes.
    public static let quietHeartbeats = Capabilities(rawValue: 1 << 8)
    /// The peer sends and answers follow-on PULLs (§8.3): a requester catching up keeps more than one
    /// batch coming, so that a link with a round trip is not left idle between batches.
    public static let pullsAhead = Capabilities(rawValue: 1 << 9)
    /// The peer merges columns by rules (§6.12, §7.7): with `version3` too, each side's SCOPE lists
    /// its columns whose rule is not last-writer-wins, and a session whose peers merge a shared
    /// column by different rules is refused (ERROR 2). A peer without it cannot sync a shared
    /// column that merges by a rule.
    public static let mergeRules = Capabilities(rawValue: 1 << 10)

    /// Everything this implementation can do.
    public static let supported: Capabilities = [
        .lz4, .livePush, .deferrals, .histories, .version3, .columnarBatches, .compactColumns, .parkedPulls,
        .quietHeartbeats, .pullsAhead, .mergeRules,
    ]

    /// What a session between peers announcing `self` and `other` may use.
    public func negotiated(with other: Capabilities) -> Capabilities {
        intersection(other).intersection(.supported)
    }
}

/// A digest of the synced schema (computed by the sync layer): peers whose
/// fingerprints differ compare their HELLO table lists to name the difference.
public struct SchemaFingerprint: Sendable, Hashable, CustomStringConvertible {
    public static let byteCount = 32
    public let bytes: [UInt8]

    /// nil unless exactly 32 bytes.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == Self.byteCount else { return nil }
        self.bytes = Array(bytes)
    }

    /// From exactly 32 bytes (checked by the caller).
    init(uncheckedBytes bytes: some Collection<UInt8>) { self.bytes = Array(bytes) }

    public var description: String {
        let digits = Array("0123456789abcdef".utf8)
        return String(decoding: bytes.flatMap { [digits[Int($0 >> 4)], digits[Int($0 & 0xf)]] }, as: UTF8.self)
    }
}

/// HELLO: the first message each side sends.
public struct Hello: Sendable, Hashable {
    /// Always `WireProtocol.version` when sent by this implementation.
    public var protocolVersion: UInt64
    public var instanceKey: InstanceKey
    public var schemaFingerprint: SchemaFingerprint
    public var capabilities: Capabilities
    /// The synced tables: peers sync the tables and columns both list (§8.2).
    public var tables: [TableDescriptor]
    /// Value columns the sender renamed: a peer that still has the old name syncs it as the same column.
    public var renames: [ColumnRename]
    public init(
        protocolVersion: UInt64 = WireProtocol.version, instanceKey: InstanceKey, schemaFingerprint: SchemaFingerprint,
        capabilities: Capabilities = .supported, tables: [TableDescriptor], renames: [ColumnRename] = []
    ) {
        self.protocolVersion = protocolVersion
        self.instanceKey = instanceKey
        self.schemaFingerprint = schemaFingerprint
        self.capabilities = capabilities
        self.tables = tables
        self.renames = renames
    }
}

extension Hello {
    /// Writes `tableCount` then each table (name, key columns, value columns), as HELLO carries
    /// them (§6.1 of Protocol/README.md). The schema fingerprint is the SHA-256 of these bytes,
    /// so HELLO and the fingerprint cannot disagree on the encoding.
    public static func writeTables(_ tables: [TableDescriptor], into writer: inout ByteWriter) {
        writer.uvarint(UInt64(tables.count))
        for table in tables {
            writer.string(table.name)
            for columns in [table.keyColumns, table.valueColumns] {
                writer.uvarint(UInt64(columns.count))
                for column in columns { writer.string(column) }
            }
        }
    }
}

/// SCOPE (version 3, §6.12): what its sender asks to receive, and what it sends only in part.
public struct ScopeAnnouncement: Sendable, Hashable {
    /// The rows the sender asks to receive, per table (a table not named: every row the
    /// receiver's policy grants). The receiver sends the rows both this and its policy hold (§8.10).
    public var interest: [String: ScopeRule]
    /// The tables of which the sender sends the receiver only part (its policy for the receiver):
    /// the receiver asks for a scope backfill once caught up (§8.10).
    public var scoped: Set<String>
    /// The sender's value columns that merge by a rule other than last-writer-wins, sent when
    /// `mergeRules` is negotiated (nil: not sent).
    public var columnRules: [ColumnRuleClaim]?

    public init(interest: [String: ScopeRule] = [:], scoped: Set<String> = [], columnRules: [ColumnRuleClaim]? = nil) {
        self.interest = interest
        self.scoped = scoped
        self.columnRules = columnRules
    }
}

/// A column's merge rule as its peer announces it in SCOPE: the rule's number, kept as sent so
/// that a rule this side does not know is named in the refusal rather than failing the decoder.
public struct ColumnRuleClaim: Sendable, Hashable {
    public var table: String
    public var column: String
    public var rule: UInt8

    public init(table: String, column: String, rule: UInt8) {
        self.table = table
        self.column = column
        self.rule = rule
    }
}

/// A value column its sender renamed (HELLO, §6.1): `from` on a peer is `to` here.
public struct ColumnRename: Sendable, Hashable {
    public var table: String
    public var from: String
    public var to: String

    public init(table: String, from: String, to: String) {
        self.table = table
        self.from = from
        self.to = to
    }
}

/// What a backfill PULL asks for (§8.3): the responder's rows through `through` that hold a
/// value other than the column's default in one of the newly shared columns, or every row of a
/// newly shared table.
public struct Backfill: Sendable, Hashable {
    /// A table whose rows are backfilled: those of its `columns` (the requester's names) not at
    /// their default, or every row when `columns` is empty (the whole table is newly shared).
    public struct Table: Sendable, Hashable {
        public var name: String
        public var columns: [String]
        public init(name: String, columns: [String]) {
            self.name = name
            self.columns = columns
        }
    }
    /// The last sequence number of the responder the backfill covers: the requester's cursor
    /// when it began (later changes come by the ordinary pulls).
    public var through: Int64
    public var tables: [Table]

    public init(through: Int64, tables: [Table]) {
        self.through = through
        self.tables = tables
    }
}

/// PULL: "send me your changes after my cursor on you".
public struct Pull: Sendable, Hashable {
    /// The requester's cursor on the receiver (the receiver's sequence), 0 for none yet.
    public var after: Int64
    /// The requester is in the middle of a full resync from the receiver.
    public var resumingResync: Bool
    /// At most this many changes in the answering BATCH (at least 1).
    public var maxChanges: Int
    /// About this many encoded bytes at most (at least 1; a single larger row still goes alone).
    public var maxBytes: Int
    /// The answering batch must hold whole rows (no partial changes, §7.2): the requester found
    /// it did not hold values a partial change left out.
    public var wholeRows: Bool
    /// Set for a backfill (§8.3): only rows holding values of newly shared columns or tables, through
    /// `backfill.through`; the answering batch does not move the requester's cursor.
    public var backfill: Backfill?
    /// The mark of the receiver's history the requester keeps (flag `history`, only with
    /// `Capabilities.histories` negotiated, §8.9): the receiver checks it still has that history.
    public var history: HistoryMark?
    /// Version 3, flag `scopeBackfill` (§8.10): instead of changes, the rows that bring what the
    /// requester holds back to its scope (those it lacks, whole; evictions of those it must no
    /// longer hold) whose last change is at or before `after`; the batch moves no cursor.
    public var scopeBackfill = false
    /// Flag `park` (capability `parkedPulls`, §8.4): if the receiver has nothing after `after` for
    /// the requester, it holds this PULL and answers it once it has, rather than with an empty
    /// batch. An ordinary pull only: not with `resumingResync`, `backfill` or `scopeBackfill`.
    public var park = false
    /// Flag `followOn` (capability `pullsAhead`, §8.3): the batch that follows the one answering
    /// the requester's previous PULL, with this PULL's limits (`after` is 0: the responder knows
    /// where that batch ends). Not with any other flag but `wholeRows`.
    public var followOn = false

    public init(
        after: Int64, resumingResync: Bool = false, maxChanges: Int, maxBytes: Int, wholeRows: Bool = false,
        backfill: Backfill? = nil,
        history: HistoryMark? = nil
    ) {
        self.after = after
        self.backfill = backfill
        self.history = history
        self.resumingResync = resumingResync
        self.wholeRows = wholeRows
        self.maxChanges = maxChanges
        self.maxBytes = maxBytes
    }
}

/// DEFERRED: "I did not apply your batch after `after` through `through`, and will pull it
/// again in about `retryAfterMilliseconds`"; the other direction goes on (§6.9).
public struct Deferral: Sendable, Hashable {
    /// Why the batch waits. Codes from a newer peer are read as `.other`.
    public enum Reason: UInt64, Sendable {
        case other = 0
        /// Its timestamps are further ahead of the requester's clock than it accepts.
        case clockSkew = 1
    }
    /// The requester's cursor on the receiver, unchanged: the deferred batch's `after`.
    public var after: Int64
    /// The `through` of the newest batch the requester discarded.
    public var through: Int64
    public var reason: Reason
    /// When the requester means to pull again (a hint).
    public var retryAfterMilliseconds: UInt64
    /// For humans: why, with the figures ("… 7200 s ahead … (limit 3600 s)").
    public var message: String

    public init(after: Int64, through: Int64, reason: Reason, retryAfterMilliseconds: UInt64, message: String) {
        self.after = after
        self.through = through
        self.reason = reason
        self.retryAfterMilliseconds = retryAfterMilliseconds
        self.message = message
    }
}
