/// What tests change in a session's behaviour, kept apart from the options a user sets
/// (`SyncOptions.testHooks` is internal: reachable only with `@testable import`).
struct SessionTestHooks: Sendable {
    /// This side does not offer `livePush`, so that a kept-open session polls.
    var offersLivePush = true
    /// This side does not offer `deferrals`, as a peer of an earlier version would not.
    var offersDeferrals = true
    /// This side does not offer `histories`, as a peer of an earlier version would not.
    var offersHistories = true
    /// This side does not offer `version3`, as a peer speaking only protocol version 2 would not.
    var offersVersion3 = true
    /// This side does not offer `columnarBatches`, as a peer reading only batch formats 1 and 2 would not.
    var offersColumnarBatches = true
    /// This side does not offer `compactColumns`, as a peer reading batch formats 1 to 3 only would not.
    var offersCompactColumns = true
    /// This side does not offer `parkedPulls`: live changes go by CHANGED and PULL (§8.4), as with
    /// a peer of an earlier version.
    var offersParkedPulls = true
    /// This side does not offer `pullsAhead`: one batch at a time is coming during a catch-up (§8.3).
    var offersPullsAhead = true
    /// This side does not offer `mergeRules`, as a peer that merges every column by last writer would not.
    var offersMergeRules = true

    /// Called on the event loop after each batch received is applied (its cursor committed),
    /// before its ACK is sent, with the number of batches applied so far; returning false cuts
    /// the connection there, as a network failure would.
    var batchAppliedHook: (@Sendable (Int) -> Bool)?
    /// The same after each batch of a catch-up staged to be applied with its last one (§8.3
    /// *Whole catch-ups*), with the number staged so far in this session.
    var batchStagedHook: (@Sendable (Int) -> Bool)?
}
