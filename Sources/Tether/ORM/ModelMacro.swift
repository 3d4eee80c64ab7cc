/// Makes a struct a ``Model`` whose rows are read and bound column by column
/// (``ColumnCodable``), generated from its stored properties and `CodingKeys`.
///
/// ```swift
/// @Model
/// struct Player {
///     var id: Int64
///     var name: String
///     var score: Int?
///     static let tableName = "player"
/// }
/// ```
///
/// The columns are those of the synthesized `Codable` conformance: each stored
/// property with a coding key, named by it (`case name = "player_name"`
/// renames a column; a property left out of `CodingKeys` is not stored and
/// keeps its initial value). A struct with its own `init(from:)` or
/// `encode(to:)`, a class, or a property wrapper is refused with an error:
/// conform such a type to ``Model`` without the macro, and it goes through
/// `Codable`.
@attached(
    extension, conformances: Model, ColumnCodable, names: named(codedColumns), named(init(columns:)),
    named(encode(columns:)))
public macro Model() = #externalMacro(module: "TetherMacros", type: "ModelMacro")
