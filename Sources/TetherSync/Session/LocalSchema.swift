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
    /// Columns renamed by migrations (`tether_column_renames`), announced in HELLO.
    var renames: [ColumnRename] = []

    /// Reads the synced tables' descriptors from the database's sync metadata.
    /// Blocking: call it off the event loop.
    static func load(from database: Database) throws(SyncSessionError) -> LocalSchema {
        let rows: [Row]
        do {
            rows = try database.fetchRows("SELECT name, key_columns, value_columns FROM tether_tables ORDER BY name")
        } catch {
            throw .database(operation: "read the synced tables", reason: "\(error)")
        }
        var tables: [TableDescriptor] = []
        let decoder = JSONDecoder()
        for row in rows {
            do {
                let name = try row.get(0, as: String.self)
                let keys = try decoder.decode([String].self, from: Data(try row.get(1, as: String.self).utf8))
                let values = try decoder.decode([String].self, from: Data(try row.get(2, as: String.self).utf8))
                tables.append(TableDescriptor(name: name, keyColumns: keys, valueColumns: values.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }))
            } catch {
                throw .database(operation: "read the synced tables", reason: "unreadable row in tether_tables: \(error)")
            }
        }
        tables.sort { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
        var renames: [ColumnRename] = []
        do {
            let byName = Dictionary(tables.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
            for row in try database.fetchRows("SELECT table_name, old_name, new_name FROM tether_column_renames ORDER BY table_name, old_name") {
                let rename = ColumnRename(table: try row.get(0, as: String.self), from: try row.get(1, as: String.self), to: try row.get(2, as: String.self))
                // Only what still holds: the new name synced, the old one gone (§6.1).
                guard let table = byName[rename.table], (table.keyColumns + table.valueColumns).contains(rename.to),
                      !(table.keyColumns + table.valueColumns).contains(rename.from) else { continue }
                renames.append(rename)
            }
        } catch {
            throw .database(operation: "read the renamed columns", reason: "\(error)")
        }
        return LocalSchema(instanceKey: database.instanceKey, tables: tables, fingerprint: try fingerprint(of: tables), renames: renames)
    }

    /// SHA-256 of `tableCount` then the tables, encoded as in HELLO (§6.1).
    static func fingerprint(of tables: [TableDescriptor]) throws(SyncSessionError) -> SchemaFingerprint {
        var bytes: [UInt8] = []
        func uvarint(_ value: UInt64) {
            var value = value
            while value >= 0x80 {
                bytes.append(UInt8(truncatingIfNeeded: value) | 0x80)
                value >>= 7
            }
            bytes.append(UInt8(value))
        }
        func string(_ text: String) {
            uvarint(UInt64(text.utf8.count))
            bytes.append(contentsOf: text.utf8)
        }
        uvarint(UInt64(tables.count))
        for table in tables {
            string(table.name)
            uvarint(UInt64(table.keyColumns.count))
            table.keyColumns.forEach(string)
            uvarint(UInt64(table.valueColumns.count))
            table.valueColumns.forEach(string)
        }
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
