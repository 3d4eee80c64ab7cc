import TetherBatch

/// The fields of each message type, independent of framing and compression.
/// Both directions check the same rules, so this side never sends a body a
/// peer with the same limits would refuse.
enum MessageBodyCoding {
    // MARK: Encoding

    static func encode(
        _ message: WireMessage, into writer: inout ByteWriter, limits: WireLimits, columnarBatches: Bool = false,
        compactColumns: Bool = false
    ) throws(WireError) {
        let type = message.type
        switch message {
        case let .hello(hello):
            try encodeHello(hello, into: &writer, limits: limits)
        case let .pull(pull):
            try checkSequence(pull.after, "after", type)
            guard pull.maxChanges >= 1, pull.maxBytes >= 1 else {
                throw WireError.invalidMessage(type: type, reason: "maxChanges and maxBytes must be at least 1")
            }
            if pull.scopeBackfill, let problem = scopeBackfillProblem(pull.resumingResync, pull.backfill != nil) {
                throw WireError.invalidMessage(type: type, reason: problem)
            }
            if pull.park, let problem = parkProblem(pull) {
                throw WireError.invalidMessage(type: type, reason: problem)
            }
            if pull.followOn, let problem = followOnProblem(pull) {
                throw WireError.invalidMessage(type: type, reason: problem)
            }
            writer.uvarint(UInt64(pull.after))
            writer.byte(
                (pull.resumingResync ? PullFlags.resumingResync : 0) | (pull.wholeRows ? PullFlags.wholeRows : 0)
                    | (pull.backfill != nil ? PullFlags.backfill : 0) | (pull.history != nil ? PullFlags.history : 0)
                    | (pull.scopeBackfill ? PullFlags.scopeBackfill : 0) | (pull.park ? PullFlags.park : 0)
                    | (pull.followOn ? PullFlags.followOn : 0))
            writer.uvarint(UInt64(pull.maxChanges))
            writer.uvarint(UInt64(pull.maxBytes))
            if let backfill = pull.backfill {
                try encodeBackfill(backfill, after: pull.after, into: &writer, limits: limits)
            }
            if let mark = pull.history { try encodeMark(mark, type, into: &writer) }
        case let .batch(batch):
            // `BatchCoding.encode` trusts its input: a change whose value counts do not match its
            // table would encode into bytes that decode as something else (`encodeColumnar` checks).
            do throws(BatchValidationError) {
                if columnarBatches,
                    let columnar = try BatchCoding.encodeColumnar(
                        batch, limits: limits.columnarLimits, compact: compactColumns)
                {
                    writer.append(columnar)
                } else {
                    try batch.validate()
                    writer.append(BatchCoding.encode(batch))
                }
            } catch {
                throw WireError.invalidMessage(type: .batch, reason: error.description)
            }
        case let .ack(through: sequence), let .changed(latest: sequence):
            try checkSequence(sequence, type == .ack ? "through" : "latest", type)
            writer.uvarint(UInt64(sequence))
        case let .ping(nonce), let .pong(nonce):
            writer.bigEndianUInt64(nonce)
        case let .error(code, message):
            writer.uvarint(code.rawValue)
            try writeString(message, "message", type, into: &writer, limits: limits)
        case let .bye(reason):
            try writeString(reason, "reason", type, into: &writer, limits: limits)
        case let .deferred(deferral):
            try checkSequence(deferral.after, "after", type)
            try checkSequence(deferral.through, "through", type)
            guard deferral.through > deferral.after else {
                throw WireError.invalidMessage(
                    type: type, reason: "through \(deferral.through) is not after \(deferral.after)")
            }
            writer.uvarint(UInt64(deferral.after))
            writer.uvarint(UInt64(deferral.through))
            writer.uvarint(deferral.reason.rawValue)
            writer.uvarint(deferral.retryAfterMilliseconds)
            try writeString(deferral.message, "message", type, into: &writer, limits: limits)
        case let .history(mark):
            try encodeMark(mark, type, into: &writer)
        case let .scope(announcement):
            if let problem = scopeProblem(announcement, limits: limits) {
                throw WireError.invalidMessage(type: type, reason: problem)
            }
            writer.uvarint(UInt64(announcement.interest.count))
            for (table, rule) in announcement.interest.sorted(by: { $0.key < $1.key }) {
                try writeString(table, "interest table", type, into: &writer, limits: limits)
                try encodeRule(rule, into: &writer, limits: limits)
            }
            writer.uvarint(UInt64(announcement.scoped.count))
            for table in announcement.scoped.sorted() {
                try writeString(table, "scoped table", type, into: &writer, limits: limits)
            }
            if let rules = announcement.columnRules {
                writer.uvarint(UInt64(rules.count))
                for claim in rules {
                    try writeString(claim.table, "rule table", type, into: &writer, limits: limits)
                    try writeString(claim.column, "rule column", type, into: &writer, limits: limits)
                    writer.byte(claim.rule)
                }
            }
        case let .refused(refusals):
            guard !refusals.isEmpty else {
                throw WireError.invalidMessage(type: type, reason: "REFUSED lists at least one change")
            }
            writer.uvarint(UInt64(refusals.count))
            for refusal in refusals {
                guard !refusal.key.isEmpty else {
                    throw WireError.invalidMessage(
                        type: type, reason: "a refused change of \(refusal.table) has no key")
                }
                try checkSequence(refusal.sequence, "sequence", type)
                try writeString(refusal.table, "table", type, into: &writer, limits: limits)
                writer.uvarint(UInt64(refusal.key.count))
                for value in refusal.key { writer.value(value) }
                writer.uvarint(UInt64(refusal.sequence))
                try writeString(
                    WireMessage.truncatedUTF8(refusal.reason, maxBytes: limits.maxStringLength), "reason", type,
                    into: &writer, limits: limits)
            }
        }
    }

