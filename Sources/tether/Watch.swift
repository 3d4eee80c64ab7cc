import ArgumentParser
import Foundation
import Tether

#if canImport(Glibc)
    import Glibc
#endif

/// `tether watch`: a change feed for shell pipelines, one line per committed change.
struct Watch: AsyncParsableCommand, ConfigurableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print each change committed to the database's synced tables as it happens, until SIGINT or SIGTERM.",
        discussion: """
            Sees the commits of every process that writes the file — `tether serve` applying a peer's batch, the \
            sqlite3 shell writing a table synced with captured external writes — by polling PRAGMA data_version (one \
            cheap read every --poll-interval milliseconds; the changelog is read only after another process \
            committed). Each row is printed once per look, as it is then: a row inserted since the previous look (by \
            whatever path) as an insert, another live row as an update, a deleted one as a delete, one removed because \
            it left this database's scope (partial replication) as an evict. Text lines are "SEQUENCE KIND TABLE KEY \
            ORIGIN"; with --json, one JSON object per line: "sequence", "kind", "table", "key" (an array of the key's \
            values), "origin" (local, peer or file), "peer" (its instance key, or null) and "transaction": the source \
            transaction the change belongs to, on the database that first committed it — {"origin": its instance key, \
            "timestamp": its hybrid timestamp, as a decimal string} (the same on every peer: a catch-up applied as \
            one commit here still tells its source's transactions apart), or null for an eviction.
            """)
    static let configKeys =
        DatabaseOption<ExistingDatabase>.configKeys + ["table"] + OutputFormatOption.configKeys + ["poll-interval"]

    @OptionGroup var common: CommonOptions

    @OptionGroup var db: DatabaseOption<ExistingDatabase>

    @Option(help: ArgumentHelp("Only changes to this table (repeatable; default: all).", valueName: "name"))
    var table: [String] = []

    @OptionGroup var output: OutputFormatOption

    @Option(
        name: .customLong("poll-interval"),
        help: ArgumentHelp("How often to look for other processes' commits.", valueName: "ms"))
    var pollInterval = 50

    func validate() throws {
        guard pollInterval > 0 else { throw ValidationError("--poll-interval must be at least 1 (milliseconds)") }
    }

    func run() async throws {
        common.bootstrapLogging(label: "tether.watch")
        _ = try db.openExisting()
        var configuration = Database.Configuration()
        configuration.observationPollInterval = .milliseconds(pollInterval)
        let database = try Database(path: db.path, configuration: configuration)
        let tables = table.isEmpty ? nil : Set(table)
        let stopRequests = await SignalWatcher(signals: [SIGINT, SIGTERM])
        // Changes committed from here on are printed: say so (on stderr, stdout carries only changes).
        let changes = try database.committedTransactions(tables: tables)
        FileHandle.standardError.write(Data("watching \(db.path)\n".utf8))
        let feed = Task { [json = output.json] in
            var resumeAfter: Int64? = nil
            var next: CommittedTransactions? = changes
            while !Task.isCancelled {
                do {
                    let current = try next ?? database.committedTransactions(tables: tables, resumingAfter: resumeAfter)
                    next = nil
                    for try await transaction in current {
                        for change in transaction.changes { Output.line(json ? Self.json(change) : Self.text(change)) }
                        if let last = transaction.sequences?.upperBound { resumeAfter = last }
                    }
                    return
                } catch let behind as CommittedTransactions.FellBehind {
                    // Too slow a pipe: catch up from the changelog and go on.
                    resumeAfter = behind.resumeAfter ?? resumeAfter
                }
            }
        }
        _ = await stopRequests.next()
        feed.cancel()
        try? database.close()
        _ = try await feed.value
    }

    static func text(_ change: DatabaseEvent) -> String {
        let key = change.key.values.map(\.description).joined(separator: ",")
        return """
            \(change.sequence.map(String.init) ?? "-") \(change.kind.rawValue) \(change.table) [\(key)] \
            \(origin(change.origin).text)
            """
    }

    static func json(_ change: DatabaseEvent) -> String {
        let key = change.key.values.map(SQL.jsonValue).joined(separator: ",")
        let (name, peer) = origin(change.origin).json
        return "{\"sequence\":\(change.sequence.map(String.init) ?? "null"),\"kind\":\"\(change.kind.rawValue)\","
            + "\"table\":\(SQL.jsonString(change.table)),"
            + "\"key\":[\(key)],\"origin\":\"\(name)\",\"peer\":\(peer.map { "\"\($0)\"" } ?? "null"),"
            + "\"transaction\":\(change.sourceTransaction.map(transactionJSON) ?? "null")}"
    }

    private static func transactionJSON(_ transaction: SourceTransaction) -> String {
        // A string: hybrid timestamps pass 2^53, where JSON readers that use doubles round them.
        "{\"origin\":\"\(transaction.origin.hex)\",\"timestamp\":\"\(transaction.timestamp.rawValue)\"}"
    }

    private static func origin(_ origin: ChangeOrigin) -> (text: String, json: (String, String?)) {
        switch origin {
        // Read back from the changelog, a change without a peer was made on this database, by whichever program.
        case .local, .external: return ("local", ("local", nil))
        case let .peer(key): return ("peer \(key.hex)", ("peer", key.hex))
        case let .syncFile(key): return ("file \(key.hex)", ("file", key.hex))
        }
    }
}
