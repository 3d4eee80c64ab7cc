import Foundation
import Tether

/// Sync over emulated WAN links (the issue's "Links" goal): the two peers run in two network
/// namespaces joined by the user-space link emulator of ../shared/tools/linkemu (`linkemu.py`: a
/// rate per direction, RTT/2 of delay each way, a drop-tail queue of one bandwidth-delay product,
/// optional random loss), each peer a child of this process (`SyncPeerChild`). Needs root (network
/// namespaces, TUN devices), `ip` and python3, so these lines run only when asked
/// (`./Scripts/bench.sh links.`), never in the default run.
///
/// Per link:
/// - `links.catchup.LINK`: one `syncOnce` of `catchUpRows` rows of random content (300,000 by
///   default) from A (server) to an empty B (client), in changes/s, timed in B as `sync.tls` is;
/// - `links.catchup.LINK.link_share`: the IP bytes A sent onto the link during that sync (counted
///   by the emulator, headers included) × 8 / its seconds / the link's rate. Goal ≥ 0.85;
/// - `links.latency.LINK.p50` / `.p99`: commit on A → visible on B, in ms, over a live session
///   (`SyncClient.connect`, caught up): A commits one row at a time through the library, B's
///   `onBatchApplied` marks it visible; both take CLOCK_MONOTONIC, one clock for the whole machine.
///   Each commit comes once the previous one is visible on B and RTT/2 + 5-10 ms more has passed
///   (B's acknowledgement has reached A: the link is idle). Goals p50 ≤ RTT/2 + 3 ms, p99 ≤ RTT/2 +
///   10 ms on the loss-free links.
///
/// `loopback` is the reference: the same runs on 127.0.0.1 without the emulator (and no share).
/// Before measuring through an emulated link, a TCP probe (Scripts/linkcheck.py) checks its round
/// trip; with TETHER_LINKS_GOODPUT_SECONDS=S it also logs the bare link's bulk goodput over S s.
enum LinkBenchmarks {
    static let group = "links"

    /// One link: a rate per direction (nil: loopback, no emulator), a round-trip time, a random loss.
    struct Link: Sendable {
        let name: String
        let rateMbit: Double?
        let rttMs: Double
        let loss: Double

        var isEmulated: Bool { rateMbit != nil }
        /// TSO packets through the emulator above 50 Mbit/s (its packet rate would bound it
        /// otherwise), never on a lossy link (one loss would take a whole 64-KiB packet).
        var offload: Bool { (rateMbit ?? 0) > 50 && loss == 0 }
    }

    static let links = [
        Link(name: "loopback", rateMbit: nil, rttMs: 0, loss: 0),
        Link(name: "100mbit_20ms", rateMbit: 100, rttMs: 20, loss: 0),
        Link(name: "20mbit_80ms", rateMbit: 20, rttMs: 80, loss: 0),
        Link(name: "5mbit_250ms", rateMbit: 5, rttMs: 250, loss: 0),
        Link(name: "20mbit_80ms_loss1", rateMbit: 20, rttMs: 80, loss: 0.01),
    ]

    /// Every line, in registry order: per link, the catch-up, its share, the latency's p50 and p99.
    static let lines: [Benchmark] = links.flatMap { lines(for: $0) }

    private static func lines(for link: Link) -> [Benchmark] {
        let catchUpName = "links.catchup.\(link.name)"
        var lines = [
            Benchmark(name: catchUpName, unit: "changes/s", bestIs: .higher, comparison: nil) { context in
                let run = try sharedCatchUp(context, link, for: catchUpName)
                return Double(run.changes) / run.seconds
            }
        ]
        if link.isEmulated {
            let shareName = catchUpName + ".link_share"
            lines.append(
                Benchmark(name: shareName, unit: "fraction", bestIs: .higher, comparison: nil) { context in
                    try sharedCatchUp(context, link, for: shareName).linkShare ?? .nan
                })
        }
        for (suffix, isP50) in [("p50", true), ("p99", false)] {
            let name = "links.latency.\(link.name).\(suffix)"
            lines.append(
                Benchmark(name: name, unit: "ms", bestIs: .lower, comparison: nil) { context in
                    let run = try context.sharedRun(named: "links-latency-\(link.name)", for: name) {
                        try measureLatency(context, link)
                    }
                    return isP50 ? run.p50 : run.p99
                })
        }
        return lines.map { $0.runningOnlyWhenAsked(as: group) }
    }

