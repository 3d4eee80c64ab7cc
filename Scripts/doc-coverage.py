#!/usr/bin/env python3
"""Lists the public symbols of the given symbol-graph directories that have no doc comment.

A symbol counts when it is public (or open), declared in this package's sources (it has a source
location: the compiler's synthesized members have none), not an extension block, and does not
implement a requirement whose documentation it inherits (the symbol graph names that requirement as
its `sourceOrigin`). Usage: doc-coverage.py check|report DIRECTORY..."""
import glob
import json
import os
import sys

mode, directories = sys.argv[1], sys.argv[2:]
missing = []
for directory in directories:
    for path in sorted(glob.glob(os.path.join(directory, "*.symbols.json"))):
        graph = json.load(open(path))
        for symbol in graph["symbols"]:
            if symbol.get("accessLevel") not in ("public", "open"):
                continue
            if symbol["kind"]["identifier"] == "swift.extension" or "location" not in symbol:
                continue
            if "sourceOrigin" in symbol or symbol.get("docComment"):
                continue
            location = symbol["location"]
            file = location["uri"].split("/Sources/", 1)[-1]
            line = location["position"]["line"] + 1
            missing.append(f"Sources/{file}:{line}: {'.'.join(symbol['pathComponents'])} ({symbol['kind']['displayName'].lower()})")
missing = sorted(set(missing))
for entry in missing:
    print(entry)
print(f"{len(missing)} public symbols without a doc comment", file=sys.stderr)
sys.exit(1 if missing and mode == "check" else 0)
