import CSQLite
import Foundation

/// Which rows of each synced table a peer holds (partial replication): per table a rule, and
/// the values of the named parameters the rules use. A table the scope does not name is whole.
///
/// After convergence, the peer's copy of a scoped table `t` is exactly the sender's
/// `SELECT * FROM t WHERE <rule>`: rows entering the rule are sent whole (move-in), rows leaving
/// it are evicted (removed there without a tombstone, never relayed as deletes).
///
/// ```swift
/// let north = SyncScope([
///     "orders": .filter("site = :peer_name"),
///     "order_line": .reference(column: "order_id", parent: "orders"),
/// ], parameters: ["peer_name": .text("north")])
/// try hub.validate(north)
/// let batch = try hub.extractChanges(for: peer, after: cursor, scope: north)
/// ```
///
/// Deeper chains are written one link at a time: `shipment` through `order_line` through
/// `orders` is `"shipment": .reference(column: "line_id", parent: "order_line")` beside the two
/// rules above; each link follows one column to the parent's key (or `parentColumn`).
public struct SyncScope: Sendable, Hashable {
    /// The rows of one table a peer holds: `.filter`, `.reference` or `.both` (see `ScopeRule`).
    public typealias Rule = ScopeRule

    /// The rule of each scoped table, by table name: this node's own rules (a policy its operator
    /// wrote), whose filters may read other synced tables in subqueries and use `parameters`.
    public var tables: [String: Rule]
    /// The rules the peer asked for (its interest, SCOPE), by table name, kept apart from `tables`
    /// because they come from the peer: a table named in both holds the rows both rules hold. Their
    /// filters are checked strictly: one expression over the table's own columns, no subquery, no
    /// parameter, only the functions of `interestFunctions` (Protocol/README.md §8.10).
    public var interest: [String: Rule]
    /// The values of the named parameters the filters of `tables` use, by name without its `:`
    /// (`peer_name`, `peer_fingerprint`). Names starting with `tether_` are reserved. An interest
    /// takes none.
    public var parameters: [String: DatabaseValue]

    /// A scope of these rules, by table name, narrowed by a peer's `interest`, and the values of the
    /// parameters the rules use; a table neither names is whole.
    public init(
        _ tables: [String: Rule] = [:], interest: [String: Rule] = [:], parameters: [String: DatabaseValue] = [:]
    ) {
        self.tables = tables
        self.interest = interest
        self.parameters = parameters
    }

    /// Every table whole: the same as no scope.
    public static let whole = SyncScope()

    /// This scope narrowed by `interest` (the rows a peer asks for, per table): a table both name
    /// holds the rows both rules hold; a table only one names, that one's rows. The interest is kept
    /// apart (`interest`), to be checked as a peer's text.
    public func intersected(with interest: [String: Rule]) -> SyncScope {
        var narrowed = self
        for (table, wanted) in interest {
            narrowed.interest[table] = self.interest[table].map { .both($0, wanted) } ?? wanted
        }
        return narrowed
    }

    /// Whether any table is scoped.
    public var isPartial: Bool { !tables.isEmpty || !interest.isEmpty }

    /// Whether `table` is scoped (by this node's rules, the peer's interest or both).
    public func scopes(_ table: String) -> Bool { tables[table] != nil || interest[table] != nil }
}

