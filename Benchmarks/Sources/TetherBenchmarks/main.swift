import Foundation

/// Every benchmark, in output order. A line compared with another must come
/// after it. Add new lines here.
func makeRegistry() -> [Benchmark] {
    [
        CAPIBenchmarks.insert,
        TetherORMBenchmarks.insert,
        TetherORMBenchmarks.insertCodable,
        GRDBBenchmarks.insertCodable,
        GRDBBenchmarks.insertFastest,
        CAPIBenchmarks.fetch,
        TetherORMBenchmarks.fetch,
        TetherORMBenchmarks.fetchCodable,
        GRDBBenchmarks.fetchCodable,
        GRDBBenchmarks.fetchFastest,
        SyncBenchmarks.syncedInsert,
        SyncBenchmarks.syncedInsertExternal,
        SyncBenchmarks.syncedInsertTombstones,
        GarbageCollectionBenchmarks.rate,
        GarbageCollectionBenchmarks.longestStep,
        TetherORMBenchmarks.update,
        SyncBenchmarks.syncedUpdate,
        SyncBenchmarks.syncedUpdateExternal,
        SyncBenchmarks.syncedUpdateCounter,
        SyncBenchmarks.cInsertLogged,
        SyncBenchmarks.engineApply,
        SyncBenchmarks.engineReceive,
        ScopeBenchmarks.engineExtract,
        ScopeBenchmarks.scopeExtract,
        WireBenchmarks.patchsetInsert,
        WireBenchmarks.wireInsert,
        WireBenchmarks.wireInsertRows,
        WireBenchmarks.patchsetUpdate2,
        WireBenchmarks.wireUpdate2,
        WireBenchmarks.wireUpdate2Rows,
        FlightsBenchmarks.patchsetInsert,
        FlightsBenchmarks.wireInsert,
        FlightsBenchmarks.patchsetUpdate,
        FlightsBenchmarks.wireUpdate,
        FlightsBenchmarks.apply,
        FlightsBenchmarks.updateApply,
        FlightsBenchmarks.sync,
        FlightsBenchmarks.updateSync,
        NetworkSyncBenchmarks.syncTLS,
        NetworkSyncBenchmarks.rssSender,
        NetworkSyncBenchmarks.rssReceiver,
        LargeSyncBenchmarks.sync10M,
        LargeSyncBenchmarks.rssSender,
        LargeSyncBenchmarks.rssReceiver,
        LargeSyncBenchmarks.sync10MOneTransaction,
        LargeSyncBenchmarks.oneTransactionRSSSender,
        LargeSyncBenchmarks.oneTransactionRSSReceiver,
        NetworkSyncBenchmarks.latencyP50,
        NetworkSyncBenchmarks.latencyP99,
        NetworkSyncBenchmarks.externalLatencyP50,
        NetworkSyncBenchmarks.externalLatencyP99,
        ScopeBenchmarks.scopeMove,
        ObservationBenchmarks.insert,
        ObservationBenchmarks.query,
        ObservationBenchmarks.grdbQuery,
        ObservationBenchmarks.latencyP99,
        LoadBenchmarks.peers,
        LoadBenchmarks.hubKBPerPeer,
        LoadBenchmarks.idleCPU,
        LoadBenchmarks.idleCPUPer1000,
        IdleBenchmarks.nodeCPU,
        LoadBenchmarks.rssNonReading,
    ] + LinkBenchmarks.lines
}

