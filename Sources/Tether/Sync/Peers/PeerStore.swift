import Foundation

/// Everything this database records about its peers, and the only code that reads or writes
/// those records: the cursors both ways (`tether_peers`), deferrals of this database's changes
/// (`tether_deferrals`), the rows a full resync confirmed (`tether_resync_seen`) and what the
/// last handshake found of each peer's schema (`tether_peer_schemas`), the mark of each peer's
/// history it was last sent (`tether_peer_marks`, see `HistoryMark`), the peers whose mark of this
/// database's history showed it was rewritten (`tether_history_findings`, see `HistoryFinding`),
/// the certificate each peer's instance key is pinned to and the one it presented last
/// (`tether_peer_certificates`), the columns each peer backfilled from this database, through
/// which sequence (`tether_peer_backfills`), the points at which each peer held every row of this
/// database (`tether_peer_complete_points`), and the peers forgotten after the horizon of garbage
/// collection (`tether_forgotten_peers`).
///
/// A value over one connection: the engine uses it on the writer, inside the transaction of the
/// apply, extract or acknowledgement it serves; the public readers (`peers()`, `cursor(for:)`)
/// use it on a reader.
struct PeerStore {
    let connection: Connection

    static let schema = """
        CREATE TABLE IF NOT EXISTS tether_peers (instance_key BLOB PRIMARY KEY, received_through INTEGER NOT NULL \
        DEFAULT 0, acknowledged_through INTEGER NOT NULL DEFAULT 0, sent_through INTEGER NOT NULL DEFAULT 0, \
        resync_from INTEGER, last_seen REAL) STRICT;
        CREATE TABLE IF NOT EXISTS tether_resync_seen (peer BLOB NOT NULL, table_name TEXT NOT NULL, row_id INTEGER \
        NOT NULL, PRIMARY KEY (peer, table_name, row_id)) STRICT, WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS tether_deferrals (peer BLOB PRIMARY KEY, after INTEGER NOT NULL, through INTEGER \
        NOT NULL, reason TEXT NOT NULL, first_deferred REAL NOT NULL, last_deferred REAL NOT NULL) STRICT;
        CREATE TABLE IF NOT EXISTS tether_peer_schemas (peer BLOB PRIMARY KEY, shared TEXT NOT NULL, differences TEXT \
        NOT NULL, updated REAL NOT NULL) STRICT;
        CREATE TABLE IF NOT EXISTS tether_peer_marks (peer BLOB PRIMARY KEY, through INTEGER NOT NULL, clock INTEGER \
        NOT NULL) STRICT;
        CREATE TABLE IF NOT EXISTS tether_history_findings (peer BLOB PRIMARY KEY, through INTEGER NOT NULL, clock \
        INTEGER NOT NULL, reason TEXT NOT NULL, found REAL NOT NULL) STRICT;
        CREATE TABLE IF NOT EXISTS tether_peer_certificates (instance_key BLOB PRIMARY KEY, certificate TEXT NOT NULL, \
        first_seen REAL NOT NULL, \(presentedCertificateColumns.map(\.definition).joined(separator: ", "))) STRICT;
        CREATE TABLE IF NOT EXISTS tether_peer_backfills (peer BLOB NOT NULL, table_name TEXT NOT NULL, column_name \
        TEXT NOT NULL, through INTEGER NOT NULL, PRIMARY KEY (peer, table_name, column_name)) STRICT, WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS tether_forgotten_peers (peer BLOB PRIMARY KEY, forgotten REAL NOT NULL) STRICT;
        CREATE TABLE IF NOT EXISTS tether_peer_complete_points (peer BLOB PRIMARY KEY, offered INTEGER, held INTEGER) \
        STRICT;
        """
    /// The columns of `tether_peer_certificates` that record the certificate a peer presented last
    /// (format 5), name and definition: NULL for the keys pinned before, until their next session.
    static let presentedCertificateColumns = [
        (name: "name", definition: "name TEXT"), (name: "fingerprint", definition: "fingerprint TEXT"),
    ]

    private static var now: Double { Date().timeIntervalSince1970 }

    // MARK: Receiving from a peer

    /// Where this database stands on a peer's changes.
    struct ReceiveCursor {
        /// The peer's changes applied here, through this sequence of the peer's.
        var receivedThrough: Int64
        /// Set while a full resync from the peer runs: this database's sequence when it began
        /// (-1: a refetch after another peer's resync, which removes nothing at its end).
        var resyncFrom: Int64?
    }

