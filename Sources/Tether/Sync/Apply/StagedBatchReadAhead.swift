// The staged batches of a catch-up read back for its final apply, the work beside the apply done
// on another thread: on a machine with a second core the apply of a whole catch-up costs its apply
// alone, as a batch-by-batch catch-up overlaps its apply with the transfer.

import Dispatch

/// Gives a catch-up's staged batches in the order they arrived, decoding the next one on another
/// thread while the caller applies the one before it, and freeing each applied batch there too.
/// Decoding a batch and freeing it cost about a fifth of its apply; the apply itself holds the
/// writer and cannot be split.
struct StagedBatchReadAhead {
    private let staging: StagingFile
    private let ids: [Int64]
    private var position = 0
    /// The decoding of `ids[position]`, started as the batch before it was handed out.
    private var decoding: Decoding?
    private let queue = DispatchQueue(label: "tether.staged-batch-read-ahead")

    init(_ staging: StagingFile, ids: [Int64]) {
        self.staging = staging
        self.ids = ids
    }

    /// The next staged batch, nil after the last; the one after it starts decoding.
    mutating func next() throws -> ChangeBatch? {
        guard position < ids.count else { return nil }
        let current = try decoding ?? startDecoding(ids[position])
        position += 1
        decoding = position < ids.count ? try startDecoding(ids[position]) : nil
        return try current.batch()
    }

    /// Frees an applied batch on the read-ahead's thread; the caller must hold no other copy
    /// (pass it with `consume`), or the last copy frees it where that copy goes.
    func release(_ batch: consuming ChangeBatch) {
        let released = Released(batch)
        queue.async { released.drop() }
    }

    private func startDecoding(_ id: Int64) throws -> Decoding {
        // The bytes are read here, on the caller's thread; only the decoding moves.
        Decoding(try staging.withStore { try $0.encodedBatch(id) }, id: id, on: queue)
    }

    /// One batch being decoded on the queue.
    private final class Decoding: @unchecked Sendable {
        private let done = DispatchSemaphore(value: 0)
        // Written once on the queue before `done` is signalled, read only after waiting on it.
        private var result: Result<ChangeBatch, any Error> = .failure(
            SyncError.corruptMetadata("a staged batch's decoding did not finish"))

        init(_ bytes: [UInt8], id: Int64, on queue: DispatchQueue) {
            queue.async { [self] in
                result = Result { try StagedBatchStore.decode(bytes, id: id) }
                done.signal()
            }
        }

        func batch() throws -> ChangeBatch {
            done.wait()
            let batch = try result.get()
            result = .failure(SyncError.corruptMetadata("a staged batch was handed out twice"))
            return batch
        }
    }

    /// A batch carried to the queue to be freed there.
    private final class Released: @unchecked Sendable {
        // Touched only by `drop`, on the queue, after the caller gave the batch up.
        private var batch: ChangeBatch?
        init(_ batch: consuming ChangeBatch) { self.batch = batch }
        func drop() { batch = nil }
    }
}
