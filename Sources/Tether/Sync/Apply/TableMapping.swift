// How a batch's description of a table maps onto the local table (a peer of another schema
// version may have more or fewer value columns).

import Foundation

/// How a batch's table maps onto the local one. A class: every change of the batch is applied
/// with its table's mapping, and a struct's copy would count references to its four arrays.
final class TableMapping {
    let table: SyncedTable
    /// Per remote value column (of those kept, see `projection`), the local value column.
    let localIndex: [Int]
    /// Every local value column, in the local order: a change binds straight into an insert.
    let isInOrder: Bool
    /// The remote value columns this database has, when it lacks some (nil: it has them all):
    /// changes are applied without the others, which are kept for when a migration adds them.
    let projection: [Int]?
    /// The remote columns this database lacks, for the record of what was kept.
    let unknownColumns: [String]
    /// The local value columns the peer lacks, in local order.
    let columnsThePeerLacks: [Int]

    init(table: SyncedTable, localIndex: [Int], projection: [Int]? = nil, unknownColumns: [String] = []) {
        self.table = table
        self.localIndex = localIndex
        self.projection = projection
        self.unknownColumns = unknownColumns
        isInOrder =
            localIndex.count == table.valueColumns.count && localIndex.indices.allSatisfy { localIndex[$0] == $0 }
        columnsThePeerLacks =
            localIndex.count == table.valueColumns.count
            ? [] : table.valueColumns.indices.filter { !localIndex.contains($0) }
    }

    /// `change` with only the columns of `projection`.
    func projected(_ change: RowChange) -> RowChange {
        projection.map(change.keepingValues(at:)) ?? change
    }
}

extension SyncEngine {
    /// How `descriptor` maps onto the local table; nil when the table is not synced here. Value
    /// columns only the peer has are left out of the mapping (see `TableMapping.projection`);
    /// local value columns the peer lacks keep their values (or, in a new row, get their default).
    func mapping(_ descriptor: TableDescriptor) throws -> TableMapping? {
        guard let table = tables[descriptor.name] else { return nil }
        guard descriptor.keyColumns == table.keyColumns else {
            throw SyncError.schemaMismatch(
                """
                table \(table.name) is identified by (\(descriptor.keyColumns.joined(separator: ", "))) on the \
                peer and by (\(table.keyColumns.joined(separator: ", "))) here
                """)
        }
        if table.needsMergeFunction { throw SyncError.missingMergeFunction(table.name) }
        var localIndex: [Int] = []
        localIndex.reserveCapacity(descriptor.valueColumns.count)
        var projection: [Int] = []
        var unknown: [String] = []
        for (remoteIndex, name) in descriptor.valueColumns.enumerated() {
            if remoteIndex < table.valueColumns.count, table.valueColumns[remoteIndex] == name {
                localIndex.append(remoteIndex)
                projection.append(remoteIndex)
            } else if let index = table.valueColumns.firstIndex(of: name) {
                localIndex.append(index)
                projection.append(remoteIndex)
            } else {
                unknown.append(name)
            }
        }
        return TableMapping(
            table: table, localIndex: localIndex, projection: unknown.isEmpty ? nil : projection,
            unknownColumns: unknown)
    }
}
