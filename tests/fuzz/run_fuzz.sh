#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Run the fuzz target for a bounded time as one test case of 'make test':
# FUZZ_SECONDS (default 60) or FUZZ_RUNS executions (default 1000000),
# whichever comes first. Any crash, leak or sanitizer report fails it.
bin="${FUZZ_BIN:-build-fuzz/fuzz_command}"
secs="${FUZZ_SECONDS:-60}"
runs="${FUZZ_RUNS:-1000000}"
here=$(dirname "$0")
corpus=$(mktemp -d "${TMPDIR:-/tmp}/shmb-fuzz.XXXXXX") || exit 1
trap 'rm -rf "$corpus"' EXIT
if [ ! -x "$bin" ]; then
    echo "FAIL: fuzz_command ($bin is missing; run make fuzz)"
    exit 1
fi
if "$bin" -max_total_time="$secs" -runs="$runs" -max_len=8192 \
    -dict="$here/request.dict" -print_final_stats=1 -artifact_prefix="$(dirname "$bin")/" \
    "$corpus" "$here/corpus"; then
    echo "PASS: fuzz_command (${secs}s or ${runs} runs, no crash, leak or sanitizer report)"
else
    echo "FAIL: fuzz_command (see the report above; the input is in crash-* / leak-*)"
    exit 1
fi
