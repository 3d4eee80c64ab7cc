/// Nested models seen from the child's side: a child saved by naming its parent
/// (SundeedQLite's `save(withForeignKey:)`), and the rows no parent links to
/// (its `retrieve(excludeIfIsForeign:)`).
extension DatabaseContext {
    /// Saves `child` (an upsert, with its own nested models) and links it to the `Parent` whose
    /// primary key is `parentKey`, as an element of its array `property`: appended at the end,
    /// unless the array already holds the child's key (SundeedQLite's `save(withForeignKey:)`).
    /// Both writes are one transaction. Throws `ModelError.notFound` when no parent has that
    /// key (nothing is saved then), `.invalidArgument` when `property` is not a nested model's
    /// column.
    ///
    /// ```swift
    /// try db.save(Employee(id: "e3", firstName: "Nour"), linkedTo: \Employer.employees, of: PrimaryKey("E1"))
    /// ```
    public func save<Parent: Model, Child: Model>(
        _ child: Child, linkedTo property: KeyPath<Parent, [Child]>, of parentKey: PrimaryKey
    ) throws {
        try save(child, linkedTo: property as AnyKeyPath, of: Parent.self, parentKey)
    }

    /// Saves `child` and links it to the `Parent` whose primary key is `parentKey`, as an element
    /// of its optional array `property` (SundeedQLite's `var employees: [Employee]?`): a nil
    /// array becomes one of `child` alone. Otherwise as for a non-optional array (above).
    ///
    /// ```swift
    /// try db.save(Employee(id: "e3", firstName: "Nour"), linkedTo: \Employer.employees, of: PrimaryKey("E1"))   // var
    /// employees: [Employee]?
    /// ```
    public func save<Parent: Model, Child: Model>(
        _ child: Child, linkedTo property: KeyPath<Parent, [Child]?>, of parentKey: PrimaryKey
    ) throws {
        try save(child, linkedTo: property as AnyKeyPath, of: Parent.self, parentKey)
    }

    /// Saves `child` and makes it the `property` of the `Parent` whose primary key is
    /// `parentKey` (replacing the child it linked to, which stays in its table); see
    /// `save(_:linkedTo:of:)` for arrays.
    public func save<Parent: Model, Child: Model>(
        _ child: Child, linkedTo property: KeyPath<Parent, Child>, of parentKey: PrimaryKey
    ) throws {
        try save(child, linkedTo: property as AnyKeyPath, of: Parent.self, parentKey)
    }

    /// Saves `child` and makes it the optional `property` of the `Parent` whose primary key is
    /// `parentKey`; see `save(_:linkedTo:of:)` for arrays.
    public func save<Parent: Model, Child: Model>(
        _ child: Child, linkedTo property: KeyPath<Parent, Child?>, of parentKey: PrimaryKey
    ) throws {
        try save(child, linkedTo: property as AnyKeyPath, of: Parent.self, parentKey)
    }

    private func save<Parent: Model, Child: Model>(
        _ child: Child, linkedTo property: AnyKeyPath, of parent: Parent.Type, _ parentKey: PrimaryKey
    ) throws {
        try withWriteConnection { conn in
            try conn.transaction {
                let schema = try ModelSchema<Parent>.shared()
                let column = try schema.column(property)
                let name = schema.columns[column].name
                guard let link = schema.columns[column].nested else {
                    throw ModelError.invalidArgument(
                        "column \(name) of \(schema.modelName) is not a nested model or array of models")
                }
                let clause = try keyCondition(schema, parentKey)
                let quoted = quoteIdentifier(name)
                guard
                    let row = try conn.fetchRow(
                        "SELECT \(quoted) FROM \(schema.quotedTable)\(clause.sql)",
                        StatementArguments(values: clause.arguments))
                else {
                    throw ModelError.notFound(table: schema.tableName, key: schema.describeKey(parentKey.values))
                }
                try conn.upsertRow(child)
                let key = try ModelParts.key(of: child)
                let linked: DatabaseValue
                switch link.shape {
                case .one:
                    linked = key
                case .many:
                    var keys = try conn.keys(inJSON: row[0])
                    if keys.contains(key) { return }
                    keys.append(key)
                    linked = .text(
                        "[" + (try keys.map { try ModelParts.jsonLiteral($0, column: name) }).joined(separator: ",")
                            + "]")
                }
                try conn.execute(
                    "UPDATE \(schema.quotedTable) SET \(quoted) = ?\(clause.sql)",
                    StatementArguments(values: [linked] + clause.arguments))
            }
        }
    }
}

extension Connection {
    /// SQL that holds for the rows of `schema`'s table that no parent links to (for
    /// `Query.excludingNestedChildren()`), from the links `createTable` recorded; nil when no
    /// model nests this one.
    func notNestedChildCondition(of schema: SchemaCore) throws -> String? {
        guard schema.primaryKey.count == 1 else { return nil }
        let key = "\(schema.quotedTable).\(quoteIdentifier(schema.columns[schema.primaryKey[0]].name))"
        let sources = try recordedNestedLinks().filter { $0.childTable == schema.tableName }.map(\.source)
        guard !sources.isEmpty else { return nil }
        return sources.map { source in
            let parent = quoteIdentifier(source.parentTable), link = "p.\(quoteIdentifier(source.column))"
            return source.many
                ? """
                NOT EXISTS (SELECT 1 FROM \(parent) AS p, json_each(CASE WHEN json_valid(\(link)) THEN \(link) \
                ELSE '[]' END) AS j WHERE j.value = \(key))
                """
                : "NOT EXISTS (SELECT 1 FROM \(parent) AS p WHERE \(link) = \(key))"
        }.joined(separator: " AND ")
    }
}
