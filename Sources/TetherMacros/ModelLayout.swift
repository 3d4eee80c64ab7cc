import SwiftDiagnostics
import SwiftParser
import SwiftSyntax

/// A stored instance property, as the synthesized `Codable` conformance sees it.
struct StoredProperty {
    /// The name without backticks: the default coding key.
    let name: String
    /// The identifier as written (backticks included), for the generated code.
    let identifier: TokenSyntax
    /// A `let` with an initial value: `Codable` encodes it but never decodes it.
    let isConstantWithValue: Bool
    /// Whether `Codable` can leave it out of `CodingKeys`: it has an initial
    /// value, or it is an optional `var` (implicitly nil).
    let hasDefault: Bool
    let node: PatternBindingSyntax
}

/// One case of a `CodingKeys` enum.
struct CodingKeyCase {
    /// The case name without backticks: the property it codes.
    let property: String
    /// The key's `stringValue`: the column name.
    let column: String
    let node: EnumCaseElementSyntax
}

/// One column of the generated coding, in order.
struct CodedColumn {
    let name: String
    let property: StoredProperty
}

/// What `@Model` learns from a struct's body: its stored properties, its
/// `CodingKeys`, and what it cannot support.
struct ModelLayout {
    private var properties: [StoredProperty] = []
    private var lazyProperties: Set<String> = []
    /// The cases of the struct's own `CodingKeys`, nil when it declares none.
    private var codingKeys: [CodingKeyCase]?
    /// Every case name of `CodingKeys`, those with an invalid raw value included.
    private var codingKeyNames: Set<String> = []
    private(set) var diagnostics: [Diagnostic] = []

    init(_ structDecl: StructDeclSyntax) {
        for member in structDecl.memberBlock.members {
            read(member.decl)
        }
    }

    /// The columns in the order `Codable` codes them, or nil (with
    /// diagnostics) when `CodingKeys` does not fit the stored properties.
    mutating func columns(typeName: String) -> [CodedColumn]? {
        guard let codingKeys else {
            return properties.map { CodedColumn(name: $0.name, property: $0) }
        }
        var byName: [String: StoredProperty] = [:]
        for property in properties { byName[property.name] = property }
        var columns: [CodedColumn] = []
        for key in codingKeys {
            guard let property = byName[key.property] else {
                let message =
                    lazyProperties.contains(key.property)
                    ? ModelDiagnostic.lazyCodingKey(key.property)
                    : ModelDiagnostic.unknownCodingKey(key.property, type: typeName)
                diagnose(key.node, message)
                continue
            }
            columns.append(CodedColumn(name: key.column, property: property))
        }
        for property in properties where !codingKeyNames.contains(property.name) && !property.hasDefault {
            diagnose(property.node, .uncodedWithoutValue(property.name))
        }
        return diagnostics.isEmpty ? columns : nil
    }

    // MARK: - Members

    private mutating func read(_ decl: DeclSyntax) {
        if let variable = decl.as(VariableDeclSyntax.self) {
            read(variable)
        } else if let enumDecl = decl.as(EnumDeclSyntax.self), enumDecl.name.identifierName == "CodingKeys" {
            readCodingKeys(enumDecl)
        } else if let initializer = decl.as(InitializerDeclSyntax.self), Self.isDecodingInit(initializer) {
            diagnose(initializer, .customCodable("init(from:)"))
        } else if let function = decl.as(FunctionDeclSyntax.self), Self.isEncodeFunction(function) {
            diagnose(function, .customCodable("encode(to:)"))
        } else if let ifConfig = decl.as(IfConfigDeclSyntax.self), Self.hidesCodedMembers(ifConfig) {
            diagnose(ifConfig, .conditionalMembers)
        } else if let kind = Self.codingKeysKind(decl) {
            diagnose(decl, .codingKeysNotAnEnum(kind))
        }
    }

