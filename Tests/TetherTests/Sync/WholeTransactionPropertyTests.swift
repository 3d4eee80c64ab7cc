import Foundation
import Testing
@testable import Tether
import TetherTestSupport

/// Issue 37's property: a peer shows only states that existed. Two sites of a ledger, each written
/// by one node only — "a" by A, "s" by S, a peer scoped to its site — in random transactions that
/// keep, per site, the money constant and the account moves equal to twice the journal's entries:
/// single transfers, runs of transfers, opened and closed accounts, and transactions of hundreds
/// of changes that span many batches. B relays A to C, which sometimes pulls from A directly; A
/// takes S's writes under S's scope and relays them; S pulls its site from A. Each sync step moves
/// one batch of one link, as a session does (after the staged catch-up, through the wire encoding,
/// `receive`, one ACK per catch-up); kills lose a batch or an ACK and sometimes close and reopen a
/// database from its file; disconnects leave a link mid catch-up for a while.
///
/// After every step, every node holds, of each of its sites, nothing or a state the site's writer
/// held (its fingerprint), which keeps the invariant. Each step commits at most one transaction
/// touching the ledger on a node (staging touches only Tether's tables), so these checks see every
/// state a reader could have. At the end, with every link synced until none moves anything, A, B
/// and C hold the same rows and S holds A's rows of site "s".
@Suite(.serialized, .timeLimit(.minutes(2))) struct WholeTransactionPropertyTests {
    /// TETHER_WHOLE_SEED=n replays one seed (n,m,… several).
    static let seeds: [UInt64] =
        ProcessInfo.processInfo.environment["TETHER_WHOLE_SEED"].map {
            $0.split(separator: ",").compactMap { UInt64($0) }
        } ?? Array(1...5)

    @Test(arguments: seeds)
    func everyObservedStateExistedAndEveryNodeConverges(seed: UInt64) throws {
        var run = try LedgerRun(seed: seed, directory: try TemporaryDirectory())
        try run.play(steps: 400)
        guard run.violation == nil else { return }
        try run.settle()
        guard run.violation == nil else { return }
        try run.expectConverged()
        let stats = run.stats
        let context = "seed \(seed): \(stats)"
        // The run went through what it is about: catch-ups applied with staged batches (S's writes
        // included), long ones, lost batches, reopened files, disconnects mid catch-up.
        #expect(stats.appliedWithStaged >= 5 && stats.scopedWritesAppliedWithStaged > 0, "\(context)")
        #expect(stats.longestStagedChain >= 5, "\(context)")
        #expect(stats.lostBatches > 0 && stats.reopened > 0 && stats.leftMidCatchUp > 0, "\(context)")
    }
}

/// A change of the ledger: each keeps its site's money and makes its moves twice its journal entries.
private enum LedgerOperation {
    /// `amount` from one account to another: both move once.
    case transfer(from: Int64, to: Int64, amount: Int, entry: Int64)
    /// A new account funded from another: both move once.
    case open(account: Int64, fundedBy: Int64, amount: Int, entry: Int64)
    /// An account's balance goes to another, and it is deleted: the entry keeps its moves (and
    /// the one closing it), the other account moves once.
    case close(account: Int64, into: Int64, entry: Int64)