    // MARK: Catch-up

    struct CatchUpRun {
        var changes: Int
        var seconds: Double
        /// IP bytes on the link from A to B per second over the link's rate (nil on loopback).
        var linkShare: Double?
    }

    private static func sharedCatchUp(_ context: BenchmarkContext, _ link: Link, for line: String) throws
        -> CatchUpRun
    {
        try context.sharedRun(named: "links-catchup-\(link.name)", for: line) { try measureCatchUp(context, link) }
    }

    /// Starts the server child (A) on a copy of the random source, then the client child (B) on an
    /// empty synced table; B's `syncOnce` is the measurement. The emulator's counters are zeroed
    /// before B starts, so that they hold this session only (TCP and TLS handshakes included).
    private static func measureCatchUp(_ context: BenchmarkContext, _ link: Link) throws -> CatchUpRun {
        let rows = try positiveIntegerSetting("TETHER_LINKS_ROWS", default: 300_000)
        let source = try context.randomSyncedSource(rowCount: rows)
        let pki = try context.syncPKI()
        return try context.withFreshDatabasePath { sourcePath in
            try FileManager.default.copyItem(atPath: source.template, toPath: sourcePath)
            return try context.withFreshDatabasePath { targetPath in
                try createSyncedTable(at: targetPath)
                let run = try LinkNetwork.with(link) { network in
                    let server = try network.start(
                        "sync server", in: .a,
                        [SyncPeerChild.flag, "server", sourcePath, pki.directory, network.serverHost])
                    defer { server.terminateIfRunning() }
                    let port = try server.value(of: "port", timeout: 60)
                    try network.resetCounters()
                    let client = try network.start(
                        "sync client", in: .b,
                        [SyncPeerChild.flag, "client-whole", targetPath, pki.directory, port, network.serverHost])
                    defer { client.terminateIfRunning() }
                    let clientReport = try client.finish(timeout: 1800)
                    let serverReport = try server.finish(timeout: 60)
                    return try summarizeCatchUp(
                        link, rows: rows, client: clientReport, server: serverReport, stats: try network.stats())
                }
                try context.verifyStoredRecords(at: targetPath, expected: source.summary)
                return run
            }
        }
    }

    private static func summarizeCatchUp(
        _ link: Link, rows: Int, client: ChildReport, server: ChildReport, stats: LinkStats?
    ) throws -> CatchUpRun {
        let received = try client.integer("received")
        let seconds = try client.number("seconds")
        let frameBytes = try client.integer("frameBytes")
        guard received == rows, try server.integer("sent") == rows else {
            throw BenchmarkFailure(
                description: "links.catchup.\(link.name): the server sent \(server["sent"] ?? "?") changes and the "
                    + "client received \(received), expected \(rows)")
        }
        let frameMbit = Double(frameBytes) * 8 / seconds / 1e6
        var message =
            "  links.catchup.\(link.name): \(received) changes in \(formatNumber(seconds)) s "
            + "(\(formatNumber(Double(received) / seconds)) changes/s), \(frameBytes) frame bytes "
            + "(\(formatNumber(Double(frameBytes) / Double(received))) per change, \(formatNumber(frameMbit)) Mbit/s); "
            + "\(client["batches"] ?? "?") batches; CPU s sender \(server["cpu"] ?? "?"), "
            + "receiver \(client["cpu"] ?? "?")"
        var share: Double?
        if let stats, let rate = link.rateMbit {
            let linkShare = Double(stats.sentBytes) * 8 / seconds / (rate * 1e6)
            share = linkShare
            message +=
                "\n    on the link A→B: \(stats.sentBytes) IP bytes (\(formatNumber(linkShare)) of "
                + "\(formatNumber(rate)) Mbit/s over the sync's seconds; frame bytes alone "
                + "\(formatNumber(frameMbit / rate)))"
            if let busy = stats.transferSeconds {
                message +=
                    ", \(formatNumber(Double(stats.sentBytes) * 8 / busy / (rate * 1e6))) over the connection's "
                    + "\(formatNumber(busy)) s from SYN to its last byte from A"
            }
            message += "; \(stats.summary)"
            message += "\n    goal link share ≥ 0.85: \(linkShare >= 0.85 ? "met" : "MISSED")"
        }
        log(message)
        return CatchUpRun(changes: received, seconds: seconds, linkShare: share)
    }

