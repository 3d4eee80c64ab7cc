import Tether
import TetherWire

/// What two peers sync when their schemas differ (§8.2 of Protocol/README.md): the tables both
/// sync with the same key columns and, in each, the value columns both have — columns matched
/// by name or through a rename either side announced in its HELLO. Equal fingerprints are the
/// fast path: everything is shared and nothing is cut.
struct SharedSchema: Sendable, Equatable {
    /// A value column both sides sync: its name here and at the peer.
    struct Column: Sendable, Equatable {
        var mine: String
        var theirs: String
    }

    /// Key columns that differ on a table both sync: rows cannot be matched (ERROR 2).
    struct KeyMismatch: Error, Equatable {
        var table: String
        var column: String?
        var message: String
    }

    /// Per table both sync (by this side's name), its shared value columns; nil when both sync
    /// the very same tables and columns.
    let tables: [String: [Column]]?
    /// Per table whose key columns one side renamed, their names at the peer, in key order.
    var peerKeyColumns: [String: [String]] = [:]
    /// How the schemas differ, in words, sorted by table (empty when they do not), as
    /// `tether status` shows them ("table t: column color is synced by the peer, not here").
    let differences: [String]

    static let everything = SharedSchema(tables: nil, differences: [])

    /// The peer's name for this side's column `column` of `table`, among `theirs`: the same, or
    /// through a rename either side announced.
    private static func peerName(
        of column: String, table: String, among theirs: Set<String>, mine: LocalSchema, hello: Hello
    ) -> String? {
        if theirs.contains(column) { return column }
        if let rename = mine.renames.first(where: { $0.table == table && $0.to == column && theirs.contains($0.from) })
        {
            return rename.from
        }
        return hello.renames.first { $0.table == table && $0.from == column && theirs.contains($0.to) }?.to
    }

