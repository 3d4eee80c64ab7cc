/// Progress of writing or reading a sync file, reported as batches go by.
public struct SyncProgress: Sendable, Equatable {
    public var changesDone: Int
    public var changesExpected: Int
    public var bytesDone: Int
}
