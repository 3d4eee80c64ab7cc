import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// The certificate each peer's instance key is pinned to, and the one it presented last
/// (`checkPeer`, `pinPeer`, `peers()`), as `tether status` shows them.
@Suite struct PeerCertificateTests {
    let peer = InstanceKey(hex: String(repeating: "1a", count: 16))
    let first = PeerIdentity(name: "north", fingerprint: String(repeating: "AB", count: 32))
    let renewed = PeerIdentity(name: "north", fingerprint: String(repeating: "cd", count: 32))

    @Test(
        """
        a key is pinned to its certificate's name and the certificate recorded; a renewed certificate of that \
        name is recorded in its place; another name is refused
        """)
    func pinnedAndRecorded() throws {
        let db = try Database(path: ":memory:")
        let peer = try #require(peer)
        #expect(try db.checkPeer(peer, certificate: first) == false, "not pinned yet")
        try db.pinPeer(peer, to: first)
        #expect(try db.checkPeer(peer, certificate: first) == true)
        try db.execute("INSERT INTO tether_peers (instance_key) VALUES (?)", [Data(peer.bytes)])
        let recorded = try #require(try db.peers().first)
        #expect(recorded.pinnedCertificate == "north")
        #expect(recorded.certificate == PeerIdentity(name: "north", fingerprint: String(repeating: "ab", count: 32)))

        #expect(try db.checkPeer(peer, certificate: renewed) == false, "a renewed certificate is recorded next")
        try db.pinPeer(peer, to: renewed)
        #expect(try db.checkPeer(peer, certificate: renewed) == true)
        #expect(try db.peers().first?.certificate == renewed)

        let south = PeerIdentity(name: "south", fingerprint: String(repeating: "ef", count: 32))
        #expect(throws: SyncError.self) { try db.checkPeer(peer, certificate: south) }
        #expect(throws: SyncError.self) { try db.pinPeer(peer, to: south) }
        #expect(try db.peers().first?.certificate == renewed, "a refused certificate is not recorded")
    }

    @Test(
        """
        a database of format 4 (pins without the certificate) gains the columns when opened: its pins stay, and \
        the certificate is recorded at the peer's next session
        """)
    func formatFourGainsTheColumns() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let path = directory.file("format4.db")
        let peer = try #require(peer)
        do {
            let db = try Database(path: path)
            try db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
            try db.enableSync(table: "t")
            try db.execute("DROP TABLE tether_peer_certificates")
            try db.execute(
                """
                CREATE TABLE tether_peer_certificates (instance_key BLOB PRIMARY KEY, certificate TEXT NOT NULL, \
                first_seen REAL NOT NULL) STRICT
                """)
            try db.execute("INSERT INTO tether_peer_certificates VALUES (?, 'north', 0)", [Data(peer.bytes)])
            try db.execute("INSERT INTO tether_peers (instance_key) VALUES (?)", [Data(peer.bytes)])
            try db.execute("UPDATE tether_meta SET value = 4 WHERE key = 'format'")
            try db.close()
        }
        let db = try Database(path: path)
        defer { try? db.close() }
        #expect(
            try db.fetchValue("SELECT value FROM tether_meta WHERE key = 'format'", as: Int.self)
                == RowMetadataLayout.formatVersion)
        let columns = try db.fetchRows("SELECT name FROM pragma_table_info('tether_peer_certificates')").map {
            try $0.get(0, as: String.self)
        }
        #expect(columns == ["instance_key", "certificate", "first_seen", "name", "fingerprint"])
        let before = try #require(try db.peers().first)
        #expect(before.pinnedCertificate == "north" && before.certificate == nil)
        #expect(try db.checkPeer(peer, certificate: first) == false, "pinned, but its certificate is not recorded yet")
        try db.pinPeer(peer, to: first)
        #expect(try db.peers().first?.certificate == first)
        #expect(try db.peerCertificates()[peer] == "north")
    }
}