    /// The cursor on `peer`, nil for a peer never recorded.
    func receiveCursor(of peer: InstanceKey) throws -> ReceiveCursor? {
        guard
            let row = try connection.fetchRow(
                "SELECT received_through, resync_from FROM tether_peers WHERE instance_key = ?",
                [Data(peer.bytes)])
        else { return nil }
        return ReceiveCursor(
            receivedThrough: try row.get(0, as: Int64.self), resyncFrom: Int64.fromDatabaseValue(row[1]))
    }

    /// The cursor on `peer`, which is recorded first if it is new.
    func registeringReceiveCursor(of peer: InstanceKey) throws -> ReceiveCursor {
        try connection.execute("INSERT OR IGNORE INTO tether_peers (instance_key) VALUES (?)", [Data(peer.bytes)])
        guard let cursor = try receiveCursor(of: peer) else {
            throw SyncError.corruptMetadata("peer \(peer) was not recorded")
        }
        return cursor
    }

    /// The peer's changes are applied here through `sequence`.
    func recordReceived(from peer: InstanceKey, through sequence: Int64) throws {
        try connection.execute(
            "UPDATE tether_peers SET received_through = ?, last_seen = ? WHERE instance_key = ?",
            [sequence, Self.now, Data(peer.bytes)])
    }

    // MARK: Full resync

    /// A full resync from `peer` starts at this database's `sequence`: rows it does not mention
    /// will be removed at its end (see `SyncEngine.finishResync`).
    func startResync(from peer: InstanceKey, at sequence: Int64) throws {
        try connection.execute(
            "UPDATE tether_peers SET resync_from = ? WHERE instance_key = ?", [sequence, Data(peer.bytes)])
        try connection.execute("DELETE FROM tether_resync_seen WHERE peer = ?", [Data(peer.bytes)])
    }

    /// The resync from `peer` confirmed the row `rowid` of `table` without changing it.
    func markSeen(by peer: InstanceKey, table: String, rowid: Int64) throws {
        try connection.cachedStatement(
            "INSERT OR IGNORE INTO tether_resync_seen (peer, table_name, row_id) VALUES (?, ?, ?)"
        )
        .execute([Data(peer.bytes), table, rowid])
    }

    /// The resync from `peer` is over.
    func endResync(from peer: InstanceKey) throws {
        try connection.execute("DELETE FROM tether_resync_seen WHERE peer = ?", [Data(peer.bytes)])
        try connection.execute("UPDATE tether_peers SET resync_from = NULL WHERE instance_key = ?", [Data(peer.bytes)])
    }

    /// Every peer but `peer` is asked again for everything, own rows included (`resync_from = -1`).
    func restartEveryCursor(except peer: InstanceKey) throws {
        try connection.execute(
            """
            UPDATE tether_peers SET received_through = 0, resync_from = coalesce(resync_from, -1) WHERE \
            instance_key != ?
            """,
            [Data(peer.bytes)])
    }

    // MARK: Sending to a peer

    /// This database's changes were sent to `peer` through `sequence`.
    func recordSent(to peer: InstanceKey, through sequence: Int64) throws {
        try connection.execute(
            """
            INSERT INTO tether_peers (instance_key, sent_through, last_seen) VALUES (?, ?, ?)
            ON CONFLICT (instance_key) DO UPDATE SET sent_through = max(sent_through, excluded.sent_through), \
            last_seen = excluded.last_seen
            """, [Data(peer.bytes), sequence, Self.now])
    }

    // MARK: Complete points

    /// `peer` was sent a batch through `through`. The end of a catch-up (`complete`: the batch
    /// reached the end of the log as it was read, whole rows of every table) is offered as a point
    /// at which the peer holds every row of this database: every row alive then was sent in a
    /// batch of the chain up to it, unless unchanged since one before. Any other batch withdraws
    /// the offer; a scoped batch also what the peer held (it holds only its scope's rows).
    func recordBatchEnd(to peer: InstanceKey, through: Int64, complete: Bool, scoped: Bool) throws {
        try connection.execute(
            """
            INSERT INTO tether_peer_complete_points (peer, offered, held) VALUES (?1, ?2, NULL)
            ON CONFLICT (peer) DO UPDATE SET offered = ?2, held = CASE WHEN ?3 THEN NULL ELSE held END
            """, [Data(peer.bytes), complete ? through : nil, scoped])
    }

