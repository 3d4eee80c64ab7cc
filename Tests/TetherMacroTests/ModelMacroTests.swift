import SwiftSyntaxMacroExpansion
import SwiftSyntaxMacrosTestSupport
import TetherMacros
import XCTest

/// What the compiler passes when the struct declares neither conformance.
private let bothConformances: [String: MacroSpec] = [
    "Model": MacroSpec(type: ModelMacro.self, conformances: ["Model", "ColumnCodable"])
]
/// What the compiler passes when the struct already declares `: Model`.
private let columnCodableOnly: [String: MacroSpec] = [
    "Model": MacroSpec(type: ModelMacro.self, conformances: ["ColumnCodable"])
]

final class ModelMacroTests: XCTestCase {
    // MARK: - Expansions

    func testPlainStruct() {
        assertMacroExpansion(
            """
            @Model
            struct Player: Model {
                var id: Int64
                var name: String
                var score: Int?
                var computed: Int { 3 }
                var observed: Int = 0 {
                    didSet { print(observed) }
                }
                static let tableName = "player"
                static var count: Int { 0 }
                lazy var cache: [Int] = []
            }
            """,
            expandedSource: """
                struct Player: Model {
                    var id: Int64
                    var name: String
                    var score: Int?
                    var computed: Int { 3 }
                    var observed: Int = 0 {
                        didSet { print(observed) }
                    }
                    static let tableName = "player"
                    static var count: Int { 0 }
                    lazy var cache: [Int] = []
                }

                extension Player: Tether.ColumnCodable {
                    static var codedColumns: [String] {
                        ["id", "name", "score", "observed"]
                    }
                    init(columns: inout Tether.ColumnReader) throws {
                        self.id = try columns.read()
                        self.name = try columns.read()
                        self.score = try columns.read()
                        self.observed = try columns.read()
                    }
                    func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.id)
                        try columns.write(self.name)
                        try columns.write(self.score)
                        try columns.write(self.observed)
                    }
                }
                """,
            macroSpecs: columnCodableOnly
        )
    }

    func testBothConformancesWhenModelIsNotDeclared() {
        assertMacroExpansion(
            """
            @Model
            struct Tag {
                var id: Int64
            }
            """,
            expandedSource: """
                struct Tag {
                    var id: Int64
                }

                extension Tag: Tether.Model, Tether.ColumnCodable {
                    static var codedColumns: [String] {
                        ["id"]
                    }
                    init(columns: inout Tether.ColumnReader) throws {
                        self.id = try columns.read()
                    }
                    func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.id)
                    }
                }
                """,
            macroSpecs: bothConformances
        )
    }

    func testQualifiedConformancesStayQualifiedOnce() {
        assertMacroExpansion(
            """
            @Model
            struct Tag {
                var id: Int64
            }
            """,
            expandedSource: """
                struct Tag {
                    var id: Int64
                }

                extension Tag: Tether.ColumnCodable {
                    static var codedColumns: [String] {
                        ["id"]
                    }
                    init(columns: inout Tether.ColumnReader) throws {
                        self.id = try columns.read()
                    }
                    func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.id)
                    }
                }
                """,
            macroSpecs: ["Model": MacroSpec(type: ModelMacro.self, conformances: ["Tether.ColumnCodable"])]
        )
    }

    /// Both conformances already declared: the members alone.
    func testNoConformanceLeftToAdd() {
        assertMacroExpansion(
            """
            @Model
            struct Tag: Model, ColumnCodable {
                var id: Int64
            }
            """,
            expandedSource: """
                struct Tag: Model, ColumnCodable {
                    var id: Int64
                }

                extension Tag {
                    static var codedColumns: [String] {
                        ["id"]
                    }
                    init(columns: inout Tether.ColumnReader) throws {
                        self.id = try columns.read()
                    }
                    func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.id)
                    }
                }
                """,
            macros: ["Model": ModelMacro.self]
        )
    }