    // MARK: Live latency

    /// Serves an empty synced table from A (live-server child), connects B (live-client child,
    /// caught up when it reports ready), then commits `TETHER_LINKS_COMMITS` rows (200 by default)
    /// one at a time as the type's comment says; each sample is B's applied time minus A's time
    /// before the insert.
    private static func measureLatency(_ context: BenchmarkContext, _ link: Link) throws
        -> (p50: Double, p99: Double)
    {
        let commits = try positiveIntegerSetting("TETHER_LINKS_COMMITS", default: 200)
        let pki = try context.syncPKI()
        return try context.withFreshDatabasePath { sourcePath in
            try context.withFreshDatabasePath { targetPath in
                try createSyncedTable(at: sourcePath)
                try createSyncedTable(at: targetPath)
                return try LinkNetwork.with(link) { network in
                    let server = try network.start(
                        "live server", in: .a,
                        [SyncPeerChild.flag, "live-server", sourcePath, pki.directory, network.serverHost])
                    defer { server.terminateIfRunning() }
                    let port = try server.value(of: "port", timeout: 60)
                    let client = try network.start(
                        "live client", in: .b,
                        [SyncPeerChild.flag, "live-client", targetPath, pki.directory, port, network.serverHost])
                    defer { client.terminateIfRunning() }
                    _ = try client.value(of: "live", timeout: 120)
                    try network.resetCounters()
                    var samples: [Double] = []
                    samples.reserveCapacity(commits)
                    for index in 1...commits {
                        try server.send("commit \(index)")
                        let committed = try timestamp(server.value(of: "commit", timeout: 30), index: index)
                        var visible: Int?
                        while visible == nil {
                            let words = try client.value(of: "applied", timeout: 30).split(separator: " ")
                            guard words.count == 2, let total = Int(words[0]), let time = Int(words[1]) else {
                                throw BenchmarkFailure(description: "the live client reported applied \(words)")
                            }
                            guard total <= index else {
                                throw BenchmarkFailure(
                                    description: "B applied \(total) changes after commit \(index): more than committed"
                                )
                            }
                            if total == index { visible = time }
                        }
                        samples.append(Double((visible ?? committed) - committed) / 1e6)
                        // The link idle again: B's acknowledgement reached A.
                        Thread.sleep(forTimeInterval: (link.rttMs / 2 + 5 + Double.random(in: 0..<5)) / 1000)
                    }
                    let stats = try network.stats()
                    try client.send("quit")
                    let clientReport = try client.finish(timeout: 60)
                    try server.send("quit")
                    let serverReport = try server.finish(timeout: 60)
                    guard try clientReport.integer("received") == commits else {
                        throw BenchmarkFailure(
                            description: "B received \(clientReport["received"] ?? "?") changes, expected \(commits)")
                    }
                    return summarizeLatency(link, samples: samples.sorted(), stats: stats, server: serverReport)
                }
            }
        }
    }

    /// Parses the live server's `INDEX T` for commit `index`.
    private static func timestamp(_ text: String, index: Int) throws -> Int {
        let words = text.split(separator: " ")
        guard words.count == 2, Int(words[0]) == index, let time = Int(words[1]) else {
            throw BenchmarkFailure(description: "the live server reported commit \(text), expected commit \(index)")
        }
        return time
    }