    /// The latest point at which `peer`, pulling from `cursor`, holds every row of this database
    /// (nil: none known). A pull from exactly the end of the catch-up last offered shows the peer
    /// applied that batch: the offer becomes what it holds. Only a guess for partial changes
    /// (`HeldColumns`): a peer that lacks a row it is sent partial asks for it whole.
    func completePoint(of peer: InstanceKey, pullingFrom cursor: Int64) throws -> Int64? {
        try connection.execute(
            "UPDATE tether_peer_complete_points SET held = offered, offered = NULL WHERE peer = ? AND offered = ?",
            [Data(peer.bytes), cursor])
        guard
            let held = try connection.fetchValue(
                "SELECT held FROM tether_peer_complete_points WHERE peer = ?", [Data(peer.bytes)], as: Int64.self)
        else { return nil }
        return held <= cursor ? held : nil
    }

    /// Through which of this database's sequences it sent `peer` changes, nil for a peer never sent any.
    func sentThrough(to peer: InstanceKey) throws -> Int64? {
        try connection.fetchValue(
            "SELECT sent_through FROM tether_peers WHERE instance_key = ?", [Data(peer.bytes)], as: Int64.self)
    }

    /// Through which of this database's sequences `peer` acknowledged, nil for a peer never recorded.
    func acknowledgedThrough(by peer: InstanceKey) throws -> Int64? {
        try connection.fetchValue(
            "SELECT acknowledged_through FROM tether_peers WHERE instance_key = ?", [Data(peer.bytes)], as: Int64.self)
    }

    /// `peer` applied this database's changes through `sequence`; a deferral of changes before
    /// it is over.
    func recordAcknowledgement(by peer: InstanceKey, through sequence: Int64) throws {
        try connection.execute(
            "DELETE FROM tether_deferrals WHERE peer = ? AND after < ?", [Data(peer.bytes), sequence])
        try connection.execute(
            """
            INSERT INTO tether_peers (instance_key, acknowledged_through, last_seen) VALUES (?, ?, ?)
            ON CONFLICT (instance_key) DO UPDATE SET acknowledged_through = max(acknowledged_through, \
            excluded.acknowledged_through), last_seen = excluded.last_seen
            """, [Data(peer.bytes), sequence, Self.now])
    }

    /// Whether `peer` deferred changes after a sequence below `sequence` (its acknowledgement of
    /// `sequence` ends that deferral).
    func hasDeferral(of peer: InstanceKey, endingBefore sequence: Int64) throws -> Bool {
        try connection.fetchValue(
            "SELECT EXISTS (SELECT 1 FROM tether_deferrals WHERE peer = ? AND after < ?)",
            [Data(peer.bytes), sequence],
            as: Bool.self) ?? true
    }

    /// `peer` deferred this database's changes after `after` through `through`.
    func recordDeferral(by peer: InstanceKey, after: Int64, through: Int64, reason: String) throws {
        try connection.execute(
            """
            INSERT INTO tether_deferrals (peer, after, through, reason, first_deferred, last_deferred) VALUES (?, ?, ?,\
             ?, ?, ?)
            ON CONFLICT (peer) DO UPDATE SET after = excluded.after, through = excluded.through, reason = \
            excluded.reason,
                last_deferred = excluded.last_deferred
            """, [Data(peer.bytes), after, through, reason, Self.now, Self.now])
    }

    // MARK: Every peer

