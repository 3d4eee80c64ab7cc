#!/usr/bin/env bash
# Builds the benchmark package (Benchmarks/, release mode) and runs it.
# Prints one JSON object per benchmark on stdout; progress goes to stderr.
#
#   ./Scripts/bench.sh                 # every benchmark
#   ./Scripts/bench.sh orm. c.         # names starting with orm. or c.
#   TETHER_BENCH_ROWS=100000 TETHER_BENCH_REPEAT=1 ./Scripts/bench.sh   # quick run
set -euo pipefail
cd "$(dirname "$0")/.."
source Scripts/setup.sh

# Build output goes to stderr so that stdout carries only the JSON lines.
swift build -c release --package-path Benchmarks >&2
exec "$(swift build -c release --package-path Benchmarks --show-bin-path)/TetherBenchmarks" "$@"