    private mutating func read(_ variable: VariableDeclSyntax) {
        guard !variable.isStatic else { return }
        let isLet = variable.bindingSpecifier.tokenKind == .keyword(.let)
        let isLazy = variable.modifiers.contains { $0.name.tokenKind == .keyword(.lazy) }
        let bindings = Array(variable.bindings)
        for (index, binding) in bindings.enumerated() where binding.isStored {
            guard let pattern = binding.pattern.as(IdentifierPatternSyntax.self) else {
                if binding.pattern.is(TuplePatternSyntax.self) {
                    diagnose(binding.pattern, .tuplePattern(binding.pattern.trimmedDescription))
                }
                continue
            }
            let name = pattern.identifier.identifierName
            if isLazy {
                lazyProperties.insert(name)
                continue
            }
            if let wrapper = variable.attributes.first(where: { !$0.isBuiltinPropertyAttribute }) {
                diagnose(wrapper, .propertyWrapper(name))
                continue
            }
            // `var a, b: Int?` gives `a` the type annotation of `b`.
            let type = bindings[index...].lazy.compactMap(\.typeAnnotation).first?.type
            let hasInitialValue = binding.initializer != nil
            properties.append(
                StoredProperty(
                    name: name,
                    identifier: pattern.identifier.trimmed,
                    isConstantWithValue: isLet && hasInitialValue,
                    hasDefault: hasInitialValue || (!isLet && type?.isOptional == true),
                    node: binding))
        }
    }

    // MARK: - CodingKeys

    private mutating func readCodingKeys(_ enumDecl: EnumDeclSyntax) {
        let rawType = enumDecl.inheritanceClause?.inheritedTypes.first?.type.trimmedDescription
        let hasStringRawValues = rawType == "String" || rawType == "Swift.String"
        var keys: [CodingKeyCase] = []
        for member in enumDecl.memberBlock.members {
            if member.decl.is(IfConfigDeclSyntax.self) {
                diagnose(member.decl, .conditionalMembers)
            } else if Self.declaresStringValue(member.decl) {
                diagnose(member.decl, .codingKeysCustomStringValue)
            }
            guard let caseDecl = member.decl.as(EnumCaseDeclSyntax.self) else { continue }
            for element in caseDecl.elements {
                let name = element.name.identifierName
                codingKeyNames.insert(name)
                guard let rawValue = element.rawValue else {
                    keys.append(CodingKeyCase(property: name, column: name, node: element))
                    continue
                }
                guard hasStringRawValues else {
                    diagnose(rawValue, .codingKeysNotString(name))
                    continue
                }
                guard let literal = rawValue.value.as(StringLiteralExprSyntax.self),
                    let column = literal.representedLiteralValue
                else {
                    diagnose(rawValue.value, .codingKeysNotLiteral(name))
                    continue
                }
                keys.append(CodingKeyCase(property: name, column: column, node: element))
            }
        }
        codingKeys = keys
    }

    /// `var stringValue` or `init?(stringValue:)`: a key computing its own name.
    private static func declaresStringValue(_ decl: DeclSyntax) -> Bool {
        if let variable = decl.as(VariableDeclSyntax.self) {
            return variable.bindings.contains {
                $0.pattern.as(IdentifierPatternSyntax.self)?.identifier.identifierName == "stringValue"
            }
        }
        if let initializer = decl.as(InitializerDeclSyntax.self) {
            let parameters = initializer.signature.parameterClause.parameters
            return parameters.count == 1 && parameters.first?.firstName.text == "stringValue"
        }
        return false
    }

    /// What a non-enum declaration named `CodingKeys` is, if it is one.
    private static func codingKeysKind(_ decl: DeclSyntax) -> String? {
        if let decl = decl.as(StructDeclSyntax.self), decl.name.identifierName == "CodingKeys" { return "a struct" }
        if let decl = decl.as(ClassDeclSyntax.self), decl.name.identifierName == "CodingKeys" { return "a class" }
        if let decl = decl.as(TypeAliasDeclSyntax.self), decl.name.identifierName == "CodingKeys" {
            return "a typealias"
        }
        return nil
    }

    // MARK: - Custom Codable

    /// `init(from decoder: any Decoder)`.
    private static func isDecodingInit(_ initializer: InitializerDeclSyntax) -> Bool {
        let parameters = initializer.signature.parameterClause.parameters
        guard parameters.count == 1, let parameter = parameters.first else { return false }
        return parameter.firstName.text == "from" && parameter.type.trimmedDescription.hasSuffix("Decoder")
    }

