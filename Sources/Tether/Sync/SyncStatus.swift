/// Sync status of a row (see `RowMetadataLayout` for where it is stored).
public enum SyncStatus: Int, Sendable, Codable, CaseIterable, DatabaseValueConvertible {
    /// Nothing local waits to be acknowledged.
    case synced = 0
    /// Inserted locally, not yet acknowledged.
    case created = 1
    /// Updated locally, not yet acknowledged.
    case updated = 2
    /// Deleted locally, not yet acknowledged (the row is in the tombstone table).
    case deleted = 3
}
