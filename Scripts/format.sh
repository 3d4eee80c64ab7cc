#!/usr/bin/env bash
# Lays out every Swift file of the repository with swift format (it ships with the toolchain) and
# the configuration in .swift-format; with --check, changes nothing and fails when a file is not
# laid out so or has a line over 120 characters (./Scripts/test.sh runs the check).
#
#   ./Scripts/format.sh            # format in place: Sources, Tests, Benchmarks (its own package),
#                                  # Fuzz, both Package.swift files
#   ./Scripts/format.sh --check    # swift format lint --strict, then the line length
#
# The files are those git knows (tracked, or new and not ignored), so build folders such as
# .build or Benchmarks/.build are never entered.
#
# Why .swift-format says what it says: the layout is swift format's (4 spaces, 120 columns,
# arguments packed on a line and wrapped when they must be, trailing commas in wrapped
# collections, the line breaks already there kept), and the rules that would rewrite code to
# another taste are off, so that formatting changes whitespace and commas and nothing else:
#   - UseLetInEveryBoundCaseVariable, OneVariableDeclarationPerLine, OneCasePerLine,
#     DoNotUseSemicolons, NoAccessLevelOnExtensionDeclaration, OrderedImports: the tree writes
#     `case let .x(a, b)`, `let a = 1, b = 2`, `case a, b`, `{ x = 1; y() }` on a line, `private
#     extension`, `@testable import` first on purpose; enforcing another way would churn hundreds
#     of lines without making one easier to read.
#   - GroupNumericLiterals: SHA-256 constants and wire bytes are written as their specs write them.
#   - ReplaceForEachWithForLoop, UseSynthesizedInitializer, OnlyOneTrailingClosureArgument,
#     AmbiguousTrailingClosureOverload, AvoidRetroactiveConformances: the few places they name are
#     deliberate (a one-line forEach, an explicit init, a public test-support overload, a
#     @retroactive conformance spelled out).
#   - OmitExplicitReturns, UseEarlyExits, UseWhereClausesInForLoops: would rewrite control flow.
#   - NeverForceUnwrap, NeverUseForceTry, NeverUseImplicitlyUnwrappedOptionals: tests use them.
#   - AllPublicDeclarationsHaveDocumentation, BeginDocumentationCommentWithOneLineSummary,
#     ValidateDocumentationComments: ./Scripts/docs.sh checks the documentation (DocC, every
#     public symbol), and a doc comment here may open with a sentence longer than a line.
# Doc comments stay `///` (UseTripleSlashForDocumentationComments) and comments are never
# reflowed; multi-line string literals are never reflowed either (their text is their value).
# The rules left on find nothing in the tree today; they keep new code from drifting.
#
# swift format cannot shorten a long string literal or comment: the check lists such lines with
# the others, to be split by hand (`"…" + "…"`, or a multi-line literal whose lines end in `\`,
# which adds no newline to the value); `python3 Scripts/split-long-lines.py [PATH_PREFIX…]` does
# most of them (review its diff).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v swift >/dev/null 2>&1 && [ -x /opt/swift/usr/bin/swift ]; then
    export PATH="/opt/swift/usr/bin:$PATH"
fi

mode=format
case "${1:-}" in
    "") ;;
    --check) mode=check ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

files=()
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    while IFS= read -r file; do
        [ -f "$file" ] && files+=("$file")
    done < <(git ls-files --cached --others --exclude-standard -- '*.swift' | sort -u)
else
    while IFS= read -r file; do files+=("$file"); done \
        < <(find . -name '*.swift' -not -path '*/.build*' -not -path './.git/*' | sort)
fi
if [ ${#files[@]} -eq 0 ]; then
    echo "format: no Swift file found" >&2
    exit 1
fi

if [ "$mode" = format ]; then
    # Twice: swift format is not always idempotent (a trailing comma after a wrapped ternary moves
    # on the second pass), and the check that follows wants the second pass's layout.
    swift format format --in-place --parallel "${files[@]}"
    swift format format --in-place --parallel "${files[@]}"
    exit 0
fi

status=0
if ! swift format lint --strict --parallel "${files[@]}"; then
    status=1
fi
# swift format's lint does not report a line it could not shorten itself (in characters, not bytes).
if ! python3 - "${files[@]}" <<'PYTHON'
import sys
found = False
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            length = len(line.rstrip("\n"))
            if length > 120:
                print(f"{path}:{number}: error: line of {length} characters, over 120")
                found = True
sys.exit(1 if found else 0)
PYTHON
then
    status=1
fi
if [ $status -ne 0 ]; then
    echo "format: the files above are not laid out as .swift-format says: run ./Scripts/format.sh," >&2
    echo "format: then split by hand what stays over 120 characters (long strings and comments)" >&2
fi
exit $status