    func execute(site: String, _ conn: Connection) throws {
        switch self {
        case let .transfer(from, to, amount, entry):
            try conn.execute(
                "UPDATE accounts SET balance = balance - ?, moves = moves + 1 WHERE id = ?", [amount, from])
            try conn.execute("UPDATE accounts SET balance = balance + ?, moves = moves + 1 WHERE id = ?", [amount, to])
            try conn.execute(
                "INSERT INTO journal (id, site, account_from, account_to, amount) VALUES (?, ?, ?, ?, ?)",
                [entry, site, from, to, amount])
        case let .open(account, fundedBy, amount, entry):
            try conn.execute("INSERT INTO accounts VALUES (?, ?, ?, 1)", [account, site, amount])
            try conn.execute(
                "UPDATE accounts SET balance = balance - ?, moves = moves + 1 WHERE id = ?", [amount, fundedBy])
            try conn.execute(
                "INSERT INTO journal (id, site, account_from, account_to, amount) VALUES (?, ?, ?, ?, ?)",
                [entry, site, fundedBy, account, amount])
        case let .close(account, into, entry):
            try conn.execute(
                """
                INSERT INTO journal (id, site, account_from, account_to, amount, moves_retired) \
                SELECT ?, site, id, ?, balance, moves + 1 FROM accounts WHERE id = ?
                """, [entry, into, account])
            try conn.execute(
                """
                UPDATE accounts SET balance = balance + (SELECT balance FROM accounts WHERE id = ?), \
                moves = moves + 1 WHERE id = ?
                """, [account, into])
            try conn.execute("DELETE FROM accounts WHERE id = ?", [account])
        }
    }
}

/// What a node holds of one site, summed up.
private struct SiteFingerprint: Hashable, CustomStringConvertible {
    /// The money its accounts hold.
    var balance: Int
    /// The moves of its accounts, and of those closed (the entries closing them keep them).
    var moves: Int
    /// Its journal's entries.
    var entries: Int
    /// Its accounts.
    var accounts: Int
    /// A hash sum of each table's rows: equal fingerprints, equal rows (short of a collision no
    /// random run meets).
    var rowHashes: [Int]

    static let empty = SiteFingerprint(balance: 0, moves: 0, entries: 0, accounts: 0, rowHashes: [0, 0])

    init(balance: Int, moves: Int, entries: Int, accounts: Int, rowHashes: [Int]) {
        (self.balance, self.moves, self.entries, self.accounts, self.rowHashes) =
            (balance, moves, entries, accounts, rowHashes)
    }

    init(site: String, on db: Database) throws {
        // Each row's hash is taken modulo a prime, so that the sums stay far from overflowing.
        let row = try db.fetchRows(
            """
            SELECT (SELECT coalesce(sum(balance), 0) FROM accounts WHERE site = ?1),
                (SELECT coalesce(sum(moves), 0) FROM accounts WHERE site = ?1)
                    + (SELECT coalesce(sum(moves_retired), 0) FROM journal WHERE site = ?1),
                (SELECT count(*) FROM journal WHERE site = ?1),
                (SELECT count(*) FROM accounts WHERE site = ?1),
                (SELECT coalesce(sum((id * 2654435761 + balance * 40503 + moves * 977) % 1000000007), 0)
                    FROM accounts WHERE site = ?1),
                (SELECT coalesce(sum((id * 2654435761 + coalesce(account_from, 0) * 40503
                    + coalesce(account_to, 0) * 977 + coalesce(amount, 0) * 31 + moves_retired) % 1000000007), 0)
                    FROM journal WHERE site = ?1)
            """, [site])
        let values = try (0..<6).map { try row[0].get($0, as: Int.self) }
        self.init(
            balance: values[0], moves: values[1], entries: values[2], accounts: values[3],
            rowHashes: Array(values[4...]))
    }

    /// The ledger's invariant: nothing yet, or all the site's money with two moves per entry.
    var keepsTheInvariant: Bool {
        self == .empty || (balance == LedgerRun.siteMoney && moves == 2 * entries)
    }

    var description: String { "\(accounts) accounts holding \(balance) with \(moves) moves, \(entries) entries" }
}

/// One random run: the nodes, their links, and what the run saw.
private struct LedgerRun {
    static let schema = """
        CREATE TABLE accounts (id INTEGER PRIMARY KEY, site TEXT NOT NULL, balance INTEGER NOT NULL,
            moves INTEGER NOT NULL);
        CREATE TABLE journal (id INTEGER PRIMARY KEY, site TEXT NOT NULL, account_from INTEGER, account_to INTEGER,
            amount INTEGER, moves_retired INTEGER NOT NULL DEFAULT 0);
        """
    static let openingAccounts = 12
    static let openingBalance = 1_000
    static let siteMoney = openingAccounts * openingBalance
    /// S's scope, as A applies S's writes and extracts for S.
    static let scopeOfS = SyncScope(
        ["accounts": .filter("site = :peer_name"), "journal": .filter("site = :peer_name")],
        parameters: ["peer_name": .text("s")])

