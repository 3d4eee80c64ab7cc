/// The synced tables as the engine loaded them from the catalog (`SyncEngine.loadTables`): by
/// name, as a flat list for the pre-update hook, and what decides how tables become synced.
/// Shared by the engine and its capture; used under the writer's lock, like them.
final class SyncedTables {
    private(set) var byName: [String: SyncedTable] = [:]
    /// For the hook: the tables in a flat array, compared by C string. Unchecked: Swift's
    /// run-time exclusivity check of each read cost hundreds of instructions per changed row.
    @exclusivity(unchecked) private(set) var list: [SyncedTable] = []
    /// Bumped whenever the set of synced tables changes, so cached per-statement decisions are redone.
    private(set) var generation = 0
    /// PRAGMA schema_version when the tables were loaded.
    private(set) var schemaVersion: Int64 = 0

    /// The functions of custom policies, by table: given at each opening (a function cannot be stored).
    var mergeFunctions: [String: MergeFunction] = [:]
    /// Whether `enableSync(allExcept:)`'s standing rule is recorded: tables made on the writer are
    /// then synced as they appear (`StandingSyncRule.swift`).
    var hasStandingRule = false
    /// The function of the standing rule's custom policy, when this opening was given one.
    var standingRuleMerge: MergeFunction?

    /// The tables just loaded replace the others.
    func replace(with loaded: [String: SyncedTable], schemaVersion: Int64) {
        byName = loaded
        list = Array(loaded.values)
        generation += 1
        self.schemaVersion = schemaVersion
    }
}