    private static func summarizeLatency(_ link: Link, samples: [Double], stats: LinkStats?, server: ChildReport)
        -> (p50: Double, p99: Double)
    {
        let percentile = { (p: Double) in NetworkSyncBenchmarks.percentile(p, ofSorted: samples) }
        let (p50, p99) = (percentile(0.5), percentile(0.99))
        var message =
            "  links.latency.\(link.name): \(samples.count) commits, min \(formatNumber(samples[0])) ms, p50 "
            + "\(formatNumber(p50)) ms, p90 \(formatNumber(percentile(0.9))) ms, p99 \(formatNumber(p99)) ms, max "
            + "\(formatNumber(samples[samples.count - 1])) ms; CPU s of A \(server["cpu"] ?? "?")"
        if let stats { message += "\n    on the link: \(stats.summary)" }
        let half = link.rttMs / 2
        let verdicts = [("p50", p50, half + 3), ("p99", p99, half + 10)].map { name, value, goal in
            "\(name) ≤ \(formatNumber(goal)) ms: \(value <= goal ? "met" : "MISSED")"
        }
        message += "\n    goals (RTT/2 + 3 / + 10 ms\(link.loss > 0 ? ", set for loss-free links only" : "")): "
        message += verdicts.joined(separator: ", ")
        log(message)
        return (p50, p99)
    }

    /// An empty synced record table in a new database at `path`.
    private static func createSyncedTable(at path: String) throws {
        let db = try Database(path: path)
        defer { try? db.close() }
        try db.createTable(BenchmarkRecord.self)
        try db.enableSync(for: BenchmarkRecord.self)
    }
}

// MARK: The random source

extension BenchmarkRecord {
    /// Row `id` of the links' source: a random 20-character name (letters and digits) and a random
    /// count and value, which LZ4 cannot shrink much (unlike `makeInputs`' names and multiples).
    static func random(id: Int, using generator: inout some RandomNumberGenerator) -> BenchmarkRecord {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyz0123456789".utf8)
        var name = [UInt8](repeating: 0, count: 20)
        for position in name.indices {
            name[position] = alphabet[Int.random(in: 0..<alphabet.count, using: &generator)]
        }
        return BenchmarkRecord(
            id: Int64(id), name: String(decoding: name, as: UTF8.self),
            count: Int64.random(in: 0..<1_000_000_000, using: &generator),
            value: Double.random(in: 0..<1_000_000, using: &generator))
    }
}

/// SplitMix64: the same random source on every run.
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension BenchmarkContext {
    /// A synced database of `rowCount` random records (`BenchmarkRecord.random`, seeded), inserted
    /// 50,000 per transaction, built once per run, and the summary of its content (read back from
    /// the file, as the copy's is).
    func randomSyncedSource(rowCount: Int) throws -> (template: String, summary: ContentSummary) {
        let name = "links-source-\(rowCount)"
        let template = try syncedTemplate(named: name, of: BenchmarkRecord.self, rows: rowCount) { db in
            var generator = SeededGenerator(seed: 0x7E7E_5EED)
            let slice = 50_000
            for start in stride(from: 0, to: rowCount, by: slice) {
                let records = (start..<min(rowCount, start + slice)).map {
                    BenchmarkRecord.random(id: $0 + 1, using: &generator)
                }
                try db.insert(contentsOf: records)
            }
        }
        let summary = try cachedValue(named: "\(name)-summary") { try summarizeWithCAPI(path: template) }
        return (template, summary)
    }
}

// MARK: The network

/// What the emulator counted since its last reset (its `stats` line), in the direction A → B
/// (what the server sends) unless named otherwise.
struct LinkStats {
    var sentBytes: Int
    var summary: String
    /// From the first SYN of the connection to the last packet with payload from A, in seconds.
    var transferSeconds: Double?

