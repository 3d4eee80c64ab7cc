#!/usr/bin/env bash
# Builds Tether and runs its whole test suite; exits non-zero on any failure.
# Long property-based runs: TETHER_LONG_TESTS=1 ./Scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source Scripts/setup.sh

# The layout first (seconds, before minutes of build): .swift-format's, lines of at most 120
# characters. On a finding: ./Scripts/format.sh, then split by hand what stays too long.
./Scripts/format.sh --check

# Warnings are errors here (not in Package.swift: unsafe flags would keep
# other packages from depending on Tether).
swift build --build-tests -Xswiftc -warnings-as-errors
swift test --skip-build
