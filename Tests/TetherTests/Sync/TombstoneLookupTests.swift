import CSQLite
import Foundation
import Testing
@testable import Tether

/// An insert into a synced table looks for a tombstone of its key (issue 35): by the tombstones'
/// key index, whatever the key's type, never by a scan — with 100,000 tombstones a scan per
/// insert made 1,000 inserts 200 times slower.
@Suite struct TombstoneLookupTests {
    static let tables = """
        CREATE TABLE by_integer (id INTEGER PRIMARY KEY, name TEXT);
        CREATE TABLE by_text (code TEXT PRIMARY KEY NOT NULL, name TEXT);
        CREATE TABLE by_pair (region TEXT NOT NULL, n INTEGER NOT NULL, name TEXT, PRIMARY KEY (region, n));
        CREATE TABLE without_rowid (region TEXT NOT NULL, n INTEGER NOT NULL, name TEXT, PRIMARY KEY (region, n)) \
        WITHOUT ROWID;
        CREATE TABLE by_integer_desc (id INTEGER PRIMARY KEY DESC, name TEXT);
        """

    @Test(
        "every statement that finds a tombstone by key or by the user's row uses the tombstones' index",
        arguments: ["by_integer", "by_text", "by_pair", "without_rowid"])
    func tombstonesAreFoundByIndex(table: String) throws {
        let db = try Database.inMemory()
        try db.execute(Self.tables)
        try db.enableSync(table: table)
        let plans = try db.read { connection in
            let record = try #require(try connection.syncedTableCatalog.record(named: table))
            let layout = RowMetadataLayout(
                table: table, keyColumns: record.keyColumns, valueColumns: record.valueColumns,
                withoutRowidKey: try WithoutRowidKey.of(table, connection))
            let lookups =
                [
                    layout.deleteDeadForRowid, layout.deleteDeadForRowids(keyIsRowid: false), layout.deleteDeadByKey,
                    layout.selectDeadByKey, layout.foldDead,
                ]
                + (table == "by_integer" ? [layout.deleteDeadForRowids(keyIsRowid: true)] : [])
            return try lookups.map { sql in
                (sql, try Self.queryPlan(of: sql, connection))
            }
        }
        for (sql, plan) in plans {
            #expect(
                !plan.contains { $0.hasPrefix("SCAN \(RowMetadataLayout.deadTableName(of: table))") },
                "\(sql)\n\(plan.joined(separator: "\n"))")
        }
    }

    @Test("a bulk insert takes the tombstones of the keys it inserts again, and only those")
    func bulkInsertRemovesOnlyItsKeysTombstones() throws {
        let db = try Database.inMemory()
        try db.execute(Self.tables)
        try db.enableSync(table: "by_integer")
        try db.enableSync(table: "by_text")
        try db.insert(contentsOf: (1...10).map { ByInteger(id: $0, name: "row \($0)") })
        try db.insert(contentsOf: (1...10).map { ByText(code: "k\($0)", name: "row \($0)") })
        try db.execute("DELETE FROM by_integer; DELETE FROM by_text")
        // Keys 4...6 again (one run of rowids), and 20, new.
        try db.insert(contentsOf: [4, 5, 6, 20].map { ByInteger(id: $0, name: "again \($0)") })
        try db.insert(contentsOf: ["k4", "k5", "k6", "k20"].map { ByText(code: $0, name: "again") })
        // An INTEGER PRIMARY KEY DESC is no rowid: its keys 3 and 1 go in as rowids 1 and 2.
        try db.enableSync(table: "by_integer_desc")
        try db.execute("INSERT INTO by_integer_desc (id, name) VALUES (1, 'one'), (2, 'two')")
        try db.execute("DELETE FROM by_integer_desc")
        try db.insert(contentsOf: [ByIntegerDesc(id: 3, name: "three"), ByIntegerDesc(id: 1, name: "one again")])
        #expect(
            try db.fetchRows("SELECT id FROM tether_dead_by_integer_desc ORDER BY id").map {
                try $0.get(0, as: Int64.self)
            } == [2])
        #expect(
            try db.fetchRows("SELECT id FROM tether_dead_by_integer ORDER BY id").map { try $0.get(0, as: Int64.self) }
                == [1, 2, 3, 7, 8, 9, 10])
        #expect(
            try db.fetchRows("SELECT code FROM tether_dead_by_text ORDER BY code").map {
                try $0.get(0, as: String.self)
            }
                == ["k1", "k10", "k2", "k3", "k7", "k8", "k9"])
    }

    /// SQLite's plan for `sql`, a line per step, its parameters left unbound (NULL).
    static func queryPlan(of sql: String, _ connection: Connection) throws -> [String] {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(connection.handle, "EXPLAIN QUERY PLAN \(sql)", -1, &statement, nil) == SQLITE_OK,
            let statement
        else {
            throw DatabaseError(
                extendedCode: sqlite3_extended_errcode(connection.handle),
                message: String(cString: sqlite3_errmsg(connection.handle)), sql: sql)
        }
        defer { sqlite3_finalize(statement) }
        var lines: [String] = []
        while sqlite3_step(statement) == SQLITE_ROW {
            lines.append(sqlite3_column_text(statement, 3).map { String(cString: $0) } ?? "")
        }
        return lines
    }

    @Test(
        """
        1,000 inserts cost the same with 100,000 tombstones in the table as with none, in SQLite's \
        virtual-machine steps, by SQL or in bulk
        """,
        arguments: [false, true])
    func insertsAfterManyDeletesCostTheSame(inBulk: Bool) throws {
        /// The virtual-machine steps (in thousands) of 1,000 inserts into a table holding `tombstones`.
        func insertSteps(after tombstones: Int) throws -> Int {
            let db = try Database.inMemory()
            try db.execute(Self.tables)
            try db.enableSync(table: "by_integer")
            if tombstones > 0 {
                try db.execute(
                    """
                    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) INSERT INTO \
                    by_integer SELECT i, 'row ' || i FROM n
                    """,
                    [tombstones])
                try db.execute("DELETE FROM by_integer")
            }
            #expect(try db.fetchValue("SELECT count(*) FROM tether_dead_by_integer", as: Int.self) == tombstones)
            // Counted on the writer, where both the SQL and the ORM's bulk insert (insert ranges) run.
            let steps = StepCounter()
            try db.write { connection in
                sqlite3_progress_handler(
                    connection.handle, 1_000,
                    { context in
                        context.map { Unmanaged<StepCounter>.fromOpaque($0).takeUnretainedValue().thousands += 1 }
                        return 0
                    }, Unmanaged.passUnretained(steps).toOpaque())
            }
            defer { try? db.write { sqlite3_progress_handler($0.handle, 0, nil, nil) } }
            if inBulk {
                try db.insert(contentsOf: (1...1000).map { ByInteger(id: 1_000_000 + Int64($0), name: "new \($0)") })
            } else {
                try db.execute(
                    """
                    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000)
                    INSERT INTO by_integer SELECT 1000000 + i, 'new ' || i FROM n
                    """)
            }
            #expect(try db.fetchValue("SELECT count(*) FROM by_integer", as: Int.self) == 1_000)
            return steps.thousands
        }
        let none = try insertSteps(after: 0)
        let many = try insertSteps(after: 100_000)
        #expect(none > 0)
        #expect(many <= 2 * none, "1,000 inserts took \(many)k steps after 100,000 tombstones, \(none)k after none")
    }
}

/// A row of `by_integer`, for the ORM's bulk insert.
private struct ByInteger: Model {
    var id: Int64
    var name: String?
    static let tableName = "by_integer"
}

/// A row of `by_integer_desc`, for the ORM's bulk insert.
private struct ByIntegerDesc: Model {
    var id: Int64
    var name: String?
    static let tableName = "by_integer_desc"
}

/// A row of `by_text`, for the ORM's bulk insert.
private struct ByText: Model {
    var code: String
    var name: String?
    static let tableName = "by_text"
    static var primaryKey: [ColumnRef<ByText>] { ["code"] }
}

/// Counts progress-handler calls; touched only by the connection's thread while it runs.
private final class StepCounter: @unchecked Sendable {
    var thousands = 0
}
