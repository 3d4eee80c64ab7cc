import ArgumentParser
import Foundation
import Tether

/// `tether status`: what a database knows of itself and its peers.
struct Status: ParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: """
            Show the instance key, last sequence, synced tables, peers (certificates, cursors, pending changes, \
            schema differences), kept-aside and refused changes, tables held in part.
            """,
        discussion: """
            Pending changes are rows of synced tables (and deletions) with a local change not yet acknowledged by a \
            peer. Per peer: received through (its changes applied here), acknowledged through (this database's changes \
            it confirmed) and pending (changes made here after what it acknowledged, those received from it left out). \
            A peer that defers this database's changes (its clock is behind their timestamps) is shown with its \
            reason: they stay pending until it applies them. Refused changes (partial replication) are changes made \
            here that a peer refused because they reached outside this database's scope there: each with its table, \
            key, sequence, reason and the peer that refused it; the row returns to that peer's state at the next sync. \
            Listed only when there are some. Writes made by other programs to trigger-captured tables are given their \
            sequence numbers first. Each peer that a session over TLS authenticated is shown with the certificate it \
            presented last: its common name and SHA-256 fingerprint (the pin --allow sha256:… takes, as tether cert \
            node prints it). With --json, one object: "instanceKey", "lastSequence", "syncedTables", "pending", \
            "peers" (each with "instanceKey", "receivedThrough", "acknowledgedThrough", "sentThrough", "pending", \
            "lastSeen", "deferral", "schemaDifferences", "certificateName", "certificateFingerprint" and "pinnedTo", \
            what its instance key is pinned to, "tombstonesHeldBack", "forgotten" (when, or null) and \
            "secondsUntilForgotten" (null when forgotten or never), "keptAside" (a count), "keptAsideChanges", \
            "copyDetected" (the reason, or null), "tombstones", "forgetPeersAfter" (seconds, or null for never), and, \
            only when there are some, "columnRules" (each with "table", "column" and "rule"; a table's row rule, \
            addWins, has the column ""), "refusedChanges" and \
            "partialTables" (table → the peers that send it in part). \
            Garbage collection: each peer holds back the tombstones of rows deleted here after what it acknowledged \
            (they are kept until every remembered peer has them); a peer not seen for --forget-peers-after (as tether \
            serve is given it, default 30d; the same key of a --config file) is forgotten at the next collection, and \
            one forgotten holds nothing back and gets a full resync if it returns. Each peer shows how close it is to \
            that horizon.
            """)
    static let configKeys =
        DatabaseOption<ExistingDatabase>.configKeys + ForgetPeersOption.configKeys + OutputFormatOption.configKeys

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @OptionGroup var forgetPeers: ForgetPeersOption

    @OptionGroup var output: OutputFormatOption

    struct PeerLine {
        var key: String
        var receivedThrough: Int64
        var acknowledgedThrough: Int64
        var sentThrough: Int64
        var pending: Int
        var lastSeen: Date?
        var deferral: Database.PeerDeferral?
        /// How its schema differed from this one at their last handshake (rolling upgrades).
        var schemaDifferences: [String]
        /// What its instance key is pinned to (nil: no session over TLS authenticated it).
        var pinnedCertificate: String?
        /// The certificate it presented last: common name and SHA-256 fingerprint.
        var certificate: PeerIdentity?
        /// Tombstones after what it acknowledged: kept for it while it is remembered (0 once forgotten).
        var tombstonesHeldBack: Int
        /// When garbage collection forgot it (not seen within the horizon); nil while remembered.
        var forgotten: Date?
    }

    /// Where a peer stands against the horizon of `--forget-peers-after`.
    enum HorizonStanding {
        case forgotten(Date)
        /// Remembered; forgotten in this many seconds unless seen (0 or less: at the next collection).
        case forgottenIn(TimeInterval)
        /// Remembered, and the horizon is never.
        case kept
    }

    static func standing(of peer: PeerLine, horizon: Duration?, now: Date) -> HorizonStanding {
        if let forgotten = peer.forgotten { return .forgotten(forgotten) }
        guard let horizon else { return .kept }
        // A peer never seen counts as seen at the epoch, as the collection reads it.
        let lastSeen = peer.lastSeen ?? Date(timeIntervalSince1970: 0)
        return .forgottenIn(lastSeen.timeIntervalSince(now) + horizon.seconds)
    }

    func run() throws {
        common.bootstrapLogging()
        let horizon = try forgetPeers.horizon()
        let database = try db.openExisting()
        try database.captureExternalWrites()
        let tables = database.syncedTables
        let lastSequence = try database.lastSequence()
        let pending = try Self.pendingCount(database, tables: tables, after: nil)
        let schemas = Dictionary(
            try database.peerSchemas().map { ($0.peer, $0.differences) }, uniquingKeysWith: { first, _ in first })
        let peers = try database.peers().map { peer in
            PeerLine(
                key: peer.instanceKey.hex, receivedThrough: peer.receivedThrough,
                acknowledgedThrough: peer.acknowledgedThrough,
                sentThrough: peer.sentThrough,
                pending: try Self.pendingCount(
                    database, tables: tables, after: peer.acknowledgedThrough, peer: peer.instanceKey),
                lastSeen: peer.lastSeen, deferral: peer.deferral, schemaDifferences: schemas[peer.instanceKey] ?? [],
                pinnedCertificate: peer.pinnedCertificate, certificate: peer.certificate,
                tombstonesHeldBack: peer.forgotten == nil
                    ? try database.tombstoneCount(after: peer.acknowledgedThrough) : 0,
                forgotten: peer.forgotten)
        }
        let tombstones = try database.tombstoneCount()
        let now = Date()
        let keptAside = try database.keptAsideChanges()
        let refused = try database.refusedChanges()
        let certificates = refused.isEmpty ? [:] : try database.peerCertificates()
        // Tables this database holds only part of (partial replication), and the peers that send them so.
        let partial = try database.partialTables().sorted { $0.key < $1.key }.map {
            ($0.key, $0.value.map(\.hex).sorted())
        }
        let copy = try database.detectedCopy()
        let rules = try database.syncedTableRecords().flatMap { record in
            (record.rowRule == .deleteWins
                ? [] : [ColumnRuleLine(table: record.name, column: "", rule: "\(record.rowRule)")])
                + record.columnRules.sorted { $0.key < $1.key }.map {
                    ColumnRuleLine(table: record.name, column: $0.key, rule: $0.value.rawValue)
                }
        }

        let report = Report(
            database: database, horizon: horizon, tables: tables, lastSequence: lastSequence, pending: pending,
            peers: peers, tombstones: tombstones, now: now, keptAside: keptAside, refused: refused,
            certificates: certificates, partial: partial, copy: copy, rules: rules)
        Output.line(output.json ? Self.json(report) : try text(report))
    }

    /// What `status` reports, read once, for either output.
    struct ColumnRuleLine {
        let table: String
        let column: String
        /// The rule's name (`ColumnMergeRule`, or for the row rule, column "", `RowMergeRule`).
        let rule: String
    }

    struct Report {
        let database: Database
        let horizon: Duration?
        let tables: [String]
        let lastSequence: Int64
        let pending: Int
        let peers: [PeerLine]
        let tombstones: Int
        let now: Date
        let keptAside: [KeptAsideChange]
        let refused: [RefusedChange]
        let certificates: [InstanceKey: String]
        /// Tables this database holds only part of (partial replication), and the peers that send them so.
        let partial: [(String, [String])]
        let copy: CopyDetection?
        /// The synced columns that merge by a rule other than last-writer-wins.
        let rules: [ColumnRuleLine]
        let formatter = ISO8601DateFormatter()

        /// The refusing peer's instance key, and its certificate's name when it is pinned here.
        func refuser(_ change: RefusedChange) -> (key: String, certificate: String?) {
            (change.refusedBy?.hex ?? "unknown", change.refusedBy.flatMap { certificates[$0] })
        }
    }

    /// The report as one JSON object.
    static func json(_ report: Report) -> String {
        let (database, horizon, tables, lastSequence, pending, peers) =
            (report.database, report.horizon, report.tables, report.lastSequence, report.pending, report.peers)
        let (tombstones, now, keptAside, refused, partial, copy, formatter) =
            (
                report.tombstones, report.now, report.keptAside, report.refused, report.partial, report.copy,
                report.formatter
            )
        let peerObjects = peers.map { peer in
            let deferral =
                peer.deferral.map { deferral in
                    "{\"after\":\(deferral.after),\"through\":\(deferral.through),"
                        + "\"reason\":\(SQL.jsonString(deferral.reason)),"
                        + "\"since\":\(SQL.jsonString(formatter.string(from: deferral.firstDeferred))),"
                        + "\"last\":\(SQL.jsonString(formatter.string(from: deferral.lastDeferred)))}"
                } ?? "null"
            let untilForgotten = Self.secondsUntilForgotten(Self.standing(of: peer, horizon: horizon, now: now))
            return "{\"instanceKey\":\"\(peer.key)\",\"receivedThrough\":\(peer.receivedThrough),"
                + "\"acknowledgedThrough\":\(peer.acknowledgedThrough),"
                + "\"sentThrough\":\(peer.sentThrough),\"pending\":\(peer.pending),"
                + "\"lastSeen\":\(peer.lastSeen.map { SQL.jsonString(formatter.string(from: $0)) } ?? "null"),"
                + "\"deferral\":\(deferral),"
                + "\"schemaDifferences\":[\(peer.schemaDifferences.map(SQL.jsonString).joined(separator: ","))],"
                + "\"certificateName\":\(peer.certificate?.name.map(SQL.jsonString) ?? "null"),"
                + "\"certificateFingerprint\":\(peer.certificate.map { SQL.jsonString($0.fingerprint) } ?? "null"),"
                + "\"pinnedTo\":\(peer.pinnedCertificate.map(SQL.jsonString) ?? "null"),"
                + "\"tombstonesHeldBack\":\(peer.tombstonesHeldBack),"
                + "\"forgotten\":\(peer.forgotten.map { SQL.jsonString(formatter.string(from: $0)) } ?? "null"),"
                + "\"secondsUntilForgotten\":\(untilForgotten)}"
        }
        let kept = keptAside.map { change in
            """
            {\"table\":\(SQL.jsonString(change.table)),\"reason\":\(SQL.jsonString(change.reason)),\
            \"attempts\":\(change.attempts)}
            """
        }
        // Present only when there are some, as in the text output.
        let refusedObjects = refused.map { change in
            let (key, certificate) = report.refuser(change)
            return "{\"table\":\(SQL.jsonString(change.table)),"
                + "\"key\":[\(change.key.map(SQL.jsonValue).joined(separator: ","))],"
                + "\"sequence\":\(change.sequence),\"reason\":\(SQL.jsonString(change.reason)),"
                + "\"refusedBy\":\(SQL.jsonString(key)),"
                + "\"refusedByCertificate\":\(certificate.map(SQL.jsonString) ?? "null")}"
        }
        let partialObjects = partial.map {
            "\(SQL.jsonString($0.0)):[\($0.1.map(SQL.jsonString).joined(separator: ","))]"
        }
        let ruleObjects = report.rules.map {
            "{\"table\":\(SQL.jsonString($0.table)),\"column\":\(SQL.jsonString($0.column)),"
                + "\"rule\":\(SQL.jsonString($0.rule))}"
        }
        let forgetPeersAfter = horizon.map { String($0.components.seconds) } ?? "null"
        return
            ("{\"instanceKey\":\"\(database.instanceKey.hex)\",\"lastSequence\":\(lastSequence),"
            + "\"syncedTables\":[\(tables.map(SQL.jsonString).joined(separator: ","))],"
            + (report.rules.isEmpty ? "" : "\"columnRules\":[\(ruleObjects.joined(separator: ","))],")
            + "\"pending\":\(pending),\"peers\":[\(peerObjects.joined(separator: ","))],"
            + "\"keptAside\":\(keptAside.count),\"keptAsideChanges\":[\(kept.joined(separator: ","))],"
            + (refused.isEmpty ? "" : "\"refusedChanges\":[\(refusedObjects.joined(separator: ","))],")
            + (partial.isEmpty ? "" : "\"partialTables\":{\(partialObjects.joined(separator: ","))},")
            + "\"tombstones\":\(tombstones),\"forgetPeersAfter\":\(forgetPeersAfter),"
            + "\"copyDetected\":\(copy.map { SQL.jsonString($0.reason) } ?? "null")}")
    }

    /// The report as lines of text.
    func text(_ report: Report) throws -> String {
        let (database, horizon, tables, lastSequence, pending, peers) =
            (report.database, report.horizon, report.tables, report.lastSequence, report.pending, report.peers)
        let (tombstones, now, keptAside, refused, partial, copy, formatter) =
            (
                report.tombstones, report.now, report.keptAside, report.refused, report.partial, report.copy,
                report.formatter
            )
        var lines = [
            "instance key:   \(database.instanceKey.hex)",
            "last sequence:  \(lastSequence)",
            "synced tables:  \(tables.isEmpty ? "none" : tables.joined(separator: ", "))",
        ]
        let rules = report.rules
        if !rules.isEmpty {
            lines.append(
                "column rules:   "
                    + rules.map { "\($0.column.isEmpty ? "\($0.table) rows" : "\($0.table).\($0.column)") \($0.rule)" }
                    .joined(separator: ", "))
        }
        lines += [
            "pending:        \(pending)",
            "kept aside:     \(keptAside.count)",
            "tombstones:     \(tombstones) (peers forgotten after \(DurationFlag.describe(horizon: horizon)) unseen)",
            "peers:          \(peers.isEmpty ? "none" : String(peers.count))",
        ]
        if let copy, copy.kind == .restored {
            // Found by peers' marks (§8.9): those peers are refused, the others sync.
            let refusedPeers = try database.historyFindings().map(\.peer.hex)
            let whom =
                refusedPeers.isEmpty
                ? "" : " with peer\(refusedPeers.count == 1 ? "" : "s") \(refusedPeers.joined(separator: ", "))"
            lines.insert(
                "RESTORED:       this database was restored to an earlier state and has written other changes "
                    + "under its instance key "
                    + "since, or a peer showed a made-up mark of its history (\(copy.reason)); it does not sync\(whom) "
                    + "until `tether rekey --db \(db.path)`", at: 1)
        } else if let copy {
            lines.insert(
                "COPY:           this database is a copy of another with the same instance key (\(copy.reason)); "
                    + "it does not sync "
                    + "until `tether rekey --db \(db.path)` (or `--keep-key` if it was moved, not copied)", at: 1)
        }
        for peer in peers {
            lines.append(
                "  \(peer.key)  received through \(peer.receivedThrough), acknowledged through "
                    + "\(peer.acknowledgedThrough), "
                    + "pending \(peer.pending), last seen "
                    + "\(peer.lastSeen.map { formatter.string(from: $0) } ?? "never")")
            if let deferral = peer.deferral {
                lines.append(
                    "    deferred by this peer since \(formatter.string(from: deferral.firstDeferred)) (changes "
                        + "after \(deferral.after) "
                        + "stay pending; it pulls them again by itself): \(deferral.reason)")
            }
            if let certificate = peer.certificate {
                lines.append("    certificate: \(certificate.nameAndFingerprint)")
            } else if let pin = peer.pinnedCertificate {
                lines.append("    certificate: \(pin) (its fingerprint is recorded at its next session)")
            }
            for difference in peer.schemaDifferences { lines.append("    schema: \(difference)") }
            lines.append(
                "    "
                    + Self.horizonLine(
                        peer, Self.standing(of: peer, horizon: horizon, now: now), formatter: formatter, now: now))
        }
        for change in keptAside {
            lines.append(
                """
                  kept aside: \(change.table) from \(change.peer.hex): \(change.reason) (\(change.attempts) \
                attempt\(change.attempts == 1 ? "" : "s"))
                """)
        }
        for (table, peers) in partial {
            lines.append(
                """
                held in part:   \(table), as \(peers.joined(separator: ", ")) send\(peers.count == 1 ? "s" : "") \
                it (partial replication)
                """)
        }
        if !refused.isEmpty {
            lines.append(
                """
                refused:        \(refused.count) (changes made here that a peer refused: outside this database's \
                scope there)
                """)
            for change in refused {
                let (key, certificate) = report.refuser(change)
                lines.append(
                    "  \(change.table) [\(change.key.map(SQL.text).joined(separator: ", "))] change "
                        + "\(change.sequence), refused by \(key)"
                        + "\(certificate.map { " (\($0))" } ?? ""): \(change.reason)")
            }
        }
        return lines.joined(separator: "\n")
    }

    /// What `peer` holds back from garbage collection, and how close it is to being forgotten.
    static func horizonLine(_ peer: PeerLine, _ standing: HorizonStanding, formatter: ISO8601DateFormatter, now: Date)
        -> String
    {
        let unseen = peer.lastSeen.map { "not seen for \(DurationFlag.age(now.timeIntervalSince($0)))" } ?? "never seen"
        let holds = "holds back \(peer.tombstonesHeldBack) tombstone\(peer.tombstonesHeldBack == 1 ? "" : "s")"
        switch standing {
        case let .forgotten(date):
            return """
                forgotten \(formatter.string(from: date)) (\(unseen)): holds nothing back; gets a full resync if \
                it returns
                """
        case let .forgottenIn(seconds) where seconds <= 0:
            return "\(holds); \(unseen): forgotten at the next garbage collection"
        case let .forgottenIn(seconds):
            return "\(holds); forgotten in \(DurationFlag.age(seconds)) unless seen (\(unseen))"
        case .kept:
            return "\(holds); never forgotten (\(unseen))"
        }
    }

    /// `secondsUntilForgotten` of the JSON: 0 when due at the next collection, null when forgotten or never.
    static func secondsUntilForgotten(_ standing: HorizonStanding) -> String {
        guard case let .forgottenIn(seconds) = standing else { return "null" }
        return String(Int64(max(0, seconds)))
    }

    /// Rows with a pending local change (`after` nil), or changed after `after` (a peer's
    /// acknowledged sequence) and not received from that `peer`, across the synced tables and
    /// their deletions (what `tether serve --metrics` reports as `tether_sync_pending_changes`).
    static func pendingCount(_ database: Database, tables: [String], after: Int64?, peer: InstanceKey? = nil) throws
        -> Int
    {
        try database.pendingChangeCount(tables: tables, after: after, excludingChangesFrom: peer)
    }
}

extension PeerIdentity {
    /// "north, sha256:3f2a…": the common name and the fingerprint, as `status` and `gc` print a peer's certificate.
    var nameAndFingerprint: String { "\(name ?? "(no common name)"), \(Self.fingerprintLabel(fingerprint))" }
}
