// The primary key of a table WITHOUT ROWID and its surrogate rowids (`tether_keys_T`).

/// The primary key of a table `WITHOUT ROWID`, whose rows the metadata names by a surrogate
/// rowid: `tether_keys_T` maps each live row's primary key (columns `k0`, `k1`, … of the same
/// types and collations, and as STRICT as the table, so that they compare as the table's do)
/// to its `row_id`. Its columns are named by position, so that renaming a key column leaves it be.
struct WithoutRowidKey: Equatable {
    /// The primary key's columns, in key order.
    let columns: [String]
    /// Each one's declared type and collation.
    let declarations: [String]
    let isStrict: Bool

    static func keysColumn(_ index: Int) -> String { "k\(index)" }
    var keysColumns: [String] { columns.indices.map(Self.keysColumn) }

    /// The keys table's row `keys` names the user's row `row` (an SQL condition: the left side's collation compares).
    func match(keys: String, row: String) -> String {
        columns.indices.map { "\(keys).\(Self.keysColumn($0)) = \(row).\(quoteIdentifier(columns[$0]))" }.joined(
            separator: " AND ")
    }

    /// The user's row `row` is the one the keys table's row `keys` names.
    func match(row: String, keys: String) -> String {
        columns.indices.map { "\(row).\(quoteIdentifier(columns[$0])) = \(keys).\(Self.keysColumn($0))" }.joined(
            separator: " AND ")
    }

    func createKeysTable(_ keysTable: String) -> String {
        let definitions = columns.indices.map { "\(Self.keysColumn($0)) \(declarations[$0])" }.joined(separator: ", ")
        return "CREATE TABLE IF NOT EXISTS \(keysTable) (row_id INTEGER PRIMARY KEY, \(definitions), UNIQUE "
            + "(\(keysColumns.joined(separator: ", "))))"
            + (isStrict ? " STRICT" : "")
    }

    /// `table`'s primary key when it is declared WITHOUT ROWID; nil when it has a rowid.
    static func of(_ table: String, _ connection: Connection) throws -> WithoutRowidKey? {
        guard
            let info = try connection.fetchRow(
                "SELECT wr, strict FROM pragma_table_list WHERE schema = 'main' AND name = ?", [table]),
            try info.get(0, as: Int.self) != 0
        else { return nil }
        let columns = try connection.fetchRows(
            """
            SELECT c.name, c.type, coalesce(x.coll, 'BINARY') FROM pragma_table_info(?1) AS c
            LEFT JOIN pragma_index_list(?1) AS i ON i.origin = 'pk'
            LEFT JOIN pragma_index_xinfo(i.name) AS x ON x.name = c.name AND x.key = 1
            WHERE c.pk > 0 ORDER BY c.pk
            """, [table])
        guard !columns.isEmpty else { throw SyncError.invalidTable("\(table) is WITHOUT ROWID but has no primary key") }
        return WithoutRowidKey(
            columns: try columns.map { try $0.get(0, as: String.self) },
            declarations: try columns.map { row in
                let type = try row.get(1, as: String.self)
                return (type.isEmpty ? "" : type + " ") + "COLLATE " + quoteIdentifier(try row.get(2, as: String.self))
            },
            isStrict: try info.get(1, as: Int.self) != 0)
    }
}