let usage = """
    usage: TetherBenchmarks [--list | --instructions] [NAME-PREFIX ...]

    Prints one JSON object per benchmark on stdout; progress goes to stderr.
    With prefixes, runs the benchmarks whose names start with one of them,
    plus the lines they are compared with. The sync.10m lines run only when
    a prefix names them (sync.10m), never in a run of every line; so do the
    links.* lines (links.: WAN links emulated between two network namespaces,
    which need root; see LinkBenchmarks.swift).

    --instructions counts instructions per row instead of timing, with
    valgrind's callgrind (run through ./Scripts/bench.sh --instructions,
    which strips the debug info valgrind 3.19 cannot read), for the lines
    whose timed part runs on one thread; TETHER_BENCH_ROWS defaults to 50000.

    Environment:
      TETHER_BENCH_ROWS     rows per benchmark (default 1000000)
      TETHER_BENCH_REPEAT   runs per benchmark; the best is reported (default 3)
      TETHER_LINKS_ROWS     rows of the links.catchup.* syncs (default 300000)
      TETHER_LINKS_COMMITS  commits of the links.latency.* runs (default 200)
      TETHER_LINKS_GOODPUT_SECONDS  also log each link's bulk TCP goodput over so many s
      TETHER_LINKEMU, TETHER_LINKCHECK  linkemu.py and linkcheck.py (./Scripts/bench.sh sets both)
    """

/// A positive integer from the environment, or `defaultValue` when unset.
func positiveIntegerSetting(_ name: String, default defaultValue: Int) throws -> Int {
    guard let text = ProcessInfo.processInfo.environment[name], !text.isEmpty else { return defaultValue }
    guard let value = Int(text), value > 0 else {
        throw UsageError(description: "\(name) must be a positive integer, not \"\(text)\"")
    }
    return value
}

func runBenchmarksCommand(_ arguments: [String]) -> Int32 {
    let registry = makeRegistry()
    validateRegistry(registry)
    if arguments.contains("--help") || arguments.contains("-h") {
        log(usage)
        return 0
    }
    if arguments.contains("--list") {
        for benchmark in registry { print(benchmark.name) }
        return 0
    }
    do {
        if arguments.first == InstructionCounts.flag {
            try InstructionCounts.run(registry: registry, prefixes: Array(arguments.dropFirst()))
            return 0
        }
        if let option = arguments.first(where: { $0.hasPrefix("-") }) {
            throw UsageError(description: "unknown option \(option)\n\n\(usage)")
        }
        let rowCount = try positiveIntegerSetting("TETHER_BENCH_ROWS", default: 1_000_000)
        let repeats = try positiveIntegerSetting("TETHER_BENCH_REPEAT", default: 3)
        let selected = try selectBenchmarks(registry, prefixes: arguments)

        let context = try BenchmarkContext(rowCount: rowCount)
        defer { context.removeRunDirectory() }
        try checkTetherTableDefinition(context)
        log("building \(rowCount) input records")
        _ = context.records
        log("running \(selected.map(\.name).joined(separator: ", ")): \(rowCount) rows, best of \(repeats)")
        let results = try runBenchmarks(selected, repeats: repeats, context: context)

        for benchmark in selected {
            if let line = jsonLine(for: benchmark, results: results) { print(line) }
        }
        for line in goalSummary(selected, results: results) { log(line) }
        return 0
    } catch let error as UsageError {
        log("bench: \(error)")
        return 2
    } catch {
        log("bench: error: \(error)")
        return 1
    }
}

// The hidden child modes (one sync peer per process, for sync.tls and
// sync.rss.*; one sync node, for idle.node_cpu) are dispatched before anything else is built.
if CommandLine.arguments.count > 1, CommandLine.arguments[1] == SyncPeerChild.flag {
    exit(SyncPeerChild.run(Array(CommandLine.arguments.dropFirst(2))))
}
// So is the process callgrind runs for one line of the instruction-count mode.
if CommandLine.arguments.count > 1, CommandLine.arguments[1] == InstructionCounts.childFlag {
    exit(InstructionCounts.runChild(Array(CommandLine.arguments.dropFirst(2))))
}
if CommandLine.arguments.count > 1, CommandLine.arguments[1] == IdleNodeChild.flag {
    exit(IdleNodeChild.run(Array(CommandLine.arguments.dropFirst(2))))
}
exit(runBenchmarksCommand(Array(CommandLine.arguments.dropFirst())))
