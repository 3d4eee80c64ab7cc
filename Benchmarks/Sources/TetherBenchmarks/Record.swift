import Tether

/// The record every contender writes and reads: an integer primary key, a
/// text, an integer and a real. The C and Tether benchmarks use this struct
/// (declared as a Tether model is usually declared: with `@Model`); the GRDB
/// ones use structs of the same shape with GRDB's conformances.
@Model
struct BenchmarkRecord: Codable, Equatable, Sendable {
    var id: Int64
    var name: String
    var count: Int64
    var value: Double

    /// The inputs of the insert benchmarks and the content of the fetch ones.
    /// Names stay under 16 bytes, as short text columns usually do (Swift keeps
    /// such strings inline, for every contender alike).
    static func makeInputs(count: Int) -> [BenchmarkRecord] {
        makeInputs(at: 0..<count)
    }

    /// The records `makeInputs(count:)` makes at `indices`: a large table built a slice at a time.
    static func makeInputs(at indices: Range<Int>) -> [BenchmarkRecord] {
        indices.map { index in
            let number = index + 1
            return BenchmarkRecord(
                id: Int64(number), name: "name-\(number)", count: Int64(number % 1000), value: Double(number) * 0.25)
        }
    }
}

/// The table every contender uses, spelled as Tether's `createTable` makes it
/// for `BenchmarkRecord` (checked once per run by `checkTetherTableDefinition`).
enum RecordTable {
    static let name = "record"
    static let createSQL = """
        CREATE TABLE "record" (
          "id" INTEGER PRIMARY KEY,
          "name" TEXT NOT NULL,
          "count" INTEGER NOT NULL,
          "value" REAL NOT NULL
        ) STRICT
        """
    static let insertSQL = #"INSERT INTO "record" ("id", "name", "count", "value") VALUES (?, ?, ?, ?)"#
    static let selectSQL = #"SELECT "id", "name", "count", "value" FROM "record""#
}
