import Foundation
import Testing
import TetherTestSupport

private let sqlite3 = URL(fileURLWithPath: "/usr/bin/sqlite3")

/// One value the sqlite3 shell prints for `sql` on `db`.
private func shell(_ db: String, _ sql: String) throws -> String {
    let result = try run(sqlite3, [db, sql])
    try #require(result.status == 0, "\(result)")
    return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
}

/// The JSON object `arguments` print on stdout.
private func object(_ arguments: String...) throws -> [String: Any] {
    let result = try tether(arguments)
    try #require(result.status == 0, "\(result)")
    return try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], "\(result)")
}

private func int(_ value: Any?) -> Int? { (value as? NSNumber)?.intValue }

/// A database whose `t` had 30 rows and 10 deleted, known to two peers: `near` acknowledged all
/// but the last 5 deletes and was seen 10 days ago; `gone` (certificate `node-gone`) acknowledged
/// nothing and was last seen 40 days ago.
private struct TwoPeers {
    static let near = String(repeating: "a1", count: 16)
    static let gone = String(repeating: "b2", count: 16)
    static let goneFingerprint = String(repeating: "c3", count: 32)
    let db: String
    let lastSequence: Int

    init(in directory: TemporaryDirectory) throws {
        db = directory.file("node.db")
        let schema = try directory.write("schema.sql", "CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT);")
        let made = try tether("init", "--db", db, "--schema", schema, "--sync", "t")
        try #require(made.status == 0, "\(made)")
        for sql in [
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30) INSERT INTO t SELECT i, \
            'row' FROM n
            """,
            "DELETE FROM t WHERE id <= 10",
        ] {
            let result = try tether("sql", "--db", db, sql)
            try #require(result.status == 0, "\(result)")
        }
        lastSequence = try #require(int(try object("status", "--db", db, "--json")["lastSequence"]))
        _ = try shell(
            db,
            """
            INSERT INTO tether_peers (instance_key, acknowledged_through, last_seen) VALUES
              (x'\(Self.near)', \(lastSequence - 5), CAST(strftime('%s', 'now') AS REAL) - 10 * 86400), \
            (x'\(Self.gone)', 0, CAST(strftime('%s', 'now') AS REAL) - 40 * 86400);
            INSERT INTO tether_peer_certificates (instance_key, certificate, first_seen, name, fingerprint)
              VALUES (x'\(Self.gone)', 'node-gone', CAST(strftime('%s', 'now') AS REAL) - 90 * 86400, 'node-gone', \
            '\(Self.goneFingerprint)');
            """)
    }

    func tombstones() throws -> Int { Int(try shell(db, "SELECT count(*) FROM tether_dead_t")) ?? -1 }
}

@Suite("tether gc, and what tether status says of garbage collection", .serialized)
struct GarbageCollectCommandTests {
    @Test(
        """
        status shows what each peer holds back and how close it is to the horizon; gc keeps what a remembered \
        peer lacks, forgets a peer beyond the horizon by name, and prints figures the database agrees with (text \
        and --json)
        """)
    func collectByHand() throws {
        let directory = try TemporaryDirectory()
        let node = try TwoPeers(in: directory)
        #expect(try node.tombstones() == 10)

        let before = try tether("status", "--db", node.db)
        #expect(before.stdout.contains("tombstones:     10 (peers forgotten after 30d unseen)"), "\(before)")
        #expect(
            before.stdout.contains("holds back 5 tombstones; forgotten in 19 days unless seen (not seen for 10 days)"),
            "\(before)")
        #expect(
            before.stdout.contains(
                "holds back 10 tombstones; not seen for 40 days: forgotten at the next garbage collection"), "\(before)"
        )
        let peers = try #require(try object("status", "--db", node.db, "--json")["peers"] as? [[String: Any]])
        let near = try #require(peers.first { $0["instanceKey"] as? String == TwoPeers.near })
        #expect(int(near["tombstonesHeldBack"]) == 5 && near["forgotten"] is NSNull)
        #expect(abs((int(near["secondsUntilForgotten"]) ?? 0) - 20 * 86_400) < 120, "\(near)")
        let gone = try #require(peers.first { $0["instanceKey"] as? String == TwoPeers.gone })
        #expect(int(gone["tombstonesHeldBack"]) == 10 && int(gone["secondsUntilForgotten"]) == 0, "\(gone)")
        // Another horizon, as tether serve may be given it.
        let never = try tether("status", "--db", node.db, "--forget-peers-after", "never")
        #expect(never.stdout.contains("holds back 10 tombstones; never forgotten (not seen for 40 days)"), "\(never)")

        // Every peer remembered: `gone` acknowledged nothing, so nothing goes.
        let kept = try tether("gc", "--db", node.db, "--forget-peers-after", "never")
        #expect(kept.status == 0, "\(kept)")
        #expect(
            kept.stdout.hasPrefix("removed 0 tombstones and 0 eviction records, kept 10 (horizon: sequence 0,"),
            "\(kept)")
        #expect(kept.stdout.contains("\nforgot no peer (--forget-peers-after never)\n"), "\(kept)")
        #expect(try node.tombstones() == 10)

        // The default horizon, 30 days: `gone` is forgotten, and what `near` acknowledged goes.
        let report = try object("gc", "--db", node.db, "--json")
        #expect(
            int(report["tombstonesRemoved"]) == 5 && int(report["tombstonesKept"]) == 5
                && int(report["evictionsRemoved"]) == 0, "\(report)")
        #expect(
            int(report["horizon"]) == node.lastSequence - 5 && int(report["forgetPeersAfter"]) == 30 * 86_400,
            "\(report)")
        let forgotten = try #require(report["peersForgotten"] as? [[String: Any]])
        #expect(forgotten.count == 1 && forgotten.first?["instanceKey"] as? String == TwoPeers.gone, "\(report)")
        #expect(
            forgotten.first?["certificateName"] as? String == "node-gone"
                && forgotten.first?["certificateFingerprint"] as? String == TwoPeers.goneFingerprint, "\(report)")
        #expect(try node.tombstones() == 5)

        let after = try tether("status", "--db", node.db)
        #expect(after.stdout.contains("tombstones:     5 "), "\(after)")
        #expect(
            after.stdout.contains("(not seen for 40 days): holds nothing back; gets a full resync if it returns"),
            "\(after)")
        let goneAfter = try #require(
            (try object("status", "--db", node.db, "--json")["peers"] as? [[String: Any]])?
                .first { $0["instanceKey"] as? String == TwoPeers.gone })
        #expect(
            goneAfter["forgotten"] is String && int(goneAfter["tombstonesHeldBack"]) == 0
                && goneAfter["secondsUntilForgotten"] is NSNull,
            "\(goneAfter)")

        // Run again in text: nothing left that the remembered peer acknowledged, no peer to forget.
        let again = try tether("gc", "--db", node.db)
        #expect(
            again.status == 0 && again.stdout.hasPrefix("removed 0 tombstones and 0 eviction records, kept 5 "),
            "\(again)")
        #expect(again.stdout.contains("\nforgot no peer (peers not seen for 30d are forgotten)\n"), "\(again)")
    }

    @Test("tether gc prints a forgotten peer by instance key, certificate name and fingerprint, in text")
    func forgottenPeerInText() throws {
        let directory = try TemporaryDirectory()
        let node = try TwoPeers(in: directory)
        let result = try tether("gc", "--db", node.db)
        #expect(result.status == 0, "\(result)")
        #expect(
            result.stdout.contains(
                "removed 5 tombstones and 0 eviction records, kept 5 (horizon: sequence \(node.lastSequence - 5),"),
            "\(result)")
        #expect(
            result.stdout.contains("forgot 1 peer not seen for 30d (each gets a full resync if it returns):"),
            "\(result)")
        #expect(
            result.stdout.contains("  \(TwoPeers.gone), node-gone, sha256:\(TwoPeers.goneFingerprint), last seen "),
            "\(result)")
    }

    @Test(
        """
        bad flags: a duration without its unit, a unit not taken, zero, a horizon given twice (command line or \
        file); a database missing or syncing nothing; serve's --gc-interval checked before it starts
        """)
    func badFlags() throws {
        let directory = try TemporaryDirectory()
        let node = try TwoPeers(in: directory)
        for value in ["10", "3w", "0d", "1.5d", "d", "forever"] {
            let result = try tether("gc", "--db", node.db, "--forget-peers-after", value)
            #expect(result.status == 64 && result.isOneLineError, "\(value): \(result)")
            #expect(
                result.stderr.contains(
                    """
                    --forget-peers-after \(value): expected a whole number and a unit: 90s, 10m, 12h, 30d, or \
                    never (see: tether help gc)
                    """),
                "\(value): \(result)")
        }
        let twice = try tether("gc", "--db", node.db, "--forget-peers-after", "1d", "--forget-peers-after", "2d")
        #expect(
            twice.status == 64 && twice.stderr.contains("--forget-peers-after given twice (1d, then 2d)"), "\(twice)")
        let arrayInFile = try directory.write("two.json", #"{"db": "\#(node.db)", "forget-peers-after": ["1d", "2d"]}"#)
        let fromFile = try tether("gc", "--config", arrayInFile)
        #expect(
            fromFile.status == 64 && fromFile.isOneLineError
                && fromFile.stderr.contains(#""forget-peers-after" holds 2 values"#), "\(fromFile)")
        // From the configuration file, as serve would take it.
        let config = try directory.write(
            "gc.json", #"{"db": "\#(node.db)", "forget-peers-after": "never", "json": true}"#)
        let configured = try object("gc", "--config", config)
        #expect(configured["forgetPeersAfter"] is NSNull && int(configured["tombstonesRemoved"]) == 0, "\(configured)")

        let missing = try tether("gc", "--db", directory.file("missing.db"))
        #expect(missing.status == 66 && missing.isOneLineError, "\(missing)")
        let plain = directory.file("plain.db")
        let schema = try directory.write("plain.sql", "CREATE TABLE p (id INTEGER PRIMARY KEY);")
        #expect(try tether("init", "--db", plain, "--schema", schema).status == 0)
        let syncsNothing = try tether("gc", "--db", plain)
        #expect(
            syncsNothing.status == 65 && syncsNothing.isOneLineError && syncsNothing.stderr.contains("syncs no table"),
            "\(syncsNothing)")

        let tls = ["--cert", "c.pem", "--key", "k.pem", "--ca", "ca.pem"]
        let interval = try tether(["serve", "--db", node.db, "--listen", "127.0.0.1:0", "--gc-interval", "soon"] + tls)
        #expect(interval.status == 64 && interval.isOneLineError, "\(interval)")
        #expect(
            interval.stderr.contains(
                """
                --gc-interval soon: expected a whole number and a unit: 90s, 10m, 12h, 30d, or never (see: tether \
                help serve)
                """),
            "\(interval)")
        let horizon = try tether(
            ["serve", "--db", node.db, "--listen", "127.0.0.1:0", "--forget-peers-after", "30"] + tls)
        #expect(horizon.status == 64 && horizon.stderr.contains("--forget-peers-after 30: expected"), "\(horizon)")
    }
}