    func all() throws -> [Database.PeerState] {
        try connection.fetchRows(
            """
            SELECT p.instance_key, p.received_through, p.acknowledged_through, p.sent_through, p.last_seen,
                   d.after, d.through, d.reason, d.first_deferred, d.last_deferred, c.certificate, c.name, \
            c.fingerprint, f.forgotten
            FROM tether_peers p LEFT JOIN tether_deferrals d ON d.peer = p.instance_key
            LEFT JOIN tether_peer_certificates c ON c.instance_key = p.instance_key
            LEFT JOIN tether_forgotten_peers f ON f.peer = p.instance_key ORDER BY p.instance_key
            """
        ).compactMap { row -> Database.PeerState? in
            guard let key = InstanceKey(bytes: [UInt8](try row.get(0, as: Data.self))) else { return nil }
            var deferral: Database.PeerDeferral?
            if let after = Int64.fromDatabaseValue(row[5]) {
                deferral = Database.PeerDeferral(
                    after: after, through: try row.get(6, as: Int64.self), reason: try row.get(7, as: String.self),
                    firstDeferred: Date(timeIntervalSince1970: try row.get(8, as: Double.self)),
                    lastDeferred: Date(timeIntervalSince1970: try row.get(9, as: Double.self)))
            }
            return Database.PeerState(
                instanceKey: key, receivedThrough: try row.get(1, as: Int64.self),
                acknowledgedThrough: try row.get(2, as: Int64.self), sentThrough: try row.get(3, as: Int64.self),
                lastSeen: Double.fromDatabaseValue(row[4]).map(Date.init(timeIntervalSince1970:)), deferral: deferral,
                pinnedCertificate: String.fromDatabaseValue(row[10]),
                certificate: String.fromDatabaseValue(row[12]).map {
                    PeerIdentity(name: String.fromDatabaseValue(row[11]), fingerprint: $0)
                },
                forgotten: Double.fromDatabaseValue(row[13]).map(Date.init(timeIntervalSince1970:)))
        }
    }

    // MARK: Forgotten peers

    /// When this database last synced with any peer (seconds since 1970); nil if it never did.
    func lastSeenAnyPeer() throws -> Double? {
        try connection.fetchValue("SELECT max(last_seen) FROM tether_peers", as: Double.self)
    }

    /// Forgets the peers not seen since `cutoff` (seconds since 1970; a peer never seen counts as
    /// seen long ago) and returns them: they no longer hold garbage collection back. Their cursors
    /// stay, so that what they already sent is not asked for again; one that returns gets a full
    /// resync, and its changes are taken only once it acknowledged it (`mustResyncBeforeSending`).
    func forgetPeers(unseenSince cutoff: Double) throws -> [InstanceKey] {
        let forgotten = try connection.fetchRows(
            """
            SELECT instance_key FROM tether_peers WHERE coalesce(last_seen, 0) < ?
              AND instance_key NOT IN (SELECT peer FROM tether_forgotten_peers)
            """, [cutoff]
        ).compactMap { InstanceKey(bytes: [UInt8](try $0.get(0, as: Data.self))) }
        for peer in forgotten {
            try connection.execute(
                "INSERT INTO tether_forgotten_peers (peer, forgotten) VALUES (?, ?)", [Data(peer.bytes), Self.now])
        }
        return forgotten
    }

    /// When `peer` was forgotten; nil for a peer remembered.
    func forgotten(_ peer: InstanceKey) throws -> Date? {
        try connection.fetchValue(
            "SELECT forgotten FROM tether_forgotten_peers WHERE peer = ?", [Data(peer.bytes)], as: Double.self
        )
        .map(Date.init(timeIntervalSince1970:))
    }

    /// Whether `peer` was forgotten and has not acknowledged a full resync yet (this database's
    /// changes through `collectedThrough`): what it sends may hold rows deleted here whose
    /// tombstones are gone, so it is taken only after the resync (which removes them there).
    func mustResyncBeforeSending(_ peer: InstanceKey, collectedThrough: Int64) throws -> Bool {
        try connection.fetchValue(
            """
            SELECT 1 FROM tether_forgotten_peers f JOIN tether_peers p ON p.instance_key = f.peer
            WHERE f.peer = ? AND p.acknowledged_through < ?
            """, [Data(peer.bytes), collectedThrough], as: Int64.self) != nil
    }

    /// `peer` acknowledged this database's changes through the horizon of its garbage collection:
    /// it holds every delete it needs, and is remembered again.
    func remember(_ peer: InstanceKey) throws {
        try connection.execute("DELETE FROM tether_forgotten_peers WHERE peer = ?", [Data(peer.bytes)])
    }

    /// Through which of this database's sequences each remembered peer acknowledged.
    func rememberedAcknowledgements() throws -> [(peer: InstanceKey, through: Int64)] {
        try connection.fetchRows(
            """
            SELECT instance_key, acknowledged_through FROM tether_peers WHERE instance_key NOT IN (SELECT peer FROM \
            tether_forgotten_peers)
            """
        ).compactMap { row in
            guard let key = InstanceKey(bytes: [UInt8](try row.get(0, as: Data.self))) else { return nil }
            return (key, try row.get(1, as: Int64.self))
        }
    }