    init(json: [String: Any]) throws {
        guard let ab = json["ab"] as? [String: Any], let ba = json["ba"] as? [String: Any],
            let bytes = (ab["ip_bytes"] as? NSNumber)?.intValue
        else {
            throw BenchmarkFailure(description: "linkemu's stats have no ab/ba ip_bytes: \(json.keys.sorted())")
        }
        sentBytes = bytes
        func number(_ object: [String: Any], _ key: String) -> String {
            (object[key] as? NSNumber).map { formatNumber($0.doubleValue) } ?? "?"
        }
        let cpu = (json["cpu_s"] as? NSNumber)?.doubleValue ?? 0
        let wall = (json["wall_s"] as? NSNumber)?.doubleValue ?? 0
        summary =
            "A→B \(number(ab, "packets")) packets, dropped \(number(ab, "dropped_queue")) at the queue and "
            + "\(number(ab, "dropped_loss")) by loss, deepest queue \(number(ab, "max_backlog_bytes")) bytes; "
            + "B→A \(number(ba, "ip_bytes")) bytes, \(number(ba, "dropped_queue")) + \(number(ba, "dropped_loss")) "
            + "dropped; emulator CPU \(formatNumber(cpu)) s in \(formatNumber(wall)) s "
            + "(\(formatNumber(wall > 0 ? cpu / wall * 100 : 0)) % of a core), delivered late by up to "
            + "\(number(ab, "late_max_ms")) ms (mean \(number(ab, "late_mean_ms")) ms)"
        // The 10-ms slots from the first to the last in which A sent anything, and those it sent nothing in.
        let slots = ((ab["timeline_10ms"] as? [[NSNumber]]) ?? []).compactMap { $0.first?.intValue }
        if let first = slots.min(), let last = slots.max() {
            let span = last - first + 1
            summary +=
                "; A sent nothing in \(span - Set(slots).count) of the \(span) 10-ms slots from its first "
                + "packet to its last"
        }
        // The connection that carried the most from its server (A): from its SYN to its last payload from A.
        let flows = (json["flows"] as? [[String: Any]]) ?? []
        if let main = flows.max(by: { Self.serverBytes(of: $0) < Self.serverBytes(of: $1) }),
            let syn = (main["syn"] as? NSNumber)?.doubleValue,
            let lastPayload = main["last_payload"] as? [String: Any],
            let last = (lastPayload[Self.serverDirection(of: main)] as? NSNumber)?.doubleValue, last > syn
        {
            transferSeconds = last - syn
        }
    }

    /// The direction in which the flow's server sends ("ba" when its client sent from A).
    private static func serverDirection(of flow: [String: Any]) -> String {
        (flow["client_dir"] as? String) == "ab" ? "ba" : "ab"
    }

    private static func serverBytes(of flow: [String: Any]) -> Int {
        ((flow["bytes"] as? [String: Any])?[serverDirection(of: flow)] as? NSNumber)?.intValue ?? 0
    }
}

/// The two peers' network: for an emulated link, two network namespaces (A at 10.77.0.1, B at
/// 10.77.0.2) joined by linkemu's TUN devices; for loopback, this process's own. Created for one
/// run and always torn down (`with`), unless this process is killed: then delete its namespaces,
/// tethA-PID and tethB-PID, with `ip netns del` (linkemu's devices go when it ends).
final class LinkNetwork {
    enum Side { case a, b }

    let link: LinkBenchmarks.Link
    /// Where A's server listens and B connects.
    var serverHost: String { link.isEmulated ? "10.77.0.1" : "127.0.0.1" }

    private let tools: Tools?
    private let names: (namespaceA: String, namespaceB: String, deviceA: String, deviceB: String)
    private var emulator: LineProcess?
    private var createdNamespaces: [String] = []

    /// Runs `body` with the network of `link`, set up and checked, and tears it down afterwards
    /// whatever happened (emulator quit, namespaces deleted).
    static func with<T>(_ link: LinkBenchmarks.Link, _ body: (LinkNetwork) throws -> T) throws -> T {
        let network = try LinkNetwork(link: link)
        defer { network.tearDown() }
        try network.setUp()
        return try body(network)
    }

    private init(link: LinkBenchmarks.Link) throws {
        self.link = link
        if link.isEmulated { tools = try Tools.find() } else { tools = nil }
        // Names of this process's own: another run at the same time has its own.
        let id = getpid()
        names = ("tethA-\(id)", "tethB-\(id)", "tethTa\(id)", "tethTb\(id)")
    }

