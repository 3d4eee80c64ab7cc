import COpenSSL
import Foundation
import Tether
import TetherWire

/// What a peer announces in its HELLO: its instance key and its synced
/// tables, in the canonical order of the protocol (§8.2 of Protocol/README.md):
/// tables sorted by name, key columns in key order, value columns sorted by name.
struct LocalSchema: Sendable {
    let instanceKey: InstanceKey
    let tables: [TableDescriptor]
    let fingerprint: SchemaFingerprint
    /// Columns renamed by migrations, announced in HELLO.
    var renames: [ColumnRename] = []
    /// The value columns that merge by a rule other than last-writer-wins, by table then column:
    /// announced in SCOPE (capability `mergeRules`), checked against the peer's.
    var columnRules: [String: [String: ColumnMergeRule]] = [:]
    /// The tables whose row rule is not delete-wins: announced and checked with the column rules.
    var rowRules: [String: RowMergeRule] = [:]
    /// The tables this database holds only part of, and the peers that send them in part: relayed
    /// to every other peer as partial (SCOPE's `scoped`), with their evictions (§8.10).
    var partialTables: [String: Set<InstanceKey>] = [:]

    /// The tables held in part because of a peer other than `peer` (what `peer` itself sends in
    /// part is no news to it).
    func tablesHeldInPart(apartFrom peer: InstanceKey) -> Set<String> {
        Self.tablesHeldInPart(partialTables, apartFrom: peer)
    }

    /// The tables of `partialTables` (`Database.partialTables()`) held in part because of a peer other than `peer`.
    static func tablesHeldInPart(_ partialTables: [String: Set<InstanceKey>], apartFrom peer: InstanceKey) -> Set<
        String
    > {
        Set(partialTables.filter { !$0.value.subtracting([peer]).isEmpty }.keys)
    }

    /// `column` of `table`'s merge rule here.
    func rule(of column: String, in table: String) -> ColumnMergeRule {
        columnRules[table]?[column] ?? .lastWriterWins
    }

    /// The rules to announce in SCOPE, sorted by table then column; a table's row rule under the
    /// empty column name (§6.12).
    var ruleClaims: [ColumnRuleClaim] {
        Set(columnRules.keys).union(rowRules.keys).sorted().flatMap { table in
            rowRules[table].map { [ColumnRuleClaim(table: table, column: "", rule: $0.wireCode)] } ?? []
                + (columnRules[table] ?? [:]).sorted { $0.key < $1.key }.map {
                    ColumnRuleClaim(table: table, column: $0.key, rule: $0.value.wireCode)
                }
        }
    }

    /// Reads the synced tables' descriptors from the database's catalog of synced tables.
    /// Blocking: call it off the event loop.
    static func load(from database: Database) throws(SyncSessionError) -> LocalSchema {
        let records: [SyncedTableRecord]
        let recordedRenames: [SyncedColumnRename]
        let partialTables: [String: Set<InstanceKey>]
        do {
            records = try database.syncedTableRecords(includingInternal: true)
            recordedRenames = try database.syncedColumnRenames()
            partialTables = try database.partialTables()
        } catch {
            throw .database(operation: "read the synced tables", reason: "\(error)")
        }
        let tables = records.map { record in
            TableDescriptor(
                name: record.name, keyColumns: record.keyColumns,
                valueColumns: record.valueColumns.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) })
        }.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
        let byName = Dictionary(tables.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        let renames = recordedRenames.compactMap { recorded -> ColumnRename? in
            // Only what still holds: the new name synced, the old one gone (§6.1).
            guard let table = byName[recorded.table],
                (table.keyColumns + table.valueColumns).contains(recorded.newName),
                !(table.keyColumns + table.valueColumns).contains(recorded.oldName)
            else { return nil }
            return ColumnRename(table: recorded.table, from: recorded.oldName, to: recorded.newName)
        }
        var schema = LocalSchema(
            instanceKey: database.instanceKey, tables: tables, fingerprint: try fingerprint(of: tables),
            renames: renames,
            partialTables: partialTables.filter { byName[$0.key] != nil })
        for record in records where !record.columnRules.isEmpty { schema.columnRules[record.name] = record.columnRules }
        for record in records where record.rowRule != .deleteWins { schema.rowRules[record.name] = record.rowRule }
        return schema
    }

    /// SHA-256 of the tables encoded as in HELLO (§6.1).
    static func fingerprint(of tables: [TableDescriptor]) throws(SyncSessionError) -> SchemaFingerprint {
        var writer = ByteWriter()
        Hello.writeTables(tables, into: &writer)
        let bytes = writer.bytes
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let ok = bytes.withUnsafeBytes { input in
            EVP_Digest(input.baseAddress, input.count, &digest, &length, EVP_sha256(), nil)
        }
        guard ok == 1, let fingerprint = SchemaFingerprint(bytes: digest.prefix(Int(length))) else {
            throw .internalFailure("SHA-256 of the schema failed in OpenSSL")
        }
        return fingerprint
    }
}
