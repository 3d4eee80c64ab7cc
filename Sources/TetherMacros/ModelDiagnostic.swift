import SwiftDiagnostics

/// An error `@Model` reports instead of generating code.
struct ModelDiagnostic: DiagnosticMessage {
    let message: String
    let diagnosticID: MessageID
    var severity: DiagnosticSeverity { .error }

    private init(_ id: String, _ message: String) {
        self.message = message
        self.diagnosticID = MessageID(domain: "TetherMacros.Model", id: id)
    }

    /// `@Model` on a class, an enum, an actor, a protocol or an extension.
    static func notAStruct(kind: String?) -> Self {
        let advice =
            if let kind { "; conform \(kind) to Model without @Model (it then goes through Codable)" } else { "" }
        return Self("notAStruct", "@Model applies to structs\(advice)")
    }

    /// A custom `init(from:)` or `encode(to:)` in the struct's body.
    static func customCodable(_ member: String) -> Self {
        Self(
            "customCodable",
            """
            @Model generates column coding from the stored properties, which a custom \(member) would contradict; \
            remove @Model to keep the custom Codable
            """
        )
    }

    /// A stored property with a property wrapper (or another custom attribute).
    static func propertyWrapper(_ property: String) -> Self {
        Self("propertyWrapper", "@Model does not support property wrappers (\(property)); remove @Model to use Codable")
    }

    /// `var (a, b) = ...`
    static func tuplePattern(_ pattern: String) -> Self {
        Self(
            "tuplePattern",
            """
            @Model does not support stored properties declared with a tuple pattern (\(pattern)); declare each \
            property on its own, or remove @Model to use Codable
            """
        )
    }

    /// A stored property or `CodingKeys` inside `#if`.
    static let conditionalMembers = Self(
        "conditionalMembers",
        """
        @Model cannot tell which #if branch is compiled; move the stored properties and CodingKeys out of #if, or \
        remove @Model to use Codable
        """
    )

    /// `CodingKeys` declared as something other than an enum.
    static func codingKeysNotAnEnum(_ kind: String) -> Self {
        Self(
            "codingKeysNotAnEnum",
            """
            @Model reads the column names from the cases of enum CodingKeys, and this CodingKeys is \(kind); \
            declare 'enum CodingKeys: String, CodingKey', or remove @Model to use Codable
            """
        )
    }

    /// A raw value on a `CodingKeys` enum whose raw type is not `String`.
    static func codingKeysNotString(_ caseName: String) -> Self {
        Self(
            "codingKeysNotString",
            """
            @Model names a column by its CodingKeys case's String raw value, and CodingKeys does not declare \
            String as its raw type (case '\(caseName)'); declare 'enum CodingKeys: String, CodingKey'
            """
        )
    }

    /// A `CodingKeys` raw value that is not a plain string literal.
    static func codingKeysNotLiteral(_ caseName: String) -> Self {
        Self(
            "codingKeysNotLiteral",
            """
            @Model needs each CodingKeys raw value as a plain string literal, to know the column's name (case \
            '\(caseName)')
            """
        )
    }

    /// A `CodingKeys` enum that computes its own `stringValue`.
    static let codingKeysCustomStringValue = Self(
        "codingKeysCustomStringValue",
        """
        @Model cannot know the column names of a CodingKeys that implements its own stringValue; name the columns \
        with String raw values, or remove @Model to use Codable
        """
    )

    /// A `CodingKeys` case that names no stored property.
    static func unknownCodingKey(_ caseName: String, type: String) -> Self {
        Self("unknownCodingKey", "CodingKeys case '\(caseName)' does not match any stored property of \(type)")
    }

    /// A `CodingKeys` case that names a lazy property.
    static func lazyCodingKey(_ caseName: String) -> Self {
        Self(
            "lazyCodingKey",
            """
            CodingKeys case '\(caseName)' names a lazy property, which Codable does not code; remove the case or \
            make the property non-lazy
            """
        )
    }

    /// A stored property left out of `CodingKeys` that Codable could not decode.
    static func uncodedWithoutValue(_ property: String) -> Self {
        Self(
            "uncodedWithoutValue",
            """
            stored property '\(property)' is not in CodingKeys and has no initial value, so it could never be \
            decoded; add it to CodingKeys or give it an initial value
            """
        )
    }
}
