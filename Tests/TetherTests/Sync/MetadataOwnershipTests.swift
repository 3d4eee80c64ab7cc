import Foundation
import Testing

/// One owner per kind of sync state: each of Tether's own tables is read and written by the
/// files named here and by no other (comments aside). `MetadataUpgrade.swift`, which moves the
/// metadata of older layouts, may name any of them.
@Suite struct MetadataOwnershipTests {
    static let owners: [String: Set<String>] = [
        "tether_meta": ["Sync/Identity/InstanceIdentity.swift"],
        "tether_clock": ["Sync/Clock/HybridClock.swift"],
        "tether_collected_echoes": ["Sync/Clock/HybridClock.swift"],
        "tether_resumed_writes": ["Sync/Clock/HybridClock.swift"],
        "tether_sites": ["Sync/Clock/SiteRegistry.swift"],
        "tether_tables": ["Sync/Catalog/SyncedTableCatalog.swift"],
        "tether_added_columns": ["Sync/Catalog/SyncedTableCatalog.swift"],
        "tether_column_renames": ["Sync/Catalog/SyncedTableCatalog.swift"],
        "tether_sync_rule": ["Sync/Catalog/SyncedTableCatalog.swift"],
        "tether_peers": ["Sync/Peers/PeerStore.swift"],
        "tether_deferrals": ["Sync/Peers/PeerStore.swift"],
        "tether_peer_schemas": ["Sync/Peers/PeerStore.swift"],
        "tether_peer_marks": ["Sync/Peers/PeerStore.swift"],
        "tether_history_findings": ["Sync/Peers/PeerStore.swift"],
        "tether_peer_certificates": ["Sync/Peers/PeerStore.swift"],
        "tether_peer_backfills": ["Sync/Peers/PeerStore.swift"],
        "tether_forgotten_peers": ["Sync/Peers/PeerStore.swift"],
        // The row layout's per-table queries join these (rows a resync confirmed, insert ranges,
        // the trigger capture's queue and pause flags).
        "tether_resync_seen": ["Sync/Peers/PeerStore.swift", "Sync/RowMetadataLayout+Resync.swift"],
        "tether_insert_ranges": [
            "Sync/InsertRanges.swift", "Sync/RowMetadataLayout+Changes.swift",
            "Sync/RowMetadataLayout+Resync.swift", "Sync/RowMetadataLayout+Status.swift",
        ],
        "tether_external_changes": ["Sync/Capture/ExternalWrites.swift", "Sync/RowMetadataLayout+Triggers.swift"],
        "tether_capture_paused": ["Sync/Capture/ExternalWrites.swift", "Sync/RowMetadataLayout+Triggers.swift"],
        "tether_kept_aside": ["Sync/Apply/KeptAside.swift"],
        "tether_scope_members": ["Sync/Peers/ScopeMembership.swift"],
        "tether_scope_rules": ["Sync/Peers/ScopeMembership.swift"],
        "tether_evictions": ["Sync/Scopes/Eviction.swift"],
        "tether_refusals": ["Sync/Scopes/ScopedWrites.swift"],
        "tether_partial_tables": ["Sync/Scopes/PartialTables.swift"],
        "tether_kept_for_schema": ["Sync/KeptForSchema.swift"],
        "tether_expiry": ["Sync/Expiry.swift"],
        "tether_synced_expiry": ["Sync/Expiry.swift"],
        "tether_migrations": ["Migration/Migrator.swift"],
        "tether_nested_links": ["ORM/NestedModels/NestedModels+Delete.swift"],
    ]

    /// Sources/Tether, found from this file (Tests/TetherTests/Sync/…).
    static let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Sources/Tether")

    @Test("each of Tether's tables is named in code only by its owner")
    func everyTableHasOneOwner() throws {
        let root = Self.sources.path + "/"
        guard let files = FileManager.default.enumerator(atPath: Self.sources.path)?.compactMap({ $0 as? String })
        else {
            Issue.record("cannot list \(root)")
            return
        }
        let swiftFiles = files.filter { $0.hasSuffix(".swift") }
        #expect(swiftFiles.count > 50, "Sources/Tether should be found from the test's own path")
        for file in swiftFiles where !file.hasSuffix("MetadataUpgrade.swift") {
            let code = try String(contentsOfFile: root + file, encoding: .utf8).split(separator: "\n")
                .filter { !$0.trimmingCharacters(in: .whitespaces).hasPrefix("//") }.joined(separator: "\n")
            for (table, owners) in Self.owners where !owners.contains(file) && Self.names(code, table) {
                Issue.record(
                    "\(file) names \(table), which only \(owners.sorted().joined(separator: " and ")) may touch")
            }
        }
    }

    /// Whether `code` names `table` as a whole word (not a longer name it begins).
    static func names(_ code: String, _ table: String) -> Bool {
        var searchStart = code.startIndex
        while let found = code.range(of: table, range: searchStart..<code.endIndex) {
            let after = found.upperBound
            if after == code.endIndex || !(code[after].isLetter || code[after].isNumber || code[after] == "_") {
                return true
            }
            searchStart = after
        }
        return false
    }
}