    struct Node {
        let name: String
        let path: String
        var db: Database
        /// The sites it holds.
        let sites: [String]
    }

    enum LinkKind: Equatable {
        /// The destination pulls everything the source holds.
        case whole
        /// The destination pulls the source's rows inside S's scope.
        case scopedPull
        /// The destination takes the source's writes, each checked against S's scope.
        case scopedWrites
    }

    struct Link: Hashable, CustomStringConvertible {
        let source: Int
        let destination: Int
        let kind: LinkKind
        /// How often a sync picks it, relative to the others.
        let weight: Int
        var description: String { "\(LedgerRun.names[source])→\(LedgerRun.names[destination])" }
    }

    struct Stats: CustomStringConvertible {
        var transactions = 0
        var batches = 0
        var appliedWithStaged = 0
        var scopedWritesAppliedWithStaged = 0
        var longestStagedChain = 0
        var lostBatches = 0
        var lostAcknowledgements = 0
        var reopened = 0
        var leftMidCatchUp = 0
        var description: String {
            """
            \(transactions) transactions, \(batches) batches, \(appliedWithStaged) catch-ups applied with staged \
            batches (\(scopedWritesAppliedWithStaged) of S's writes), longest staged \(longestStagedChain), \
            \(lostBatches) batches and \(lostAcknowledgements) ACKs lost, \(reopened) reopened, \
            \(leftMidCatchUp) left mid catch-up
            """
        }
    }

    /// The nodes, by index.
    static let (a, b, c, s) = (0, 1, 2, 3)
    static let names = ["A", "B", "C", "S"]

    let seed: UInt64
    /// Holds the databases' files: it goes with the run.
    let directory: TemporaryDirectory
    var random: SeededGenerator
    var nodes: [Node]
    static let pullOfS = Link(source: a, destination: s, kind: .scopedPull, weight: 2)
    static let links = [
        Link(source: a, destination: b, kind: .whole, weight: 3),
        Link(source: b, destination: c, kind: .whole, weight: 3),
        Link(source: a, destination: c, kind: .whole, weight: 1),
        pullOfS,
        Link(source: s, destination: a, kind: .scopedWrites, weight: 3),
    ]
    /// The writer of each site, and every state it held (the fingerprints of its commits).
    static let writers = ["a": a, "s": s]
    var statesHeld: [String: Set<SiteFingerprint>] = ["a": [.empty], "s": [.empty]]
    /// The link a session is on, and the links down until a step.
    var session: Link?
    var downUntil: [Link: Int] = [:]
    var step = 0
    var nextID: Int64 = 0
    var history: [String] = []
    var stats = Stats()
    /// The first state a reader could see that did not exist; the run stops there.
    var violation: String?

    init(seed: UInt64, directory: TemporaryDirectory) throws {
        self.seed = seed
        self.directory = directory
        random = SeededGenerator(seed: seed)
        nodes = try zip(Self.names, [["a", "s"], ["a", "s"], ["a", "s"], ["s"]]).map { name, sites in
            let path = directory.file("\(name).db")
            let db = try Database(path: path)
            try db.execute(Self.schema)
            for table in ["accounts", "journal"] { try db.enableSync(table: table) }
            return Node(name: name, path: path, db: db, sites: sites)
        }
        // A opens both sites in one transaction; from then on S alone writes site "s".
        let opening = (1...Self.openingAccounts * 2).map { id in (Int64(id), id <= Self.openingAccounts ? "a" : "s") }
        nextID = Int64(opening.count)
        try nodes[Self.a].db.write { conn in
            for (id, site) in opening {
                try conn.execute("INSERT INTO accounts VALUES (?, ?, ?, 0)", [id, site, Self.openingBalance])
            }
        }
        for site in ["a", "s"] { statesHeld[site]?.insert(try SiteFingerprint(site: site, on: nodes[Self.a].db)) }
        record("A opens \(opening.count) accounts of sites a and s")
    }

