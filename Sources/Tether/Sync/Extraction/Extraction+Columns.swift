// Reading a change's columns from the current row of a query, and its size in a batch.

import CSQLite
import Foundation

extension Extraction {
    /// The key columns then the value columns at the start of the current row; with `omitted` (a
    /// partial change's flags), the value columns it leaves out are not read (NULL in their place).
    static func readKeyAndValues(_ handle: OpaquePointer, _ table: TableRead, leavingOut omitted: [Bool] = [])
        -> (key: [DatabaseValue], values: [DatabaseValue])
    {
        let key = readColumns(handle, from: 0, count: table.keyCount)
        guard !omitted.isEmpty else { return (key, readColumns(handle, from: table.keyCount, count: table.valueCount)) }
        return (
            key,
            (0..<table.valueCount).map {
                omitted[$0] ? .null : DatabaseValue(statement: handle, index: Int32(table.keyCount + $0))
            }
        )
    }

    /// `count` columns of the current row from column `first`. Up to four are written as an array
    /// literal, whose storage is allocated at its size in one call: this runs twice per change
    /// extracted, and growing an array (or allocating one of a size known only at run time) goes
    /// through the generic paths, which cost more than reading the values.
    static func readColumns(_ handle: OpaquePointer, from first: Int, count: Int) -> [DatabaseValue] {
        func column(_ offset: Int) -> DatabaseValue { DatabaseValue(statement: handle, index: Int32(first + offset)) }
        switch count {
        case 0: return []
        case 1: return [column(0)]
        case 2: return [column(0), column(1)]
        case 3: return [column(0), column(1), column(2)]
        case 4: return [column(0), column(1), column(2), column(3)]
        default: return (0..<count).map(column)
        }
    }

    /// An estimate of `change`'s encoded size, for the batch's byte budget.
    static func estimatedSize(_ change: RowChange) -> Int {
        func size(_ value: DatabaseValue) -> Int {
            switch value {
            case .null: return 1
            case .integer: return 5
            case .real: return 9
            case let .text(text): return 2 + text.utf8.count
            case let .blob(data): return 2 + data.count
            }
        }
        var total = 12 + change.versions.count * 10
        for value in change.key { total += size(value) }
        for value in change.values { total += size(value) }
        return total
    }
}