/// Why a scope cannot be used, naming the table and the reason.
public struct ScopeError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What is wrong with the table's rule.
    public enum Reason: Sendable, Hashable {
        /// The scope names a table this database does not sync.
        case tableNotSynced
        /// The filter is not a valid SQL expression over the table (an unknown column, bad syntax):
        /// SQLite's message.
        case invalidExpression(String)
        /// The filter is a value, not a condition (a text, a real, a text column…).
        case notACondition(String)
        /// A subquery of the filter reads a table that is not synced (its rows could not be known
        /// on every node alike).
        case readsUnsyncedTable(String)
        /// The filter uses a parameter the scope gives no value for (or a positional `?`).
        case missingParameter(String)
        /// A parameter name starts with `tether_`, which Tether's own queries use.
        case reservedParameter(String)
        /// The reference's column (or the parent's referenced column) does not exist.
        case unknownColumn(table: String, column: String)
        /// The reference's parent is not scoped (or not synced): scope it, or use a filter.
        case parentNotScoped(String)
        /// The parent has a composite key: name the referenced column.
        case parentKeyIsComposite(String)
        /// References lead back to this table.
        case referenceCycle([String])
        /// A scoped extraction was asked without the peer's instance key (what it holds is recorded by it).
        case needsPeer
        /// The table is declared WITHOUT ROWID: scopes do not cover such tables yet (what a peer
        /// holds is recorded by rowid).
        case withoutRowid
        /// A peer's filter (its interest) is not one expression standing alone: an unbalanced
        /// parenthesis, a `;`, a comment, an unterminated quote, a control character. Says what was
        /// found and at which character.
        case notOneExpression(String)
        /// A peer's filter reads rows other than the one it judges: a subquery or a WITH (an
        /// interest may read only its own table's columns).
        case interestReadsOtherRows
        /// A peer's filter calls a function outside `SyncScope.interestFunctions` (named).
        case functionNotAllowed(String)
        /// A peer's filter uses a parameter (named): an interest takes none.
        case interestParameter(String)
        /// Evaluating a peer's filter took longer than its `InterestBudget.timeLimit`.
        case evaluationTooLong(Duration)
        /// Evaluating a peer's filter was stopped because the session ended (`InterestBudget.cancel()`).
        case evaluationCancelled
    }

    /// The table whose rule is refused.
    public let table: String
    /// What is wrong with it.
    public let reason: Reason

    public var description: String {
        switch reason {
        case .tableNotSynced: return "scope of \(table): the table is not synced"
        case let .invalidExpression(message):
            return "scope of \(table): the filter is not a valid expression over the table: \(message)"
        case let .notACondition(type):
            return "scope of \(table): the filter is a value of type \(type), not a condition"
        case let .readsUnsyncedTable(other):
            return "scope of \(table): the filter reads table \(other), which is not synced"
        case let .missingParameter(name):
            return "scope of \(table): the filter uses parameter \(name), which the scope gives no value"
        case let .reservedParameter(name):
            return "scope of \(table): parameter \(name) starts with tether_, which is reserved"
        case let .unknownColumn(owner, column): return "scope of \(table): table \(owner) has no column \(column)"
        case let .parentNotScoped(parent):
            return "scope of \(table): the referenced table \(parent) is not scoped (scope it, or use a filter)"
        case let .parentKeyIsComposite(parent):
            return "scope of \(table): \(parent) has a composite key: name the referenced column"
        case let .referenceCycle(path):
            return "scope of \(table): references lead back to it (\(path.joined(separator: " → ")))"
        case .needsPeer:
            return "a scoped extraction needs the peer's instance key: what each peer holds is recorded by it"
        case .withoutRowid:
            return
                "scope of \(table): the table is declared WITHOUT ROWID, which scopes do not cover yet; sync it whole"
        case let .notOneExpression(found): return "scope of \(table): the interest is not one expression: \(found)"
        case .interestReadsOtherRows:
            return """
                scope of \(table): the interest holds a subquery or a WITH; an interest may read only the columns \
                of the row it judges
                """
        case let .functionNotAllowed(function):
            return
                "scope of \(table): the interest calls function \(function), which an interest may not call (allowed: "
                + SyncScope.interestFunctions.sorted().joined(separator: ", ") + ")"
        case let .interestParameter(name):
            return """
                scope of \(table): the filter uses parameter \(name), but an interest takes no parameters: write \
                the value itself
                """
        case let .evaluationTooLong(limit):
            return "scope of \(table): evaluating the interest took longer than its time limit (\(limit))"
        case .evaluationCancelled: return "scope of \(table): evaluating the interest was stopped: the session ended"
        }
    }
}

/// Who wrote a rule: this node's operator (a policy, trusted as written: its filters may read
/// other synced tables and use parameters) or the peer (its interest: checked by `InterestFilter`).
enum RuleAuthor {
    case node
    case peer
}