    mutating func newID() -> Int64 {
        nextID += 1
        return nextID
    }

    mutating func record(_ event: String) {
        history.append("step \(step): \(event)")
        if history.count > 16 { history.removeFirst() }
    }

    // MARK: Steps

    mutating func play(steps: Int) throws {
        // S joins with a catch-up of its site out of A's opening, so that it writes from the start.
        while violation == nil {
            step += 1
            let batch = try moveOneBatch(along: Self.pullOfS, limit: Int.random(in: 1...40, using: &random))
            try checkEveryNode()
            if batch.appliedCatchUp { break }
        }
        for _ in 0..<steps where violation == nil {
            step += 1
            switch Int.random(in: 0..<100, using: &random) {
            case 0..<30: try writeTransaction()
            case 30..<82: try syncOneBatch()
            case 82..<92: try kill()
            default: try disconnect()
            }
            try checkEveryNode()
        }
    }

    /// The writer of a site (A or S) commits one random transaction.
    mutating func writeTransaction() throws {
        let site = Bool.random(using: &random) ? "a" : "s"
        guard let writer = Self.writers[site] else { return }
        let db = nodes[writer].db
        var accounts = try db.fetchRows("SELECT id FROM accounts WHERE site = ? ORDER BY id", [site]).map {
            try $0.get(0, as: Int64.self)
        }
        let size =
            switch Int.random(in: 0..<100, using: &random) {
            case 0..<55: 1
            case 55..<95: Int.random(in: 2...12, using: &random)
            // Hundreds of changes: a catch-up of many batches, however they are cut.
            default: Int.random(in: 100...200, using: &random)
            }
        var operations: [LedgerOperation] = []
        for _ in 0..<size {
            let pair = accounts.shuffled(using: &random).prefix(2)
            guard let first = pair.first, let second = pair.last else { break }
            switch Int.random(in: 0..<100, using: &random) {
            case 0..<80:
                operations.append(
                    .transfer(
                        from: first, to: second, amount: Int.random(in: 1...300, using: &random), entry: newID()))
            case 80..<92:
                let account = newID()
                operations.append(
                    .open(
                        account: account, fundedBy: first, amount: Int.random(in: 1...100, using: &random),
                        entry: newID()))
                accounts.append(account)
            default:
                guard accounts.count > 4 else { continue }
                operations.append(.close(account: first, into: second, entry: newID()))
                accounts.removeAll { $0 == first }
            }
        }
        try db.write { conn in
            for operation in operations { try operation.execute(site: site, conn) }
        }
        statesHeld[site]?.insert(try SiteFingerprint(site: site, on: db))
        stats.transactions += 1
        record("\(nodes[writer].name) commits \(operations.count) operation(s) on site \(site)")
    }

    /// The session's link moves one batch; a new session starts on a link that is up, now and then.
    mutating func syncOneBatch() throws {
        if session == nil || Int.random(in: 0..<100, using: &random) < 20 {
            let up = Self.links.filter { (downUntil[$0] ?? 0) <= step }
            let weights = up.map(\.weight)
            var pick = Int.random(in: 0..<weights.reduce(0, +), using: &random)
            session = up.first { link in
                pick -= link.weight
                return pick < 0
            }
        }
        guard let link = session else { return }
        let moved = try moveOneBatch(along: link, limit: Int.random(in: 1...40, using: &random))
        // A finished catch-up often ends the session: the next sync picks a link anew.
        if moved.appliedCatchUp, Bool.random(using: &random) { session = nil }
    }

