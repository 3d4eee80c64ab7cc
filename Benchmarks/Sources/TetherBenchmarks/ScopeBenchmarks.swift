import Foundation
import Tether
import TetherSync

/// A record of one of ten sites: what a hub serving ten site nodes holds (partial replication,
/// issue 23). Each site node's scope is its own site's rows, a tenth of the table.
@Model
struct SitedRecord: Codable, Equatable, Sendable {
    var id: Int64
    var site: String
    var name: String
    var count: Int64
    var value: Double

    static let tableName = "sited_record"
    static let siteCount = 10

    static func makeInputs(count: Int) -> [SitedRecord] {
        (0..<count).map { index in
            let number = index + 1
            return SitedRecord(
                id: Int64(number), site: siteName(number % siteCount), name: "name-\(number)",
                count: Int64(number % 1000),
                value: Double(number) * 0.25)
        }
    }

    static func siteName(_ index: Int) -> String { "site-\(index)" }
}

/// Extraction for a scoped peer against the same extraction unscoped, over the same changes.
enum ScopeBenchmarks {
    /// The peer both lines extract for (membership is recorded under its key).
    private static let peer = InstanceKey(hex: "5c09e5c09e5c09e5c09e5c09e5c09e5c")

    /// A site node's scope: its own site's rows.
    static func siteScope(_ index: Int) -> SyncScope {
        SyncScope(
            ["sited_record": .filter("site = :peer_name")],
            parameters: ["peer_name": .text(SitedRecord.siteName(index))])
    }

    /// Extracting every change of the sited database (`rowCount` rows, ten sites) for a peer
    /// holding everything, batch by batch as `engine.apply` extracts: the extract half of
    /// `engine.apply`, the rate `scope.extract` is compared with.
    static let engineExtract = Benchmark(name: "engine.extract", unit: "changes/s", bestIs: .higher, comparison: nil) {
        context in
        try extractionRate(context, scope: nil)
    }.countingInstructions()

    /// The same changes extracted for a peer whose scope holds one site (a tenth of the rows): the
    /// scope is decided for every change, and the rows it holds are recorded. Per change of the
    /// log, as `engine.extract`.
    static let scopeExtract = Benchmark(
        name: "scope.extract", unit: "changes/s", bestIs: .higher,
        comparison: Comparison(baseline: "engine.extract", goal: 0.8, better: .higher)
    ) { context in
        try extractionRate(context, scope: siteScope(3))
    }.countingInstructions()

    /// A tenth of the rows (one site's) moving from one site to another, over sessions as
    /// `sync.tls` syncs: a hub serving the sited database, each site scoped by its certificate's
    /// name (`site = :peer_name`), both sites holding their rows; the hub moves every row of the
    /// first site to the second (before the clock starts), then the first site syncs (the rows
    /// are evicted there) and the second (they move in), one after the other, each with
    /// `syncOnce` over TLS 1.3 on loopback. Moved rows per second of both syncs.
    static let scopeMove = Benchmark(
        name: "scope.move", unit: "rows/s", bestIs: .higher,
        comparison: Comparison(baseline: "sync.tls", goal: 0.5, better: .higher)
    ) { context in
        try moveRate(context)
    }

    private static func moveRate(_ context: BenchmarkContext) throws -> Double {
        let pki = try context.sitePKI()
        let (from, to) = (SitedRecord.siteName(3), SitedRecord.siteName(4))
        let serverTLS = try pki.serverContext()
        let fromTLS = try pki.clientContext(site: from)
        let toTLS = try pki.clientContext(site: to)
        return try context.withSitedSourceDatabase { hubPath in
            try context.withFreshDatabasePath { fromPath in
                try context.withFreshDatabasePath { toPath in
                    let hub = try Database(path: hubPath)
                    let fromSite = try Database(path: fromPath)
                    let toSite = try Database(path: toPath)
                    defer {
                        try? fromSite.close()
                        try? toSite.close()
                        try? hub.close()
                    }
                    for site in [fromSite, toSite] {
                        try site.createTable(SitedRecord.self)
                        try site.enableSync(for: SitedRecord.self)
                    }
                    var policy = SyncOptions()
                    policy.peers.others = PeerPolicy(scopes: [SitedRecord.tableName: .filter("site = :peer_name")])
                    let options = policy
                    let server = try blockingAwait {
                        try await SyncServer.start(database: hub, tls: serverTLS, options: options)
                    }
                    defer { try? blockingAwait { try await server.stop() } }
                    let port = server.port
                    func sync(_ site: Database, _ tls: TLSContext) throws -> SyncSummary {
                        try blockingAwait {
                            try await SyncClient.syncOnce(database: site, host: "127.0.0.1", port: port, tls: tls)
                        }
                    }
                    func count(_ db: Database, site: String) throws -> Int {
                        try db.fetchValue(
                            "SELECT count(*) FROM \(SitedRecord.tableName) WHERE site = ?", [site], as: Int.self) ?? -1
                    }
                    let perSite = context.rowCount / SitedRecord.siteCount
                    // Twice each: a site's first session after receiving its rows sends their echoes
                    // back (the hub's cursor on it moves past them), which is no part of the move.
                    for _ in 1...2 {
                        _ = try sync(fromSite, fromTLS)
                        _ = try sync(toSite, toTLS)
                    }
                    guard try count(fromSite, site: from) == perSite, try count(toSite, site: to) == perSite else {
                        throw BenchmarkFailure(
                            description: "before the move, the sites do not hold their \(perSite) rows each")
                    }
                    log("  scope.move: moving \(perSite) rows from \(from) to \(to)")
                    try hub.execute("UPDATE \(SitedRecord.tableName) SET site = ? WHERE site = ?", [to, from])
                    var summaries: [SyncSummary] = []
                    var halves: [Double] = []
                    let seconds = try timed {
                        for (site, tls) in [(fromSite, fromTLS), (toSite, toTLS)] {
                            let (summary, half) = try timed { try sync(site, tls) }
                            summaries.append(summary)
                            halves.append(half)
                        }
                    }.seconds
                    let held = (
                        try fromSite.fetchValue("SELECT count(*) FROM \(SitedRecord.tableName)", as: Int.self),
                        try count(toSite, site: to)
                    )
                    guard held.0 == 0, held.1 == 2 * perSite else {
                        throw BenchmarkFailure(
                            description: "after the move, the first site holds \(held.0.map(String.init) ?? "?") rows "
                                + "(expected 0) "
                                + "and the second \(held.1) of its site (expected \(2 * perSite))")
                    }
                    log(
                        "  scope.move: \(perSite) rows in \(formatNumber(seconds)) s (leaving "
                            + "\(formatNumber(halves[0])) s, arriving \(formatNumber(halves[1])) s); received "
                            + "\(summaries.map(\.changesReceived)) changes "
                            + "in \(summaries.map(\.batchesReceived)) batches, \(summaries.map(\.bytesReceived)) bytes")
                    return Double(perSite) / seconds
                }
            }
        }
    }