    /// The tables and columns `mine` and the peer's `hello` both sync; a table whose key columns
    /// differ is the one hard error.
    static func negotiate(mine: LocalSchema, theirs hello: Hello, peerRole: String) -> Result<SharedSchema, KeyMismatch>
    {
        if hello.schemaFingerprint == mine.fingerprint { return .success(.everything) }
        let local = Dictionary(mine.tables.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        let remote = Dictionary(hello.tables.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        let names = Set(local.keys).union(remote.keys).sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        var tables: [String: [Column]] = [:]
        var peerKeyColumns: [String: [String]] = [:]
        var differences: [String] = []
        var cutsSomething = false
        for name in names {
            guard let table = local[name] else {
                differences.append("table \(name) is synced by the peer, not here")
                continue
            }
            guard let peer = remote[name] else {
                differences.append("table \(name) is synced here, not by the peer")
                cutsSomething = true
                continue
            }
            // Key columns match in order, by name or through a rename.
            let peerKeys = table.keyColumns.map {
                peerName(of: $0, table: name, among: Set(peer.keyColumns), mine: mine, hello: hello)
            }
            guard peerKeys.count == peer.keyColumns.count, zip(peerKeys, peer.keyColumns).allSatisfy({ $0 == $1 })
            else {
                let column = zip(table.keyColumns, peerKeys).first { $0 != $1 }?.0 ?? table.keyColumns.first
                return .failure(
                    KeyMismatch(
                        table: name, column: column,
                        message:
                            """
                            table \(name): the key columns differ (this peer: \
                            \(table.keyColumns.joined(separator: ", ")); the \(peerRole): \
                            \(peer.keyColumns.joined(separator: ", ")))
                            """))
            }
            if peer.keyColumns != table.keyColumns {
                peerKeyColumns[name] = peer.keyColumns
                for (column, theirName) in zip(table.keyColumns, peer.keyColumns) where column != theirName {
                    differences.append("table \(name): key column \(column) here is \(theirName) on the peer (renamed)")
                }
                cutsSomething = true
            }
            let theirs = Set(peer.valueColumns)
            var columns: [Column] = []
            // A column of the same name on both sides is that column, whatever a rename says: the
            // peer's column is matched by name first, and a rename only matches a column left over
            // (both sides then agree, whatever the order of their columns).
            var matched = Set(table.valueColumns.filter(theirs.contains))
            for column in table.valueColumns {
                let theirName =
                    theirs.contains(column)
                    ? column : peerName(of: column, table: name, among: theirs, mine: mine, hello: hello)
                guard let theirName, theirName == column || !matched.contains(theirName) else {
                    differences.append("table \(name): column \(column) is synced here, not by the peer")
                    cutsSomething = true
                    continue
                }
                matched.insert(theirName)
                columns.append(Column(mine: column, theirs: theirName))
                if theirName != column {
                    differences.append("table \(name): column \(column) here is \(theirName) on the peer (renamed)")
                    cutsSomething = true
                }
            }
            for column in peer.valueColumns where !matched.contains(column) {
                differences.append("table \(name): column \(column) is synced by the peer, not here")
            }
            tables[name] = columns
        }
        // What the peer has more changes nothing of what this side sends: only what it has less is cut.
        guard cutsSomething else { return .success(SharedSchema(tables: nil, differences: differences)) }
        var shared = SharedSchema(tables: tables, differences: differences)
        shared.peerKeyColumns = peerKeyColumns
        return .success(shared)
    }

    /// Per table both sync, the value columns both sync (this side's names): what the peer
    /// record keeps, to find what becomes shared later. `schema` gives every table when all is shared.
    func sharedColumns(of schema: LocalSchema) -> [String: [String]] {
        guard let tables else {
            return Dictionary(schema.tables.map { ($0.name, $0.valueColumns) }, uniquingKeysWith: { first, _ in first })
        }
        return tables.mapValues { $0.map(\.mine) }
    }

    /// The peer's name for this side's value column `column` of `table` (nil: the peer does not
    /// sync it). Everything shared: the same name.
    func peerName(ofColumn column: String, in table: String) -> String? {
        guard let tables else { return column }
        return tables[table]?.first { $0.mine == column }?.theirs
    }

    /// Whether `table`, synced here, is synced by the peer too.
    func sharesTable(_ table: String) -> Bool {
        tables.map { $0[table] != nil } ?? true
    }

    /// Whether some table synced here is not synced by the peer: its rows are then left out of
    /// what is sent, and must not be marked in flight (the peer's ACK would mark them synced).
    func leavesOutTables(of schema: LocalSchema) -> Bool {
        guard let tables else { return false }
        return schema.tables.contains { tables[$0.name] == nil }
    }

    /// `batch` (this side's) as the peer syncs it: without the tables it does not sync, without
    /// the columns it lacks, with renamed columns (key columns included) under its names.
    func restrict(_ batch: ChangeBatch) -> ChangeBatch {
        guard let tables else { return batch }
        return batch.cut(
            tables: { descriptor in
                guard let columns = tables[descriptor.name] else { return nil }
                var kept: [Int] = []
                var names: [String] = []
                for (position, name) in descriptor.valueColumns.enumerated() {
                    guard let column = columns.first(where: { $0.mine == name }) else { continue }
                    kept.append(position)
                    names.append(column.theirs)
                }
                return ChangeBatch.TableCut(
                    descriptor: TableDescriptor(
                        name: descriptor.name, keyColumns: peerKeyColumns[descriptor.name] ?? descriptor.keyColumns,
                        valueColumns: names),
                    keptValues: kept.count == descriptor.valueColumns.count ? nil : kept)
            },
            changes: { change in
                // An expiry goes with the table whose row it names: the peer refuses one for a table it does not sync.
                batch.tableConcerned(by: change).map { tables[$0] != nil } == true
            })
    }

    /// The backfill to ask the peer for (§8.3): `newlyShared` (this side's names; no columns:
    /// the whole table), through `through`, the cursor on the peer.
    func backfill(of newlyShared: [String: [String]], through: Int64) -> Backfill {
        Backfill(
            through: through,
            tables: newlyShared.keys.sorted().map { Backfill.Table(name: $0, columns: newlyShared[$0] ?? []) })
    }

    /// What the peer's backfill PULL asks of this side: its tables and columns under this side's
    /// names (a name it does not share is left out).
    func scope(of backfill: Backfill) -> BackfillScope {
        var columns: [String: [String]] = [:]
        for table in backfill.tables {
            guard tables == nil || tables?[table.name] != nil else { continue }
            let mine = table.columns.compactMap { name in
                guard let shared = tables?[table.name] else { return name }
                return shared.first { $0.theirs == name }?.mine
            }
            // Columns listed, none of them shared: nothing to send (not the whole table, which an
            // empty list asks for).
            if !table.columns.isEmpty && mine.isEmpty { continue }
            columns[table.name] = mine
        }
        return BackfillScope(through: backfill.through, columns: columns)
    }
}
