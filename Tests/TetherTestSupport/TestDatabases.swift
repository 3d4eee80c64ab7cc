import Tether

/// An in-memory database holding `schema`, with the tables named in `syncing` synced.
public func makeDatabase(
    schema: String, syncing tables: [String] = [], policy: ConflictPolicy = .lastWriterWins,
    capturingExternalWrites: Bool = false
) throws -> Database {
    let db = try Database.inMemory()
    try db.execute(schema)
    for table in tables {
        try db.enableSync(table: table, policy: policy, capturingExternalWrites: capturingExternalWrites)
    }
    return db
}

/// An in-memory database whose table `t`, `id INTEGER PRIMARY KEY` and then `columns`, is synced:
/// the table most sync tests write to.
public func makeDatabase(columns: String = "name TEXT, n INTEGER") throws -> Database {
    try makeDatabase(schema: "CREATE TABLE t (id INTEGER PRIMARY KEY, \(columns))", syncing: ["t"])
}

/// An in-memory database with `model`'s table, synced.
public func makeDatabase<M: Model>(syncing model: M.Type) throws -> Database {
    let db = try Database.inMemory()
    try db.createTable(model)
    try db.enableSync(for: model)
    return db
}
