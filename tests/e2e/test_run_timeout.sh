#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tests/run.sh's per-program time limit follows the length asked for: a
# program named soak (or soak_valgrind.sh) that runs longer than
# SHMB_TEST_TIMEOUT but within SOAK_SECONDS (SOAK_VALGRIND_SECONDS) more
# passes, while any other program is still stopped at SHMB_TEST_TIMEOUT.
# Dummy programs sleep 2 s under a 1 s limit; nothing else runs.
here=$(cd "$(dirname "$0")" && pwd)
run="$here/../run.sh"

if ! command -v timeout >/dev/null 2>&1; then
    echo "SKIP: run_timeout ('timeout' not found: run.sh has no time limit)"
    exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/shmbt-run-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin" "$tmp/build"
for name in soak soak_valgrind.sh other; do
    printf '#!/bin/sh\nexec sleep 2\n' >"$tmp/bin/$name"
    chmod +x "$tmp/bin/$name"
done

failed=0
# check NAME EXPECT(pass|timeout) VAR=VALUE...: run one dummy through run.sh.
check() {
    name="$1"
    expect="$2"
    shift 2
    env SHMB_TEST_TIMEOUT=1 SOAK_SECONDS=0 SOAK_VALGRIND_SECONDS=0 FUZZ_SECONDS=0 "$@" \
        sh "$run" "$tmp/build" "$tmp/bin/$name" >"$tmp/out" 2>&1
    rc=$?
    if [ "$expect" = pass ] && [ "$rc" -eq 0 ] && grep -q '^1 passed, 0 failed$' "$tmp/out"; then
        echo "PASS: run_timeout $name ($*): the limit followed the asked length"
    elif [ "$expect" = timeout ] && [ "$rc" -ne 0 ] &&
        grep -q "FAILED (timed out after 1s)" "$tmp/out"; then
        echo "PASS: run_timeout $name ($*): still stopped after 1 s"
    else
        echo "FAIL: run_timeout $name ($*): expected $expect, run.sh said:"
        cat "$tmp/out"
        failed=1
    fi
}

check soak pass SOAK_SECONDS=20
check soak_valgrind.sh pass SOAK_VALGRIND_SECONDS=20
check other timeout SOAK_SECONDS=20 SOAK_VALGRIND_SECONDS=20
check soak timeout
exit "$failed"