    /// A crash of a link's end: a batch lost in flight or an ACK lost, and sometimes the receiver,
    /// or both ends, closed and reopened from their files, as after SIGKILL.
    mutating func kill() throws {
        guard let link = Self.links.randomElement(using: &random) else { return }
        session = nil
        let limit = Int.random(in: 1...40, using: &random)
        if Bool.random(using: &random) {
            let batch = try extractBatch(along: link, limit: limit)
            stats.lostBatches += 1
            record("\(link) kill: a batch after \(batch.after) (\(batch.changes.count) changes) lost in flight")
        } else {
            _ = try moveOneBatch(along: link, limit: limit, acknowledging: false)
            record("\(link) kill: its ACK, if any, lost")
        }
        var reopened: [Int] = []
        if Bool.random(using: &random) { reopened.append(link.destination) }
        if Int.random(in: 0..<4, using: &random) == 0 { reopened.append(link.source) }
        for index in reopened {
            try nodes[index].db.close()
            nodes[index].db = try Database(path: nodes[index].path)
            stats.reopened += 1
        }
        if !reopened.isEmpty { record("reopened \(reopened.map { nodes[$0].name }.joined(separator: ", "))") }
    }

    /// The session's link goes down for a while, mid catch-up or not: other links sync meanwhile.
    mutating func disconnect() throws {
        guard let link = session else { return }
        session = nil
        downUntil[link] = step + Int.random(in: 3...30, using: &random)
        let midCatchUp = try nodes[link.destination].db.stagedCatchUp(from: nodes[link.source].db.instanceKey) != nil
        if midCatchUp { stats.leftMidCatchUp += 1 }
        record("\(link) disconnects\(midCatchUp ? " mid catch-up" : "") until step \(downUntil[link] ?? 0)")
    }

    // MARK: Sync

    /// Where the destination's next pull starts, as a session reads it: after its staged catch-up
    /// when that starts at the cursor, else at the cursor.
    func pullStart(along link: Link) throws -> Int64 {
        let destination = nodes[link.destination].db
        let source = nodes[link.source].db.instanceKey
        let cursor = try destination.cursor(for: source).after
        guard let staged = try destination.stagedCatchUp(from: source), staged.after == cursor else { return cursor }
        return staged.through
    }

    /// The link's next batch, as it arrives: read after the pull start, through the wire encoding.
    func extractBatch(along link: Link, limit: Int) throws -> ChangeBatch {
        let batch = try nodes[link.source].db.extractChanges(
            for: nodes[link.destination].db.instanceKey, after: try pullStart(along: link),
            limits: BatchLimits(maximumChanges: limit), scope: link.kind == .scopedPull ? Self.scopeOfS : nil)
        return try BatchCoding.decode(BatchCoding.encode(batch))
    }

    struct MovedBatch {
        var changes: Int
        /// The batch was its catch-up's last: applied, with the staged batches before it.
        var appliedCatchUp: Bool
    }

    /// Moves one batch along `link`: staged, or applied with the staged ones and acknowledged (one
    /// ACK per catch-up).
    @discardableResult
    mutating func moveOneBatch(along link: Link, limit: Int, acknowledging: Bool = true) throws -> MovedBatch {
        let source = nodes[link.source].db
        let destination = nodes[link.destination].db
        let batch = try extractBatch(along: link, limit: limit)
        let stagedBefore = try destination.stagedCatchUp(from: source.instanceKey)
        let outcome = try destination.receive(batch, scope: link.kind == .scopedWrites ? Self.scopeOfS : nil)
        stats.batches += 1
        let moved = "\(link) batch after \(batch.after) through \(batch.through), \(batch.changes.count) changes"
        switch outcome {
        case let .staged(chain):
            stats.longestStagedChain = max(stats.longestStagedChain, chain.batches)
            record("\(moved): staged (\(chain.batches) batches, \(chain.changes) changes)")
            return MovedBatch(changes: batch.changes.count, appliedCatchUp: false)
        case let .applied(report):
            // S writes only inside its scope (a row it opened and closed between two of its
            // catch-ups comes as a delete of a row A never held, taken with nothing written): any
            // refusal of S's own site is a failure.
            if !report.refused.isEmpty {
                fail("\(link) refused \(report.refused.count) change(s) of S's own site: \(report.refused.prefix(3))")
            }
            if let stagedBefore, batch.after == stagedBefore.through {
                stats.appliedWithStaged += 1
                if link.kind == .scopedWrites { stats.scopedWritesAppliedWithStaged += 1 }
            }
            if acknowledging {
                try source.acknowledge(peer: destination.instanceKey, through: report.cursor)
            } else {
                stats.lostAcknowledgements += 1
            }
            record("\(moved): applied \(report.applied) (\(stagedBefore?.batches ?? 0) staged before)")
            return MovedBatch(changes: batch.changes.count, appliedCatchUp: true)
        }
    }