    /// Renamed keys, an omitted lazy property, a
    /// constant with a value, inferred types, statics and computed properties.
    func testCodingKeysRenameOrderAndConstant() {
        assertMacroExpansion(
            """
            @Model
            public struct Player: Model {
                var id: Int64
                var name: String
                var score: Int?
                var tags: [String] = []
                var note = "x"
                var computed: Int { 3 }
                static let tableName = "player"
                let kind = "k"
                lazy var x = 1
                enum CodingKeys: String, CodingKey {
                    case id, name = "player_name", score, tags, note, kind
                }
            }
            """,
            expandedSource: """
                public struct Player: Model {
                    var id: Int64
                    var name: String
                    var score: Int?
                    var tags: [String] = []
                    var note = "x"
                    var computed: Int { 3 }
                    static let tableName = "player"
                    let kind = "k"
                    lazy var x = 1
                    enum CodingKeys: String, CodingKey {
                        case id, name = "player_name", score, tags, note, kind
                    }
                }

                extension Player: Tether.ColumnCodable {
                    public static var codedColumns: [String] {
                        ["id", "player_name", "score", "tags", "note"]
                    }
                    public init(columns: inout Tether.ColumnReader) throws {
                        self.id = try columns.read()
                        self.name = try columns.read()
                        self.score = try columns.read()
                        self.tags = try columns.read()
                        self.note = try columns.read()
                    }
                    public func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.id)
                        try columns.write(self.name)
                        try columns.write(self.score)
                        try columns.write(self.tags)
                        try columns.write(self.note)
                    }
                }
                """,
            macroSpecs: columnCodableOnly
        )
    }

