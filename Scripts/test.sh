#!/usr/bin/env bash
# Builds Tether and runs its whole test suite; exits non-zero on any failure.
# Long property-based runs: TETHER_LONG_TESTS=1 ./Scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source Scripts/setup.sh

swift build --build-tests
swift test --skip-build