    // MARK: Marks of the peers' histories

    /// The mark of `peer`'s history it sent with its changes; nil if it sent none.
    func historyMark(of peer: InstanceKey) throws -> HistoryMark? {
        try connection.fetchRow("SELECT through, clock FROM tether_peer_marks WHERE peer = ?", [Data(peer.bytes)]).map {
            HistoryMark(
                through: try $0.get(0, as: Int64.self), clock: UInt64(bitPattern: try $0.get(1, as: Int64.self)))
        }
    }

    /// Keeps `mark` of `peer`'s history, unless the one kept reaches further (any true mark may be
    /// kept: the one that reaches furthest shows the most).
    func recordHistoryMark(_ mark: HistoryMark, of peer: InstanceKey) throws {
        try connection.execute(
            """
            INSERT INTO tether_peer_marks (peer, through, clock) VALUES (?, ?, ?)
            ON CONFLICT (peer) DO UPDATE SET through = excluded.through, clock = excluded.clock WHERE excluded.through \
            >= through
            """, [Data(peer.bytes), mark.through, Int64(bitPattern: mark.clock)])
    }

    // MARK: Findings of a rewritten history

    /// What `peer`'s mark showed of this database's history, if it showed a divergence.
    func historyFinding(of peer: InstanceKey) throws -> HistoryFinding? {
        try connection.fetchRow(
            "SELECT peer, through, clock, reason, found FROM tether_history_findings WHERE peer = ?", [Data(peer.bytes)]
        )
        .flatMap(Self.historyFinding)
    }

    /// Every finding, oldest first.
    func historyFindings() throws -> [HistoryFinding] {
        try connection.fetchRows(
            "SELECT peer, through, clock, reason, found FROM tether_history_findings ORDER BY found, peer"
        )
        .compactMap(Self.historyFinding)
    }

    /// Records `finding` (the first one about a peer stays).
    func recordHistoryFinding(_ finding: HistoryFinding) throws {
        try connection.execute(
            """
            INSERT OR IGNORE INTO tether_history_findings (peer, through, clock, reason, found) VALUES (?, ?, ?, \
            ?, ?)
            """,
            [
                Data(finding.peer.bytes), finding.mark.through, Int64(bitPattern: finding.mark.clock), finding.reason,
                finding.found.timeIntervalSince1970,
            ])
    }

    /// This database has a new instance key: no peer holds a history of it yet.
    func forgetHistoryFindings() throws {
        try connection.execute("DELETE FROM tether_history_findings")
    }

    private static func historyFinding(_ row: Row) throws -> HistoryFinding? {
        guard let peer = InstanceKey(bytes: [UInt8](try row.get(0, as: Data.self))) else { return nil }
        return HistoryFinding(
            peer: peer,
            mark: HistoryMark(
                through: try row.get(1, as: Int64.self), clock: UInt64(bitPattern: try row.get(2, as: Int64.self))),
            reason: try row.get(3, as: String.self), found: Date(timeIntervalSince1970: try row.get(4, as: Double.self))
        )
    }

    // MARK: Certificates

    /// What is recorded of `peer`'s certificate: what its key is pinned to, and the certificate it
    /// presented last (nil when recorded before format 5); nil before any session with it.
    func certificate(of peer: InstanceKey) throws -> (pin: String, presented: PeerIdentity?)? {
        try connection.fetchRow(
            "SELECT certificate, name, fingerprint FROM tether_peer_certificates WHERE instance_key = ?",
            [Data(peer.bytes)]
        ).map { row in
            (
                try row.get(0, as: String.self),
                String.fromDatabaseValue(row[2]).map {
                    PeerIdentity(name: String.fromDatabaseValue(row[1]), fingerprint: $0)
                }
            )
        }
    }

    /// Pins `peer` to `certificate` unless it is pinned already, and records `certificate` as the
    /// one it presented when the pin is its own; returns the pin it holds.
    func pin(_ peer: InstanceKey, to certificate: PeerIdentity) throws -> String {
        try connection.execute(
            """
            INSERT INTO tether_peer_certificates (instance_key, certificate, first_seen, name, fingerprint) VALUES (?, \
            ?, ?, ?, ?)
            ON CONFLICT (instance_key) DO UPDATE SET name = excluded.name, fingerprint = excluded.fingerprint WHERE \
            certificate = excluded.certificate
            """, [Data(peer.bytes), certificate.pin, Self.now, certificate.name, certificate.fingerprint])
        return try self.certificate(of: peer)?.pin ?? certificate.pin
    }

