#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Run the adoption fuzzer for FUZZ_ADOPT_SECONDS (default 30) as one test
# case of 'make test', or for as long as asked (make fuzz-adopt). Any crash,
# hang, leak, sanitizer report or broken invariant fails it. The corpus is
# kept in FUZZ_ADOPT_CORPUS when that is set, else in a temporary directory.
bin="${FUZZ_ADOPT_BIN:-build-fuzz/fuzz_adopt}"
secs="${FUZZ_ADOPT_SECONDS:-30}"
here=$(dirname "$0")
# The segment it works on; removed at the end whatever happened.
FUZZ_ADOPT_NAME="shmb-fuzz-adopt-$$"
export FUZZ_ADOPT_NAME
if [ ! -x "$bin" ]; then
    echo "FAIL: fuzz_adopt ($bin is missing; run make fuzz-adopt)"
    exit 1
fi
if [ -n "$FUZZ_ADOPT_CORPUS" ]; then
    corpus="$FUZZ_ADOPT_CORPUS"
    mkdir -p "$corpus" || exit 1
    trap 'rm -f "/dev/shm/$FUZZ_ADOPT_NAME"' EXIT
else
    corpus=$(mktemp -d "${TMPDIR:-/tmp}/shmb-fuzz-adopt.XXXXXX") || exit 1
    trap 'rm -rf "$corpus"; rm -f "/dev/shm/$FUZZ_ADOPT_NAME"' EXIT
fi
# -timeout: one input that takes 10 s is a hang. corpus-adopt holds inputs
# that found bugs (they run first, every time).
if "$bin" -max_total_time="$secs" -timeout=10 -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$(dirname "$bin")/" "$corpus" "$here/corpus-adopt"; then
    echo "PASS: fuzz_adopt (${secs}s: no crash, hang, leak, sanitizer report, refused restart or overlap)"
else
    echo "FAIL: fuzz_adopt (see the report above; the input is in crash-* / leak-* / timeout-*)"
    exit 1
fi