    /// CodingKeys order wins over declaration order; a property left out is
    /// not coded; multi-line cases, escapes and raw strings are read as Swift does.
    func testCodingKeysOrderAndOmittedProperties() {
        assertMacroExpansion(
            #"""
            @Model
            struct Item {
                var a: Int
                var b: Int
                var cache: [Int] = []
                var maybe: Int?
                var d: Int
                enum CodingKeys: String, CodingKey {
                    case d = #"d"d"#
                    case b = "b\u{65}", a
                }
            }
            """#,
            expandedSource: #"""
                struct Item {
                    var a: Int
                    var b: Int
                    var cache: [Int] = []
                    var maybe: Int?
                    var d: Int
                    enum CodingKeys: String, CodingKey {
                        case d = #"d"d"#
                        case b = "b\u{65}", a
                    }
                }

                extension Item {
                    static var codedColumns: [String] {
                        [#"d"d"#, "be", "a"]
                    }
                    init(columns: inout Tether.ColumnReader) throws {
                        self.d = try columns.read()
                        self.b = try columns.read()
                        self.a = try columns.read()
                    }
                    func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.d)
                        try columns.write(self.b)
                        try columns.write(self.a)
                    }
                }
                """#,
            macros: ["Model": ModelMacro.self]
        )
    }

    /// A constant with a value, without CodingKeys: not a column (Codable never decodes it).
    func testConstantWithValueWithoutCodingKeys() {
        assertMacroExpansion(
            """
            @Model
            struct Event {
                let id: Int64
                let version = 2
            }
            """,
            expandedSource: """
                struct Event {
                    let id: Int64
                    let version = 2
                }

                extension Event {
                    static var codedColumns: [String] {
                        ["id"]
                    }
                    init(columns: inout Tether.ColumnReader) throws {
                        self.id = try columns.read()
                    }
                    func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.id)
                    }
                }
                """,
            macros: ["Model": ModelMacro.self]
        )
    }

    /// Several bindings in one declaration, and names that need backticks.
    func testMultipleBindingsAndEscapedNames() {
        assertMacroExpansion(
            """
            @Model
            struct Settings {
                var a, b: Int
                var `default`: String
                var x = 1, y = 2
                enum CodingKeys: String, CodingKey {
                    case a, b, `default`, x = "the x", y
                }
            }
            """,
            expandedSource: """
                struct Settings {
                    var a, b: Int
                    var `default`: String
                    var x = 1, y = 2
                    enum CodingKeys: String, CodingKey {
                        case a, b, `default`, x = "the x", y
                    }
                }

                extension Settings {
                    static var codedColumns: [String] {
                        ["a", "b", "default", "the x", "y"]
                    }
                    init(columns: inout Tether.ColumnReader) throws {
                        self.a = try columns.read()
                        self.b = try columns.read()
                        self.`default` = try columns.read()
                        self.x = try columns.read()
                        self.y = try columns.read()
                    }
                    func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.a)
                        try columns.write(self.b)
                        try columns.write(self.`default`)
                        try columns.write(self.x)
                        try columns.write(self.y)
                    }
                }
                """,
            macros: ["Model": ModelMacro.self]
        )
    }

    /// CodingKeys without raw values: the case names are the columns.
    func testCodingKeysWithoutRawType() {
        assertMacroExpansion(
            """
            @Model
            struct Pair {
                var left: Int
                var right: Int
                var scratch: Int?
                enum CodingKeys: CodingKey {
                    case right, left
                }
            }
            """,
            expandedSource: """
                struct Pair {
                    var left: Int
                    var right: Int
                    var scratch: Int?
                    enum CodingKeys: CodingKey {
                        case right, left
                    }
                }

                extension Pair {
                    static var codedColumns: [String] {
                        ["right", "left"]
                    }
                    init(columns: inout Tether.ColumnReader) throws {
                        self.right = try columns.read()
                        self.left = try columns.read()
                    }
                    func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.right)
                        try columns.write(self.left)
                    }
                }
                """,
            macros: ["Model": ModelMacro.self]
        )
    }

    func testAccessLevels() {
        let cases: [(modifier: String, member: String)] = [
            ("public ", "public "), ("package ", "package "), ("open ", "public "), ("", ""),
            ("internal ", ""), ("fileprivate ", ""), ("private ", ""),
        ]
        for (modifier, member) in cases {
            assertMacroExpansion(
                """
                @Model
                \(modifier)struct Tag {
                    var id: Int64
                }
                """,
                expandedSource: """
                    \(modifier)struct Tag {
                        var id: Int64
                    }

                    extension Tag {
                        \(member)static var codedColumns: [String] {
                            ["id"]
                        }
                        \(member)init(columns: inout Tether.ColumnReader) throws {
                            self.id = try columns.read()
                        }
                        \(member)func encode(columns: inout Tether.ColumnWriter) throws {
                            try columns.write(self.id)
                        }
                    }
                    """,
                macros: ["Model": ModelMacro.self]
            )
        }
    }

    func testBuiltinAttributesAreNotPropertyWrappers() {
        assertMacroExpansion(
            """
            @Model
            public struct Tag {
                @usableFromInline var id: Int64
                @available(*, deprecated) var old: Int?
            }
            """,
            expandedSource: """
                public struct Tag {
                    @usableFromInline var id: Int64
                    @available(*, deprecated) var old: Int?
                }

                extension Tag {
                    public static var codedColumns: [String] {
                        ["id", "old"]
                    }
                    public init(columns: inout Tether.ColumnReader) throws {
                        self.id = try columns.read()
                        self.old = try columns.read()
                    }
                    public func encode(columns: inout Tether.ColumnWriter) throws {
                        try columns.write(self.id)
                        try columns.write(self.old)
                    }
                }
                """,
            macros: ["Model": ModelMacro.self]
        )
    }

    // MARK: - Diagnostics

    func testClassIsRefused() {
        assertMacroExpansion(
            """
            @Model
            final class Player: Model {
                var id: Int64 = 0
            }
            """,
            expandedSource: """
                final class Player: Model {
                    var id: Int64 = 0
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        """
                        @Model applies to structs; conform a class to Model without @Model (it then goes through \
                        Codable)
                        """,
                    line: 1, column: 1)
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testEnumActorAndProtocolAreRefused() {
        let cases: [(source: String, message: String)] = [
            (
                "enum E {\n    case a\n}",
                "@Model applies to structs; conform an enum to Model without @Model (it then goes through Codable)"
            ),
            (
                "actor A {}",
                "@Model applies to structs; conform an actor to Model without @Model (it then goes through Codable)"
            ),
            ("protocol P {}", "@Model applies to structs"),
        ]
        for (source, message) in cases {
            assertMacroExpansion(
                "@Model\n\(source)",
                expandedSource: source,
                diagnostics: [DiagnosticSpec(message: message, line: 1, column: 1)],
                macros: ["Model": ModelMacro.self]
            )
        }
    }

    func testCustomCodableIsRefused() {
        assertMacroExpansion(
            """
            @Model
            struct Player {
                var id: Int64
                init(from decoder: any Decoder) throws { id = 0 }
                func encode(to encoder: Encoder) throws {}
                init(from other: Player) { id = other.id }
            }
            """,
            expandedSource: """
                struct Player {
                    var id: Int64
                    init(from decoder: any Decoder) throws { id = 0 }
                    func encode(to encoder: Encoder) throws {}
                    init(from other: Player) { id = other.id }
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        """
                        @Model generates column coding from the stored properties, which a custom init(from:) \
                        would contradict; remove @Model to keep the custom Codable
                        """,
                    line: 4, column: 5),
                DiagnosticSpec(
                    message:
                        """
                        @Model generates column coding from the stored properties, which a custom encode(to:) \
                        would contradict; remove @Model to keep the custom Codable
                        """,
                    line: 5, column: 5),
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testPropertyWrapperIsRefused() {
        assertMacroExpansion(
            """
            @Model
            struct Player {
                var id: Int64
                @Clamped var x: Int
            }
            """,
            expandedSource: """
                struct Player {
                    var id: Int64
                    @Clamped var x: Int
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message: "@Model does not support property wrappers (x); remove @Model to use Codable", line: 4,
                    column: 5)
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testTuplePatternIsRefused() {
        assertMacroExpansion(
            """
            @Model
            struct Point {
                var (x, y) = (0, 0)
            }
            """,
            expandedSource: """
                struct Point {
                    var (x, y) = (0, 0)
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        """
                        @Model does not support stored properties declared with a tuple pattern ((x, y)); declare \
                        each property on its own, or remove @Model to use Codable
                        """,
                    line: 3, column: 9)
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testUnknownAndLazyCodingKeys() {
        assertMacroExpansion(
            """
            @Model
            struct Player {
                var id: Int64
                lazy var rank = 1
                var computed: Int { 1 }
                enum CodingKeys: String, CodingKey {
                    case id, nickname = "nick", rank, computed
                }
            }
            """,
            expandedSource: """
                struct Player {
                    var id: Int64
                    lazy var rank = 1
                    var computed: Int { 1 }
                    enum CodingKeys: String, CodingKey {
                        case id, nickname = "nick", rank, computed
                    }
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message: "CodingKeys case 'nickname' does not match any stored property of Player", line: 7,
                    column: 18),
                DiagnosticSpec(
                    message:
                        """
                        CodingKeys case 'rank' names a lazy property, which Codable does not code; remove the \
                        case or make the property non-lazy
                        """,
                    line: 7, column: 37),
                DiagnosticSpec(
                    message: "CodingKeys case 'computed' does not match any stored property of Player", line: 7,
                    column: 43),
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testPropertyMissingFromCodingKeysNeedsAValue() {
        assertMacroExpansion(
            """
            @Model
            struct Player {
                var id: Int64
                var name: String
                let optional: Int?
                enum CodingKeys: String, CodingKey {
                    case id
                }
            }
            """,
            expandedSource: """
                struct Player {
                    var id: Int64
                    var name: String
                    let optional: Int?
                    enum CodingKeys: String, CodingKey {
                        case id
                    }
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        """
                        stored property 'name' is not in CodingKeys and has no initial value, so it could never \
                        be decoded; add it to CodingKeys or give it an initial value
                        """,
                    line: 4, column: 9),
                DiagnosticSpec(
                    message:
                        """
                        stored property 'optional' is not in CodingKeys and has no initial value, so it could \
                        never be decoded; add it to CodingKeys or give it an initial value
                        """,
                    line: 5, column: 9),
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testCodingKeysMustBeAnEnum() {
        assertMacroExpansion(
            """
            @Model
            struct Player {
                var id: Int64
                struct CodingKeys: CodingKey {}
            }
            """,
            expandedSource: """
                struct Player {
                    var id: Int64
                    struct CodingKeys: CodingKey {}
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        """
                        @Model reads the column names from the cases of enum CodingKeys, and this CodingKeys is a \
                        struct; declare 'enum CodingKeys: String, CodingKey', or remove @Model to use Codable
                        """,
                    line: 4, column: 5)
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testCodingKeysRawValuesMustBeStrings() {
        assertMacroExpansion(
            """
            @Model
            struct Player {
                var id: Int64
                enum CodingKeys: Int, CodingKey {
                    case id = 1
                }
            }
            """,
            expandedSource: """
                struct Player {
                    var id: Int64
                    enum CodingKeys: Int, CodingKey {
                        case id = 1
                    }
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        """
                        @Model names a column by its CodingKeys case's String raw value, and CodingKeys does not \
                        declare String as its raw type (case 'id'); declare 'enum CodingKeys: String, CodingKey'
                        """,
                    line: 5, column: 17)
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testCodingKeysMustNotComputeStringValue() {
        assertMacroExpansion(
            """
            @Model
            struct Player {
                var id: Int64
                enum CodingKeys: CodingKey {
                    case id
                    var stringValue: String { "ID" }
                }
            }
            """,
            expandedSource: """
                struct Player {
                    var id: Int64
                    enum CodingKeys: CodingKey {
                        case id
                        var stringValue: String { "ID" }
                    }
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        """
                        @Model cannot know the column names of a CodingKeys that implements its own stringValue; \
                        name the columns with String raw values, or remove @Model to use Codable
                        """,
                    line: 6, column: 9)
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testCodingKeysRawValueMustBeALiteral() {
        assertMacroExpansion(
            #"""
            @Model
            struct Player {
                var id: Int64
                enum CodingKeys: String, CodingKey {
                    case id = "id\(suffix)"
                }
            }
            """#,
            expandedSource: #"""
                struct Player {
                    var id: Int64
                    enum CodingKeys: String, CodingKey {
                        case id = "id\(suffix)"
                    }
                }
                """#,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        """
                        @Model needs each CodingKeys raw value as a plain string literal, to know the column's \
                        name (case 'id')
                        """,
                    line: 5, column: 19)
            ],
            macros: ["Model": ModelMacro.self]
        )
    }

    func testStoredPropertiesUnderIfConfigAreRefused() {
        assertMacroExpansion(
            """
            @Model
            struct Player {
                var id: Int64
                #if DEBUG
                var debugNote: String?
                #endif
                #if os(Linux)
                static let linux = true
                #endif
            }
            """,
            expandedSource: """
                struct Player {
                    var id: Int64
                    #if DEBUG
                    var debugNote: String?
                    #endif
                    #if os(Linux)
                    static let linux = true
                    #endif
                }
                """,
            diagnostics: [
                DiagnosticSpec(
                    message:
                        """
                        @Model cannot tell which #if branch is compiled; move the stored properties and \
                        CodingKeys out of #if, or remove @Model to use Codable
                        """,
                    line: 4, column: 5)
            ],
            macros: ["Model": ModelMacro.self]
        )
    }
}
