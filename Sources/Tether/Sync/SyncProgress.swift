/// Progress of writing or reading a sync file, reported as batches go by.
public struct SyncProgress: Sendable, Equatable {
    /// Changes written or read so far.
    public var changesDone: Int
    /// Changes the file will hold in all, as estimated so far (on import, the changes it holds).
    public var changesExpected: Int
    /// Bytes of the file written so far (0 while importing).
    public var bytesDone: Int
}
