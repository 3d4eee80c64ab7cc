import SwiftDiagnostics
import SwiftSyntax
import SwiftSyntaxBuilder
import SwiftSyntaxMacros

/// `@Model`: writes a struct's `ColumnCodable` conformance from its stored
/// properties and `CodingKeys`, with the columns of its synthesized `Codable`
/// conformance, in the same order.
///
/// ```swift
/// extension Player: Tether.ColumnCodable {
///     public static var codedColumns: [String] { ["id", "player_name"] }
///     public init(columns: inout Tether.ColumnReader) throws {
///         self.id = try columns.read()
///         self.name = try columns.read()
///     }
///     public func encode(columns: inout Tether.ColumnWriter) throws {
///         try columns.write(self.id)
///         try columns.write(self.name)
///     }
/// }
/// ```
///
/// A `let` with an initial value is no column: `Codable` never decodes it, and
/// Tether stores only what reads back. On any error the macro reports it and
/// generates nothing.
public struct ModelMacro: ExtensionMacro {
    public static func expansion(
        of node: AttributeSyntax,
        attachedTo declaration: some DeclGroupSyntax,
        providingExtensionsOf type: some TypeSyntaxProtocol,
        conformingTo protocols: [TypeSyntax],
        in context: some MacroExpansionContext
    ) throws -> [ExtensionDeclSyntax] {
        guard let structDecl = declaration.as(StructDeclSyntax.self) else {
            context.diagnose(Diagnostic(node: node, message: ModelDiagnostic.notAStruct(kind: kind(of: declaration))))
            return []
        }
        var layout = ModelLayout(structDecl)
        guard let coded = layout.columns(typeName: structDecl.name.text), layout.diagnostics.isEmpty else {
            for diagnostic in layout.diagnostics { context.diagnose(diagnostic) }
            return []
        }
        // Codable encodes a `let` with an initial value but never decodes it;
        // Tether stores only what reads back (its columns come from decoding),
        // so such a constant is no column.
        let columns = coded.filter { !$0.property.isConstantWithValue }

        let access = accessModifier(of: structDecl)
        let conformances = protocols.map { "Tether.\($0.lastName)" }
        let header: SyntaxNodeString =
            conformances.isEmpty
            ? "extension \(type.trimmed)"
            : "extension \(type.trimmed): \(raw: conformances.joined(separator: ", "))"
        let names = columns.map(\.name)
        let conformance = try ExtensionDeclSyntax(header) {
            // Computed, not `static let`: a generic struct cannot have static stored properties.
            DeclSyntax("\(raw: access)static var codedColumns: [String] { \(literal: names) }")
            try InitializerDeclSyntax("\(raw: access)init(columns: inout Tether.ColumnReader) throws") {
                for column in columns {
                    ExprSyntax("self.\(column.property.identifier) = try columns.read()")
                }
            }
            try FunctionDeclSyntax("\(raw: access)func encode(columns: inout Tether.ColumnWriter) throws") {
                for column in columns {
                    ExprSyntax("try columns.write(self.\(column.property.identifier))")
                }
            }
        }
        return [conformance]
    }

    /// The modifier (with its trailing space) the generated members need: the
    /// struct's own access when it is visible outside its module.
    private static func accessModifier(of structDecl: StructDeclSyntax) -> String {
        for modifier in structDecl.modifiers {
            switch modifier.name.tokenKind {
            case .keyword(.public), .keyword(.open): return "public "
            case .keyword(.package): return "package "
            default: continue
            }
        }
        return ""
    }

    /// "a class", "an enum", "an actor" for the error on a declaration that is not a struct.
    private static func kind(of declaration: some DeclGroupSyntax) -> String? {
        if declaration.is(ClassDeclSyntax.self) { return "a class" }
        if declaration.is(EnumDeclSyntax.self) { return "an enum" }
        if declaration.is(ActorDeclSyntax.self) { return "an actor" }
        return nil
    }
}

extension TypeSyntax {
    /// `Model` for `Model` or `Tether.Model`.
    fileprivate var lastName: String {
        if let member = self.as(MemberTypeSyntax.self) { return member.name.text }
        if let identifier = self.as(IdentifierTypeSyntax.self) { return identifier.name.text }
        return trimmedDescription
    }
}