/// A scope checked against this database's synced tables, as SQL: per scoped table, the condition
/// a row of it meets (over the table named by its name, so that it fits any query reading the
/// table under its own name), the tables it depends on, and its fingerprint.
struct CompiledScope {
    struct TableRule {
        let table: SyncedTable
        /// A boolean SQL expression over `"table".column`s and named parameters.
        let condition: String
        /// The tables its chain of references leads to (a row moving in or out of one of them moves rows of this one).
        let references: Set<String>
        /// Its own references, one link each (`.both` may have two): the column that names a row of
        /// the parent, by the parent's column.
        var links: [ReferenceLink] = []
        /// The other tables its filters read in subqueries (any change to them may move rows of this one).
        let subqueryReads: Set<String>
        /// Changes when the rule, a parent's rule or a parameter value it uses changes.
        let fingerprint: String
        /// The table's key is its rowid (see `SyncEngine.keyIsRowid`): always an integer.
        var keyIsRowid = false
    }

    /// A row of `table` belongs to the row of `parent` whose `parentColumn` equals its `column`.
    struct ReferenceLink: Hashable {
        let column: String
        let parent: String
        let parentColumn: String
    }

    let rules: [String: TableRule]
    /// The named parameters, with their `:`, for binding.
    let parameters: [String: DatabaseValue]

    /// The tables whose rules reference `table` (directly or through a chain of references).
    func dependents(of table: String) -> Set<String> {
        var found = Set<String>()
        var frontier = [table]
        while let next = frontier.popLast() {
            for (name, rule) in rules where !found.contains(name) && rule.references.contains(next) {
                found.insert(name)
                frontier.append(name)
            }
        }
        return found
    }
}

extension SyncEngine {
    /// Checks `scope` against this database's synced tables and compiles it (see `SyncScope`).
    func compile(_ scope: SyncScope, _ connection: Connection) throws -> CompiledScope {
        var parameters: [String: DatabaseValue] = [:]
        for (name, value) in scope.parameters {
            let bare = name.hasPrefix(":") ? String(name.dropFirst()) : name
            guard !bare.lowercased().hasPrefix("tether_") else {
                throw ScopeError(table: scope.tables.keys.sorted().first ?? "", reason: .reservedParameter(bare))
            }
            parameters[":" + bare] = value
        }
        var compiled: [String: CompiledScope.TableRule] = [:]
        func compileRule(_ name: String, path: [String]) throws -> CompiledScope.TableRule {
            if let done = compiled[name] { return done }
            guard scope.scopes(name), let table = tables[name], !SyncedTable.isInternal(name) else {
                throw ScopeError(table: name, reason: .tableNotSynced)
            }
            guard !table.isWithoutRowid else { throw ScopeError(table: name, reason: .withoutRowid) }
            /// Both rules' rows: the condition of each, over the same table.
            func both(_ a: CompiledScope.TableRule, _ b: CompiledScope.TableRule) -> CompiledScope.TableRule {
                CompiledScope.TableRule(
                    table: table, condition: "(\(a.condition) AND \(b.condition))",
                    references: a.references.union(b.references), links: a.links + b.links,
                    subqueryReads: a.subqueryReads.union(b.subqueryReads),
                    fingerprint: SHA256.hex(Array("both:\(a.fingerprint)|\(b.fingerprint)".utf8)))
            }
            /// One rule of `name` written by `author` (`.both` compiles each side over the same table).
            func compileCondition(_ rule: SyncScope.Rule, by author: RuleAuthor) throws -> CompiledScope.TableRule {
                let quoted = quoteIdentifier(name)
                switch rule {
                case let .filter(expression):
                    let (reads, used) = try checkFilter(
                        expression, of: table, by: author, parameters: parameters, connection)
                    let usedValues = used.sorted().map { "\($0)=\(parameters[$0]?.description ?? "NULL")" }.joined(
                        separator: ",")
                    return CompiledScope.TableRule(
                        table: table, condition: "(\n\(expression)\n)", references: [],
                        subqueryReads: reads.subtracting([name]),
                        fingerprint: SHA256.hex(Array("filter:\(expression)|\(usedValues)".utf8)))
                case let .reference(column, parentName, parentColumn):
                    let columns = try connection.fetchRows("SELECT name FROM pragma_table_info(?)", [name]).map {
                        try $0.get(0, as: String.self)
                    }
                    guard columns.contains(column) else {
                        throw ScopeError(table: name, reason: .unknownColumn(table: name, column: column))
                    }
                    guard !path.contains(parentName) else {
                        throw ScopeError(table: name, reason: .referenceCycle(path + [parentName]))
                    }
                    guard scope.scopes(parentName), let parentTable = tables[parentName] else {
                        throw ScopeError(table: name, reason: .parentNotScoped(parentName))
                    }
                    let referenced: String
                    if let parentColumn {
                        referenced = parentColumn
                    } else {
                        guard parentTable.keyColumns.count == 1 else {
                            throw ScopeError(table: name, reason: .parentKeyIsComposite(parentName))
                        }
                        referenced = parentTable.keyColumns[0]
                    }
                    let parentColumns = try connection.fetchRows("SELECT name FROM pragma_table_info(?)", [parentName])
                        .map { try $0.get(0, as: String.self) }
                    guard parentColumns.contains(referenced) else {
                        throw ScopeError(table: name, reason: .unknownColumn(table: parentName, column: referenced))
                    }
                    let parent = try compileRule(parentName, path: path + [parentName])
                    // A correlated EXISTS: one lookup of the parent per row, not the parent's whole scope.
                    let condition = """
                        EXISTS (SELECT 1 FROM \(quoteIdentifier(parentName)) WHERE \
                        \(quoteIdentifier(parentName)).\(quoteIdentifier(referenced)) = \
                        \(quoted).\(quoteIdentifier(column)) AND \(parent.condition))
                        """
                    return CompiledScope.TableRule(
                        table: table, condition: condition, references: parent.references.union([parentName]),
                        links: [.init(column: column, parent: parentName, parentColumn: referenced)],
                        subqueryReads: parent.subqueryReads,
                        fingerprint: SHA256.hex(
                            Array("reference:\(column)>\(parentName).\(referenced)|\(parent.fingerprint)".utf8)))
                case let .both(first, second):
                    return both(try compileCondition(first, by: author), try compileCondition(second, by: author))
                }
            }
            var result: CompiledScope.TableRule
            // The node's rule and the peer's are compiled apart, each checked as its author's, and
            // combined as `.both(policy, interest)` always was (the fingerprints stay as they were).
            switch (scope.tables[name], scope.interest[name]) {
            case let (policy?, interest?):
                result = both(try compileCondition(policy, by: .node), try compileCondition(interest, by: .peer))
            case let (policy?, nil): result = try compileCondition(policy, by: .node)
            case let (nil, interest?): result = try compileCondition(interest, by: .peer)
            case (nil, nil): throw ScopeError(table: name, reason: .tableNotSynced)
            }
            result.keyIsRowid = try keyIsRowid(table, connection)
            compiled[name] = result
            return result
        }
        for name in Set(scope.tables.keys).union(scope.interest.keys).sorted() {
            _ = try compileRule(name, path: [name])
        }
        return CompiledScope(rules: compiled, parameters: parameters)
    }