    /// Why a scope backfill PULL cannot also carry `resumingResync` or a schema backfill, if it does.
    private static func scopeBackfillProblem(_ resumingResync: Bool, _ backfill: Bool) -> String? {
        if resumingResync { return "a scope backfill does not resume a full resync" }
        if backfill { return "a scope backfill is not also a schema backfill" }
        return nil
    }

    /// Why `pull` cannot be parked, if it cannot: only an ordinary pull waits for changes (§6.2).
    private static func parkProblem(_ pull: Pull) -> String? {
        if pull.resumingResync { return "a parked PULL does not resume a full resync" }
        if pull.backfill != nil { return "a parked PULL is not a backfill" }
        if pull.scopeBackfill { return "a parked PULL is not a scope backfill" }
        return nil
    }

    /// Why `pull` cannot be a follow-on, if it cannot: only an ordinary pull follows another (§6.2).
    private static func followOnProblem(_ pull: Pull) -> String? {
        if pull.after != 0 { return "a follow-on PULL has after 0, not \(pull.after)" }
        if pull.resumingResync || pull.backfill != nil || pull.scopeBackfill || pull.park || pull.history != nil {
            return "a follow-on PULL is an ordinary pull (no resync, backfill, scope backfill, park or history)"
        }
        return nil
    }

    /// Deepest `.both` nesting of an interest's rule (4).
    static let maxRuleDepth = 4

    /// A history mark (§8.9): `through` (uvarint), then `clock` (u64be).
    private static func encodeMark(_ mark: HistoryMark, _ type: MessageType, into writer: inout ByteWriter)
        throws(WireError)
    {
        try checkSequence(mark.through, "history through", type)
        writer.uvarint(UInt64(mark.through))
        writer.bigEndianUInt64(mark.clock)
    }

    private static func encodeHello(_ hello: Hello, into writer: inout ByteWriter, limits: WireLimits) throws(WireError)
    {
        guard hello.tables.count <= limits.maxTables else {
            throw WireError.tooManyTables(count: UInt64(hello.tables.count), limit: limits.maxTables)
        }
        writer.uvarint(hello.protocolVersion)
        writer.append(hello.instanceKey.bytes)
        writer.append(hello.schemaFingerprint.bytes)
        writer.uvarint(hello.capabilities.rawValue)
        var names = Set<String>()
        for table in hello.tables {
            guard names.insert(table.name).inserted else {
                throw WireError.invalidMessage(type: .hello, reason: "table \(table.name) is listed twice")
            }
            if let problem = columnProblem(table) { throw WireError.invalidMessage(type: .hello, reason: problem) }
            try checkLength(table.name, "table name", .hello, limits: limits)
            for column in table.keyColumns + table.valueColumns {
                try checkLength(column, "column name", .hello, limits: limits)
            }
        }
        Hello.writeTables(hello.tables, into: &writer)
        if let problem = renameProblem(hello.renames, tables: hello.tables, limits: limits) {
            throw WireError.invalidMessage(type: .hello, reason: problem)
        }
        writer.uvarint(UInt64(hello.renames.count))
        for rename in hello.renames {
            for (text, field) in [
                (rename.table, "renamed table"), (rename.from, "renamed from"), (rename.to, "renamed to"),
            ] {
                try writeString(text, field, .hello, into: &writer, limits: limits)
            }
        }
    }