    /// `func encode(to encoder: any Encoder)`.
    private static func isEncodeFunction(_ function: FunctionDeclSyntax) -> Bool {
        let parameters = function.signature.parameterClause.parameters
        guard function.name.identifierName == "encode", parameters.count == 1, let parameter = parameters.first
        else { return false }
        return parameter.firstName.text == "to" && parameter.type.trimmedDescription.hasSuffix("Encoder")
    }

    // MARK: - #if

    /// Whether an `#if` holds stored properties, `CodingKeys` or custom
    /// coding, which `@Model` cannot know are compiled.
    private static func hidesCodedMembers(_ ifConfig: IfConfigDeclSyntax) -> Bool {
        ifConfig.clauses.contains { clause in
            guard case .decls(let members) = clause.elements else { return false }
            return members.contains { member in
                let decl = member.decl
                if let variable = decl.as(VariableDeclSyntax.self) {
                    return !variable.isStatic && variable.bindings.contains(where: \.isStored)
                }
                if let nested = decl.as(IfConfigDeclSyntax.self) { return hidesCodedMembers(nested) }
                if let enumDecl = decl.as(EnumDeclSyntax.self) { return enumDecl.name.identifierName == "CodingKeys" }
                if let initializer = decl.as(InitializerDeclSyntax.self) { return isDecodingInit(initializer) }
                if let function = decl.as(FunctionDeclSyntax.self) { return isEncodeFunction(function) }
                return codingKeysKind(decl) != nil
            }
        }
    }

    private mutating func diagnose(_ node: some SyntaxProtocol, _ message: ModelDiagnostic) {
        diagnostics.append(Diagnostic(node: node, message: message))
    }
}

// MARK: - Syntax helpers

extension TokenSyntax {
    /// The identifier without backticks (`default` for `` `default` ``).
    var identifierName: String { identifier?.name ?? text }
}

extension VariableDeclSyntax {
    /// `static` or `class`.
    var isStatic: Bool {
        modifiers.contains { $0.name.tokenKind == .keyword(.static) || $0.name.tokenKind == .keyword(.class) }
    }
}

extension PatternBindingSyntax {
    /// Whether the binding has storage: no accessors, or only observers.
    var isStored: Bool {
        guard let accessorBlock else { return true }
        switch accessorBlock.accessors {
        case .getter:
            return false
        case .accessors(let accessors):
            return accessors.allSatisfy {
                $0.accessorSpecifier.tokenKind == .keyword(.willSet)
                    || $0.accessorSpecifier.tokenKind == .keyword(.didSet)
            }
        }
    }
}

extension TypeSyntax {
    /// `T?`, `T!` or `Optional<T>`: a `var` of this type is implicitly nil.
    var isOptional: Bool {
        if self.is(OptionalTypeSyntax.self) || self.is(ImplicitlyUnwrappedOptionalTypeSyntax.self) { return true }
        if let identifier = self.as(IdentifierTypeSyntax.self) {
            return identifier.name.text == "Optional" && identifier.genericArgumentClause != nil
        }
        if let member = self.as(MemberTypeSyntax.self) {
            return member.baseType.trimmedDescription == "Swift" && member.name.text == "Optional"
        }
        return false
    }
}

extension AttributeListSyntax.Element {
    /// Built-in attributes that leave a stored property's storage and coding
    /// alone; anything else (a property wrapper, an attached macro) is refused.
    var isBuiltinPropertyAttribute: Bool {
        guard case .attribute(let attribute) = self else { return false }
        return Self.builtinPropertyAttributes.contains(attribute.attributeName.trimmedDescription)
    }

    private static let builtinPropertyAttributes: Set<String> = [
        "available", "usableFromInline", "_spi", "objc", "nonobjc", "NSCopying", "NSManaged", "preconcurrency",
        "exclusivity", "_hasStorage", "_documentation", "_spi_available", "_alwaysEmitIntoClient",
    ]
}
