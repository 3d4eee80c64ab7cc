import Foundation

/// A bulk insert into a synced table in progress (`Connection.insertingInBulk`): its rows share
/// one version, and new ranges start above `floor`.
struct BulkInsertCapture {
    let table: SyncedTable
    let version: LocalVersion
    let versions: [UInt8]
    var floor: Int64
}

/// Bulk inserts into synced tables (`Connection.insertingInBulk`) are logged as insert ranges:
/// one row of `tether_insert_ranges` per run of consecutive rowids, not metadata per row.
extension ChangeCapture {
    /// A bulk insert into `table` begins: its rows will have one version.
    func beginBulkInsert(into table: SyncedTable, _ connection: Connection) throws {
        try engine.prepareClock(connection)
        let version = localChangeVersion()
        bulkInsert = BulkInsertCapture(
            table: table, version: version, versions: RowVersions.uniform(version).encoded(),
            floor: try engine.rangeFloor(of: table, connection))
    }

    /// Logs rows a bulk insert wrote, consecutive rowids, as created here: those above every
    /// existing range as one new range (consecutive sequence numbers, one version), those below
    /// (an explicit key under existing rows) each with its own metadata. The key of a row
    /// deleted before loses its tombstone: one statement for the run, whatever the tombstones.
    func logBulkInserted(_ rowids: ClosedRange<Int64>, into name: String, _ connection: Connection) throws {
        guard let bulk = bulkInsert, bulk.table.name == name else { return }
        let table = bulk.table
        if table.mayHaveDeadRows {
            try table.statement(.deleteDeadForRowids, connection).execute([rowids.lowerBound, rowids.upperBound])
        }
        if rowids.lowerBound <= bulk.floor {
            for rowid in rowids.lowerBound...min(rowids.upperBound, bulk.floor) {
                try engine.stamp(
                    table, rowid: rowid, status: .created, versions: bulk.versions, inserted: .now, connection)
            }
        }
        guard rowids.upperBound > bulk.floor else { return }
        let above = max(rowids.lowerBound, bulk.floor + 1)...rowids.upperBound
        let firstSequence = clock.nextSequence()
        for _ in above.dropFirst() { _ = clock.nextSequence() }
        try engine.record(
            InsertRange(
                firstRowid: above.lowerBound, lastRowid: above.upperBound, firstSequence: firstSequence,
                version: bulk.version, status: .created), of: table, connection)
        bulkInsert?.floor = above.upperBound
    }
}
