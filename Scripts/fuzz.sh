#!/usr/bin/env bash
# Fuzzes TetherWire's frame decoder with libFuzzer for a fixed time budget.
#   ./Scripts/fuzz.sh [seconds]      (default 60)
# Builds TetherBatch, TetherWire and Fuzz/FrameDecoderFuzzer.swift with
# -sanitize=fuzzer,address into .build-fuzz/frame-decoder-fuzzer, seeds the
# corpus with Protocol/vectors/valid, and exits non-zero if the fuzzer finds
# a crash, a leak, a timeout or an out-of-memory (the input is saved in
# .build-fuzz/artifacts/). The corpus grows across runs in .build-fuzz/corpus.
# Extra libFuzzer options: FUZZ_OPTIONS="-jobs=2 -workers=2" ./Scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source Scripts/setup.sh

seconds="${1:-60}"
out=.build-fuzz
mkdir -p "$out/modules" "$out/corpus" "$out/seeds" "$out/artifacts"

# The toolchain's clang and lld: the fuzzer runtime is the toolchain's own.
swift_bin="$(dirname "$(command -v swiftc)")"
common=(-parse-as-library -O -g -sanitize=fuzzer,address -module-cache-path "$out/module-cache")
[ -x "$swift_bin/ld.lld" ] && common+=(-use-ld=lld)

echo "fuzz: building (TetherBatch, TetherWire, fuzzer)" >&2
# -package-name as SwiftPM gives it: TetherBatch has package members.
# shellcheck disable=SC2046
swiftc "${common[@]}" -module-name TetherBatch -package-name tether -emit-library -static -emit-module \
    -emit-module-path "$out/modules/TetherBatch.swiftmodule" -o "$out/libTetherBatch.a" \
    $(find Sources/TetherBatch -name '*.swift' | sort)
# shellcheck disable=SC2046
swiftc "${common[@]}" -module-name TetherWire -package-name tether -emit-library -static -emit-module \
    -emit-module-path "$out/modules/TetherWire.swiftmodule" -o "$out/libTetherWire.a" \
    -I "$out/modules" -I Sources/CLZ4 $(find Sources/TetherWire -name '*.swift' | sort)
swiftc "${common[@]}" -module-name FrameDecoderFuzzer -I "$out/modules" -I Sources/CLZ4 \
    Fuzz/FrameDecoderFuzzer.swift "$out/libTetherWire.a" "$out/libTetherBatch.a" -llz4 \
    -o "$out/frame-decoder-fuzzer"

# Seeds: the valid vectors, from hex to binary.
rm -f "$out/seeds"/*
for file in Protocol/vectors/valid/*.hex; do
    perl -0777 -ne 's/\s+//g; print pack("H*", $_)' "$file" > "$out/seeds/$(basename "$file" .hex).bin"
done

echo "fuzz: running for ${seconds}s" >&2
# shellcheck disable=SC2086
"$out/frame-decoder-fuzzer" "$out/corpus" "$out/seeds" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
    -dict=Fuzz/wire.dict -artifact_prefix="$out/artifacts/" -print_final_stats=1 ${FUZZ_OPTIONS:-}
