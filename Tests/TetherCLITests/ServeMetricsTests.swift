import Foundation
import Testing
import TetherTestSupport

#if canImport(Glibc)
    import Glibc
#endif

// `tether serve --metrics`: the Prometheus endpoint of a node run as a separate process.

/// Connects to 127.0.0.1:`port`, sends `request`, and returns what comes back until the other side closes.
func exchange(port: Int, _ request: [UInt8]) throws -> [UInt8] {
    let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    try #require(socket >= 0, "socket(): errno \(errno)")
    defer { close(socket) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
        }
    }
    try #require(connected == 0, "connect to 127.0.0.1:\(port): errno \(errno)")
    try #require(request.withUnsafeBytes { send(socket, $0.baseAddress, $0.count, 0) } == request.count)
    var response: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let read = chunk.withUnsafeMutableBytes { recv(socket, $0.baseAddress, $0.count, 0) }
        try #require(read >= 0, "recv: errno \(errno)")
        if read == 0 { break }
        response += chunk[..<read]
    }
    return response
}

/// An HTTP/1.1 GET of `path` on 127.0.0.1:`port` (the connection closed after the answer): the
/// status code and the body.
func httpGet(port: Int, _ path: String) throws -> (status: Int, body: String) {
    let request = "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n"
    let text = String(decoding: try exchange(port: port, Array(request.utf8)), as: UTF8.self)
    let parts = text.components(separatedBy: "\r\n\r\n")
    let statusLine = parts.first?.split(separator: "\r\n").first ?? ""
    let status = try #require(
        statusLine.split(separator: " ").dropFirst().first.flatMap { Int($0) }, "no status line: \(text)")
    return (status, parts.dropFirst().joined(separator: "\r\n\r\n"))
}

/// The samples of a Prometheus text: "name{labels}" (or "name") → value.
func samples(_ text: String) -> [String: Double] {
    var samples: [String: Double] = [:]
    for line in text.split(separator: "\n") where !line.hasPrefix("#") {
        guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else {
            continue
        }
        samples[String(line[..<space])] = value
    }
    return samples
}

/// Whether the TCP ports process `pid` listens on are exactly `expected`, read again until they are
/// (or the tests' window passes):
/// /proc/net/tcp comes a page per read, and while other tests open and close sockets a read can skip
/// lines. What it found last is in `found`.
private func listensOn(_ expected: Set<Int>, pid: Int32, found: inout Set<Int>) throws -> Bool {
    try eventually(checkingEvery: .milliseconds(50)) {
        found = try listeningPorts(of: pid)
        return found == expected
    }
}

/// The TCP ports process `pid` listens on (from /proc: its socket inodes, matched in /proc/net/tcp).
private func listeningPorts(of pid: Int32) throws -> Set<Int> {
    let descriptors = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")
    let inodes = Set(
        descriptors.compactMap { fd -> String? in
            guard let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(fd)"),
                target.hasPrefix("socket:[")
            else { return nil }
            return String(target.dropFirst("socket:[".count).dropLast())
        })
    var ports: Set<Int> = []
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        // Read to the end: procfs files report no size, and String(contentsOfFile:) stops after the first 4 KiB.
        guard let file = FileHandle(forReadingAtPath: table) else { continue }
        defer { try? file.close() }
        let text = String(decoding: file.readDataToEndOfFile(), as: UTF8.self)
        for line in text.split(separator: "\n").dropFirst() {
            // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            let fields = line.split(separator: " ")
            guard fields.count > 9, fields[3] == "0A", inodes.contains(String(fields[9])),
                let port = fields[1].split(separator: ":").last.flatMap({ Int($0, radix: 16) })
            else { continue }
            ports.insert(port)
        }
    }
    return ports
}

