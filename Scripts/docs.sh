#!/usr/bin/env bash
# Builds the DocC documentation of Tether and TetherSync with warnings as errors (a broken symbol
# link or article reference fails), then lists every public symbol without a doc comment and fails
# when there is one (Scripts/doc-coverage.py says which symbols count).
#
#   ./Scripts/docs.sh                 # build and check
#   ./Scripts/docs.sh --report        # build, and list undocumented symbols without failing
#
# The archives are written to .build/plugins/Swift-DocC/outputs/{Tether,TetherSync}.doccarchive; to
# read them, serve one with a static file server, for example:
#   python3 -m http.server --directory .build/plugins/Swift-DocC/outputs/Tether.doccarchive 8000
# then open http://localhost:8000/documentation/tether.
set -euo pipefail
cd "$(dirname "$0")/.."
source Scripts/setup.sh

mode=check
if [[ "${1:-}" == "--report" ]]; then mode=report; fi

for target in Tether TetherSync; do
    swift package generate-documentation --target "$target" --warnings-as-errors >&2
done
python3 Scripts/doc-coverage.py "$mode" .build/*/extracted-symbols/*/Tether .build/*/extracted-symbols/*/TetherSync
