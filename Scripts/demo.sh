#!/usr/bin/env bash
# Builds Tether and runs its demonstration.
set -euo pipefail
cd "$(dirname "$0")/.."
source Scripts/setup.sh

swift build --product tether >&2
exec "$(swift build --show-bin-path)/tether" demo "$@"
