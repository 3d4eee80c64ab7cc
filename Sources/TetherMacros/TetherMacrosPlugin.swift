import SwiftCompilerPlugin
import SwiftSyntaxMacros

/// The compiler plugin that provides Tether's macros.
@main
struct TetherMacrosPlugin: CompilerPlugin {
    let providingMacros: [any Macro.Type] = [ModelMacro.self]
}