    /// Why a HELLO's renames cannot be sent, if they cannot: each names a listed table, one of
    /// whose columns (key or value) it renamed to, from a name the table no longer has; at most
    /// one per old name.
    private static func renameProblem(_ renames: [ColumnRename], tables: [TableDescriptor], limits: WireLimits)
        -> String?
    {
        guard renames.count <= limits.maxTables * 16 else {
            return "\(renames.count) renames, more than \(limits.maxTables * 16)"
        }
        let byName = Dictionary(tables.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        var seen = Set<[String]>()
        for rename in renames {
            guard let table = byName[rename.table] else {
                return "a rename names table \(rename.table), which is not listed"
            }
            guard (table.keyColumns + table.valueColumns).contains(rename.to) else {
                return "table \(rename.table): renamed column \(rename.to) is not one of its columns"
            }
            guard !(table.keyColumns + table.valueColumns).contains(rename.from) else {
                return "table \(rename.table): column \(rename.from) was renamed but is still listed"
            }
            guard seen.insert([rename.table, rename.from]).inserted else {
                return "table \(rename.table): column \(rename.from) is renamed twice"
            }
        }
        return nil
    }

    private static func encodeBackfill(
        _ backfill: Backfill, after: Int64, into writer: inout ByteWriter, limits: WireLimits
    ) throws(WireError) {
        try checkSequence(backfill.through, "backfill through", .pull)
        guard backfill.through >= after else {
            throw WireError.invalidMessage(
                type: .pull, reason: "backfill through \(backfill.through) is before after \(after)")
        }
        guard !backfill.tables.isEmpty, backfill.tables.count <= limits.maxTables else {
            throw WireError.invalidMessage(
                type: .pull, reason: "a backfill names 1 to \(limits.maxTables) tables, not \(backfill.tables.count)")
        }
        var names = Set<String>()
        for table in backfill.tables {
            guard names.insert(table.name).inserted else {
                throw WireError.invalidMessage(type: .pull, reason: "backfill table \(table.name) is listed twice")
            }
            guard Set(table.columns).count == table.columns.count else {
                throw WireError.invalidMessage(type: .pull, reason: "backfill table \(table.name) lists a column twice")
            }
        }
        writer.uvarint(UInt64(backfill.through))
        writer.uvarint(UInt64(backfill.tables.count))
        for table in backfill.tables {
            try writeString(table.name, "backfill table", .pull, into: &writer, limits: limits)
            writer.uvarint(UInt64(table.columns.count))
            for column in table.columns {
                try writeString(column, "backfill column", .pull, into: &writer, limits: limits)
            }
        }
    }

    static func writeString(
        _ text: String, _ field: String, _ type: MessageType, into writer: inout ByteWriter,
        limits: WireLimits
    ) throws(WireError) {
        try checkLength(text, field, type, limits: limits)
        writer.string(text)
    }

    private static func checkLength(_ text: String, _ field: String, _ type: MessageType, limits: WireLimits)
        throws(WireError)
    {
        let length = text.utf8.count
        guard length <= limits.maxStringLength else {
            throw WireError.stringTooLong(
                field: "\(type).\(field)", length: UInt64(length), limit: limits.maxStringLength)
        }
    }

    private static func checkSequence(_ value: Int64, _ field: String, _ type: MessageType) throws(WireError) {
        guard value >= 0 else { throw WireError.invalidMessage(type: type, reason: "\(field) \(value) is negative") }
    }

    /// Why a HELLO table's columns cannot be described, if they cannot.
    private static func columnProblem(_ table: TableDescriptor) -> String? {
        if table.keyColumns.isEmpty { return "table \(table.name) has no key column" }
        var seen = Set<String>()
        for column in table.keyColumns + table.valueColumns where !seen.insert(column).inserted {
            return "table \(table.name) lists column \(column) twice"
        }
        return nil
    }

    // MARK: Decoding

    /// Decodes and fully validates one body: every field, and nothing after the last.
    static func decode(
        _ type: MessageType, body: UnsafeRawBufferPointer, limits: WireLimits, columnarBatches: Bool = true,
        compactColumns: Bool = true
    ) throws(WireError) -> WireMessage {
        var fields = MessageFieldReader(body, type: type, limits: limits)
        let message: WireMessage
        switch type {
        case .batch:
            // The body is exactly a change batch, which checks its own end. Format 2 (evictions)
            // only belongs in a version 3 session: the session checks that. Format 3 (columnar) only
            // once both announced `columnarBatches`, until which it is a bad magic; format 4 (compact
            // values) once both announced `compactColumns` too.
            let maximumFormat =
                !columnarBatches ? 2 : compactColumns ? BatchCoding.compactColumnarFormat : BatchCoding.columnarFormat
            do {
                return .batch(
                    try BatchCoding.decode(
                        Array(body), maximumFormat: maximumFormat, columnarLimits: limits.columnarLimits))
            } catch {
                throw WireError.batch(error)
            }
        case .hello:
            message = .hello(try decodeHello(&fields))
        case .pull:
            let after = try fields.sequence("after")
            let flags = try fields.byte("flags")
            guard
                flags
                    & ~(PullFlags.resumingResync | PullFlags.wholeRows | PullFlags.backfill | PullFlags.history
                    | PullFlags.scopeBackfill | PullFlags.park | PullFlags.followOn) == 0
            else {
                throw fields.malformed("unknown flags 0x\(String(flags, radix: 16))")
            }
            let maxChanges = try fields.positive("maxChanges")
            let maxBytes = try fields.positive("maxBytes")
            let backfill = flags & PullFlags.backfill != 0 ? try decodeBackfill(&fields, after: after) : nil
            let history = flags & PullFlags.history != 0 ? try decodeMark(&fields) : nil
            var pull = Pull(
                after: after, resumingResync: flags & PullFlags.resumingResync != 0, maxChanges: maxChanges,
                maxBytes: maxBytes,
                wholeRows: flags & PullFlags.wholeRows != 0, backfill: backfill, history: history)
            if flags & PullFlags.scopeBackfill != 0 {
                if let problem = scopeBackfillProblem(pull.resumingResync, backfill != nil) {
                    throw fields.malformed(problem)
                }
                pull.scopeBackfill = true
            }
            if flags & PullFlags.park != 0 {
                pull.park = true
                if let problem = parkProblem(pull) { throw fields.malformed(problem) }
            }
            if flags & PullFlags.followOn != 0 {
                pull.followOn = true
                if let problem = followOnProblem(pull) { throw fields.malformed(problem) }
            }
            message = .pull(pull)
        case .ack:
            message = .ack(through: try fields.sequence("through"))
        case .changed:
            message = .changed(latest: try fields.sequence("latest"))
        case .ping:
            message = .ping(try fields.bigEndianUInt64("nonce"))
        case .pong:
            message = .pong(try fields.bigEndianUInt64("nonce"))
        case .error:
            // A code from a newer version is still an error: read it as internal.
            let code = WireErrorCode(rawValue: try fields.uvarint("code")) ?? .internal
            message = .error(code: code, message: try fields.string("message"))
        case .bye:
            message = .bye(reason: try fields.string("reason"))
        case .deferred:
            let after = try fields.sequence("after")
            let through = try fields.sequence("through")
            guard through > after else { throw fields.malformed("through \(through) is not after \(after)") }
            // A reason from a newer version still defers: read it as other.
            let reason = Deferral.Reason(rawValue: try fields.uvarint("reason")) ?? .other
            message = .deferred(
                Deferral(
                    after: after, through: through, reason: reason,
                    retryAfterMilliseconds: try fields.uvarint("retryAfter"), message: try fields.string("message")))
        case .history:
            message = .history(try decodeMark(&fields))
        case .scope:
            message = .scope(try decodeScope(&fields))
        case .refused:
            let count = try fields.count("refused count")
            guard count >= 1 else { throw fields.malformed("REFUSED lists no change") }
            var refusals: [RefusedChange] = []
            for _ in 0..<count {
                let table = try fields.string("table")
                let keyCount = try fields.count("key count")
                guard keyCount >= 1 else { throw fields.malformed("a refused change of \(table) has no key") }
                var key: [DatabaseValue] = []
                for _ in 0..<keyCount { key.append(try fields.value("key value")) }
                refusals.append(
                    RefusedChange(
                        table: table, key: key, sequence: try fields.sequence("sequence"),
                        reason: try fields.string("reason")))
            }
            message = .refused(refusals)
        }
        try fields.expectEnd()
        return message
    }

    private static func decodeHello(_ fields: inout MessageFieldReader) throws(WireError) -> Hello {
        // The version comes first and is checked first: the rest of a HELLO
        // from another version may be laid out differently.
        let version = try fields.uvarint("protocolVersion")
        guard version == WireProtocol.version else { throw WireError.unsupportedProtocolVersion(version) }
        guard let key = InstanceKey(bytes: try fields.bytes(16, "instanceKey")) else {
            throw fields.malformed("unreadable instance key")  // not reached: the length was checked
        }
        let fingerprint = SchemaFingerprint(
            uncheckedBytes: try fields.bytes(SchemaFingerprint.byteCount, "schemaFingerprint"))
        let capabilities = Capabilities(rawValue: try fields.uvarint("capabilities"))
        let tableCount = try fields.uvarint("table count")
        guard tableCount <= UInt64(fields.limits.maxTables) else {
            throw WireError.tooManyTables(count: tableCount, limit: fields.limits.maxTables)
        }
        var tables: [TableDescriptor] = []
        var names = Set<String>()
        for _ in 0..<tableCount {
            let name = try fields.string("table name")
            var columns: [[String]] = []
            for field in ["key column count", "value column count"] {
                let count = try fields.count(field)
                var columnNames: [String] = []
                for _ in 0..<count { columnNames.append(try fields.string("column name")) }
                columns.append(columnNames)
            }
            let table = TableDescriptor(name: name, keyColumns: columns[0], valueColumns: columns[1])
            guard names.insert(name).inserted else { throw fields.malformed("table \(name) is listed twice") }
            if let problem = columnProblem(table) { throw fields.malformed(problem) }
            tables.append(table)
        }
        // The limit first, as for tables: a count above it is refused before any rename is read.
        let renameCount = try fields.count("rename count", limit: fields.limits.maxTables * 16) { count, limit in
            "\(count) renames, more than \(limit)"
        }
        var renames: [ColumnRename] = []
        for _ in 0..<renameCount {
            renames.append(
                ColumnRename(
                    table: try fields.string("renamed table"), from: try fields.string("renamed from"),
                    to: try fields.string("renamed to")))
        }
        if let problem = renameProblem(renames, tables: tables, limits: fields.limits) {
            throw fields.malformed(problem)
        }
        return Hello(
            protocolVersion: version, instanceKey: key, schemaFingerprint: fingerprint, capabilities: capabilities,
            tables: tables,
            renames: renames)
    }

    private static func decodeMark(_ fields: inout MessageFieldReader) throws(WireError) -> HistoryMark {
        HistoryMark(through: try fields.sequence("history through"), clock: try fields.bigEndianUInt64("history clock"))
    }

    private static func decodeBackfill(_ fields: inout MessageFieldReader, after: Int64) throws(WireError) -> Backfill {
        let through = try fields.sequence("backfill through")
        guard through >= after else { throw fields.malformed("backfill through \(through) is before after \(after)") }
        let count = try fields.count("backfill table count", limit: fields.limits.maxTables) { count, limit in
            "a backfill names 1 to \(limit) tables, not \(count)"
        }
        guard count >= 1 else {
            throw fields.malformed("a backfill names 1 to \(fields.limits.maxTables) tables, not 0")
        }
        var tables: [Backfill.Table] = []
        var names = Set<String>()
        for _ in 0..<count {
            let name = try fields.string("backfill table")
            guard names.insert(name).inserted else { throw fields.malformed("backfill table \(name) is listed twice") }
            let columnCount = try fields.count("backfill column count")
            var columns: [String] = []
            for _ in 0..<columnCount {
                let column = try fields.string("backfill column")
                guard !columns.contains(column) else {
                    throw fields.malformed("backfill table \(name): column \(column) is listed twice")
                }
                columns.append(column)
            }
            tables.append(Backfill.Table(name: name, columns: columns))
        }
        return Backfill(through: through, tables: tables)
    }
}

enum PullFlags {
    static let resumingResync: UInt8 = 1
    static let wholeRows: UInt8 = 2
    static let backfill: UInt8 = 4
    static let history: UInt8 = 8
    static let scopeBackfill: UInt8 = 16
    static let park: UInt8 = 32
    static let followOn: UInt8 = 64
}