    /// Starts the emulator, makes the namespaces, moves a device into each, and probes the link.
    private func setUp() throws {
        guard let tools, let rate = link.rateMbit else { return }
        // A child that died must not kill this process when it writes to its stdin.
        signal(SIGPIPE, SIG_IGN)
        var arguments = [
            tools.emulatorScript, "--dev-a", names.deviceA, "--dev-b", names.deviceB,
            "--rate-mbit", "\(rate)", "--rtt-ms", "\(link.rttMs)",
        ]
        if link.loss > 0 { arguments += ["--loss", "\(link.loss)"] }
        if link.offload { arguments.append("--offload") }
        let emulator = try LineProcess(name: "linkemu", executable: tools.python, arguments: arguments)
        self.emulator = emulator
        let ready = try emulator.nextLine(timeout: 30)
        guard ready.hasPrefix("ready") else {
            throw BenchmarkFailure(description: "linkemu said \"\(ready)\", expected ready")
        }
        for (namespace, device, address, peer) in [
            (names.namespaceA, names.deviceA, "10.77.0.1", "10.77.0.2"),
            (names.namespaceB, names.deviceB, "10.77.0.2", "10.77.0.1"),
        ] {
            try ip(["netns", "add", namespace])
            createdNamespaces.append(namespace)
            try ip(["-n", namespace, "link", "set", "lo", "up"])
            try ip(["link", "set", device, "netns", namespace])
            try ip(["-n", namespace, "addr", "add", address, "peer", peer, "dev", device])
            try ip(["-n", namespace, "link", "set", device, "mtu", "1500", "up"])
        }
        try probe()
    }

    /// Quits the emulator (its devices go with it) and deletes the namespaces; logs what fails.
    private func tearDown() {
        if let emulator {
            do {
                try emulator.send("quit")
                _ = try emulator.finish(timeout: 10)
            } catch {
                log("links: linkemu did not quit (\(error)); terminating it")
            }
            emulator.terminateIfRunning()
            self.emulator = nil
        }
        for namespace in createdNamespaces.reversed() {
            do { try ip(["netns", "del", namespace]) } catch {
                log("links: could not delete network namespace \(namespace): \(error)")
            }
        }
        createdNamespaces = []
    }

    /// This executable in child mode (`SyncPeerChild`) on `side`.
    func start(_ name: String, in side: Side, _ arguments: [String]) throws -> LineProcess {
        let executable = Bundle.main.executableURL?.path ?? CommandLine.arguments[0]
        return try run(name, in: side, executable: executable, arguments)
    }

    private func run(_ name: String, in side: Side, executable: String, _ arguments: [String]) throws
        -> LineProcess
    {
        guard let tools else { return try LineProcess(name: name, executable: executable, arguments: arguments) }
        let namespace = side == .a ? names.namespaceA : names.namespaceB
        return try LineProcess(
            name: name, executable: tools.ip, arguments: ["netns", "exec", namespace, executable] + arguments)
    }

    /// Zeroes the emulator's counters (nothing on loopback).
    func resetCounters() throws {
        guard let emulator else { return }
        try emulator.send("reset")
        let answer = try emulator.nextLine(timeout: 10)
        guard answer == "ok" else { throw BenchmarkFailure(description: "linkemu answered reset with \(answer)") }
    }

