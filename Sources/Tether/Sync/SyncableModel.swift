/// A model that reads its row's sync state (sModel's SyncableModel), kept
/// up to date by the engine: map the two properties onto `tether_status` and
/// `tether_in_flight` in `CodingKeys`. These are not columns of the table:
/// Tether reads them from its own metadata (`createTable` does not declare
/// them, and writes leave them out).
///
/// ```swift
/// struct Note: SyncableModel {
///     var id: Int64
///     var text: String
///     var syncStatus: SyncStatus = .created
///     var inFlight = false
///
///     enum CodingKeys: String, CodingKey {
///         case id, text
///         case syncStatus = "tether_status", inFlight = "tether_in_flight"
///     }
/// }
/// let waiting = try db.fetchAll(Note.where(.pendingSync))
/// ```
///
/// Values written through these properties are ignored: the engine alone
/// sets them (created, updated, deleted, synced on acknowledgement).
public protocol SyncableModel: Model {
    /// The row's sync state: created, updated or deleted here and not yet acknowledged by a peer,
    /// or synced (map it to `tether_status`).
    var syncStatus: SyncStatus { get }
    /// Whether the row's latest change was sent to a peer that has not acknowledged it yet (map it
    /// to `tether_in_flight`).
    var inFlight: Bool { get }
}

extension DatabaseContext {
    /// The sync state of the row with this primary key in a synced table, or
    /// nil when there is no such row (a deleted row is in its tombstone table).
    public func syncState<M: Model>(of type: M.Type, key: PrimaryKey) throws -> (status: SyncStatus, inFlight: Bool)? {
        try withReadConnection { conn in
            let schema = try ModelSchema<M>.shared()
            let clause = try keyCondition(schema, key)
            let rowsTable = RowMetadataLayout.rowsTableName(of: schema.tableName)
            guard try conn.tableExists(rowsTable) else {
                throw SyncError.notSynced(schema.tableName)
            }
            let withoutRowidKey = try WithoutRowidKey.of(schema.tableName, conn)?.columns
            let rowid = RowMetadataLayout.rowidSQL(
                table: schema.tableName, alias: schema.quotedTable, withoutRowidKey: withoutRowidKey)
            let sql = """
                SELECT \(RowMetadataLayout.statusSQL(table: schema.tableName, rowid: rowid)), \
                \(RowMetadataLayout.inFlightSQL(table: schema.tableName, rowid: rowid)) FROM \
                \(schema.quotedTable)\(clause.sql)
                """
            guard let row = try conn.fetchRow(sql, StatementArguments(values: clause.arguments)) else { return nil }
            guard let status = SyncStatus.fromDatabaseValue(row[0]) else {
                throw SyncError.corruptMetadata(
                    "\(schema.tableName) row \(schema.describeKey(key.values)) has status \(row[0])")
            }
            return (status, try row.get(1, as: Bool.self))
        }
    }
}