    // MARK: Checks

    /// Every node holds, of each site, nothing or a state its writer held; one that does not
    /// stops the run with its seed, step and recent history.
    mutating func checkEveryNode() throws {
        for node in nodes {
            for site in node.sites {
                let held = try SiteFingerprint(site: site, on: node.db)
                let existed = statesHeld[site]?.contains(held) ?? false
                if held.keepsTheInvariant && existed { continue }
                let problem = held.keepsTheInvariant ? "a state its writer never held" : "a broken invariant"
                fail("\(node.name) shows site \(site) with \(problem): \(held)")
                return
            }
            let sites = node.sites.map { "'\($0)'" }.joined(separator: ", ")
            let outside = try node.db.fetchValue(
                """
                SELECT (SELECT count(*) FROM accounts WHERE site NOT IN (\(sites)))
                    + (SELECT count(*) FROM journal WHERE site NOT IN (\(sites)))
                """, as: Int.self)
            if outside != 0 {
                fail("\(node.name) holds \(outside ?? -1) row(s) of a site it does not hold")
                return
            }
        }
    }

    mutating func fail(_ problem: String) {
        violation = problem
        Issue.record(
            """
            seed \(seed) (TETHER_WHOLE_SEED=\(seed) replays it), step \(step): \(problem)
            last steps:
            \(history.joined(separator: "\n"))
            """)
    }

    /// Every link syncs its catch-ups whole until no link moves anything, checking every node
    /// after each batch.
    mutating func settle() throws {
        for _ in 0..<10 {
            var moved = false
            for link in Self.links {
                while violation == nil {
                    step += 1
                    let batch = try moveOneBatch(along: link, limit: 40)
                    moved = moved || batch.changes > 0
                    try checkEveryNode()
                    if batch.appliedCatchUp { break }
                }
            }
            if !moved || violation != nil { return }
        }
        fail("the links still moved changes after 10 rounds")
    }

    static func rows(_ db: Database, _ table: String, site: String? = nil) throws -> [[DatabaseValue]] {
        let condition = site.map { " WHERE site = '\($0)'" } ?? ""
        return try db.fetchRows("SELECT * FROM \(table)\(condition) ORDER BY id").map { Array($0.values) }
    }

    func expectConverged() throws {
        let a = nodes[Self.a].db
        for table in ["accounts", "journal"] {
            let rowsOfA = try Self.rows(a, table)
            #expect(rowsOfA.count > Self.openingAccounts, "seed \(seed): \(table) of A")
            for replica in [nodes[Self.b], nodes[Self.c]] {
                #expect(try Self.rows(replica.db, table) == rowsOfA, "seed \(seed): \(table) of \(replica.name)")
            }
            #expect(
                try Self.rows(nodes[Self.s].db, table) == Self.rows(a, table, site: "s"), "seed \(seed): \(table) of S")
        }
        for link in Self.links {
            #expect(
                try nodes[link.destination].db.stagedCatchUp(from: nodes[link.source].db.instanceKey) == nil,
                "seed \(seed): \(link) left staged")
        }
    }
}