    /// The emulator's counters since the last reset (nil on loopback).
    func stats() throws -> LinkStats? {
        guard let emulator else { return nil }
        try emulator.send("stats")
        let line = try emulator.nextLine(timeout: 30)
        guard let json = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
            throw BenchmarkFailure(description: "linkemu's stats are not a JSON object: \(line.prefix(200))")
        }
        return try LinkStats(json: json)
    }

    /// The link alone: round trips over TCP between the namespaces (Scripts/linkcheck.py), which
    /// must take about the link's RTT; with TETHER_LINKS_GOODPUT_SECONDS, a bulk transfer from A to
    /// B too, logged.
    private func probe() throws {
        guard let tools else { return }
        let bulkSeconds = Double(ProcessInfo.processInfo.environment["TETHER_LINKS_GOODPUT_SECONDS"] ?? "") ?? 0
        let port = "7999"
        let server = try run(
            "linkcheck server", in: .a, executable: tools.python, [tools.checkScript, "serve", serverHost, port])
        defer { server.terminateIfRunning() }
        let listening = try server.nextLine(timeout: 30)
        guard listening == "listening" else {
            throw BenchmarkFailure(description: "linkcheck serve said \"\(listening)\", expected listening")
        }
        let client = try run(
            "linkcheck probe", in: .b, executable: tools.python,
            [tools.checkScript, "probe", serverHost, port, "--pings", "5", "--bulk-seconds", "\(bulkSeconds)"])
        defer { client.terminateIfRunning() }
        let report = try client.finish(timeout: 60 + bulkSeconds * 2)
        _ = try server.finish(timeout: 30)
        let rtts = (report["rtt_ms"] ?? "").split(separator: " ").compactMap { Double($0) }
        guard let fastest = rtts.first else {
            throw BenchmarkFailure(description: "link check \(link.name): no round trip measured")
        }
        guard fastest >= link.rttMs * 0.95, fastest <= link.rttMs * 1.5 + 20 else {
            throw BenchmarkFailure(
                description:
                    "link check \(link.name): a TCP round trip takes \(fastest) ms, expected about \(link.rttMs) ms")
        }
        var message = "  links \(link.name): link checked, TCP round trips min/median/max \(report["rtt_ms"] ?? "?") ms"
        let goodput = (report["goodput_mbit"] ?? "").split(separator: " ").compactMap { Double($0) }
        if goodput.count >= 2, let rate = link.rateMbit {
            message +=
                "; bulk goodput A→B over \(formatNumber(bulkSeconds)) s: \(formatNumber(goodput[0])) Mbit/s whole, "
                + "\(formatNumber(goodput[1])) Mbit/s in its second half (rate × 1448/1500 = "
                + "\(formatNumber(rate * 1448 / 1500)); \(formatNumber(goodput[1] / (rate * 1448 / 1500))) of it)"
        }
        log(message)
    }

    @discardableResult
    private func ip(_ arguments: [String]) throws -> String {
        guard let tools else { return "" }
        let process = Process()
        let errors = Pipe()
        process.executableURL = URL(fileURLWithPath: tools.ip)
        process.arguments = arguments
        process.standardError = errors
        try process.run()
        let message = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationReason == .exit, process.terminationStatus == 0 else {
            throw BenchmarkFailure(
                description: "ip \(arguments.joined(separator: " ")) failed: "
                    + String(decoding: message, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
        }
        return String(decoding: message, as: UTF8.self)
    }

    /// What an emulated link needs: root, `ip`, python3, the emulator and the probe.
    struct Tools {
        var ip: String
        var python: String
        var emulatorScript: String
        var checkScript: String

        static func find() throws -> Tools {
            guard geteuid() == 0 else {
                throw BenchmarkFailure(
                    description: "the links.* lines need root (network namespaces and TUN devices): run "
                        + "./Scripts/bench.sh links. as root")
            }
            let environment = ProcessInfo.processInfo.environment
            let emulatorScript = environment["TETHER_LINKEMU"] ?? "../shared/tools/linkemu/linkemu.py"
            let checkScript = environment["TETHER_LINKCHECK"] ?? "Scripts/linkcheck.py"
            for (script, variable) in [(emulatorScript, "TETHER_LINKEMU"), (checkScript, "TETHER_LINKCHECK")]
            where !FileManager.default.isReadableFile(atPath: script) {
                throw BenchmarkFailure(
                    description: "the links.* lines need \(script) (set \(variable) to its path; "
                        + "./Scripts/bench.sh sets both)")
            }
            let python = try interpreter(try executable(named: "python3"))
            return Tools(
                ip: try executable(named: "ip"), python: python,
                emulatorScript: URL(fileURLWithPath: emulatorScript).standardizedFileURL.path,
                checkScript: URL(fileURLWithPath: checkScript).standardizedFileURL.path)
        }

        /// The path of `name` on PATH (or in /usr/sbin, /sbin, where `ip` lives).
        private static func executable(named name: String) throws -> String {
            let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
            let directories = path.split(separator: ":").map(String.init) + ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            for directory in directories where FileManager.default.isExecutableFile(atPath: directory + "/" + name) {
                return directory + "/" + name
            }
            throw BenchmarkFailure(description: "the links.* lines need \(name), which is not on PATH")
        }

        /// The interpreter itself (sys.executable), not a wrapper such as pyenv's shim, so that it
        /// runs the same under `ip netns exec`.
        private static func interpreter(_ python: String) throws -> String {
            let process = try LineProcess(
                name: "python3", executable: python, arguments: ["-c", "import sys; print('python', sys.executable)"])
            let report = try process.finish(timeout: 30)
            guard let path = report["python"], FileManager.default.isExecutableFile(atPath: path) else {
                throw BenchmarkFailure(description: "\(python) did not name its interpreter")
            }
            return path
        }
    }
}

/// A process whose stdin this one writes and whose stdout it reads a line at a time, each read with
/// a time limit (a peer that hangs fails the line instead of the run). Lines are `key value`;
/// `value(of:)` takes the next one of a key and leaves the others to be taken in their turn.
final class LineProcess {
    let name: String
    private let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private var pending = Data()
    private var unread: [String] = []
    private var ended = false

    init(name: String, executable: String, arguments: [String]) throws {
        self.name = name
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardInput = input
        process.standardOutput = output
        // stderr is inherited: the child's logs go where this process's go.
        try process.run()
    }

    func send(_ line: String) throws {
        try input.fileHandleForWriting.write(contentsOf: Data((line + "\n").utf8))
    }

    /// The next line, whatever it is.
    func nextLine(timeout: Double) throws -> String {
        let deadline = Date(timeIntervalSinceNow: timeout)
        while unread.isEmpty { try fill(until: deadline, waiting: "a line") }
        return unread.removeFirst()
    }

    /// What follows `key ` on the next line that starts so.
    func value(of key: String, timeout: Double) throws -> String {
        let deadline = Date(timeIntervalSinceNow: timeout)
        let prefix = key + " "
        while true {
            if let index = unread.firstIndex(where: { $0.hasPrefix(prefix) }) {
                return String(unread.remove(at: index).dropFirst(prefix.count))
            }
            try fill(until: deadline, waiting: key)
        }
    }

    /// Waits for the process to exit (terminating it after `timeout` seconds), reads the rest of
    /// its output, and returns every `key value` line not taken yet (the last of each key). Throws
    /// unless it exited with status 0.
    func finish(timeout: Double) throws -> ChildReport {
        let deadline = Date(timeIntervalSinceNow: timeout)
        while process.isRunning {
            if Date() >= deadline {
                terminateIfRunning()
                throw BenchmarkFailure(description: "the \(name) did not end within \(timeout) s")
            }
            if ended {
                Thread.sleep(forTimeInterval: 0.01)
            } else {
                _ = try? fill(until: Date(timeIntervalSinceNow: 0.01), waiting: "")
            }
        }
        // What it wrote before it exited (a process it started may still hold the pipe: no EOF).
        while !ended, (try? fill(until: Date(), waiting: "")) != nil {}
        if !pending.isEmpty { unread.append(String(decoding: pending, as: UTF8.self)) }
        pending.removeAll()
        guard process.terminationReason == .exit, process.terminationStatus == 0 else {
            throw BenchmarkFailure(description: "the \(name) failed (status \(process.terminationStatus))")
        }
        var values: [String: String] = [:]
        for line in unread {
            let parts = line.split(separator: " ", maxSplits: 1)
            if parts.count == 2 { values[String(parts[0])] = String(parts[1]) }
        }
        unread.removeAll()
        return ChildReport(values: values)
    }

    /// SIGTERM, then SIGKILL if it is still there 5 s later.
    func terminateIfRunning() {
        guard process.isRunning else { return }
        process.terminate()
        let deadline = Date(timeIntervalSinceNow: 5)
        while process.isRunning, Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
    }

    /// Reads what the pipe holds, waiting for it until `deadline`; throws at the deadline or the
    /// end of the output.
    private func fill(until deadline: Date, waiting what: String) throws {
        guard !ended else { throw BenchmarkFailure(description: "the \(name) ended without reporting \(what)") }
        let descriptor = output.fileHandleForReading.fileDescriptor
        var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(max(0, min(deadline.timeIntervalSinceNow * 1000, 3_600_000)).rounded(.up))
        let ready = poll(&poller, 1, milliseconds)
        guard ready > 0 else {
            if ready < 0, errno == EINTR { return }
            throw BenchmarkFailure(description: "the \(name) did not report \(what) in time")
        }
        var buffer = [UInt8](repeating: 0, count: 65_536)
        let count = read(descriptor, &buffer, buffer.count)
        guard count > 0 else {
            if count < 0, errno == EINTR || errno == EAGAIN { return }
            ended = true
            throw BenchmarkFailure(description: "the \(name) ended without reporting \(what)")
        }
        pending.append(contentsOf: buffer[0..<count])
        while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
            unread.append(String(decoding: pending[pending.startIndex..<newline], as: UTF8.self))
            pending.removeSubrange(pending.startIndex...newline)
        }
    }
}