    private static func extractionRate(_ context: BenchmarkContext, scope: SyncScope?) throws -> Double {
        guard let peer else { throw BenchmarkFailure(description: "the benchmark peer's key is not 32 hex characters") }
        return try context.withSitedSourceDatabase { path in
            let db = try Database(path: path)
            defer { try? db.close() }
            var extracted = 0
            var batches = 0
            let seconds = try timed {
                var cursor: Int64 = 0
                while true {
                    let batch = try db.extractChanges(
                        for: peer, after: cursor, limits: BatchLimits(maximumChanges: 5_000),
                        markInFlight: false, scope: scope)
                    extracted += batch.changes.count
                    batches += 1
                    cursor = batch.through
                    if batch.isLast { break }
                }
            }.seconds
            let expected = scope == nil ? context.rowCount : context.rowCount / SitedRecord.siteCount
            guard extracted == expected else {
                throw BenchmarkFailure(
                    description: "extracted \(extracted) changes in \(batches) batches, expected \(expected)")
            }
            return Double(context.rowCount) / seconds
        }
    }
}

extension BenchmarkContext {
    /// Runs `body` with a fresh copy of a synced database holding `rowCount` sited records
    /// (built once per run, bulk-inserted as `withSyncedSourceDatabase`'s records are).
    func withSitedSourceDatabase<T>(_ body: (String) throws -> T) throws -> T {
        let template = try syncedTemplate(named: "sited-source", of: SitedRecord.self, rows: rowCount) { db in
            try db.insert(contentsOf: SitedRecord.makeInputs(count: rowCount))
        }
        return try withFreshDatabasePath { path in
            try FileManager.default.copyItem(atPath: template, toPath: path)
            return try body(path)
        }
    }
}

/// The certificates of `scope.move`: a CA, the hub's, and one per site, named as the site (the
/// name a scope's `:peer_name` takes).
struct SitePKI {
    let directory: String
    static let sites = [SitedRecord.siteName(3), SitedRecord.siteName(4)]

    func serverContext() throws -> TLSContext {
        try TLSContext(
            configuration: .server(
                certificateChainFile: directory + "/hub.crt", privateKeyFile: directory + "/hub.key",
                trustedCAFile: directory + "/ca.crt"))
    }

    func clientContext(site: String) throws -> TLSContext {
        try TLSContext(
            configuration: .client(
                certificateChainFile: directory + "/\(site).crt", privateKeyFile: directory + "/\(site).key",
                trustedCAFile: directory + "/ca.crt"))
    }

    static func create(in directory: String) throws -> SitePKI {
        let validity: TimeInterval = 86_400
        let ca = try CertificateAuthority.create(commonName: "Tether Bench Sites CA", validity: validity)
        try CertificateAuthority.write(
            ca, certificatePath: directory + "/ca.crt", privateKeyPath: directory + "/ca.key")
        for name in ["hub"] + sites {
            let credentials = try CertificateAuthority.issue(commonName: name, signedBy: ca, validity: validity)
            try CertificateAuthority.write(
                credentials, certificatePath: directory + "/\(name).crt", privateKeyPath: directory + "/\(name).key")
        }
        return SitePKI(directory: directory)
    }
}

extension BenchmarkContext {
    func sitePKI() throws -> SitePKI {
        try cachedValue(named: "site-pki") {
            try SitePKI.create(in: try runSubdirectory(named: "site-pki").path)
        }
    }
}
