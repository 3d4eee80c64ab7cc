/// A Codable type stored as rows of one table.
///
/// Columns come from the type's `CodingKeys`: a property's column is named by
/// its coding key (so `case firstName = "first_name"` renames a column) and a
/// property left out of `CodingKeys` is not stored. Column types come from the
/// property types; declare only what the types cannot say.
///
/// ```swift
/// struct Player: Model {
///     var id: Int64
///     var name: String
///     var email: String
///     var score: Int?
///     var team: Team            // an enum, stored as its raw value
///     var tags: [String]        // stored as JSON text
///
///     static let tableName = "player"
///     static var constraints: [Constraint<Player>] {
///         [.unique("email"), .check("score >= 0"), .index(["name"])]
///     }
/// }
/// ```
///
/// Tether learns a model's columns by decoding it from sample values (see
/// `DatabaseValueConvertible.sampleValues`): an enum's cases come from its
/// type, so enums need no `CaseIterable`; a type that can be decoded from no
/// placeholder declares its samples.
///
/// Write `@Model` on a struct to have its columns read and bound one by one
/// (``ColumnCodable``) rather than through `Codable`'s containers, which is
/// several times cheaper per value; the columns stay the same.
public protocol Model: Codable, Sendable {
    /// The table's name. Default: the type's name.
    static var tableName: String { get }
    /// The primary key, one or several columns. Default: the column `id`.
    static var primaryKey: [ColumnRef<Self>] { get }
    /// Keys that identify a row across peers when the primary key is local
    /// (an auto-incremented integer); each becomes a UNIQUE constraint.
    static var secondaryKeys: [[ColumnRef<Self>]] { get }
    /// Column and table constraints the Swift types do not say.
    static var constraints: [Constraint<Self>] { get }
    /// AgileDB's automatic columns: when true, a column of the model that its table lacks is
    /// added (`ALTER TABLE … ADD COLUMN`, as the model declares it) by the first write that
    /// needs it, and reads before then see it as NULL. When false (the default), a missing
    /// column is an error (`ModelError.columnNotInTable`) on reads and writes alike.
    static var addsMissingColumns: Bool { get }
    /// The order of fetched rows when a query names none (SundeedQLite's `<<` and `>>` marks):
    /// `fetchAll`, `fetchFirst`, `fetchKeys` and `lazyFetch` sort by it unless the query has
    /// its own `orderBy`. Default: none (the order SQLite reads them in). A column the model
    /// lacks makes the model invalid (`ModelError.unknownColumn` at its first use).
    ///
    /// ```swift
    /// static var defaultOrder: [Ordering<Employer>] { [.ascending("fullName")] }
    /// ```
    static var defaultOrder: [Ordering<Self>] { get }
}

extension Model {
    public static var tableName: String { String(describing: Self.self) }
    public static var primaryKey: [ColumnRef<Self>] { ["id"] }
    public static var secondaryKeys: [[ColumnRef<Self>]] { [] }
    public static var constraints: [Constraint<Self>] { [] }
    public static var addsMissingColumns: Bool { false }
    public static var defaultOrder: [Ordering<Self>] { [] }
}

/// One term of a model's `defaultOrder`: a column, ascending or descending.
public struct Ordering<M: Model> {
    /// The column sorted by.
    public let column: ColumnRef<M>
    /// Whether smaller values come first.
    public let ascending: Bool

    /// Smaller values first (SundeedQLite's `<<`).
    public static func ascending(_ column: ColumnRef<M>) -> Ordering { Ordering(column: column, ascending: true) }
    /// Larger values first (SundeedQLite's `>>`).
    public static func descending(_ column: ColumnRef<M>) -> Ordering { Ordering(column: column, ascending: false) }
}

/// A column of `M`, named by its column name or by a key path to its property.
///
/// ```swift
/// static var primaryKey: [ColumnRef<Player>] { ["id"] }
/// static var primaryKey: [ColumnRef<Player>] { [.column(\.id)] }
/// ```
public enum ColumnRef<M: Model>: ExpressibleByStringLiteral, Hashable {
    /// The column of this name, as stored.
    case named(String)
    /// The column of the property at this key path; Tether learns the name from the model.
    case keyPath(PartialKeyPath<M>)

    public init(stringLiteral value: String) { self = .named(value) }
    /// The column of the property at `keyPath`: `.column(\.score)`; checked by the compiler where a
    /// name is not.
    public static func column(_ keyPath: PartialKeyPath<M>) -> ColumnRef<M> { .keyPath(keyPath) }
}

