// What an application reads after its write — the rowid it inserted, the rows it changed — kept
// from the observers' own writes after it.

import CSQLite

/// The rowid a write inserted and the rows it changed, as SQLite left them when the statement
/// ended: the observers' writes after it (the capture's metadata and tombstones) would
/// otherwise take their place in `sqlite3_last_insert_rowid` and `sqlite3_changes`.
struct StatementOutcome {
    let insertedRowid: Int64
    let changes: Int64

    init(of handle: OpaquePointer) {
        insertedRowid = sqlite3_last_insert_rowid(handle)
        changes = sqlite3_changes64(handle)
    }
}

extension Connection {
    /// The outcome of the observed write that just ended, taken before its observers write.
    func statementOutcome() -> StatementOutcome? {
        handle.map { StatementOutcome(of: $0) }
    }

    /// Puts back what `outcome` holds once the observers have written: the rowid in SQLite (SQL's
    /// `last_insert_rowid()` reads it too), the count here (SQLite's cannot be set), read by
    /// `changes` and SQL's `changes()` until an unobserved write ends (`Statement.step`).
    func restore(_ outcome: StatementOutcome?) {
        guard let outcome, let handle else { return }
        sqlite3_set_last_insert_rowid(handle, outcome.insertedRowid)
        changesOfObservedWrite = outcome.changes
    }

    /// SQL's `changes()` answers as `changes` does (an application function takes the place of
    /// the built-in one on this connection).
    func installChangesFunction() {
        guard let handle else { return }
        sqlite3_create_function_v2(
            handle, "changes", 0, SQLITE_UTF8, Unmanaged.passUnretained(self).toOpaque(), changesFunction, nil, nil,
            nil)
    }
}

private func changesFunction(
    _ context: OpaquePointer?, _ argumentCount: Int32, _ arguments: UnsafeMutablePointer<OpaquePointer?>?
) {
    guard let data = sqlite3_user_data(context) else { return sqlite3_result_null(context) }
    sqlite3_result_int64(context, Int64(Unmanaged<Connection>.fromOpaque(data).takeUnretainedValue().changes))
}
