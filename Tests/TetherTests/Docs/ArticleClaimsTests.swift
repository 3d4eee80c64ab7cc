import CSQLite
import Foundation
import Testing

/// What the articles say of behaviour other tests show, checked in the articles' own words: an
/// article that drops such a claim, or goes back to one the code contradicts, fails here. Each
/// test names the tests that show the behaviour.
@Suite struct ArticleClaimsTests {
    /// The text of the file at `path` (from the package's root), its words joined by single
    /// spaces whatever the line breaks.
    static func prose(_ path: String) throws -> String {
        let text = try String(contentsOf: ArticleExamplesTests.root.appendingPathComponent(path), encoding: .utf8)
        return text.split(whereSeparator: \.isWhitespace).joined(separator: " ")
    }

    /// Records an issue for each of `claims` the file at `path` does not say, naming the file and
    /// the words (not its whole text); returns the file's prose.
    @discardableResult
    static func expect(_ path: String, says claims: [String], sourceLocation: SourceLocation = #_sourceLocation) throws
        -> String
    {
        let text = try prose(path)
        for words in claims {
            let says = text.contains(words)
            #expect(says, "\(path) should say: \(words)", sourceLocation: sourceLocation)
        }
        return text
    }

    /// Shown by ProtocolSpecTests (every receiver vector: ERROR 5 in a session; kept for a later
    /// schema, applied, or refused whole from a sync file) and the rolling-upgrade tests (columns).
    @Test func howItWorksTellsASessionsRefusalFromASyncFilesKeeping() throws {
        let howItWorks = try Self.expect(
            "Sources/TetherSync/TetherSync.docc/HowItWorks.md",
            says: [
                "**in a live session** the peer was told this database's tables in its HELLO",
                "a batch naming another is refused whole (ERROR 5 `tableNotAllowed`",
                """
                a change to a table this database does not sync (yet) is no error: it is kept whole, with its \
                versions
                """,
                "Value columns are never a reason to refuse, on either path",
            ])
        let contradicted = howItWorks.contains("names a table or column this database does not sync")
        #expect(
            !contradicted,
            "HowItWorks still says a batch naming a table or column this database does not sync is refused whole")
    }

    /// Shown by ScopedExtractionTests.anInterestOnTheParentNarrowsTheRowsHeldByReferenceToIt, by
    /// ScopedSessionTests.aCatchAllPolicyCoversThePeerANodeConnectsTo, and (a reference without
    /// its parent column, from the configuration file) by ScopeOptionsTests.peerPolicyScopesValidated.
    @Test func partialReplicationTellsReferencesRelaysAndTheParentColumn() throws {
        try Self.expect(
            "Sources/TetherSync/TetherSync.docc/PartialReplication.md",
            says: [
                "an interest on `orders` (`status = 'open'`) narrows `order_line` to the lines of open orders too",
                "on a relaying node, `*` (``PeerPolicies/others``) also covers the peer it connects to",
                "its writes outside it are refused — which makes the hub drop its own version of those rows",
                "with `\"parent-column\": \"id\"` only when the column it holds is not the parent's key",
            ])
    }

    /// Garbage collection, where operators look: shown by ScheduledGarbageCollectionTests (the large
    /// deletes, the time limit, the metrics, a peer forgotten), ServeGarbageCollectionTests (a running
    /// pair collects by itself), GarbageCollectCommandTests (`tether gc`, status, the flags) and, for
    /// a returning peer, SyncBehaviorGarbageTests.
    @Test func runningTetherServeTellsGarbageCollection() throws {
        try Self.expect(
            "Sources/TetherSync/TetherSync.docc/RunningTetherServe.md",
            says: [
                "## Garbage collection", "the tombstones of deletes **every remembered peer acknowledged**",
                """
                It runs every `--gc-interval` (default `10m`), and soon after large deletes: once 10,000 \
                tombstones were written since the last run
                """,
                "for 200 ms at most", "`--forget-peers-after` (default `30d`",
                "it gets a **full resync** of every row the node holds",
                "its own changes are taken only once it acknowledged that resync",
                """
                rows it held that the node deleted meanwhile are deleted on it, as its own deletes, and so on its \
                other peers
                """,
                """
                rows it created while away, and its edits of rows the node still holds, are kept and sent; an \
                edit of a row the node deleted loses
                """,
                "The tombstones of deletes received from a peer do not wait for that peer",
                "`tether_sync_gc_runs_total`", "`tether_sync_gc_tombstones_removed_total`",
                "`tether_sync_gc_peers_forgotten_total`",
                "`tether_sync_gc_tombstones_kept`", "`tether_sync_gc_run_seconds`", "tether gc --db",
            ])
        try Self.expect(
            "README.md", says: ["tether gc --db node.sqlite", "--gc-interval 10m", "--forget-peers-after 30d"])
    }

    /// Encryption at rest, where operators look (and the README's table of articles leads there).
    /// What SQLCipher lacks is what this library needs of the SQLite it links: version 3.37 at least.
    @Test func runningTetherServeTellsHowToEncryptAtRest() throws {
        try Self.expect(
            "Sources/TetherSync/TetherSync.docc/RunningTetherServe.md",
            says: [
                "## Encryption at rest", "**fscrypt**", "**LUKS (dm-crypt)**",
                "SQLCipher, which encrypts inside SQLite as a replacement library, is not an option here",
                "Debian 12 packages SQLCipher 3.4.1 (`libsqlcipher-dev`), built on SQLite 3.15",
            ])
        try Self.expect(
            "README.md", says: ["encryption at rest (an encrypted file system, fscrypt or LUKS; why not SQLCipher)"])
        #expect(
            sqlite3_libversion_number() >= 3_037_000, "the linked SQLite is \(String(cString: sqlite3_libversion()))")
    }
}