/// Actions of a foreign key when the referenced row is deleted or its key changes.
public enum ForeignKeyAction: String, Sendable {
    /// The default: the change is refused if the key is still referenced when the statement ends
    /// (and the transaction commits, for a deferred key).
    case noAction = "NO ACTION"
    /// The change is refused at once while a row references the key.
    case restrict = "RESTRICT"
    /// The referencing columns become NULL.
    case setNull = "SET NULL"
    /// The referencing columns take their default value.
    case setDefault = "SET DEFAULT"
    /// Deleting the referenced row deletes the rows that reference it; changing its key changes
    /// theirs.
    case cascade = "CASCADE"
}

/// Collating sequences for text columns.
public enum Collation: Sendable, Equatable {
    /// SQLite's built-in collations: `binary` compares bytes (the default), `noCase` folds ASCII
    /// letters' case, `rtrim` ignores trailing spaces.
    case binary, noCase, rtrim
    /// A collation registered on the connection under this name.
    case custom(String)
    var sql: String {
        switch self {
        case .binary: return "BINARY"
        case .noCase: return "NOCASE"
        case .rtrim: return "RTRIM"
        case let .custom(name): return quoteIdentifier(name)
        }
    }
}

/// A constraint the Swift types do not express.
public enum Constraint<M: Model> {
    /// NOT NULL on a column whose Swift type is optional (for example one filled by a default).
    case notNull(ColumnRef<M>)
    /// A UNIQUE constraint over one or several columns.
    case uniqueColumns([ColumnRef<M>])
    /// DEFAULT for a column.
    case defaultValue(ColumnRef<M>, DatabaseValue)
    /// A CHECK constraint, as SQL (`"score >= 0"`).
    case check(String)
    /// The collating sequence of a text column.
    case collate(ColumnRef<M>, Collation)
    /// A foreign key from `columns` to `referencedColumns` of `table`.
    case foreignKey(
        [ColumnRef<M>], table: String, columns: [String], onDelete: ForeignKeyAction, onUpdate: ForeignKeyAction)
    /// An index (unique or not) over columns.
    case indexOn([ColumnRef<M>], unique: Bool, name: String?)
    /// The primary key is an INTEGER that SQLite assigns with AUTOINCREMENT
    /// (never reused, even after deletes).
    case autoIncrement
    /// SundeedQLite's `<*>`: a row whose value in this column is NULL, or whose nested model is
    /// missing, is left out of fetch results instead of failing the fetch.
    case mandatory(ColumnRef<M>)
    /// SundeedQLite's `<**>`: a row whose array of models is empty or misses an element is left
    /// out of fetch results.
    case mandatoryElements(ColumnRef<M>)
    /// An element of this array of models whose row is missing is dropped from the array
    /// (without it, a missing element fails the fetch with `ModelError.missingChild`).
    case dropsMissingElements(ColumnRef<M>)

    /// A UNIQUE constraint over these columns together: `.unique("email")`, `.unique("team", "number")`.
    public static func unique(_ columns: ColumnRef<M>...) -> Constraint { .uniqueColumns(columns) }
    /// The value `column` takes when an insert leaves it out: `.default("score", 0)`.
    public static func `default`(_ column: ColumnRef<M>, _ value: some DatabaseValueConvertible) -> Constraint {
        .defaultValue(column, value.databaseValue)
    }
    /// A foreign key from `column` to `parentColumn` of `parent`'s table, with what deleting or
    /// re-keying the parent row does to this one.
    ///
    /// ```swift
    /// static var constraints: [Constraint<Player>] {
    /// [.foreignKey("teamID", references: Team.self, onDelete: .cascade)]
    /// }
    /// ```
    public static func foreignKey<Parent: Model>(
        _ column: ColumnRef<M>, references parent: Parent.Type, column parentColumn: String = "id",
        onDelete: ForeignKeyAction = .noAction, onUpdate: ForeignKeyAction = .noAction
    ) -> Constraint {
        .foreignKey([column], table: parent.tableName, columns: [parentColumn], onDelete: onDelete, onUpdate: onUpdate)
    }
    /// An index over `columns`, in order, for queries that filter or sort on them; `unique` also
    /// refuses duplicates. The name defaults to one made from the table and columns.
    public static func index(_ columns: [ColumnRef<M>], unique: Bool = false, name: String? = nil) -> Constraint {
        .indexOn(columns, unique: unique, name: name)
    }
}

/// Double-quotes an SQL identifier.
@inline(__always)
func quoteIdentifier(_ name: String) -> String {
    "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
}