@Suite("tether serve --metrics", .serialized)
struct ServeMetricsTests {
    @Test(
        """
        --metrics answers /health and /metrics; after a sync the peer's series hold its counts; without it \
        nothing more listens
        """)
    func scrape() throws {
        let fixture = try ServeFixture()
        let nodes = ServeProcesses()
        defer { nodes.killAll() }
        let (a, flagsA) = try fixture.node("a")
        let (b, flagsB) = try fixture.node("b")
        #expect(
            try tether("sql", "--db", a, "INSERT INTO t (id, body, n) VALUES (1, 'a', 1), (2, 'a', 2), (3, 'a', 3)")
                .status == 0)
        #expect(
            try tether("sql", "--db", b, "INSERT INTO t (id, body, n) VALUES (10, 'b', 10), (11, 'b', 11)").status == 0)
        let status = try tether("status", "--db", b, "--json")
        let keyB = try #require(
            (try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])?["instanceKey"]
                as? String)

        let server = try nodes.start(fixture.serveArguments(db: a, flags: flagsA) + ["--metrics", "127.0.0.1:0"])
        let listening = try #require(server.waitForListening(), "\(server.summary)")
        let line = try #require(server.waitForLine(startingWith: "metrics on "), "\(server.summary)")
        let port = try #require(line.split(separator: ":").last.flatMap { Int($0) }, "\(line)")
        #expect(line == "metrics on 127.0.0.1:\(port)" && port > 0)
        var found: Set<Int> = []
        #expect(try listensOn([listening.port, port], pid: server.pid, found: &found), "\(found)")

        let health = try httpGet(port: port, "/health")
        #expect(health.status == 200, "\(health)")
        #expect(try httpGet(port: port, "/nowhere").status == 404)

        let synced = try tether(["sync", "--db", b, "--peer", "127.0.0.1:\(listening.port)"] + flagsB)
        #expect(synced.status == 0 && synced.stdout.contains("sent 2, received 3"), "\(synced)")

        let scraped = try httpGet(port: port, "/metrics")
        #expect(scraped.status == 200)
        let text = scraped.body
        for (name, type) in [
            ("tether_sync_sessions_open", "gauge"), ("tether_sync_sessions_total", "counter"),
            ("tether_sync_changes_sent_total", "counter"), ("tether_sync_batch_apply_seconds", "histogram"),
            ("tether_sync_pending_changes", "gauge"),
        ] {
            #expect(text.contains("# TYPE \(name) \(type)\n"), "\(name) \(type) in:\n\(text)")
        }
        let values = samples(text)
        let peer = "{peer=\"\(keyB)\"}"
        #expect(values["tether_sync_changes_sent_total\(peer)"] == 3, "\(text)")
        #expect(values["tether_sync_changes_received_total\(peer)"] == 2, "\(text)")
        #expect(values["tether_sync_changes_applied_total\(peer)"] == 2, "\(text)")
        #expect(values["tether_sync_conflicts_total\(peer)"] == 0, "\(text)")
        #expect(values["tether_sync_changes_kept_aside_total\(peer)"] == 0, "\(text)")
        #expect((values["tether_sync_bytes_sent_total\(peer)"] ?? 0) > 0, "\(text)")
        #expect((values["tether_sync_bytes_received_total\(peer)"] ?? 0) > 0, "\(text)")
        #expect(values["tether_sync_sessions_total"] == 1, "\(text)")
        #expect(values["tether_sync_batch_apply_seconds_count"] == 1, "\(text)")
        #expect(values["tether_sync_batch_apply_seconds_bucket{le=\"+Inf\"}"] == 1, "\(text)")
        // B acknowledged A's three rows, and holds its own two: nothing pending for it.
        #expect(values["tether_sync_pending_changes\(peer)"] == 0, "\(text)")
        #expect(
            !text.contains("tether_sync_batches_refused_total")
                && !text.contains("tether_sync_tls_handshake_failures_total"))

        // Computed at each scrape: a write on A is pending for B until B syncs again.
        #expect(try tether("sql", "--db", a, "UPDATE t SET n = 100 WHERE id = 1").status == 0)
        #expect(samples(try httpGet(port: port, "/metrics").body)["tether_sync_pending_changes\(peer)"] == 1)

        // A plaintext connection to the sync port: a failed TLS handshake.
        let answer = try exchange(port: listening.port, Array("GET / HTTP/1.1\r\n\r\n".utf8))
        #expect(!String(decoding: answer, as: UTF8.self).contains("HTTP"), "the sync port answered HTTP")
        #expect(
            samples(try httpGet(port: port, "/metrics").body)[
                "tether_sync_tls_handshake_failures_total{reason=\"notTLS\"}"] == 1)

        // A second node asking for the same metrics port: exit 69, one line naming it; a bad address: 64.
        let taken = try nodes.start(fixture.serveArguments(db: b, flags: flagsB) + ["--metrics", "127.0.0.1:\(port)"])
        #expect(taken.waitForExit(timeout: 15) == 69, "\(taken.summary)")
        #expect(
            taken.stderr.hasPrefix("tether: error: cannot serve metrics on 127.0.0.1:\(port)")
                && taken.stderr.contains("in use"),
            "\(taken.summary)")
        let badAddress = try nodes.start(fixture.serveArguments(db: b, flags: flagsB) + ["--metrics", "nowhere"])
        #expect(badAddress.waitForExit(timeout: 15) == 64, "\(badAddress.summary)")
        #expect(server.isRunning, "\(server.summary)")
        #expect(server.stop() == 0, "\(server.summary)")

        // Off by default: a node without --metrics listens on its sync port only, and says nothing of metrics.
        let plain = try nodes.start(fixture.serveArguments(db: b, flags: flagsB))
        let plainListening = try #require(plain.waitForListening(), "\(plain.summary)")
        #expect(try listensOn([plainListening.port], pid: plain.pid, found: &found), "\(found)")
        #expect(plain.stop() == 0, "\(plain.summary)")
        #expect(!plain.stdout.contains("metrics"), "\(plain.summary)")
    }
}
