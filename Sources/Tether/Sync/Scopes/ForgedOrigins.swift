// Versions a scoped writer claims for another peer: a peer writes under its own instance key, or
// relays versions of keys this database does not know; a version of a key pinned here to another
// certificate, new here, is a forged origin (Protocol/README.md §7.2, §8.10).

import Foundation

extension SyncEngine {
    /// What `writer`'s batch is checked against under `scope`: the keys pinned here to another
    /// certificate than the one `writer` is pinned to. A certificate may present several keys (a
    /// rekeyed database): versions of its own older keys are its own.
    func writerChecks(scope: CompiledScope, writer: InstanceKey, _ connection: Connection) throws -> WriterChecks {
        let pins = try connection.peerStore.pinnedCertificates()
        let writerCertificate = pins[writer]
        let foreign = pins.filter { $0.key != writer && $0.value != writerCertificate }
        return WriterChecks(scope: scope, foreignOrigins: foreign, writerCertificate: writerCertificate)
    }

    /// Why `change` is refused as a forged origin, nil when it is not: one of its versions claims
    /// the key of a peer pinned here to another certificate than the writer's, and is not held here
    /// already (at that version or a later one). A scoped writer only ever got that peer's versions
    /// from this database, or from a peer that sent them here too: a change merely carrying them
    /// (a row written there, moved into the writer's scope, then changed by it) holds them here
    /// already. Unscoped writers are not checked: a mesh of full peers relays each other's versions.
    func originRefusal(of change: RowChange, _ mapping: TableMapping, _ checks: WriterChecks, _ connection: Connection)
        throws -> String?
    {
        guard !checks.foreignOrigins.isEmpty,
            checks.foreignOrigins[change.existence.origin] != nil
                || change.versions.contains(where: { checks.foreignOrigins[$0.origin] != nil })
        else { return nil }
        let local = try localRow(mapping.table, change.key, connection)
        // The local value column of each remote one the mapping keeps.
        var localColumn: [Int: Int] = [:]
        for (position, remote) in (mapping.projection ?? Array(change.values.indices)).enumerated()
        where position < mapping.localIndex.count {
            localColumn[remote] = mapping.localIndex[position]
        }
        func forged(_ claimed: Version, held: LocalVersion?) throws -> String? {
            guard let certificate = checks.foreignOrigins[claimed.origin] else { return nil }
            if let held, try version(held) >= claimed { return nil }
            return "a version (\(claimed.timestamp)) claims instance key \(claimed.origin), which is pinned here to "
                + "certificate \(certificate), not to the writer's (\(checks.writerCertificate ?? "unpinned")): a "
                + "peer writes under its own key"
        }
        if let reason = try forged(change.existence, held: local?.versions.existence) { return reason }
        for remote in change.values.indices {
            let held = local.flatMap { row in localColumn[remote].map { row.versions.column($0) } }
            if let reason = try forged(change.version(remote), held: held) { return reason }
        }
        return nil
    }
}
