import Foundation

/// The sync engine's changelog as observation reads it: the sequence numbers each commit gives,
/// and the rows changed after a sequence number, read back from the metadata.
extension SyncEngine: ChangelogSource {
    /// The capture notes them at each commit.
    func takeCommittedSequences() -> ClosedRange<Int64>? { capture.takeCommittedSequences() }

    func takeCommittedTransaction() -> SourceTransaction? {
        capture.takeCommittedVersion().map {
            SourceTransaction(origin: instanceKey, timestamp: HybridTimestamp(rawValue: $0.timestamp))
        }
    }

    func foldExternalWrites(_ connection: Connection) throws { try capture.foldExternalWrites(connection) }

    var recordedTables: Set<String> { Set(tableList.map(\.name)) }

    func lastStoredSequence(_ connection: Connection) throws -> Int64 {
        try HybridClock.storedSequence(connection)
    }

    /// Live rows with metadata of their own are reported as inserts when they were inserted after
    /// `sequence` (whatever path inserted them: their metadata records it), as updates otherwise;
    /// rows of an insert range (inserted in bulk or applied from a peer) like them, by the sequence
    /// number that inserted each (a range of rows updated together holds it), tombstones as deletes, the eviction log's
    /// entries as evictions. The key is the table's sync identity.
    func changes(after sequence: Int64, _ connection: Connection) throws -> [DatabaseEvent] {
        var events: [DatabaseEvent] = []
        var transactions = SourceTransactionReader(connection)
        for table in tableList.sorted(by: { $0.name < $1.name }) {
            let layout = table.layout
            let keys = table.keyColumns.map(quoteIdentifier)
            // A table WITHOUT ROWID has no rowid to report.
            let rowid = layout.isWithoutRowid ? "NULL" : "t.rowid"
            let live = """
                SELECT m.seq, \(SiteRegistry.instanceKeySQL(ofSiteIn: "m.via")), \(rowid), coalesce(m.inserted_seq > \
                ?1, 0), m.versions, \(keys.map { "t.\($0)" }.joined(separator: ", "))
                FROM \(layout.rowsTable) AS m \(layout.joinUser("t", on: "m.row_id")) WHERE m.seq > ?1
                """
            for row in try connection.fetchRows(live, [sequence]) {
                // Inserted since the last look (maybe updated after): an insert. Not from the status,
                // which an acknowledgement turns to synced whatever the row went through.
                let kind: DatabaseEvent.Kind = try row.get(3, as: Bool.self) ? .insert : .update
                events.append(
                    try event(
                        kind, table, row, sequenceColumn: 0, rowidColumn: layout.isWithoutRowid ? nil : 2,
                        transaction: transactions.newest(in: row[4]), keyStart: 5))
            }
            for range in try insertRanges(of: table, after: sequence, connection) {
                let firstRowid = max(range.firstRowid, range.rowid(ofSequence: sequence + 1))
                let via = try range.via.map { try SiteRegistry.storedKey(of: $0, connection) } ?? nil
                let transaction = try transactions.newest(of: range.rowVersions)
                let rows = try connection.fetchRows(
                    """
                    SELECT t.rowid, \(keys.map { "t.\($0)" }.joined(separator: ", ")) FROM \(layout.quotedTable) AS t
                    WHERE t.rowid BETWEEN ? AND ? AND NOT EXISTS (SELECT 1 FROM \(layout.rowsTable) WHERE row_id = \
                    t.rowid)
                    """, [firstRowid, range.lastRowid])
                for row in rows {
                    let rowid = try row.get(0, as: Int64.self)
                    // Rows updated together since their insert are a range too: updates, unless inserted since
                    // the last look.
                    let kind: DatabaseEvent.Kind = range.insertedSequence(ofRowid: rowid) > sequence ? .insert : .update
                    events.append(
                        DatabaseEvent(
                            kind: kind, table: table.name, rowID: rowid, keyValues: Array(row.values.dropFirst()),
                            origin: via.map { .peer($0) } ?? .local, sequence: range.sequence(ofRowid: rowid),
                            sourceTransaction: transaction))
                }
            }
            let dead = """
                SELECT tether_seq, \(SiteRegistry.instanceKeySQL(ofSiteIn: "tether_via")), NULL, tether_versions, \
                \(keys.joined(separator: ", "))
                FROM \(layout.deadTable) WHERE tether_seq > ?
                """
            for row in try connection.fetchRows(dead, [sequence]) {
                events.append(
                    try event(
                        .delete, table, row, sequenceColumn: 0, rowidColumn: nil,
                        transaction: transactions.newest(in: row[3]), keyStart: 4))
            }
        }
        events += try EvictionLog.events(after: sequence, tables: Set(tableList.map(\.name)), connection)
        return events.sorted { ($0.sequence ?? 0) < ($1.sequence ?? 0) }
    }

    private func event(
        _ kind: DatabaseEvent.Kind, _ table: SyncedTable, _ row: Row, sequenceColumn: Int, rowidColumn: Int?,
        transaction: SourceTransaction?, keyStart: Int
    ) throws -> DatabaseEvent {
        let peer = Data.fromDatabaseValue(row[1]).flatMap { InstanceKey(bytes: [UInt8]($0)) }
        return DatabaseEvent(
            kind: kind, table: table.name, rowID: try rowidColumn.map { try row.get($0, as: Int64.self) },
            keyValues: Array(row.values.dropFirst(keyStart)), origin: peer.map { .peer($0) } ?? .local,
            sequence: try row.get(sequenceColumn, as: Int64.self), sourceTransaction: transaction)
    }
}

/// The source transactions of rows read back, from their stored versions: the newest version's
/// timestamp and site, the site's instance key read once per site.
private struct SourceTransactionReader {
    let connection: Connection
    var keys: [Int32: InstanceKey] = [:]

    init(_ connection: Connection) { self.connection = connection }

    /// The transaction of a stored `tether_versions` value (nil when it is not one).
    mutating func newest(in stored: DatabaseValue) throws -> SourceTransaction? {
        guard let data = Data.fromDatabaseValue(stored), let versions = RowVersions(encoded: [UInt8](data)) else {
            return nil
        }
        return try newest(of: versions)
    }

    mutating func newest(of versions: RowVersions) throws -> SourceTransaction? {
        let newest = versions.newest
        let key: InstanceKey
        if let known = keys[newest.site] {
            key = known
        } else {
            guard let stored = try SiteRegistry.storedKey(of: newest.site, connection) else { return nil }
            keys[newest.site] = stored
            key = stored
        }
        return SourceTransaction(origin: key, timestamp: HybridTimestamp(rawValue: newest.timestamp))
    }
}
