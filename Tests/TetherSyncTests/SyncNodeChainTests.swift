import Foundation
import Testing
import Tether
@testable import TetherSync
import TetherTestSupport

/// Every session end and link drop of a set of nodes, as their events report them: between
/// honest nodes kept running, each one is a failure (an ERROR sent or received, a timeout, a cut).
private final class SessionFailures: Sendable {
    private let failures = LockedBox<[String]>([])
    private let connections = LockedBox(0)

    var all: [String] { failures.value }
    var linksConnected: Int { connections.value }

    func record(_ event: SyncNodeEvent, node: Int) {
        switch event {
        case let .acceptedSessionEnded(.failure(error)):
            failures.withLock { $0.append("node \(node), accepted session: \(error)") }
        case .acceptedSessionEnded(.success):
            failures.withLock { $0.append("node \(node), accepted session: ended with BYE") }
        case .link(_, .connected):
            connections.withLock { $0 += 1 }
        case let .link(peer, .disconnected(reason, _)):
            failures.withLock {
                $0.append("node \(node), link to \(peer): \(reason.map { "\($0)" } ?? "BYE from the peer")")
            }
        }
    }
}

@Suite("Sync nodes: a chain under load")
struct SyncNodeChainTests {
    static let nodeCount = 10
    static let commitsPerNode = 6
    static let rowsPerCommit = 10
    static let rowsPerNode = commitsPerNode * rowsPerCommit

    @Test(
        """
        ten nodes in a chain, rows written on every node at once, small pipelined batches: they converge with no \
        ERROR between them
        """)
    func chainConvergesWithoutErrors() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let databases = try (0..<Self.nodeCount).map { _ in try makeDatabase(columns: "name TEXT") }
        var options = SyncOptions()
        // Batches of a few rows: most catch-ups end with a batch cut at the sender's last change,
        // then a pipelined empty last batch with the same `through` (issue 22).
        options.batchLimits = BatchLimits(maximumChanges: 4, maximumBytes: 96)
        let reconnect = ReconnectPolicy(initialDelay: .milliseconds(20), maximumDelay: .milliseconds(200))
        let failures = SessionFailures()
        var nodes: [SyncNode] = []
        var watchers: [Task<Void, Never>] = []
        for (index, database) in databases.enumerated() {
            let previous = nodes.last.map { [PeerAddress(host: "127.0.0.1", port: $0.port)] } ?? []
            let node = try await SyncNode.start(
                database: database, host: "127.0.0.1", port: 0, serverTLS: try pki.serverContext(),
                clientTLS: try pki.clientContext(), peers: previous, options: options, reconnect: reconnect)
            nodes.append(node)
            watchers.append(Task { for await event in node.events { failures.record(event, node: index) } })
        }
        #expect(try await eventually { failures.linksConnected >= Self.nodeCount - 1 })

        // Every node writes at once, in several commits: the live pushes cross the catch-ups.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, database) in databases.enumerated() {
                group.addTask {
                    for commit in 0..<Self.commitsPerNode {
                        let first = index * Self.rowsPerNode + commit * Self.rowsPerCommit
                        try database.write { conn in
                            for id in first..<(first + Self.rowsPerCommit) {
                                try conn.execute(
                                    "INSERT INTO t (id, name) VALUES (?, ?)", [id, "node \(index) row \(id)"])
                            }
                        }
                    }
                }
            }
            try await group.waitForAll()
        }

        func rowCounts() throws -> [Int] {
            try databases.map { try $0.fetchValue("SELECT count(*) FROM t", as: Int.self) ?? -1 }
        }
        func pendingCounts() throws -> [Int] {
            try databases.map { try $0.pendingChangeCount(tables: ["t"]) }
        }
        let total = Self.nodeCount * Self.rowsPerNode
        let converged = try await eventually { try rowCounts().allSatisfy { $0 == total } }
        let counts = try rowCounts()
        #expect(converged, "rows on each node: \(counts)")
        // Every row sent was acknowledged, through every hop.
        let acknowledged = try await eventually { try pendingCounts().allSatisfy { $0 == 0 } }
        let pending = try pendingCounts()
        #expect(acknowledged, "pending on each node: \(pending)")
        #expect(failures.all.isEmpty, "\(failures.all.joined(separator: "\n"))")

        for node in nodes.reversed() { try await node.stop() }
        for watcher in watchers { await watcher.value }
    }
}
