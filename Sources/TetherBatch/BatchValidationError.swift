/// A rule of its own that a change batch breaks (Protocol/README.md §7.2, "Checked from the batch
/// alone"), and where: which table, which change. Thrown by `ChangeBatch.validate()`.
public enum BatchValidationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// `after` and `through` do not bound a range of sequence numbers: 0 ≤ `after` ≤ `through` fails.
    case invalidRange(after: Int64, through: Int64)
    /// Tables `first` and `second` of the batch have the same name.
    case tableNamedTwice(name: String, first: Int, second: Int)
    /// Table `index` has no key column.
    case tableWithoutKey(name: String, index: Int)
    /// Table `index` names `column` twice among its key and value columns.
    case columnNamedTwice(table: String, index: Int, column: String)
    /// Change `change` refers to table `table`, but the batch describes `tableCount` tables.
    case unknownTable(change: Int, table: Int, tableCount: Int)
    /// Change `change` to `table` holds `count` of `part` where its table calls for `expected`
    /// (versions and omitted flags: also none).
    case wrongCount(change: Int, table: String, part: ChangePart, count: Int, expected: Int)
    /// Change `change` to `table` has an `omitted` list that leaves no column out.
    case partialLeavesNothingOut(change: Int, table: String)
    /// Change `change` to `table` has a sequence number outside (`after`, `through`].
    case sequenceOutOfRange(change: Int, table: String, sequence: Int64, after: Int64, through: Int64)
    /// Change `change` to `table` has a sequence number not above the previous change's.
    case sequenceNotIncreasing(change: Int, table: String, sequence: Int64, previous: Int64)

    /// Change `change` to `table` is an eviction that carries values, versions, omitted flags or
    /// claims the row alive: an eviction carries its key alone.
    case evictionWithRowState(change: Int, table: String)

    /// The lists of a change whose length its table sets.
    public enum ChangePart: String, Sendable, Hashable {
        case keyValues = "key value(s)"
        case values = "value(s)"
        case versions = "version(s)"
        case omittedFlags = "omitted flag(s)"
    }

    public var description: String {
        switch self {
        case let .invalidRange(after, through):
            return """
                the batch covers the sequences after \(after) through \(through), which is not a range (0 ≤ after \
                ≤ through)
                """
        case let .tableNamedTwice(name, first, second):
            return "tables \(first) and \(second) are both named \(name)"
        case let .tableWithoutKey(name, index):
            return "table \(index) (\(name)) has no key column"
        case let .columnNamedTwice(table, index, column):
            return "table \(index) (\(table)) names column \(column) twice"
        case let .unknownTable(change, table, tableCount):
            return "change \(change) refers to table \(table), but the batch describes \(tableCount)"
        case let .wrongCount(change, table, part, count, expected):
            let allowed = part == .versions || part == .omittedFlags ? "\(expected) or none" : "\(expected)"
            return "change \(change) to table \(table) has \(count) \(part.rawValue), not \(allowed)"
        case let .partialLeavesNothingOut(change, table):
            return "change \(change) to table \(table) is partial but leaves no column out"
        case let .sequenceOutOfRange(change, table, sequence, after, through):
            return """
                change \(change) to table \(table) has sequence \(sequence), outside the batch's (\(after), \
                \(through)]
                """
        case let .evictionWithRowState(change, table):
            return """
                change \(change) to table \(table) is an eviction but carries row state (values, versions, \
                omitted flags or alive); an eviction carries its key alone
                """
        case let .sequenceNotIncreasing(change, table, sequence, previous):
            return """
                change \(change) to table \(table) has sequence \(sequence), not above the previous change's \
                \(previous)
                """
        }
    }
}
