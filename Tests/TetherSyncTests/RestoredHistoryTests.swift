import Foundation
import Testing
@testable import Tether
@testable import TetherSync
import TetherTestSupport
import TetherWire

/// A database restored in place (a snapshot rolled back: same file, same inode) and written
/// since names other changes with sequence numbers its peers hold (issue 22). Over sessions with
/// `histories`, the peer's mark of its history shows it (Protocol/README.md §8.9).
@Suite("Restored in place: two histories under one key, over sync sessions")
struct RestoredHistoryTests {
    /// One `syncOnce` of `client` with a server over `server`.
    @discardableResult
    static func sync(_ server: Database, _ client: Database, pki: TestPKI, options: SyncOptions = SyncOptions())
        async throws -> SyncSummary
    {
        try await withSyncServer(server, pki: pki) { syncServer in
            try await SyncClient.syncOnce(
                database: client, host: "127.0.0.1", port: syncServer.port, tls: try pki.clientContext(),
                options: options)
        }
    }

    /// The error a `syncOnce` ended with, nil if it succeeded.
    static func failure(_ server: Database, _ client: Database, pki: TestPKI) async -> (any Error)? {
        do {
            try await sync(server, client, pki: pki)
            return nil
        } catch {
            return error
        }
    }

    @Test(
        """
        a node restored in place and written since is refused by its peer's mark, as client and as server, while \
        its other peers sync; after a rekey every row is on every node
        """)
    func restoredNodeIsRefusedThenRekeyed() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let directory = try TemporaryDirectory()
        let path = directory.file("a.db")
        var a = try NoteDatabase.open(path)
        let c = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        let d = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        try NoteDatabase.insert(["r1", "r2"], into: a)
        try await Self.sync(c, a, pki: pki)
        try a.close()
        let snapshot = try Data(contentsOf: URL(fileURLWithPath: path))
        a = try NoteDatabase.open(path)
        try NoteDatabase.insert(["r3", "r4", "r5"], into: a)
        try await Self.sync(c, a, pki: pki)
        try await Self.sync(c, d, pki: pki)
        #expect(try c.historyMark(of: a.instanceKey)?.through == (try a.lastSequence()))
        try a.close()

        try restoreInPlace(path, from: snapshot)
        a = try NoteDatabase.open(path)
        #expect(try a.detectedCopy() == nil)
        try NoteDatabase.insert(["n1", "n2", "n3", "n4", "n5", "n6"], into: a)
        // As the client: its own side refuses c's pull, with the fix.
        let asClient = await Self.failure(c, a, pki: pki)
        #expect(asClient.map { "\($0)".contains("tether rekey") } == true, "\(String(describing: asClient))")
        #expect(try a.detectedCopy()?.kind == .restored)
        // As the server: c's session ends with a's ERROR, which names the fix too.
        let asServer = await Self.failure(a, c, pki: pki)
        #expect(asServer.map { "\($0)".contains("tether rekey") } == true, "\(String(describing: asServer))")
        #expect(try NoteDatabase.ids(c) == ["r1", "r2", "r3", "r4", "r5"])
        #expect(try NoteDatabase.ids(a) == ["n1", "n2", "n3", "n4", "n5", "n6", "r1", "r2"])
        // c alone is refused: d, which holds no mark past the restored point, syncs with a meanwhile
        // and gets its new rows (a's undone rows, which d got through c, are echoes to a until the rekey).
        try await Self.sync(a, d, pki: pki)
        #expect(try NoteDatabase.ids(d) == ["n1", "n2", "n3", "n4", "n5", "n6", "r1", "r2", "r3", "r4", "r5"])
        #expect(try a.historyFindings().map(\.peer) == [c.instanceKey])

        try a.resetInstanceKey()
        try await Self.sync(c, a, pki: pki)
        try await Self.sync(c, d, pki: pki)
        let everything = ["n1", "n2", "n3", "n4", "n5", "n6", "r1", "r2", "r3", "r4", "r5"]
        for node in [a, c, d] { #expect(try NoteDatabase.ids(node) == everything) }
        // Later sessions show the marks kept since, and refuse nothing.
        try NoteDatabase.insert(["n7"], into: a)
        try await Self.sync(c, a, pki: pki)
        #expect(try NoteDatabase.ids(c).contains("n7"))
    }

    @Test("with a peer that does not offer histories (an earlier release), sessions sync as before and no mark is kept")
    func withoutTheCapabilityNothingChanges() async throws {
        let pki = try TestPKI()
        defer { pki.directory.remove() }
        let server = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        let client = try makeDatabase(schema: NoteDatabase.schema, syncing: ["note"])
        try NoteDatabase.insert(["s1"], into: server)
        try NoteDatabase.insert(["c1"], into: client)
        var older = SyncOptions()
        older.testHooks.offersHistories = false
        try await Self.sync(server, client, pki: pki, options: older)
        #expect(try NoteDatabase.ids(server) == ["c1", "s1"] && NoteDatabase.ids(client) == ["c1", "s1"])
        #expect(try server.historyMark(of: client.instanceKey) == nil)
        #expect(try client.historyMark(of: server.instanceKey) == nil)
        // Both offering it: each keeps the other's mark.
        try await Self.sync(server, client, pki: pki)
        #expect(try server.historyMark(of: client.instanceKey) != nil)
        #expect(try client.historyMark(of: server.instanceKey) != nil)
    }
}