    /// Whether `table`'s key is a single INTEGER PRIMARY KEY column, which SQLite makes an alias of
    /// the rowid (a primary key index of its own shows it is not: declared `INTEGER PRIMARY KEY DESC`).
    /// Its values are then integers, whose text membership can spell without a function call.
    func keyIsRowid(_ table: SyncedTable, _ connection: Connection) throws -> Bool {
        guard !table.isWithoutRowid, table.keyColumns.count == 1 else { return false }
        let primaryKey = try connection.fetchRows(
            "SELECT name, upper(type) FROM pragma_table_info(?) WHERE pk > 0", [table.name])
        guard primaryKey.count == 1, try primaryKey[0].get(0, as: String.self) == table.keyColumns[0],
            try primaryKey[0].get(1, as: String.self) == "INTEGER"
        else { return false }
        return try connection.fetchValue(
            "SELECT count(*) FROM pragma_index_list(?) WHERE origin = 'pk'", [table.name], as: Int.self) == 0
    }

    /// Checks a filter with SQLite itself: it must prepare as the condition of a query of the table
    /// alone (names resolved, syntax), have nothing after it, read only synced tables, use only
    /// parameters the scope gives, and not be a mere value (a text, a real, a column declared as
    /// neither integer nor boolean). A peer's filter must also pass `InterestFilter` (one
    /// expression, its own row only, allowed functions) and use no parameter. Returns the tables it
    /// reads and the parameters it uses.
    private func checkFilter(
        _ expression: String, of table: SyncedTable, by author: RuleAuthor, parameters: [String: DatabaseValue],
        _ connection: Connection
    ) throws -> (reads: Set<String>, parameters: Set<String>) {
        let name = table.name
        if author == .peer {
            // Before SQLite parses it: text that would close the parentheses it is pasted in.
            try InterestFilter.checkText(expression, of: name)
        }
        let probe = "SELECT (\n\(expression)\n) FROM \(table.quotedName)"
        let db = try connection.liveHandle(sql: probe)
        var handle: OpaquePointer?
        // What SQLite left unread after the first statement (read while the C string lives), and
        // what its authorizer reported while preparing it.
        let ((rc, rest), actions) = probe.withCString { text in
            connection.collectingAuthorizations { () -> (Int32, String) in
                var tail: UnsafePointer<CChar>?
                let rc = sqlite3_prepare_v2(db, text, -1, &handle, &tail)
                return (rc, tail.map { String(cString: $0) } ?? "")
            }
        }
        defer { sqlite3_finalize(handle) }
        guard rc == SQLITE_OK, let handle else {
            throw ScopeError(table: name, reason: .invalidExpression(String(cString: sqlite3_errmsg(db))))
        }
        guard rest.allSatisfy(\.isWhitespace) else {
            throw ScopeError(table: name, reason: .invalidExpression("text follows the expression: \(rest)"))
        }
        if author == .peer {
            try InterestFilter.judge(actions, of: name)
            // Where extraction uses it: a row's condition (an aggregate or a window would not prepare there).
            let condition = "SELECT 1 FROM \(table.quotedName) WHERE (\n\(expression)\n)"
            do { _ = try connection.prepare(condition) } catch let error as DatabaseError {
                throw ScopeError(table: name, reason: .invalidExpression(error.message))
            }
        }
        var used = Set<String>()
        for index in 0..<sqlite3_bind_parameter_count(handle) {
            guard let cName = sqlite3_bind_parameter_name(handle, index + 1) else {
                throw ScopeError(
                    table: name, reason: author == .peer ? .interestParameter("?") : .missingParameter("?"))
            }
            let parameter = String(cString: cName)
            if author == .peer {
                throw ScopeError(table: name, reason: .interestParameter(String(parameter.dropFirst())))
            }
            guard parameter.hasPrefix(":") || parameter.hasPrefix("@") || parameter.hasPrefix("$") else {
                throw ScopeError(table: name, reason: .missingParameter(parameter))
            }
            let key = ":" + parameter.dropFirst()
            guard parameters[key] != nil else {
                throw ScopeError(table: name, reason: .missingParameter(String(parameter.dropFirst())))
            }
            guard !parameter.dropFirst().lowercased().hasPrefix("tether_") else {
                throw ScopeError(table: name, reason: .reservedParameter(parameter))
            }
            used.insert(key)
        }
        if let declared = sqlite3_column_decltype(handle, 0).map({ String(cString: $0).uppercased() }),
            !(declared.contains("INT") || declared.contains("BOOL"))
        {
            throw ScopeError(table: name, reason: .notACondition(declared))
        }
        // A constant value (a text, a real) shows on a row of NULLs.
        let nulls = try connection.fetchRows("SELECT name FROM pragma_table_info(?)", [name]).map { _ in "NULL" }
            .joined(separator: ", ")
        let columnNames = try connection.fetchRows("SELECT name FROM pragma_table_info(?)", [name]).map {
            quoteIdentifier(try $0.get(0, as: String.self))
        }
        let typeProbe = """
            WITH \(table.quotedName)(\(columnNames.joined(separator: ", "))) AS (SELECT \(nulls)) SELECT \
            typeof((\n\(expression)\n)) FROM \(table.quotedName)
            """
        let probeStatement = try connection.prepare(typeProbe)
        try probeStatement.bind(StatementArguments(named: used.reduce(into: [:]) { $0[$1] = parameters[$1] ?? .null }))
        if try probeStatement.step(),
            let type = String.fromDatabaseValue(DatabaseValue(statement: probeStatement.handle, index: 0)),
            ["text", "real", "blob"].contains(type)
        {
            throw ScopeError(table: name, reason: .notACondition(type))
        }
        probeStatement.reset()
        let reads = try connection.readTables(ofSQL: probe)
        for other in reads where other != name && (tables[other] == nil || SyncedTable.isInternal(other)) {
            throw ScopeError(table: name, reason: .readsUnsyncedTable(other))
        }
        return (reads, used)
    }
}

extension StatementArguments {
    init(named values: [String: DatabaseValue]) {
        self.init()
        named = values
    }
}