    /// Every pinned key, with its certificate.
    func pinnedCertificates() throws -> [InstanceKey: String] {
        var pins: [InstanceKey: String] = [:]
        for row in try connection.fetchRows("SELECT instance_key, certificate FROM tether_peer_certificates") {
            guard let key = InstanceKey(bytes: [UInt8](try row.get(0, as: Data.self))) else { continue }
            pins[key] = try row.get(1, as: String.self)
        }
        return pins
    }

    // MARK: Backfills

    /// `peer` backfilled `columns` (per table, this database's names) through `sequence`: rows this
    /// database inserted by then reached it without those columns' values (§8.3 of
    /// Protocol/README.md), so no later change to such a row leaves them out as held there.
    func recordBackfill(to peer: InstanceKey, columns: [String: [String]], through sequence: Int64) throws {
        for (table, names) in columns.sorted(by: { $0.key < $1.key }) {
            for column in names {
                try connection.execute(
                    """
                    INSERT INTO tether_peer_backfills (peer, table_name, column_name, through) VALUES (?, ?, ?, ?)
                    ON CONFLICT (peer, table_name, column_name) DO UPDATE SET through = max(through, excluded.through)
                    """, [Data(peer.bytes), table, column, sequence])
            }
        }
    }

    /// Per table and column, the sequence through which `peer` backfilled it (see `recordBackfill`).
    func backfills(to peer: InstanceKey) throws -> [String: [String: Int64]] {
        var result: [String: [String: Int64]] = [:]
        for row in try connection.fetchRows(
            "SELECT table_name, column_name, through FROM tether_peer_backfills WHERE peer = ?", [Data(peer.bytes)])
        {
            result[try row.get(0, as: String.self), default: [:]][try row.get(1, as: String.self)] = try row.get(
                2, as: Int64.self)
        }
        return result
    }

    // MARK: Peer schemas

    /// What the last handshake with `peer` recorded of its schema; nil when none was (peers of
    /// identical schemas are not recorded).
    func schema(of peer: InstanceKey) throws -> PeerSchema? {
        try connection.fetchRow(
            "SELECT peer, shared, differences, updated FROM tether_peer_schemas WHERE peer = ?", [Data(peer.bytes)]
        )
        .flatMap(Self.peerSchema)
    }

    /// Every peer's schema record, by instance key.
    func schemas() throws -> [PeerSchema] {
        try connection.fetchRows("SELECT peer, shared, differences, updated FROM tether_peer_schemas ORDER BY peer")
            .compactMap(Self.peerSchema)
    }

    /// Records `schema`, replacing what was recorded of its peer.
    func save(_ schema: PeerSchema) throws {
        try connection.execute(
            """
            INSERT INTO tether_peer_schemas (peer, shared, differences, updated) VALUES (?, ?, ?, ?)
            ON CONFLICT (peer) DO UPDATE SET shared = excluded.shared, differences = excluded.differences, updated = \
            excluded.updated
            """,
            [
                Data(schema.peer.bytes), Self.json(schema.shared), Self.json(schema.differences),
                schema.updated.timeIntervalSince1970,
            ])
    }

    private static func peerSchema(_ row: Row) throws -> PeerSchema? {
        guard let peer = InstanceKey(bytes: [UInt8](try row.get(0, as: Data.self))) else { return nil }
        let decoder = JSONDecoder()
        return PeerSchema(
            peer: peer,
            shared: try decoder.decode([String: [String]].self, from: Data(try row.get(1, as: String.self).utf8)),
            differences: try decoder.decode([String].self, from: Data(try row.get(2, as: String.self).utf8)),
            updated: Date(timeIntervalSince1970: try row.get(3, as: Double.self)))
    }

    private static func json(_ value: some Encodable) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return (try? encoder.encode(value)).map { String(decoding: $0, as: UTF8.self) } ?? "[]"
    }
}

extension Connection {
    /// What this database records about its peers, read and written on this connection.
    var peerStore: PeerStore { PeerStore(connection: self) }
}
