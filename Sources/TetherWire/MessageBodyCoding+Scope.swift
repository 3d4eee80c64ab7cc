import Foundation
import TetherBatch

// SCOPE's body (§6.12): interests and their rules, the tables sent in part, and the column rules
// of `mergeRules`.
extension MessageBodyCoding {
    /// A scope rule (§6.1): kind (u8: 0 filter, 1 reference, 2 both), then its fields.
    static func encodeRule(_ rule: ScopeRule, into writer: inout ByteWriter, limits: WireLimits)
        throws(WireError)
    {
        switch rule {
        case let .filter(expression):
            writer.byte(0)
            try writeString(expression, "filter", .scope, into: &writer, limits: limits)
        case let .reference(column, parent, parentColumn):
            writer.byte(1)
            for (text, field) in [
                (column, "reference column"), (parent, "reference parent"),
                (parentColumn ?? "", "reference parent column"),
            ] {
                try writeString(text, field, .scope, into: &writer, limits: limits)
            }
        case let .both(first, second):
            writer.byte(2)
            try encodeRule(first, into: &writer, limits: limits)
            try encodeRule(second, into: &writer, limits: limits)
        }
    }

    /// Why SCOPE cannot be sent, if it cannot.
    static func scopeProblem(_ announcement: ScopeAnnouncement, limits: WireLimits) -> String? {
        guard announcement.interest.count <= limits.maxTables, announcement.scoped.count <= limits.maxTables else {
            return "an interest or scoped list of more than \(limits.maxTables) tables"
        }
        for (table, rule) in announcement.interest {
            guard rule.depth <= maxRuleDepth else {
                return "the interest in \(table) nests rules \(rule.depth) deep, more than \(maxRuleDepth)"
            }
            if let problem = ruleProblem(rule) { return "the interest in \(table): \(problem)" }
        }
        if let rules = announcement.columnRules {
            guard rules.count <= maxColumnRules(limits) else {
                return "\(rules.count) column rules, more than \(maxColumnRules(limits))"
            }
            var seen = Set<[String]>()
            for claim in rules where !seen.insert([claim.table, claim.column]).inserted {
                return "column \(claim.column) of \(claim.table) has two rules"
            }
        }
        return nil
    }

    /// The most column rules a SCOPE may list: 16 per table, as renames in HELLO.
    static func maxColumnRules(_ limits: WireLimits) -> Int { limits.maxTables * 16 }

    static func ruleProblem(_ rule: ScopeRule) -> String? {
        switch rule {
        case let .filter(expression): return expression.allSatisfy(\.isWhitespace) ? "an empty filter" : nil
        case let .reference(column, parent, _):
            return column.isEmpty || parent.isEmpty ? "a reference without its column or parent" : nil
        case let .both(first, second): return ruleProblem(first) ?? ruleProblem(second)
        }
    }

    static func decodeScope(_ fields: inout MessageFieldReader) throws(WireError) -> ScopeAnnouncement {
        var announcement = ScopeAnnouncement()
        let interestCount = try fields.count("interest count", limit: fields.limits.maxTables) { count, limit in
            "an interest in \(count) tables, more than \(limit)"
        }
        for _ in 0..<interestCount {
            let table = try fields.string("interest table")
            guard announcement.interest[table] == nil else {
                throw fields.malformed("the interest names table \(table) twice")
            }
            let rule = try decodeRule(&fields, depth: 1)
            if let problem = ruleProblem(rule) { throw fields.malformed("the interest in \(table): \(problem)") }
            announcement.interest[table] = rule
        }
        let scopedCount = try fields.count("scoped count", limit: fields.limits.maxTables) { count, limit in
            "\(count) scoped tables, more than \(limit)"
        }
        for _ in 0..<scopedCount {
            let table = try fields.string("scoped table")
            guard announcement.scoped.insert(table).inserted else {
                throw fields.malformed("scoped table \(table) is listed twice")
            }
        }
        // The rules, when `mergeRules` is negotiated: the last field, absent otherwise.
        if !fields.isAtEnd {
            let limit = maxColumnRules(fields.limits)
            let ruleCount = try fields.count("rule count", limit: limit) { count, limit in
                "\(count) column rules, more than \(limit)"
            }
            var rules: [ColumnRuleClaim] = []
            var seen = Set<[String]>()
            for _ in 0..<ruleCount {
                let claim = ColumnRuleClaim(
                    table: try fields.string("rule table"), column: try fields.string("rule column"),
                    rule: try fields.byte("rule"))
                guard seen.insert([claim.table, claim.column]).inserted else {
                    throw fields.malformed("column \(claim.column) of \(claim.table) has two rules")
                }
                rules.append(claim)
            }
            announcement.columnRules = rules
        }
        return announcement
    }

    /// A scope rule, its nesting checked before it is read further.
    static func decodeRule(_ fields: inout MessageFieldReader, depth: Int) throws(WireError) -> ScopeRule {
        guard depth <= maxRuleDepth else {
            throw fields.malformed("an interest's rules nest more than \(maxRuleDepth) deep")
        }
        switch try fields.byte("rule kind") {
        case 0: return .filter(try fields.string("filter"))
        case 1:
            let column = try fields.string("reference column"), parent = try fields.string("reference parent")
            let parentColumn = try fields.string("reference parent column")
            return .reference(column: column, parent: parent, parentColumn: parentColumn.isEmpty ? nil : parentColumn)
        case 2: return .both(try decodeRule(&fields, depth: depth + 1), try decodeRule(&fields, depth: depth + 1))
        case let kind: throw fields.malformed("unknown rule kind \(kind)")
        }
    }
}
